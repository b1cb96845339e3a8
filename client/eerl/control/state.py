"""What the EE-RL controller knows about one phase kind: a few small records, each owned by one part.

A :class:`KindTrack` holds the kind's state in the state machine, its committed and candidate clocks, the
clock curve every part reads, and one record per part:

* :class:`BaselineState` — :mod:`eerl.control.baseline`: the predictor of the default governor's cost, the
  typical default cost of a phase (the budget's weights) and a pending re-baseline;
* :class:`SearchState` — :mod:`eerl.control.search`: the coarse trials still to run, the exploration
  bounds (a failed trial's floor, a re-tune's window) and the search's epoch;
* :class:`MonitorState` — :mod:`eerl.control.monitor`: the committed phases' cadence (control phases,
  refines) and the recent ratios and workload shifts drift is judged on;
* :class:`Ledger` — the energy accounting the snapshot reports.

The controller-wide records are :class:`RefinePace` (:mod:`eerl.control.retune`) and the async peer's
durations (:class:`eerl.control.slack.PeerSlack`). Everything here is plain data: the parts change it.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np

from eerl.control.base import Decision
from eerl.control.curve import ClockCurve
from eerl.control.predictor import BaselinePredictor
from eerl.control.regimes import RegimeMemory
from eerl.phases import ControllerState, PhaseKind, savings_fraction

SEARCHING = (ControllerState.EXPLORING, ControllerState.RETUNING)
"""The states in which a kind's clock is being searched for."""


@dataclass(slots=True)
class BaselineState:
    """The default governor's cost of this kind: its predictor and its typical phase (the budget's weight)."""

    predictor: BaselinePredictor
    default_duration_s: float = 0.0
    default_energy_j: float = 0.0
    rebaseline_left: int = 0
    """Default phases still to run before a re-tune starts from a fresh baseline (0: none pending)."""
    rebaseline_length: int = 0
    """Default phases the latest re-baseline runs in all (the new regime's own samples)."""
    rebaseline_same_work: bool = False
    """The pending re-baseline answers a change in what the same work costs (ratios, control phases), not
    in the work: every older default phase goes, however alike its workload."""
    changed_since_iteration: int | None = None
    """A same-work re-baseline's estimate of where the cost changed: the locked phases from then on are
    judged on the new yardstick, not settled on the old (None: every phase so far belongs to the old)."""
    rebaseline_errors_mark: int | None = None
    """The predictor's error count when the pending re-baseline began: the errors after it are the step's
    (:meth:`~eerl.control.predictor.BaselinePredictor.drop_errors_since` at its end)."""
    last_default_iteration: int = 0
    check_pending: bool = False
    """A measured miss waits for one default phase: the yardstick is re-checked before the clock is blamed."""


@dataclass(slots=True)
class SearchState:
    """Where the search for this kind's clock stands."""

    coarse: list[int] = field(default_factory=list)
    """Trials to run before the model-based search (the coarse descent, or a re-tune's centre and edges)."""
    coarse_stopped: bool = False
    min_energy_ratio: float = np.inf
    """The lowest energy ratio of the coarse descent so far (it stops once past the minimum)."""
    energy_recheck: tuple[int, float] | None = None
    """A coarse trial that looked past the energy minimum, (clock, energy ratio), waiting for its repeat."""
    floor_mhz: int = 0
    """Clocks below this failed the threshold at iteration level: search above it."""
    floor_iteration: int = 0
    window: tuple[int, int] | None = None
    """A local re-tune searches only this clock range."""
    epoch_iteration: int = 0
    """Trials from this iteration on count towards a commit."""
    trials_in_search: int = 0
    step_sign: int = 0
    """The sign of the previous locked phase's workload shift when it lay beyond the step band (0: it did
    not): a step is confirmed by the next phase, one odd batch is not."""


@dataclass(slots=True)
class MonitorState:
    """A committed kind's cadence and the recent evidence drift is judged on."""

    since_control: int = 0
    """Committed phases since the last control phase (default governor, to re-validate the predictor)."""
    control_miss_sign: int = 0
    """The sign of an unconfirmed control-phase miss (0: none)."""
    since_refine: int = 0
    since_probe: int = 0
    """Committed phases since the last probe a fine step below the committed clock."""
    recent_time: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    recent_energy: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    recent_iteration: deque[int] = field(default_factory=lambda: deque(maxlen=64))
    """The iteration of each of ``recent_time``'s phases (-1: not known)."""
    recent_shift: dict[int, deque[float]] = field(default_factory=dict)
    """Per watched workload feature (index into :func:`workload_features`), its recent relative shifts."""
    recent_watched: deque[tuple[float, ...]] = field(default_factory=lambda: deque(maxlen=8))
    """The newest phases' watched features themselves (a step's signature: where the workload went)."""


@dataclass(slots=True)
class Ledger:
    """Energy accounting of one kind, for the snapshot."""

    phases: int = 0
    exploration_cost_j: float = 0.0
    """Energy of trials that missed the threshold."""
    savings_j: float = 0.0
    predicted_energy_j: float = 0.0
    """The default-equivalent energy of every phase so far (what savings are a fraction of)."""
    default_s: float = 0.0
    """The default-equivalent time of every phase so far (the report's throughput; no decision uses it)."""
    actual_s: float = 0.0
    """The time those phases took."""

    def add_default(self, energy_j: float, duration_s: float = 0.0) -> None:
        """A default-governor phase saves nothing by definition; its energy and time count in the totals."""
        self.predicted_energy_j += energy_j
        self.default_s += duration_s
        self.actual_s += duration_s

    def add_trial(
        self, predicted_energy_j: float, energy_j: float, predicted_s: float = 0.0, duration_s: float = 0.0
    ) -> None:
        """A locked phase saves the predicted default energy minus what it measured."""
        self.predicted_energy_j += predicted_energy_j
        self.savings_j += predicted_energy_j - energy_j
        self.default_s += predicted_s
        self.actual_s += duration_s

    def add_missed_trial(self, energy_j: float) -> None:
        """A search trial slower than the threshold allows: its whole energy is exploration cost."""
        self.exploration_cost_j += energy_j

    @property
    def savings_fraction(self) -> float:
        """Estimated savings over the default-equivalent energy (0 before any phase)."""
        return savings_fraction(self.savings_j, self.predicted_energy_j)


@dataclass(slots=True)
class KindTrack:
    """Everything the controller knows about one phase kind, as the records of its parts."""

    kind: PhaseKind
    curve: ClockCurve
    """Trials of this kind: time and energy ratio versus clock (read by the search, commit and refine)."""
    baseline: BaselineState
    search: SearchState = field(default_factory=SearchState)
    monitor: MonitorState = field(default_factory=MonitorState)
    ledger: Ledger = field(default_factory=Ledger)
    regimes: RegimeMemory = field(default_factory=RegimeMemory)
    """The workload regimes this kind has left, kept for when one returns."""
    state: ControllerState = ControllerState.BASELINE
    committed_mhz: int | None = None
    """The committed clock (None: committed to the default governor, or nothing committed yet)."""
    committed_ratios: tuple[float, float] = (1.0, 1.0)
    """The committed clock's measured (time, energy) ratios when it was committed."""
    candidate_mhz: int | None = None
    """The clock of the latest decision."""
    last_decision: Decision | None = None

    @property
    def searching(self) -> bool:
        """Exploring or re-tuning."""
        return self.state in SEARCHING

    @property
    def relearning(self) -> bool:
        """Running default phases to (re-)learn the baseline."""
        return self.state is ControllerState.BASELINE or self.baseline.rebaseline_left > 0


@dataclass(slots=True)
class RefinePace:
    """How often committed allocations are re-checked: backs off while refines gain nothing."""

    backoff: int = 1
    """The refine interval's multiplier."""
    from_energy: float | None = None
    """The energy ratio an energy-driven re-tune left; judged when the re-tune commits."""
    committed_throughput: float | None = None
    """The throughput ratio the latest commit expected: the plan's threshold then (see
    :func:`eerl.control.retune.refine_interval`)."""


def new_track(
    kind: PhaseKind, predictor_window: int, bandwidth_mhz: float, top_mhz: float | None = None
) -> KindTrack:
    """A kind's track before its first phase: a fresh predictor and a curve judged against it (read
    through the physics-shaped fit when ``top_mhz`` is given)."""
    predictor = BaselinePredictor(kind, window=predictor_window)
    curve = ClockCurve(predictor.predict_many, bandwidth_mhz, top_mhz=top_mhz)
    return KindTrack(kind, curve, BaselineState(predictor))
