"""The session book: open, claim, attach, renew and close sessions, and tell their attached clients.

Every session enters through :meth:`SessionBook.open_session` — checked against job mode's admission
(allowed on this node; an incarnation not older than the newest seen for the job on this socket), the
caller's authority (:class:`~eerld.access.Access`), the drains (:class:`~eerld.daemon.gate.ClaimGate`) —
and leaves through :meth:`SessionBook.close`: its GPUs are reset *before* the session is forgotten (a
watcher that sees the session gone sees its GPUs at default), its Attach stream is ended and its decisions
go to the read model's archive. A session whose tenancy ended (:meth:`SessionBook.end_session`) or whose
grants were removed (:meth:`SessionBook.forget_tenants`) also has its socket's job incarnations forgotten:
the next tenant of a socket is another job.

The admin depends on the book's narrow side (:class:`Holders`: the holder of a GPU, the sessions of
grants, notify, close, forget tenants) and calls nothing else back.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

import structlog
from eerl.control.base import ControllerFactory, ControllerSettings
from eerl.control.simple import create_off_controller
from eerl.errors import ValidationError as ControllerSettingsError
from eerl.job.admission import JobPolicy, refuse_session
from eerl.phases import PhaseKind
from eerl.reports import SessionReport

from eerld.access import Access, Authorization
from eerld.clocks.arbiter import ClockArbiter
from eerld.daemon.gate import ClaimGate
from eerld.daemon.inventory import Inventory
from eerld.daemon.jobmode import IncarnationBook, JobSessions, JobState
from eerld.daemon.lifecycle import LifeCycle
from eerld.daemon.reports import report_of
from eerld.daemon.views import ClaimView, ClosedSession, GpuInfoView, OpenedSession
from eerld.errors import Conflict, NotFound, ValidationError
from eerld.grants import SHARED_NAME
from eerld.sessions import DEFAULT_MAX_LEASE_TTL_S, HeldSession, SessionRegistry, SessionSpec, short_id

log = structlog.get_logger("eerld.daemon")

DEFAULT_LEASE_TTL_S = 10.0
DEFAULT_THROUGHPUT_THRESHOLD = 0.95


class Attachment:
    """An Attach stream's handle: events for the client and a flag set when the session ends."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.events: queue.Queue[tuple[float, str]] = queue.Queue(maxsize=256)
        self.ended = threading.Event()

    def push(self, timestamp_unix_s: float, message: str) -> None:
        """Queue an event for the client (dropped when the client does not read)."""
        with contextlib.suppress(queue.Full):
            self.events.put_nowait((timestamp_unix_s, message))


class ClosedArchive(Protocol):
    """Where a closing session's decisions go (the read model, :class:`eerld.daemon.status.StatusReader`)."""

    def record_closed(self, session: HeldSession, job: JobState | None = None) -> None:
        """Keep a closing session's decisions."""
        ...


class ReportSink(Protocol):
    """Where a finished session's report goes (:class:`eerld.daemon.reports.ReportStore`)."""

    def record(self, report: SessionReport) -> None:
        """Keep a finished session's report."""
        ...


class Holders(Protocol):
    """What the admin needs of the session book: who holds a GPU, and closing those sessions."""

    def holder(self, index: int) -> HeldSession | None:
        """The open session holding the GPU at ``index``, if any."""
        ...

    def of_grants(self, names: set[str]) -> list[HeldSession]:
        """The open sessions whose authority came from these grants."""
        ...

    def notify(self, indices: Sequence[int], message: str) -> None:
        """Tell the attached client of each session holding one of the GPUs (once per session)."""
        ...

    def close(self, session: HeldSession, reason: str, *, reset: bool = True) -> ClosedSession:
        """Close a session and (with ``reset``) return its GPUs to default."""
        ...

    def forget_tenants(self, sockets: set[str]) -> None:
        """Forget the job incarnations seen on these sockets (the next tenant is another job)."""
        ...


class SessionBook:
    """The open sessions: their claims, leases, Attach streams and job-mode incarnations."""

    def __init__(
        self,
        registry: SessionRegistry,
        inventory: Inventory,
        arbiter: ClockArbiter,
        access: Access,
        gate: ClaimGate,
        *,
        life: LifeCycle,
        archive: ClosedArchive,
        reports: ReportSink | None = None,
        controller_factory: ControllerFactory,
        fixed_clocks_mhz: Mapping[PhaseKind, int],
        job_policy: JobPolicy,
        incarnations: IncarnationBook,
        jobs: JobSessions,
        default_lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        max_lease_ttl_s: float = DEFAULT_MAX_LEASE_TTL_S,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        self._inventory = inventory
        self._arbiter = arbiter
        self._access = access
        self._gate = gate
        self._life = life
        self._archive = archive
        self._reports = reports
        self._controller_factory = controller_factory
        self._fixed_clocks_mhz = dict(fixed_clocks_mhz)
        self._job_policy = job_policy
        self._incarnations = incarnations
        self._jobs = jobs
        self._default_lease_ttl_s = default_lease_ttl_s
        self._max_lease_ttl_s = max_lease_ttl_s
        self._clock = clock
        self._wall = wall_clock
        self.registry = registry
        """The open sessions (shared with the phase path and the read model, which only look them up)."""
        self._attachments: dict[str, Attachment] = {}

    # -- open ---------------------------------------------------------------------------------------

    def open_session(self, spec: SessionSpec, grant: str = SHARED_NAME) -> OpenedSession:
        """Claim the spec's GPUs exclusively (if ``grant``'s socket may) and start a session.

        A job-mode session (``spec.job``) is refused (Conflict) where the config denies job mode or when its
        incarnation is older than the newest seen for the job on this socket; its own controller is off.
        """
        self._life.check_running()
        job_key = (grant, spec.job_id)
        self._admit_job(spec, job_key)
        requested = self._inventory.resolve(spec.gpus) if spec.gpus else ()
        authorization = self._access.authorize(grant, spec.job_id, requested, spec.claim_tickets)
        indices = authorization.gpu_indices
        self._gate.check(indices)
        session, asked_lease_s = self._new_session(spec, grant, authorization)
        with self._gate.claim(indices):  # again, ordered against a new drain and shutdown
            self._claim(session, authorization)
            if spec.job is not None:  # only a session that opened raises the job's incarnation
                self._incarnations.accept(job_key, spec.job.incarnation)
                self._jobs.add(
                    session.session_id, JobState(job_key, spec.job, self._job_policy.trial_window_s)
                )
        self._arbiter.set_session(indices, session.session_id, None)
        self._log_open(session, asked_lease_s)
        return OpenedSession(session.session_id, session.lease_ttl_s, self._gpus_of(session))

    def _admit_job(self, spec: SessionSpec, job_key: tuple[str, str]) -> None:
        """Job mode's admission: allowed on this node, and no older incarnation than seen (Conflict)."""
        if spec.job is None:
            return
        newest = self._incarnations.newest(job_key)
        refusal = refuse_session(
            self._job_policy, spec.job_id, spec.job.incarnation, newest_incarnation=newest
        )
        if refusal is not None:
            raise Conflict(refusal)

    def _new_session(
        self, spec: SessionSpec, grant: str, authorization: Authorization
    ) -> tuple[HeldSession, float]:
        """The session (its controller built, its lease capped), not yet in the book; the lease it asked."""
        indices = authorization.gpu_indices
        supported = self._inventory.common_sm_clocks_mhz(indices)
        kinds = spec.role.kinds()
        threshold = spec.throughput_threshold or DEFAULT_THROUGHPUT_THRESHOLD
        settings = ControllerSettings(
            supported_sm_clocks_mhz=supported,
            kinds=kinds,
            mode=spec.mode,
            throughput_threshold=threshold,
            fixed_clocks_mhz={k: v for k, v in self._fixed_clocks_mhz.items() if k in kinds},
        )
        asked_lease_s = spec.lease_ttl_s or self._default_lease_ttl_s
        lease_ttl_s = min(asked_lease_s, self._max_lease_ttl_s)
        now_s = self._clock()
        try:
            # job mode: the job-level controller decides; the session's own controller stays off
            factory = create_off_controller if spec.job is not None else self._controller_factory
            controller = factory(settings)
        except ControllerSettingsError as e:  # the controller's own error tree, in the daemon's words
            raise ValidationError(e.field, e.problem) from e
        session = HeldSession(
            SessionRegistry.new_session_id(),
            spec,
            indices,
            controller,
            supported_sm_clocks_mhz=supported,
            throughput_threshold=threshold,
            lease_ttl_s=lease_ttl_s,
            opened_at_unix_s=self._wall(),
            now_s=now_s,
            grant=grant,
            authority=authorization.authority,
            granted_by=authorization.granted_by,
        )
        return session, asked_lease_s

    def _claim(self, session: HeldSession, authorization: Authorization) -> None:
        """Add the session; only an open that holds its GPUs uses its tickets up."""
        self.registry.add(session)
        try:
            self._access.redeem(authorization)
        except BaseException:
            self.registry.remove(session)
            raise

    def _log_open(self, session: HeldSession, asked_lease_s: float) -> None:
        spec = session.spec
        log.info(
            "session_open",
            session_id=short_id(session.session_id),
            job_id=spec.job_id,
            rank=spec.rank,
            gpu_indices=list(session.gpu_indices),
            gpu_uuids=[self._inventory.uuid(i) for i in session.gpu_indices],
            mode=spec.mode.value,
            role=spec.role.value,
            client=spec.client_name,
            grant=session.grant,
            job_mode=spec.job is not None,
            incarnation=spec.job.incarnation if spec.job is not None else None,
            node_rank=spec.job.node_rank if spec.job is not None else None,
            lease_ttl_s=session.lease_ttl_s,
        )
        if session.lease_ttl_s < asked_lease_s:
            log.info(
                "lease_capped",
                session_id=short_id(session.session_id),
                job_id=spec.job_id,
                asked_s=asked_lease_s,
                granted_s=session.lease_ttl_s,
                reason="--max-lease-ttl: without an Attach stream, a session ends this long after its last "
                "heartbeat or phase event",
            )

    def _gpus_of(self, session: HeldSession) -> tuple[GpuInfoView, ...]:
        """The session's GPUs as its client sees them: for job mode, the clocks a directive may name (on
        the grid, at or above the floor)."""
        gpus = tuple(self._inventory.info(i) for i in session.gpu_indices)
        if session.spec.job is None:
            return gpus
        floor = self._job_policy.floor_mhz(session.supported_sm_clocks_mhz)
        return tuple(
            dataclasses.replace(
                g, supported_sm_clocks_mhz=tuple(c for c in g.supported_sm_clocks_mhz if c >= floor)
            )
            for g in gpus
        )

    # -- attach, renew ------------------------------------------------------------------------------

    def attach(self, session_id: str) -> Attachment:
        """Bind a session's life to a stream; the caller must call :meth:`detach` when the stream ends."""
        self._life.check_running()
        session = self.registry.get(session_id)
        with session.lock:
            if session.attached:
                raise Conflict("session_id: this session is already bound to a stream")
            session.attached = True
            attachment = Attachment(session_id)
            self._attachments[session_id] = attachment
        attachment.push(self._wall(), "attached")
        log.info("session_attached", session_id=short_id(session_id))
        return attachment

    def detach(self, attachment: Attachment) -> None:
        """The stream ended (client closed, cancelled or died): close the session and reset its GPUs."""
        attachment.ended.set()
        try:
            session = self.registry.get(attachment.session_id)
        except NotFound:
            return
        self.close(session, reason="stream ended")

    def heartbeat(self, session_id: str) -> float:
        """Renew the lease; return the seconds left."""
        self._life.check_running()
        session = self.registry.get(session_id)
        now_s = self._clock()
        session.renew(now_s)
        return session.lease_remaining_s(now_s)

    def notify(self, indices: Sequence[int], message: str) -> None:
        """Tell the attached client of each session holding one of the GPUs (once per session)."""
        now_unix = self._wall()
        seen: set[str] = set()
        for index in indices:
            holder = self.registry.holder(index)
            if holder is None or holder.session_id in seen:
                continue
            seen.add(holder.session_id)
            attachment = self._attachments.get(holder.session_id)
            if attachment is not None:
                attachment.push(now_unix, message)

    # -- reads the admin and the pod watch need -----------------------------------------------------

    def holder(self, index: int) -> HeldSession | None:
        """The open session holding the GPU at ``index``, if any."""
        return self.registry.holder(index)

    def of_grants(self, names: set[str]) -> list[HeldSession]:
        """The open sessions whose authority came from these grants."""
        return self.registry.of_grants(names)

    def claims(self) -> tuple[ClaimView, ...]:
        """Every open session's id, job and GPUs (index, UUID), oldest first; reads no GPU."""
        return tuple(
            ClaimView(s.session_id, s.spec.job_id, tuple((i, self._inventory.uuid(i)) for i in s.gpu_indices))
            for s in self.registry.all()
        )

    # -- close --------------------------------------------------------------------------------------

    def close_session(self, session_id: str) -> ClosedSession:
        """End a session at its client's request and reset its GPUs."""
        session = self.registry.get(session_id)
        return self.close(session, reason="closed by client")

    def end_session(self, session_id: str, reason: str) -> bool:
        """End a session whose tenancy ended (its GPU left its pod), as a lease expiry does: its GPUs reset,
        its claim freed, ``reason`` logged, and its socket's job incarnations forgotten (the next tenant of
        a per-GPU socket is another pod). False when it is no longer open (it ended meanwhile)."""
        try:
            session = self.registry.get(session_id)
        except NotFound:
            return False
        self.close(session, reason=reason)
        self.forget_tenants({session.grant})
        return True

    def forget_tenants(self, sockets: set[str]) -> None:
        """Forget the job incarnations seen on these sockets (the next tenant is another job)."""
        self._incarnations.forget_sockets(sockets)

    def expire_leases(self) -> None:
        """Close every session whose lease ran out (the reaper's tick)."""
        for session in self.registry.expired(self._clock()):
            self.close(session, reason="lease expired")

    def close_all(self, reason: str) -> None:
        """Close every session without resetting its GPUs (shutdown resets them all at once)."""
        for session in self.registry.all():
            self.close(session, reason=reason, reset=False)

    def close(self, session: HeldSession, reason: str, *, reset: bool = True) -> ClosedSession:
        """Close a session: its GPUs back to default (with ``reset``) before it is forgotten, its stream
        ended, its decisions archived; its totals (a session already closed: the same totals)."""
        with session.lock:
            if session.closed:
                return _totals(session)
            session.closed = True
            session.active = None
        if reset:
            self._arbiter.set_session(session.gpu_indices, None, None)
        self.registry.remove(session)
        attachment = self._attachments.pop(session.session_id, None)
        if attachment is not None:
            attachment.ended.set()
        self._archive.record_closed(session, self._jobs.remove(session.session_id))
        self._record_report(session, reason)
        totals = _totals(session)
        log.info(
            "session_close",
            session_id=short_id(session.session_id),
            job_id=session.spec.job_id,
            rank=session.spec.rank,
            gpu_indices=list(session.gpu_indices),
            gpu_uuids=[self._inventory.uuid(i) for i in session.gpu_indices],
            reason=reason,
            energy_mj=totals.energy_mj,
            energy_j=round(totals.energy_mj / 1000.0, 3),
            valid_tokens=totals.valid_tokens,
        )
        return totals

    def _record_report(self, session: HeldSession, reason: str) -> None:
        """Keep the ending session's report (where a report sink was given)."""
        if self._reports is None:
            return
        try:
            snapshots = session.controller.snapshot()
        except Exception:
            log.exception("controller_error", session_id=short_id(session.session_id))
            snapshots = ()
        self._reports.record(report_of(session, snapshots, reason=reason, closed_at_unix_s=self._wall()))


def _totals(session: HeldSession) -> ClosedSession:
    return ClosedSession(
        energy_mj=sum(t.energy_mj for t in session.totals.values()),
        valid_tokens=sum(t.valid_tokens for t in session.totals.values()),
    )


__all__ = [
    "DEFAULT_LEASE_TTL_S",
    "DEFAULT_THROUGHPUT_THRESHOLD",
    "Attachment",
    "ClosedArchive",
    "Holders",
    "SessionBook",
]
