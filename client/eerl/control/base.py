"""The controller interface shared by the daemon (real time), the benchmark (virtual time) and RL jobs.

A controller is pure: it never sleeps, reads a clock, or touches a GPU. Time comes in as ``now_s``
(seconds on any monotonic scale the driver chooses) and decisions go out as values. The daemon creates
one controller per session; the bench drives the very same classes in virtual time.

Flow for every phase::

    decision = controller.decide(kind, iteration, hints, now_s)   # before the phase: which clock
    ... the phase runs at decision.sm_clock_mhz (None: default governor) ...
    controller.observe(observation, now_s)                          # after: what it cost

In async mode a session runs one phase kind only; the daemon (or the bench) also feeds it the
observations of its peer pool (the other phase kind of the same job) so that it can see its slack.
A controller ignores observations it cannot use; it never decides for a kind it was not given.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from eerl.phases import ControllerState, ExecutionMode, PhaseKind, Workload


@dataclass(frozen=True, slots=True)
class PhaseObservation:
    """One metered phase: its workload, how long it took and the energy of its GPUs (idle waits included)."""

    kind: PhaseKind
    iteration: int
    workload: Workload
    duration_s: float
    energy_j: float
    sm_clock_mhz: int | None
    """The lock that held during the phase; None for the default governor."""
    gpus: int
    end_time_s: float
    gap_before_s: float = 0.0
    """Time from the end of the session's previous phase to this phase's begin (0 for its first): the work
    between the phases, which runs at the default governor (the lock ends with its phase)."""


@dataclass(frozen=True, slots=True)
class Decision:
    """A controller's choice for one phase (or its verdict after an observation)."""

    kind: PhaseKind
    iteration: int
    sm_clock_mhz: int | None
    """None means the default governor (no lock)."""
    state: ControllerState
    reason: str
    time_s: float
    throughput_ratio: float | None = None
    """Measured throughput over the predicted default's, when an observation was judged."""
    energy_ratio: float | None = None
    """Measured energy over the predicted default's, when an observation was judged."""


@dataclass(frozen=True, slots=True)
class PhaseSnapshot:
    """The controller's current view of one phase kind, for Status and metrics."""

    kind: PhaseKind
    state: ControllerState
    sm_clock_mhz: int | None
    candidate_sm_clock_mhz: int | None = None
    phases: int = 0
    estimated_savings_fraction: float = 0.0
    """The controller's estimate of the energy saved so far (:func:`eerl.phases.savings_fraction`)."""
    exploration_cost_j: float = 0.0
    predictor_error_fraction: float = 0.0
    default_energy_j: float = 0.0
    """What the judged phases would have used on the default governor (predicted for a locked one)."""
    default_s: float = 0.0
    """What they would have taken on the default governor (predicted for a locked one)."""
    actual_s: float = 0.0
    """What they took: ``default_s / actual_s`` is the throughput against the predicted default."""


@dataclass(frozen=True, slots=True)
class ControllerSettings:
    """What a controller is told when a session opens."""

    supported_sm_clocks_mhz: tuple[int, ...]
    """Ascending; a controller only ever proposes one of these (or None)."""
    kinds: tuple[PhaseKind, ...] = (PhaseKind.GENERATION, PhaseKind.TRAINING)
    """The phase kinds this session runs (and the controller decides for)."""
    mode: ExecutionMode = ExecutionMode.SYNC
    throughput_threshold: float = 0.95
    fixed_clocks_mhz: dict[PhaseKind, int] = field(default_factory=dict)
    """For the ``fixed`` controller: the clock per phase kind."""


class Controller(Protocol):
    """Per-session clock controller; see the module docstring for the call order."""

    def decide(self, kind: PhaseKind, iteration: int, hints: Workload | None, now_s: float) -> Decision:
        """The clock for the phase about to begin."""
        ...

    def observe(self, observation: PhaseObservation, now_s: float) -> Decision | None:
        """Take a metered phase into account; return the verdict when the observation changed something."""
        ...

    def snapshot(self) -> Sequence[PhaseSnapshot]:
        """Current view per phase kind this controller decides for."""
        ...

    def state_of(self, kind: PhaseKind) -> ControllerState | None:
        """The state of one phase kind (None: not one it decides for); what EndPhase returns, so cheap."""
        ...

    def decisions(self) -> Sequence[Decision]:
        """History, oldest first (bounded; old entries may be dropped)."""
        ...


ControllerFactory = Callable[[ControllerSettings], Controller]
