"""The session's throughput so far: what earlier phases left unused, for the plan to spend.

A job is judged on its throughput over the run, not iteration by iteration, and an allocation planned at
the threshold delivers more than it: default-governor phases (the baseline, control phases, a
re-baseline) run at full speed, and the clock grid is coarse, so the committed allocation sits somewhat
above its plan. Measured on ``drift-h100`` seed 1, the run delivered 0.9585 of the default's throughput
while every plan aimed at 0.956; throughput left unused is energy left unsaved (there, about a point of
capture for every 0.001). This ledger sums, since the session began (or its latest regime), the default
time of every phase — measured for a default-governor phase, predicted for a locked one — and the time
the phases took, the work between them on both sides. What it banks above the planned threshold, the
plan may spend over the next ``horizon`` iterations (never more than ``max_spend`` below its threshold,
and never the other way: a session behind its plan is the search's cost, not a debt later iterations pay).
An async pool alone in its session keeps its own: its phases against their default, no gaps (a pool's gap
is waiting for its peer, not work). The pool that gates the iteration banks and spends; the waiting one
runs slower than its default by design, so it banks nothing and its plan stays its own.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

from eerl.phases import PhaseKind

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
    actual_s: float = 0.0
    _ratios: dict[tuple[PhaseKind, int], deque[float]] = field(default_factory=dict)

    def add_default(self, predicted_s: float, between_s: float) -> None:
        """A default-governor phase (its predicted default time: an outlier is the predictor's business)."""
        self._add(predicted_s, predicted_s, between_s)

    def add_locked(
        self, kind: PhaseKind, clock_mhz: int, predicted_s: float, duration_s: float, between_s: float
    ) -> None:
        """A phase locked at ``clock_mhz`` that took ``duration_s`` where the default would take
        ``predicted_s``."""
        if predicted_s <= 0 or duration_s <= 0:
            return
        recent = self._ratios.setdefault((kind, clock_mhz), deque(maxlen=RECENT_AT_CLOCK))
        recent.append(duration_s / predicted_s)
        self._add(predicted_s, predicted_s * statistics.median(recent), between_s)

    def _add(self, default_s: float, actual_s: float, between_s: float) -> None:
        if default_s > 0 and actual_s > 0:
            self.default_s += default_s + between_s
            self.actual_s += actual_s + between_s

    def restart(self) -> None:
        """A new regime (a re-baseline): the old regime's phases were judged on a predictor now gone."""
        self.default_s = self.actual_s = 0.0
        self._ratios.clear()

    def spend(self, planned: float, iteration_default_s: float, horizon: int, max_spend: float) -> float:
        """How far below ``planned`` the next iterations may plan (a number ≤ 0).

        The time banked above ``planned`` (``default / planned - actual``), spread over ``horizon``
        iterations of ``iteration_default_s`` each: those iterations may take their default time over
        ``planned`` plus the banked time, so the run ends at ``planned`` if they do.
        """
        if self.actual_s <= 0 or iteration_default_s <= 0 or planned <= 0:
            return 0.0
        banked_s = self.default_s / planned - self.actual_s
        if banked_s <= 0:
            return 0.0
        ahead_s = horizon * iteration_default_s
        effective = ahead_s / (ahead_s / planned + banked_s)
        return max(-max_spend, effective - planned)
