"""The session's throughput so far: what earlier phases left unused, for the plan to spend.

A job is judged on its throughput over the run, not iteration by iteration, and an allocation planned at
the threshold delivers more than it: default-governor phases (the baseline, control phases, a
re-baseline) run at full speed, and the clock grid is coarse, so the committed allocation sits somewhat
above its plan. Measured on ``drift-h100`` seed 1, the run delivered 0.9585 of the default's throughput
while every plan aimed at 0.956; throughput left unused is energy left unsaved (there, about a point of
capture for every 0.001). This ledger sums, since the session began (or its latest regime), the default
time of every phase — measured for a default-governor phase, predicted for a locked one — and the time
the phases took, the work between them on both sides. What it banks above the planned threshold, the
plan may spend over the next ``horizon`` iterations (never more than ``max_spend`` below its threshold);
what it owes — slow trials, locked phases a corrected yardstick shows were slower than they looked — the
same iterations repay (never more than ``max_repay`` above it): the threshold is a promise over the run.
The locked phases' default time is judged on the newest predictor (:meth:`RunThroughput.banked_s`), not
on the one each phase had: the early predictors rest on few default phases, and their bias summed over
every locked phase was the gap between what runs believed they delivered and what they did.
An async pool alone in its session keeps its own: its phases against their default, no gaps (a pool's gap
is waiting for its peer, not work). The pool that gates the iteration banks and spends; the waiting one
runs slower than its default by design, so it banks nothing and its plan stays its own.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from eerl.phases import PhaseKind

Yardstick = Callable[[PhaseKind, int, npt.NDArray[np.float64]], float | None]
"""The summed predicted default time of ``count`` phases of a kind whose workload features sum to the
array given (:meth:`eerl.control.predictor.BaselinePredictor.predict_sum`); None when it cannot say."""


@dataclass(slots=True)
class LockedWork:
    """A kind's locked phases in the run: how many, their summed features and predicted default time."""

    count: int = 0
    predicted_s: float = 0.0
    feature_sum: npt.NDArray[np.float64] | None = None

    def add(self, predicted_s: float, features: npt.NDArray[np.float64], count: int = 1) -> None:
        self.count += count
        self.predicted_s += predicted_s
        self.feature_sum = features.copy() if self.feature_sum is None else self.feature_sum + features

    def remove(self, predicted_s: float, features: npt.NDArray[np.float64]) -> None:
        """Take one phase out (it goes to another regime's judgement)."""
        if self.feature_sum is None or self.count == 0:
            return
        self.count -= 1
        self.predicted_s -= predicted_s
        self.feature_sum = self.feature_sum - features if self.count else None

    def absorb(self, other: LockedWork) -> None:
        """Take ``other``'s phases in."""
        if other.feature_sum is not None:
            self.add(other.predicted_s, other.feature_sum, other.count)


NEWEST_LOCKED = 64
"""Per kind, the newest locked phases kept one by one: those a change in cost came before go to the new
yardstick when the kind re-baselines (:meth:`RunThroughput.settle`)."""


@dataclass(frozen=True, slots=True)
class _LockedPhase:
    """One of a kind's newest locked phases, as the ledger counted it."""

    iteration: int
    clock_mhz: int
    predicted_s: float
    duration_s: float
    counted_s: float
    """The time the ledger counted it at (its clock's recent median ratio times ``predicted_s``)."""
    features: npt.NDArray[np.float64]


RECENT_AT_CLOCK = 5
"""A locked phase counts at the median time ratio of the last few phases of its kind at its clock."""


@dataclass(slots=True)
class RunThroughput:
    """Default-equivalent and actual time of a session's phases since the latest restart.

    Robust, as the rest of the controller: one committed phase far off moves nothing. A locked phase
    counts at the median ratio of its kind's last few phases at its clock (times its predicted default), a
    default-governor phase at its predicted default on both sides, the work between the phases at most at
    twice its typical time (a checkpoint or an evaluation is no throughput to spend). A single trial or
    probe at a clock is its own median: it counts as measured (the time it took was spent).
    """

    default_s: float = 0.0
    """Default time of every phase as each was judged (predicted for a locked one), the work between."""
    actual_s: float = 0.0
    _ratios: dict[tuple[PhaseKind, int], deque[float]] = field(default_factory=dict)
    _locked: dict[PhaseKind, LockedWork] = field(default_factory=dict)
    _newest: dict[PhaseKind, deque[_LockedPhase]] = field(default_factory=dict)
    """Per kind, the newest locked phases of ``_locked``: (iteration, predicted default, features)."""
    _landing: dict[PhaseKind, LockedWork] = field(default_factory=dict)
    """Per kind, locked phases that showed a workload step: counted at their own time until the regime
    they landed in is known (:meth:`settle` gives them to it; a step not confirmed, to the regime left)."""

    def add_default(self, predicted_s: float, between_s: float) -> None:
        """A default-governor phase (its predicted default time: an outlier is the predictor's business)."""
        self._add(predicted_s, predicted_s, between_s)

    def add_locked(
        self,
        kind: PhaseKind,
        clock_mhz: int,
        predicted_s: float,
        duration_s: float,
        between_s: float,
        *,
        features: npt.NDArray[np.float64] | None = None,
        iteration: int | None = None,
    ) -> None:
        """A phase locked at ``clock_mhz`` that took ``duration_s`` where the default would take
        ``predicted_s``; with its workload ``features``, :meth:`banked_s` may judge it again on a newer
        predictor (and with its ``iteration``, a re-baseline after a change in cost may hand it to the
        new yardstick)."""
        if predicted_s <= 0 or duration_s <= 0:
            return
        recent = self._ratios.setdefault((kind, clock_mhz), deque(maxlen=RECENT_AT_CLOCK))
        recent.append(duration_s / predicted_s)
        counted_s = predicted_s * statistics.median(recent)
        self._add(predicted_s, counted_s, between_s)
        if features is not None:
            self._locked.setdefault(kind, LockedWork()).add(predicted_s, features)
            if iteration is not None:
                newest = self._newest.setdefault(kind, deque(maxlen=NEWEST_LOCKED))
                newest.append(
                    _LockedPhase(iteration, clock_mhz, predicted_s, duration_s, counted_s, features)
                )
        landing = self._landing.pop(kind, None)
        if landing is not None:
            # The step they showed was not confirmed: they were phases of this regime after all.
            self._locked.setdefault(kind, LockedWork()).absorb(landing)

    def add_stepped(
        self, kind: PhaseKind, duration_s: float, between_s: float, features: npt.NDArray[np.float64]
    ) -> None:
        """A locked phase that showed a workload step: its default is the old regime's guess at another
        workload, so it counts at its own time (neither banked nor owed) until :meth:`settle` hands it to
        the regime it landed in, whose predictor judges it from then on. Counted at its own time for good,
        the phases at a regime's first clock on the next regime's work read as taken at the default: on
        regimes alternating every 15 iterations the run believed itself 0.4 % faster than it was."""
        if duration_s <= 0:
            return
        self._add(duration_s, duration_s, between_s)
        self._landing.setdefault(kind, LockedWork()).add(duration_s, features)

    def add_wait(self, wait_s: float) -> None:
        """Time the iteration lasted past this session's phase (an async peer that ran longer): taken, with
        no default time of this session's to set against it."""
        if wait_s > 0 and self.actual_s > 0:
            self.actual_s += wait_s

    def _add(self, default_s: float, actual_s: float, between_s: float) -> None:
        if default_s > 0 and actual_s > 0:
            self.default_s += default_s + between_s
            self.actual_s += actual_s + between_s

    def settle(self, kind: PhaseKind, yardstick: Yardstick, *, carry_since: int | None = None) -> None:
        """``kind`` leaves its regime: its locked phases are judged once more, on ``yardstick`` (the
        predictor of the regime they ran in), and that judgement stays. Those from iteration
        ``carry_since`` on ran at a cost the yardstick no longer knew (the same work got cheaper or
        dearer before the monitor could see it): they stay to be judged on the new regime's predictor.
        Settled on the old one, a halving of generation's memory traffic counted the six committed phases
        before its verdict as 16 % faster than the default: the run believed 0.952, delivered 0.944.

        :meth:`banked_s` judges the locked phases on each kind's newest predictor; after a step that is
        another regime's, and it judged a long regime's phases on a short one's (on `short-switch-gb200`
        the run believed itself at 1.10 of the default's throughput, at 0.963, and planned 1 % under its
        threshold). Dropping the old regime's phases instead (a restart of the whole ledger at every
        re-baseline) threw away what they had banked or owed: jobs whose regimes alternate ended 1–2 %
        over their threshold.
        """
        locked = self._locked.pop(kind, None)
        carried = LockedWork()
        newest = self._newest.pop(kind, ())
        if carry_since is not None and locked is not None:
            moved = [phase for phase in newest if phase.iteration >= carry_since]
            for phase in moved:
                locked.remove(phase.predicted_s, phase.features)
                carried.add(phase.predicted_s, phase.features)
            self.actual_s += _recounted_s(moved) - sum(phase.counted_s for phase in moved)
        if locked is not None and locked.feature_sum is not None:
            judged = yardstick(kind, locked.count, locked.feature_sum)
            if judged is not None and judged > 0:
                self.default_s += judged - locked.predicted_s
        for key in [key for key in self._ratios if key[0] is kind]:
            del self._ratios[key]
        landing = self._landing.pop(kind, None)
        if landing is not None:
            # The phases that showed the step belong to the regime the kind goes to.
            carried.absorb(landing)
        if carried.count:
            self._locked[kind] = carried

    def banked_s(self, planned: float, yardstick: Yardstick | None = None) -> float:
        """The time the run is ahead of ``planned`` (negative: behind): ``default / planned - actual``.

        With a ``yardstick`` (each kind's newest predictor, summed over workloads), the locked phases' default
        time is judged again on it: a locked phase was judged on the predictor of its day, which the early
        phases — few default phases — left biased, and that bias, summed over every locked phase, is the gap
        between what the run believes it delivered and what it did.
        """
        if self.actual_s <= 0 or planned <= 0:
            return 0.0
        default_s = self.default_s
        if yardstick is not None:
            for kind, locked in self._locked.items():
                if locked.feature_sum is None:
                    continue
                judged = yardstick(kind, locked.count, locked.feature_sum)
                if judged is not None and judged > 0:
                    default_s += judged - locked.predicted_s
        return default_s / planned - self.actual_s

    def spend(
        self,
        planned: float,
        iteration_default_s: float,
        horizon: int,
        max_spend: float,
        *,
        yardstick: Yardstick | None = None,
        max_repay: float = 0.0,
    ) -> float:
        """How far below ``planned`` the next iterations may plan (a number ≤ 0).

        The time banked above ``planned`` (``default / planned - actual``), spread over ``horizon``
        iterations of ``iteration_default_s`` each: those iterations may take their default time over
        ``planned`` plus the banked time, so the run ends at ``planned`` if they do.
        """
        if self.actual_s <= 0 or iteration_default_s <= 0 or planned <= 0:
            return 0.0
        banked_s = self.banked_s(planned, yardstick)
        if banked_s <= 0 and max_repay <= 0:
            return 0.0
        ahead_s = horizon * iteration_default_s
        remaining_s = ahead_s / planned + banked_s
        if remaining_s <= 0:
            return max_repay
        effective = ahead_s / remaining_s
        return min(max_repay, max(-max_spend, effective - planned))


def _recounted_s(phases: list[_LockedPhase]) -> float:
    """The phases' time counted as they took it, each at most twice their median (one far-off phase
    moves the ledger no more than elsewhere). Counted when they ran, the median ratio of their clock's
    recent phases reached back to before the change, and their predicted defaults came from a
    predictor that was itself moving with the change (``kv-fp8-verl-h100``: 157 s, then 96 s, for phases
    of 83 s and 88 s): neither is their level."""
    if not phases:
        return 0.0
    bound = 2.0 * statistics.median(phase.duration_s for phase in phases)
    return sum(min(phase.duration_s, bound) for phase in phases)
