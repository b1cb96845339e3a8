"""The daemon's domain: the hub that sequences each event through sessions, energy, control and clocks.

One module per job:

- :mod:`~eerld.daemon.core`: :class:`Daemon`, the hub — life cycle (start, tick, shutdown), sessions and
  phases, subscriptions (:meth:`Daemon.subscribe`); every RPC of both services is one of its methods;
- :mod:`~eerld.daemon.admin`: pins, drains, resets and grants (what the admin socket changes);
- :mod:`~eerld.daemon.drains`: the GPUs drained of new claims;
- :mod:`~eerld.daemon.timebase`: the wall-clock times of phase-clock readings (decisions in UTC);
- :mod:`~eerld.daemon.status`: the read model behind Status, ListSessions, GetDecisions and metrics;
- :mod:`~eerld.daemon.inventory`: the node's GPUs, selectors → indices, supported clocks per GPU;
- :mod:`~eerld.daemon.jobmode`: job mode — what the daemon remembers per job and session (the checks on a
  job-level controller's directives and the fallback are the pure :mod:`eerl.job.admission`);
- :mod:`~eerld.daemon.views`: the frozen answers and the events it publishes.

Nothing here imports gRPC (:mod:`eerld.api` serves it) or builds a backend (:mod:`eerld.app` does).
"""

from eerld.daemon.core import Attachment, Daemon
from eerld.daemon.views import (
    BeganPhase,
    ClaimView,
    ClosedSession,
    DaemonView,
    DecisionView,
    DirectiveObserver,
    DirectiveRecord,
    DrainOutcome,
    EndedPhase,
    GpuInfoView,
    GpuPinView,
    GpuStatusView,
    GrantOutcome,
    GrantView,
    OpenedSession,
    PhaseObserver,
    PhaseRecord,
    PhaseStatusView,
    PinOutcome,
    ResetOutcome,
    RevokeOutcome,
    RpcObserver,
    SessionView,
    StatusView,
    TicketView,
    UndrainOutcome,
    UnpinOutcome,
    Unsubscribe,
)

__all__ = [
    "Attachment",
    "BeganPhase",
    "ClaimView",
    "ClosedSession",
    "Daemon",
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
