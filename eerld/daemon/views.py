"""The daemon's answers: frozen views for the admin RPCs, metrics and eerlctl, and the events it publishes.

Every type here is plain data built by :mod:`eerld.daemon.core`, :mod:`eerld.daemon.admin` or
:mod:`eerld.daemon.status`; none holds a reference back into the daemon, so a view can be encoded, logged
or kept after the state it describes has changed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from eerl.control.base import Decision
from eerl.directives import DirectiveVerdict
from eerl.job.admission import ReceivedDirective
from eerl.phases import ControllerState, ExecutionMode, GpuRole, PhaseKind

from eerld.clocks.arbiter import AppliedClock, ClockSource
from eerld.clocks.pins import Pin
from eerld.daemon.drains import Drain
from eerld.grants import SHARED_NAME, Grant
from eerld.sessions import JobModeSpec


@dataclass(frozen=True, slots=True)
class GpuInfoView:
    """Static facts about a GPU."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    min_sm_clock_mhz: int
    max_sm_clock_mhz: int
    supported_sm_clocks_mhz: tuple[int, ...] = ()
    """Every supported SM clock, ascending (the grid a job directive must be on); () when unknown."""


@dataclass(frozen=True, slots=True)
class GpuStatusView:
    """Everything an admin (or a metrics scrape) wants to know about one GPU now."""

    info: GpuInfoView
    sm_clock_mhz: int
    mem_clock_mhz: int
    locked_sm_clock_mhz: int | None
    would_lock_sm_clock_mhz: int | None
    source: ClockSource
    session_id: str | None
    job_id: str | None
    rank: int | None
    pin: Pin | None
    power_w: float
    power_limit_w: float
    energy_mj: float
    utilization_gpu_percent: int
    degraded_reason: str
    clock_event_reasons: tuple[str, ...]
    drain: Drain | None = None
    """The drain in force: no session may claim the GPU."""
    clock_event_mask: int | None = None
    """``clock_event_reasons`` as NVML's bitmask (as DCGM_FI_DEV_CLOCKS_EVENT_REASONS); None: unread."""


@dataclass(frozen=True, slots=True)
class PhaseStatusView:
    """A session's view of one phase kind: the controller's state and the metered totals."""

    kind: PhaseKind
    state: ControllerState
    sm_clock_mhz: int | None
    candidate_sm_clock_mhz: int | None
    phases: int
    energy_mj: float
    valid_tokens: int
    tokens: int
    duration_s: float
    energy_per_valid_token_j: float
    throughput_tokens_per_s: float
    estimated_savings_fraction: float
    exploration_cost_mj: float
    predictor_error_fraction: float


@dataclass(frozen=True, slots=True)
class SessionView:
    """One open session."""

    session_id: str
    job_id: str
    rank: int
    world_size: int
    gpu_indices: tuple[int, ...]
    mode: ExecutionMode
    role: GpuRole
    current_phase: PhaseKind | None
    iteration: int
    phases: tuple[PhaseStatusView, ...]
    opened_at_unix_s: float
    attached: bool
    lease_remaining_s: float
    throughput_threshold: float
    client_name: str
    grant: str = SHARED_NAME
    job: JobModeSpec | None = None
    """Job mode: the incarnation and node rank it was opened with; None for a session not in job mode."""
    held_since_unix_s: float | None = None
    """Between phases with its GPUs still locked at the last phase's clock: when that phase ended (wall
    clock); None during a phase, before the first, or when the GPUs are on the default governor."""
    held_sm_clock_mhz: int | None = None
    """The SM clock held between phases (with ``held_since_unix_s``)."""


@dataclass(frozen=True, slots=True)
class ClaimView:
    """An open session's claim, cheaply: whose it is and which GPUs (index, UUID) it holds."""

    session_id: str
    job_id: str
    gpus: tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True)
class DaemonView:
    """The daemon itself."""

    version: str
    backend: str
    controller: str
    dry_run: bool
    uptime_s: float
    hostname: str


@dataclass(frozen=True, slots=True)
class GrantView:
    """One worker socket: its grant, the GPUs it covers on this node and its open sessions."""

    grant: Grant
    gpus: tuple[GpuInfoView, ...]
    sessions: int


@dataclass(frozen=True, slots=True)
class StatusView:
    """The answer to Status."""

    daemon: DaemonView
    gpus: tuple[GpuStatusView, ...]
    sessions: tuple[SessionView, ...]
    grants: tuple[GrantView, ...] = ()


@dataclass(frozen=True, slots=True)
class GrantOutcome:
    """The answer to Grant."""

    grant: GrantView
    revoked: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RevokeOutcome:
    """The answer to Revoke."""

    revoked: tuple[str, ...]
    clocks: tuple[AppliedClock, ...]
    closed_session_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TicketView:
    """The answer to IssueClaimTicket."""

    ticket: str
    gpus: tuple[GpuInfoView, ...]
    expires_in_s: float


@dataclass(frozen=True, slots=True)
class DecisionView:
    """One controller decision with its session and wall-clock time."""

    session_id: str
    decision: Decision
    timestamp_unix_s: float
    directive: ReceivedDirective | None = None
    """Job mode: the directive the phase carried (None: none, or not a job-mode decision)."""
    verdict: DirectiveVerdict | None = None
    """Job mode: the daemon's verdict on it; None for the daemon's own controller's decisions."""


@dataclass(frozen=True, slots=True)
class OpenedSession:
    """The answer to OpenSession."""

    session_id: str
    lease_ttl_s: float
    gpus: tuple[GpuInfoView, ...]


@dataclass(frozen=True, slots=True)
class BeganPhase:
    """The answer to BeginPhase: the clocks read back after the decision was applied."""

    clocks: tuple[AppliedClock, ...]
    state: ControllerState
    target_sm_clock_mhz: int | None
    resynced: bool = False
    """A phase that never ended was abandoned unmetered to begin this one."""
    verdict: DirectiveVerdict = DirectiveVerdict.NOT_JOB_MODE
    """The verdict on the phase's directive (NOT_JOB_MODE for a session not in job mode)."""
    verdict_detail: str = ""
    applied_epoch: int = 0
    """Job mode: the plan epoch of the clock applied (0: the default governor)."""


@dataclass(frozen=True, slots=True)
class EndedPhase:
    """The answer to EndPhase: what the phase cost."""

    duration_s: float
    energy_mj: float
    mean_power_w: float
    state: ControllerState
    sm_clock_mhz: int | None = None
    """The SM clock target that held over the phase (None: the default governor)."""
    applied_epoch: int = 0
    verdict: DirectiveVerdict = DirectiveVerdict.NOT_JOB_MODE
    gpus: int = 0
    """How many GPUs the energy covers."""


@dataclass(frozen=True, slots=True)
class ClosedSession:
    """The answer to CloseSession: the session's totals."""

    energy_mj: float
    valid_tokens: int


@dataclass(frozen=True, slots=True)
class GpuPinView:
    """An admin pin and the index of its GPU."""

    index: int
    pin: Pin


@dataclass(frozen=True, slots=True)
class PinOutcome:
    """The answer to Pin: the clocks read back and the pins it replaced."""

    clocks: tuple[AppliedClock, ...]
    replaced: tuple[GpuPinView, ...] = ()


@dataclass(frozen=True, slots=True)
class UnpinOutcome:
    """The answer to Unpin: the clocks read back after the change, the pins removed, the GPUs unpinned."""

    clocks: tuple[AppliedClock, ...]
    removed: tuple[GpuPinView, ...]
    not_pinned: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DrainOutcome:
    """The answer to Drain."""

    gpu_indices: tuple[int, ...]
    clocks: tuple[AppliedClock, ...]
    closed_session_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class UndrainOutcome:
    """The answer to Undrain."""

    undrained: tuple[int, ...]
    not_drained: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ResetOutcome:
    """The answer to ResetAll."""

    clocks: tuple[AppliedClock, ...]
    closed_session_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PhaseRecord:
    """A metered phase, published to the daemon's phase subscribers (metrics)."""

    session_id: str
    job_id: str
    rank: int
    kind: PhaseKind
    iteration: int
    duration_s: float
    energy_mj: float
    tokens: int
    valid_tokens: int
    sm_clock_mhz: int | None
    gpu_indices: tuple[int, ...]
    state: ControllerState


@dataclass(frozen=True, slots=True)
class DirectiveRecord:
    """A judged job directive (or its absence), published to the daemon's directive subscribers."""

    job_id: str
    node_rank: int
    kind: PhaseKind
    iteration: int
    verdict: DirectiveVerdict
    sm_clock_mhz: int | None
    """The clock the phase runs at (the directive's when accepted, else the fallback's)."""


RpcObserver = Callable[[str, str, float], None]
"""Called after every RPC with (method, status code name, duration_s)."""
PhaseObserver = Callable[[PhaseRecord], None]
"""Called after every metered phase."""
DirectiveObserver = Callable[[DirectiveRecord], None]
"""Called after every job-mode BeginPhase, with the verdict on its directive."""
Unsubscribe = Callable[[], None]
"""Ends a subscription (:meth:`eerld.daemon.Daemon.subscribe`); idempotent."""

__all__ = [
    "BeganPhase",
    "ClosedSession",
    "DaemonView",
    "DecisionView",
    "DirectiveObserver",
    "DirectiveRecord",
    "DrainOutcome",
    "EndedPhase",
    "GpuInfoView",
    "GpuPinView",
    "GpuStatusView",
    "GrantOutcome",
    "GrantView",
    "OpenedSession",
    "PhaseObserver",
    "PhaseRecord",
    "PhaseStatusView",
    "PinOutcome",
    "ResetOutcome",
    "RevokeOutcome",
    "RpcObserver",
    "SessionView",
    "StatusView",
    "TicketView",
    "UndrainOutcome",
    "UnpinOutcome",
    "Unsubscribe",
]
