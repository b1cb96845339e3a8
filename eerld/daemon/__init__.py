"""The daemon's domain: the hub that builds the components each event goes through, and the components.

One module per job:

- :mod:`~eerld.daemon.core`: :class:`Daemon`, the hub — builds the components and exposes them
  (``book``, ``phases``, ``admin``, ``reads``, ``events``, ``access``); its own methods are the life cycle
  that spans them (start, the reaper's tick, shutdown);
- :mod:`~eerld.daemon.book`: the session book — open, claim, attach, renew and close sessions, tell their
  attached clients, forget a tenancy's job incarnations;
- :mod:`~eerld.daemon.phases`: the phase path — BeginPhase (the session's controller, or job mode's
  ruling) and EndPhase (meter, release, account, feed the controller, tell peers and observers);
- :mod:`~eerld.daemon.events`: subscribe to and publish RPC, phase and directive events;
- :mod:`~eerld.daemon.lifecycle`: running or stopping, and the reaper thread;
- :mod:`~eerld.daemon.gate`: the claim gate — the drains in force, ordered against the claims in flight;
- :mod:`~eerld.daemon.admin`: pins, drains, resets and grants (what the admin socket changes);
- :mod:`~eerld.daemon.drains`: what a drain is;
- :mod:`~eerld.daemon.timebase`: the wall-clock times of phase-clock readings (decisions in UTC);
- :mod:`~eerld.daemon.status`: the read model behind Status, ListSessions, GetDecisions and metrics;
- :mod:`~eerld.daemon.inventory`: the node's GPUs, selectors → indices, supported clocks per GPU;
- :mod:`~eerld.daemon.jobmode`: job mode — what the daemon remembers per job and session (the checks on a
  job-level controller's directives and the fallback are the pure :mod:`eerl.job.admission`);
- :mod:`~eerld.daemon.views`: the frozen answers and the events it publishes.

Nothing here imports gRPC (:mod:`eerld.api` serves it) or builds a backend (:mod:`eerld.app` does).
"""

from eerld.daemon.book import Attachment
from eerld.daemon.core import Daemon
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
