"""The status read model: what Status, ListSessions, ListGrants, GetDecisions and a metrics scrape see.

It only reads — the backend's live readings, the arbiter's view of each GPU, the open sessions and their
controllers, the grants — and answers with the frozen views of :mod:`eerld.daemon.views`. A failed GPU
read shows as zero with a reason; a controller that raises shows no snapshot; neither fails the answer.
The one thing it keeps is the decision history of the last closed sessions, which the session book hands
it when a session closes (:meth:`StatusReader.record_closed`).
"""

from __future__ import annotations

import socket
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import structlog
from eerl.control.base import Decision, PhaseSnapshot
from eerl.directives import DirectiveVerdict
from eerl.job.admission import ReceivedDirective
from eerl.phases import ControllerState, PhaseKind

from eerld.access import Access
from eerld.clocks.arbiter import ClockArbiter
from eerld.daemon.gate import ClaimGate
from eerld.daemon.inventory import Inventory
from eerld.daemon.jobmode import JobDecision, JobSessions, JobState
from eerld.daemon.timebase import PhaseTimebase
from eerld.daemon.views import (
    DaemonView,
    DecisionView,
    GpuStatusView,
    GrantView,
    PhaseStatusView,
    SessionView,
    StatusView,
)
from eerld.errors import GpuError, NotFound
from eerld.gpu.base import ClockEventReasons, GpuBackend, GpuClocks, GpuUtilization
from eerld.grants import Grant
from eerld.sessions import HeldSession, SessionRegistry, short_id

log = structlog.get_logger("eerld.daemon")
_T = TypeVar("_T")
_Entry = tuple[Decision, ReceivedDirective | None, DirectiveVerdict | None]
"""A decision with, for a job-mode phase, its directive and verdict."""

VERSION = "0.1.0"
DEFAULT_DECISIONS_LIMIT = 1000
CLOSED_SESSIONS_KEPT = 64


class StatusReader:
    """Builds the read-side views of one daemon from the state it shares with it (never changes it)."""

    def __init__(
        self,
        backend: GpuBackend,
        inventory: Inventory,
        arbiter: ClockArbiter,
        sessions: SessionRegistry,
        access: Access,
        *,
        jobs: JobSessions,
        controller_name: str,
        clock: Callable[[], float],
        started_s: float,
        timebase: PhaseTimebase,
        drains: ClaimGate,
    ) -> None:
        """``timebase`` turns the phase-clock times of decisions into wall-clock times; ``drains`` says
        which drain is in force on a GPU."""
        self._backend = backend
        self._inventory = inventory
        self._arbiter = arbiter
        self._sessions = sessions
        self._access = access
        self._jobs = jobs
        self._controller_name = controller_name
        self._clock = clock
        self._started_s = started_s
        self._timebase = timebase
        self._drains = drains
        self._closed_decisions: deque[tuple[str, tuple[_Entry, ...]]] = deque(maxlen=CLOSED_SESSIONS_KEPT)

    def record_closed(self, session: HeldSession, job: JobState | None = None) -> None:
        """Keep a closing session's decisions for GetDecisions (the newest sessions only)."""
        self._closed_decisions.append((session.session_id, self._history(session, job)))

    def _history(self, session: HeldSession, job: JobState | None) -> tuple[_Entry, ...]:
        if job is not None:
            return tuple(_job_entry(d) for d in job.history())
        pinned: tuple[_Entry, ...] = tuple((d, None, None) for d in session.pin_decisions)
        try:
            return tuple((d, None, None) for d in session.controller.decisions()) + pinned
        except Exception:
            log.exception("controller_error", session_id=short_id(session.session_id))
            return pinned

    def daemon_info(self) -> DaemonView:
        """Version, backend, controller, mode and uptime."""
        return DaemonView(
            version=VERSION,
            backend=self._backend.name,
            controller=self._controller_name,
            dry_run=self._arbiter.dry_run,
            uptime_s=self._clock() - self._started_s,
            hostname=socket.gethostname(),
        )

    def gpu_status(self) -> tuple[GpuStatusView, ...]:
        """Every GPU of the node now (reads the backend; a failed read shows as zero and a reason)."""
        return tuple(self._gpu_status(index) for index in self._inventory.indices)

    def _gpu_status(self, index: int) -> GpuStatusView:
        view = self._arbiter.view(index)
        holder = self._sessions.holder(index)
        problems: list[str] = []

        def read(fn: Callable[[int], _T], default: _T) -> _T:
            try:
                return fn(index)
            except GpuError as e:
                problems.append(f"{type(e).__name__}: {e}")
                return default

        clocks: GpuClocks | None = read(self._backend.clocks, None)
        util: GpuUtilization | None = read(self._backend.utilization, None)
        reasons: ClockEventReasons | None = read(self._backend.clock_event_reasons, None)
        power_w = read(self._backend.power_w, 0.0)
        power_limit_w = read(self._backend.power_limit_w, 0.0)
        energy_mj = float(read(self._backend.total_energy_mj, 0))
        degraded = view.degraded_reason or (problems[0] if problems else "")  # after every read
        return GpuStatusView(
            info=self._inventory.info(index),
            sm_clock_mhz=clocks.sm_clock_mhz if clocks is not None else 0,
            mem_clock_mhz=clocks.mem_clock_mhz if clocks is not None else 0,
            locked_sm_clock_mhz=view.locked_sm_clock_mhz,
            would_lock_sm_clock_mhz=view.would_lock_sm_clock_mhz,
            source=view.source,
            session_id=holder.session_id if holder else None,
            job_id=holder.spec.job_id if holder else None,
            rank=holder.spec.rank if holder else None,
            pin=view.pin,
            power_w=power_w,
            power_limit_w=power_limit_w,
            energy_mj=energy_mj,
            utilization_gpu_percent=util.gpu_percent if util is not None else 0,
            degraded_reason=degraded,
            clock_event_reasons=tuple(reasons.names()) if reasons is not None else (),
            drain=self._drains.drain_of(index),
            clock_event_mask=reasons.value if reasons is not None else None,
        )

    def sessions(self) -> tuple[SessionView, ...]:
        """Every open session with its per-phase view."""
        return tuple(self._session_view(s) for s in self._sessions.all())

    def _session_view(self, session: HeldSession) -> SessionView:
        now_s = self._clock()
        job = self._jobs.get(session.session_id)
        # job mode: the session's own controller is off; the last ruling is its view of each kind
        snaps = {s.kind: s for s in _snapshots(session)} if job is None else {}
        phases: list[PhaseStatusView] = []
        for kind in session.kinds:
            totals = session.totals[kind]
            snap = snaps.get(kind)
            last = session.last_decision.get(kind)
            state = snap.state if snap else (last.state if last else ControllerState.OFF)
            if last is not None and last.state is ControllerState.PINNED:  # eerld decided, not the controller
                state = ControllerState.PINNED
            phases.append(
                PhaseStatusView(
                    kind=kind,
                    state=state,
                    sm_clock_mhz=snap.sm_clock_mhz if snap else (last.sm_clock_mhz if last else None),
                    candidate_sm_clock_mhz=snap.candidate_sm_clock_mhz if snap else None,
                    phases=totals.phases,
                    energy_mj=totals.energy_mj,
                    valid_tokens=totals.valid_tokens,
                    tokens=totals.tokens,
                    duration_s=totals.duration_s,
                    energy_per_valid_token_j=totals.energy_per_valid_token_j(),
                    throughput_tokens_per_s=totals.throughput_tokens_per_s(),
                    estimated_savings_fraction=snap.estimated_savings_fraction if snap else 0.0,
                    exploration_cost_mj=snap.exploration_cost_j * 1000.0 if snap else 0.0,
                    predictor_error_fraction=snap.predictor_error_fraction if snap else 0.0,
                )
            )
        active = session.active
        held_since, held_mhz = None, None
        if active is None and session.held_since_unix_s is not None and session.gpu_indices:
            view = self._arbiter.view(session.gpu_indices[0])
            # The lock ended with the phase; one still in place is a release that failed (the GPU is
            # degraded and retried). A pin's lock is the pin's, not the session's.
            if view.pin is None:
                held_mhz = view.locked_sm_clock_mhz or view.would_lock_sm_clock_mhz
            held_since = session.held_since_unix_s if held_mhz is not None else None
        return SessionView(
            session_id=session.session_id,
            job_id=session.spec.job_id,
            rank=session.spec.rank,
            world_size=session.spec.world_size,
            gpu_indices=session.gpu_indices,
            mode=session.spec.mode,
            role=session.spec.role,
            current_phase=active.kind if active else None,
            iteration=session.last_iteration or 0,
            phases=tuple(phases),
            opened_at_unix_s=session.opened_at_unix_s,
            attached=session.attached,
            lease_remaining_s=session.lease_remaining_s(now_s),
            throughput_threshold=session.throughput_threshold,
            client_name=session.spec.client_name,
            grant=session.grant,
            job=session.spec.job,
            held_since_unix_s=held_since,
            held_sm_clock_mhz=held_mhz,
        )

    def grants(self) -> tuple[GrantView, ...]:
        """Every worker socket with its GPUs and open sessions."""
        return tuple(self.grant_view(g) for g in self._access.all())

    def grant_view(self, grant: Grant) -> GrantView:
        """One worker socket: its grant, its GPUs on this node, how many sessions it has open."""
        return grant_view(grant, self._inventory, self._access, self._sessions)

    def status(self) -> StatusView:
        """The whole node: daemon, GPUs, sessions, grants."""
        return StatusView(self.daemon_info(), self.gpu_status(), self.sessions(), self.grants())

    def decisions(
        self,
        session_id: str | None = None,
        kind: PhaseKind | None = None,
        limit: int = DEFAULT_DECISIONS_LIMIT,
    ) -> tuple[DecisionView, ...]:
        """Controller decisions, oldest first, the newest ``limit``; NotFound for an unknown session."""
        histories: list[tuple[str, Sequence[_Entry]]] = list(self._closed_decisions)
        for session in self._sessions.all():
            histories.append((session.session_id, self._history(session, self._jobs.get(session.session_id))))
        if session_id is not None:
            histories = [h for h in histories if h[0] == session_id]
            if not histories:
                raise NotFound("session_id: no session with this id")
        views = [
            DecisionView(sid, d, self._timebase.to_unix_s(d.time_s), directive, verdict)
            for sid, history in histories
            for d, directive, verdict in history
            if kind is None or d.kind == kind
        ]
        views.sort(key=lambda v: v.timestamp_unix_s)
        return tuple(views[-limit:]) if limit > 0 else ()


class GrantedSessions(Protocol):
    """Who has sessions open through a grant (the registry, or the session book)."""

    def of_grants(self, names: set[str]) -> list[HeldSession]:
        """The open sessions whose authority came from these grants."""
        ...


def grant_view(grant: Grant, inventory: Inventory, access: Access, sessions: GrantedSessions) -> GrantView:
    """One worker socket: its grant, its GPUs on this node, how many sessions it has open."""
    opened = len(sessions.of_grants({grant.name}))
    return GrantView(grant, tuple(inventory.info(i) for i in access.indices(grant)), opened)


def _job_entry(record: JobDecision) -> _Entry:
    return record.decision, record.directive, record.verdict


def _snapshots(session: HeldSession) -> Sequence[PhaseSnapshot]:
    try:
        return session.controller.snapshot()
    except Exception:
        log.exception("controller_error", session_id=short_id(session.session_id))
        return ()


__all__ = [
    "CLOSED_SESSIONS_KEPT",
    "DEFAULT_DECISIONS_LIMIT",
    "VERSION",
    "GrantedSessions",
    "StatusReader",
    "grant_view",
]
