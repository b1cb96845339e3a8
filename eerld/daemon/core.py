"""The hub: every RPC of both services is one method of :class:`Daemon`, with no gRPC in sight.

The daemon sequences each event through the layers and returns: a validated request enters here, updates
:mod:`eerld.sessions`, is metered by :mod:`eerld.energy`, judged by the session's controller
(:mod:`eerl.control`), and the decision is applied through the :class:`~eerld.clocks.arbiter.ClockArbiter`.
The layers never call each other sideways or back up. This module holds the life cycle (start, the reaper's
tick, shutdown), sessions and phases; what the admin socket changes is :mod:`eerld.daemon.admin`, what
Status and metrics read is :mod:`eerld.daemon.status`, the node's GPUs are :mod:`eerld.daemon.inventory`.
Time comes from injectable clocks (monotonic for leases and phases, wall for timestamps and pin expiry),
so tests drive leases and expiry without sleeping.

The daemon is given a backend that is ready to use: wrappers (background energy sampling, observe-only
under ``--dry-run``) are applied by the composition root, :mod:`eerld.app`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TypeVar

import structlog
from eerl.clocks import nearest_supported_mhz
from eerl.control.base import ControllerFactory, ControllerSettings, Decision, PhaseObservation
from eerl.control.simple import create_off_controller
from eerl.directives import DirectiveVerdict
from eerl.errors import ValidationError as ControllerSettingsError
from eerl.job.admission import (
    JobPolicy,
    ReceivedDirective,
    Ruling,
    judge,
    rate_limited,
    refuse_session,
    to_default,
)
from eerl.phases import ControllerState, ExecutionMode, PhaseKind, Workload

from eerld import files
from eerld.access import Access
from eerld.clocks.arbiter import APPLY_TIMEOUT_S, AppliedClock, ClockArbiter, ClockSource
from eerld.clocks.ledger import Ledger
from eerld.clocks.pins import PinStore
from eerld.clocks.ratelimit import DEFAULT_MAX_CHANGES_PER_S, ClockChangeLimiter
from eerld.daemon.admin import Admin
from eerld.daemon.inventory import Inventory
from eerld.daemon.jobmode import IncarnationBook, JobDecision, JobSessions, JobState
from eerld.daemon.status import DEFAULT_DECISIONS_LIMIT, StatusReader
from eerld.daemon.timebase import PhaseTimebase
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
    GpuStatusView,
    GrantOutcome,
    GrantView,
    OpenedSession,
    PhaseObserver,
    PhaseRecord,
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
from eerld.energy import CounterReading, phase_energy, read_counters
from eerld.errors import Conflict, NotFound, Unavailable, ValidationError
from eerld.gpu.base import GpuBackend
from eerld.grants import SHARED_NAME, GrantSpec
from eerld.sessions import (
    DEFAULT_MAX_LEASE_TTL_S,
    ActivePhase,
    GpuSelector,
    HeldSession,
    SessionRegistry,
    SessionSpec,
    short_id,
)

log = structlog.get_logger("eerld.daemon")
_T = TypeVar("_T")

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


class Daemon:
    """The hub of eerld: sessions, phases, pins, grants and status over one GPU backend."""

    def __init__(
        self,
        backend: GpuBackend,
        state_dir: Path,
        *,
        controller_name: str,
        controller_factory: ControllerFactory,
        fixed_clocks_mhz: Mapping[PhaseKind, int] | None = None,
        dry_run: bool = False,
        default_lease_ttl_s: float = DEFAULT_LEASE_TTL_S,
        max_lease_ttl_s: float = DEFAULT_MAX_LEASE_TTL_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        phase_clock: Callable[[], float] | None = None,
        clock_workers: int = 8,
        apply_timeout_s: float = APPLY_TIMEOUT_S,
        max_clock_changes_per_s: float = DEFAULT_MAX_CHANGES_PER_S,
        tenancy: str = "single",
        socket_path: Path = Path("/run/eerld/eerld.sock"),
        grant_dir: Path | None = None,
        gpu_socket_dir: Path | None = None,
        job_policy: JobPolicy | None = None,
    ) -> None:
        """``backend`` is used as given (under ``dry_run`` the composition root wraps it observe-only);
        ``dry_run`` makes the arbiter skip actuation. ``phase_clock`` times phases (the backend's own
        clock where it has one, so durations and energy agree); leases and pins stay on ``clock`` and
        ``wall_clock``. ``job_policy`` is the admin's envelope for job mode (default: allowed, auto floor).
        No session's lease is longer than ``max_lease_ttl_s``, whatever it asks for."""
        self._backend = backend
        self._job_policy = job_policy if job_policy is not None else JobPolicy()
        self._incarnations = IncarnationBook()
        self._jobs = JobSessions()
        self._controller_factory = controller_factory
        self._fixed_clocks_mhz = dict(fixed_clocks_mhz or {})
        self._default_lease_ttl_s = default_lease_ttl_s
        self._max_lease_ttl_s = max_lease_ttl_s
        self._clock = clock
        self._wall = wall_clock
        # every phase-clock reading is paired with the wall clock: decisions are shown in UTC
        self._timebase = PhaseTimebase(phase_clock if phase_clock is not None else clock, wall_clock)
        self._phase_clock = self._timebase.now
        started_s = clock()
        self._lock = threading.RLock()
        self._stopping = False
        self._sessions = SessionRegistry()
        self._attachments: dict[str, Attachment] = {}
        self._inventory = Inventory(backend)
        self._inventory.check_fixed_clocks(self._fixed_clocks_mhz)
        files.ensure_private_dir(state_dir, "--state-dir")
        self.access = Access(
            self._inventory.identities,
            state_dir,
            tenancy=tenancy,
            shared_socket=socket_path,
            grant_dir=grant_dir,
            gpu_socket_dir=gpu_socket_dir,
            clock=clock,
            wall_clock=wall_clock,
        )
        self._arbiter = ClockArbiter(
            backend,
            Ledger(state_dir),
            dry_run=dry_run,
            clock=clock,
            max_workers=clock_workers,
            apply_timeout_s=apply_timeout_s,
            change_limiter=ClockChangeLimiter(max_clock_changes_per_s),
        )
        self._admin = Admin(
            self._inventory,
            self._arbiter,
            PinStore(state_dir),
            self.access,
            self._sessions,
            clock=clock,
            wall_clock=wall_clock,
            close=lambda session, reason: self._close(session, reason=reason),
            notify=self._notify,
            incarnations=self._incarnations,
        )
        self._status = StatusReader(
            backend,
            self._inventory,
            self._arbiter,
            self._sessions,
            self.access,
            jobs=self._jobs,
            controller_name=controller_name,
            clock=clock,
            started_s=started_s,
            timebase=self._timebase,
            drain_of=self._admin.drain_of,
        )
        self._observers_lock = threading.Lock()
        self._rpc_observers: tuple[RpcObserver, ...] = ()
        self._phase_observers: tuple[PhaseObserver, ...] = ()
        self._directive_observers: tuple[DirectiveObserver, ...] = ()
        self._reaper: threading.Thread | None = None
        self._reaper_stop = threading.Event()

    # -- subscriptions ------------------------------------------------------------------------------

    def subscribe(
        self,
        *,
        on_rpc: RpcObserver | None = None,
        on_phase: PhaseObserver | None = None,
        on_directive: DirectiveObserver | None = None,
    ) -> Unsubscribe:
        """Call ``on_rpc`` after every RPC, ``on_phase`` after every metered phase and ``on_directive`` after
        every job-mode BeginPhase (with its verdict), until unsubscribed.

        Subscribers run on the calling thread (an RPC's, the phase's) and must be quick; one that raises is
        logged and never fails the event. The returned callable ends the subscription; idempotent.
        """
        with self._observers_lock:
            if on_rpc is not None:
                self._rpc_observers = (*self._rpc_observers, on_rpc)
            if on_phase is not None:
                self._phase_observers = (*self._phase_observers, on_phase)
            if on_directive is not None:
                self._directive_observers = (*self._directive_observers, on_directive)

        def unsubscribe() -> None:
            with self._observers_lock:
                self._rpc_observers = _without(self._rpc_observers, on_rpc)
                self._phase_observers = _without(self._phase_observers, on_phase)
                self._directive_observers = _without(self._directive_observers, on_directive)

        return unsubscribe

    @property
    def subscribers(self) -> tuple[int, int]:
        """How many RPC and phase subscribers there are (a closed metrics server leaves none behind)."""
        return len(self._rpc_observers), len(self._phase_observers)

    @property
    def directive_subscribers(self) -> int:
        """How many directive subscribers there are (the metrics endpoint subscribes one)."""
        return len(self._directive_observers)

    def rpc_done(self, method: str, code: str, duration_s: float) -> None:
        """Publish one handled RPC to the RPC subscribers (the API's interceptor calls this)."""
        for observer in self._rpc_observers:
            try:
                observer(method, code, duration_s)
            except Exception:
                log.exception("rpc_observer_error")

    # -- life cycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Reset every GPU a previous daemon left locked, then re-apply the persisted admin pins.

        A corrupt ledger names nothing: every GPU is reset and the file set aside (the arbiter). Pins are
        checked as the Pin RPC checks them (:meth:`eerld.daemon.admin.Admin.restore_pins`).
        """
        reset = self._arbiter.recover_from_ledger()
        log.info("daemon_start", gpus=len(self._inventory), ledger_reset=reset, dry_run=self.dry_run)
        self._admin.restore_pins()

    def start_reaper(self, interval_s: float = 0.2) -> None:
        """Run :meth:`tick` in a background thread every ``interval_s``."""

        def run() -> None:
            while not self._reaper_stop.wait(interval_s):
                try:
                    self.tick()
                except Exception:
                    log.exception("reaper_error")

        self._reaper = threading.Thread(target=run, name="eerld-reaper", daemon=True)
        self._reaper.start()

    def tick(self) -> None:
        """Expire leases, grants and pins, retry degraded GPUs (the reaper calls this; tests call it too)."""
        now_s = self._clock()
        for session in self._sessions.expired(now_s):
            self._close(session, reason="lease expired")
        self._admin.expire()
        self._arbiter.retry_degraded()
        self._admin.flush_pins()

    def shutdown(self) -> list[AppliedClock]:
        """Refuse new calls, close every session and reset every GPU eerld locked (pins stay on disk)."""
        with self._lock:
            self._stopping = True
        self._reaper_stop.set()
        if self._reaper is not None:
            self._reaper.join(timeout=5)
        for session in self._sessions.all():
            self._close(session, reason="daemon stopping", reset=False)
        results = self._arbiter.release_all()
        log.info("daemon_stop", reset_gpus=[r.index for r in results])
        self._arbiter.close()
        return results

    def reset_clocks(self) -> list[AppliedClock]:
        """Reset every GPU and empty the ledger (``eerld --reset-clocks``)."""
        results = self._arbiter.reset_everything()
        self._arbiter.close()
        return results

    @property
    def dry_run(self) -> bool:
        """True when decisions are never applied."""
        return self._arbiter.dry_run

    @property
    def stopping(self) -> bool:
        """True once shutdown began."""
        return self._stopping

    def _check_running(self) -> None:
        if self._stopping:
            raise Unavailable("eerld is stopping")

    # -- sessions -----------------------------------------------------------------------------------

    def open_session(self, spec: SessionSpec, grant: str = SHARED_NAME) -> OpenedSession:
        """Claim the spec's GPUs exclusively (if ``grant``'s socket may) and start a session.

        A job-mode session (``spec.job``) is refused (Conflict) where the config denies job mode or when its
        incarnation is older than the newest seen for the job on this socket; its own controller is off.
        """
        self._check_running()
        job_key = (grant, spec.job_id)
        if spec.job is not None:
            newest = self._incarnations.newest(job_key)
            refusal = refuse_session(
                self._job_policy, spec.job_id, spec.job.incarnation, newest_incarnation=newest
            )
            if refusal is not None:
                raise Conflict(refusal)
        requested = self._inventory.resolve(spec.gpus) if spec.gpus else ()
        authorization = self.access.authorize(grant, spec.job_id, requested, spec.claim_tickets)
        indices = authorization.gpu_indices
        self._check_not_drained(indices)
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
        with self._lock:
            self._check_running()
            self._check_not_drained(indices)  # again, under the lock a drain is recorded under
            self._sessions.add(session)
            try:
                self.access.redeem(authorization)  # only an open that holds its GPUs uses its tickets up
            except BaseException:
                self._sessions.remove(session)
                raise
            if spec.job is not None:  # only a session that opened raises the job's incarnation
                self._incarnations.accept(job_key, spec.job.incarnation)
                self._jobs.add(
                    session.session_id, JobState(job_key, spec.job, self._job_policy.trial_window_s)
                )
        self._arbiter.set_session(indices, session.session_id, None)
        log.info(
            "session_open",
            session_id=short_id(session.session_id),
            job_id=spec.job_id,
            rank=spec.rank,
            gpu_indices=list(indices),
            gpu_uuids=[self._inventory.uuid(i) for i in indices],
            mode=spec.mode.value,
            role=spec.role.value,
            client=spec.client_name,
            grant=grant,
            job_mode=spec.job is not None,
            incarnation=spec.job.incarnation if spec.job is not None else None,
            node_rank=spec.job.node_rank if spec.job is not None else None,
            lease_ttl_s=lease_ttl_s,
        )
        if lease_ttl_s < asked_lease_s:
            log.info(
                "lease_capped",
                session_id=short_id(session.session_id),
                job_id=spec.job_id,
                asked_s=asked_lease_s,
                granted_s=lease_ttl_s,
                reason="--max-lease-ttl: without an Attach stream, a session ends this long after its last "
                "heartbeat or phase event",
            )
        gpus = tuple(self._inventory.info(i) for i in indices)
        if spec.job is not None:  # the clocks a directive may name: on the grid, at or above the floor
            floor = self._job_policy.floor_mhz(supported)
            gpus = tuple(
                dataclasses.replace(
                    g, supported_sm_clocks_mhz=tuple(c for c in g.supported_sm_clocks_mhz if c >= floor)
                )
                for g in gpus
            )
        return OpenedSession(session.session_id, session.lease_ttl_s, gpus)

    def _check_not_drained(self, indices: Sequence[int]) -> None:
        """Conflict naming the drain when one of the GPUs is drained (no new claims)."""
        for index in indices:
            drain = self._admin.drain_of(index)
            if drain is not None:
                raise Conflict(
                    f"gpus: GPU {index} is {drain.describe()}; no session may claim it until an admin "
                    "undrains it (eerlctl undrain) or the drain ends"
                )

    def attach(self, session_id: str) -> Attachment:
        """Bind a session's life to a stream; the caller must call :meth:`detach` when the stream ends."""
        self._check_running()
        session = self._sessions.get(session_id)
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
            session = self._sessions.get(attachment.session_id)
        except NotFound:
            return
        self._close(session, reason="stream ended")

    def heartbeat(self, session_id: str) -> float:
        """Renew the lease; return the seconds left."""
        self._check_running()
        session = self._sessions.get(session_id)
        now_s = self._clock()
        session.renew(now_s)
        return session.lease_remaining_s(now_s)

    def close_session(self, session_id: str) -> ClosedSession:
        """End a session at its client's request and reset its GPUs."""
        session = self._sessions.get(session_id)
        return self._close(session, reason="closed by client")

    def claims(self) -> tuple[ClaimView, ...]:
        """Every open session's id, job and GPUs (index, UUID), oldest first; reads no GPU."""
        return tuple(
            ClaimView(s.session_id, s.spec.job_id, tuple((i, self._inventory.uuid(i)) for i in s.gpu_indices))
            for s in self._sessions.all()
        )

    def end_session(self, session_id: str, reason: str) -> bool:
        """End a session whose tenancy ended (its GPU left its pod), as a lease expiry does: its GPUs reset,
        its claim freed, ``reason`` logged, and its socket's job incarnations forgotten (the next tenant of
        a per-GPU socket is another pod). False when it is no longer open (it ended meanwhile)."""
        try:
            session = self._sessions.get(session_id)
        except NotFound:
            return False
        self._close(session, reason=reason)
        self._incarnations.forget_sockets({session.grant})
        return True

    def _close(self, session: HeldSession, *, reason: str, reset: bool = True) -> ClosedSession:
        with session.lock:
            if session.closed:
                return _totals(session)
            session.closed = True
            session.active = None
        if reset:
            self._arbiter.set_session(session.gpu_indices, None, None)
        self._sessions.remove(session)
        attachment = self._attachments.pop(session.session_id, None)
        if attachment is not None:
            attachment.ended.set()
        self._status.record_closed(session, self._jobs.remove(session.session_id))
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
        )
        return totals

    def _notify(self, indices: Sequence[int], message: str) -> None:
        """Tell the attached client of each session holding one of the GPUs (once per session)."""
        now_unix = self._wall()
        seen: set[str] = set()
        for index in indices:
            holder = self._sessions.holder(index)
            if holder is None or holder.session_id in seen:
                continue
            seen.add(holder.session_id)
            attachment = self._attachments.get(holder.session_id)
            if attachment is not None:
                attachment.push(now_unix, message)

    # -- phases -------------------------------------------------------------------------------------

    def begin_phase(
        self,
        session_id: str,
        kind: PhaseKind,
        iteration: int,
        hints: Workload | None,
        directive: ReceivedDirective | None = None,
    ) -> BeganPhase:
        """Decide the phase's clock, apply it to the session's GPUs, read it back, start metering.

        A job-mode session's clock is its ``directive``'s, once checked (:mod:`eerld.daemon.jobmode`); a
        refused or missing one runs the phase at the fallback. Any other session ignores a directive
        (verdict NOT_JOB_MODE) and its controller decides.
        """
        self._check_running()
        session = self._sessions.get(session_id)
        job = self._jobs.get(session_id)
        if job is not None:
            return self._begin_job_phase(session, job, kind, iteration, directive)
        with session.lock:
            abandoned = _check_begin(session, kind, iteration)
            now_s = self._clock()
            decision = self._decide(session, kind, iteration, hints, self._phase_clock())
            clocks = self._arbiter.set_session(session.gpu_indices, session.session_id, decision.sm_clock_mhz)
            begin = read_counters(self._backend, session.gpu_indices, self._phase_clock())
            held = _held_clock(clocks, decision.sm_clock_mhz)
            session.active = ActivePhase(kind, iteration, held, begin, gap_before_s=_gap(session, begin))
            session.last_iteration = iteration
            session.last_decision[kind] = decision
            session.renew(now_s)
        if directive is not None:
            log.info(
                "job_directive_ignored",
                session_id=short_id(session.session_id),
                job_id=session.spec.job_id,
                kind=kind.value,
                iteration=iteration,
                verdict=DirectiveVerdict.NOT_JOB_MODE.value,
            )
        return BeganPhase(tuple(clocks), decision.state, decision.sm_clock_mhz, abandoned is not None)

    def _begin_job_phase(
        self,
        session: HeldSession,
        job: JobState,
        kind: PhaseKind,
        iteration: int,
        directive: ReceivedDirective | None,
    ) -> BeganPhase:
        with session.lock:
            abandoned = _check_begin(session, kind, iteration)
            now_s = self._clock()
            ruling = self._rule(
                session, job, kind=kind, iteration=iteration, directive=directive, now_s=now_s
            )
            clocks = self._arbiter.set_session(session.gpu_indices, session.session_id, ruling.sm_clock_mhz)
            job.record(ruling, kind, now_s)
            if ruling.accepted and directive is not None:
                self._incarnations.accept(job.key, directive.incarnation)
            begin = read_counters(self._backend, session.gpu_indices, self._phase_clock())
            held = _held_clock(clocks, ruling.sm_clock_mhz)
            session.active = ActivePhase(
                kind, iteration, held, begin, ruling.verdict, ruling.applied_epoch, _gap(session, begin)
            )
            session.last_iteration = iteration
            decision = Decision(
                kind, iteration, ruling.sm_clock_mhz, ruling.state, ruling.reason(), begin.time_s
            )
            session.last_decision[kind] = decision
            job.remember(JobDecision(decision, directive, ruling.verdict))
            session.renew(now_s)
        log.info(
            "job_directive",
            session_id=short_id(session.session_id),
            job_id=session.spec.job_id,
            node_rank=job.spec.node_rank,
            kind=kind.value,
            iteration=iteration,
            verdict=ruling.verdict.value,
            detail=ruling.detail,
            directive=directive.describe() if directive is not None else None,
            sm_clock_mhz=ruling.sm_clock_mhz,
            held_sm_clock_mhz=held,
            applied_epoch=ruling.applied_epoch,
        )
        observers = self._directive_observers
        if observers:  # metrics on: tell them (nothing to build otherwise)
            record = DirectiveRecord(
                session.spec.job_id, job.spec.node_rank, kind, iteration, ruling.verdict, ruling.sm_clock_mhz
            )
            for observer in observers:
                try:
                    observer(record)
                except Exception:
                    log.exception("directive_observer_error")
        return BeganPhase(
            tuple(clocks),
            ruling.state,
            ruling.sm_clock_mhz,
            abandoned is not None,
            verdict=ruling.verdict,
            verdict_detail=ruling.detail,
            applied_epoch=ruling.applied_epoch,
        )

    def _rule(
        self,
        session: HeldSession,
        job: JobState,
        *,
        kind: PhaseKind,
        iteration: int,
        directive: ReceivedDirective | None,
        now_s: float,
    ) -> Ruling:
        """The verdict on the directive and the clock to apply: checks 1-8, then the rate limit (check 9).

        A fallback the rate limit would refuse as well goes to the default governor (a reset is never held
        back), so that the GPUs never stay at an earlier trial clock.
        """
        ruling = judge(
            directive,
            job,
            self._job_policy,
            newest_incarnation=self._incarnations.newest(job.key),
            kind=kind,
            iteration=iteration,
            supported_mhz=session.supported_sm_clocks_mhz,
            now_s=now_s,
        )
        indices = session.gpu_indices
        if ruling.sm_clock_mhz is not None and self._arbiter.would_rate_limit(indices, ruling.sm_clock_mhz):
            if ruling.accepted:
                ruling = rate_limited(job, ruling, kind)
            if ruling.sm_clock_mhz is not None and self._arbiter.would_rate_limit(
                indices, ruling.sm_clock_mhz
            ):
                ruling = to_default(ruling)
        return ruling

    def _decide(
        self, session: HeldSession, kind: PhaseKind, iteration: int, hints: Workload | None, now_s: float
    ) -> Decision:
        try:
            decision = session.controller.decide(kind, iteration, hints, now_s)
        except Exception:
            log.exception("controller_error", session_id=short_id(session.session_id), kind=kind.value)
            return Decision(kind, iteration, None, ControllerState.OFF, "controller error: default", now_s)
        supported = session.supported_sm_clocks_mhz
        if decision.sm_clock_mhz is not None and supported and decision.sm_clock_mhz not in supported:
            log.warning(
                "controller_unsupported_clock",
                session_id=short_id(session.session_id),
                sm_clock_mhz=decision.sm_clock_mhz,
            )
            snapped = nearest_supported_mhz(supported, decision.sm_clock_mhz)
            decision = Decision(kind, iteration, snapped, decision.state, decision.reason, decision.time_s)
        return decision

    def end_phase(self, session_id: str, kind: PhaseKind, iteration: int, workload: Workload) -> EndedPhase:
        """Meter the running phase, release its lock, attribute it to (session, kind, iteration) and tell
        the controller.

        The lock ends with its phase: the work a trainer does between phases (log-probabilities, rewards,
        weight sync) runs at the default governor, as it would without eerl, and its time reaches the
        controller as the next phase's gap (see docs/algorithm.md, "Whole iterations").
        """
        self._check_running()
        session = self._sessions.get(session_id)
        with session.lock:
            if session.closed:
                raise NotFound("session_id: no open session with this id")
            active = session.check_end(kind, iteration)
            end = read_counters(self._backend, session.gpu_indices, self._phase_clock())
            self._arbiter.set_session(session.gpu_indices, session.session_id, None)
            session.last_end_time_s = end.time_s
            energy = phase_energy(active.begin, end, session.gpu_indices)
            now_s = end.time_s
            observation = PhaseObservation(
                kind=kind,
                iteration=iteration,
                workload=workload,
                duration_s=energy.duration_s,
                energy_j=energy.energy_mj / 1000.0,
                sm_clock_mhz=active.sm_clock_mhz,
                gpus=len(session.gpu_indices),
                end_time_s=now_s,
                gap_before_s=active.gap_before_s,
            )
            session.active = None
            session.last_ended[kind] = iteration
            session.held_since_unix_s = self._wall()
            session.totals[kind].add(
                energy.energy_mj, workload.valid_tokens, workload.tokens, energy.duration_s
            )
            session.renew(self._clock())
            job = self._jobs.get(session_id)
            if job is None:
                self._observe(session, observation, now_s)
                state = self._state_of(session, kind)
            else:  # job mode: the job-level controller observes what EndPhase returns
                ruling = job.last.get(kind)
                state = ruling.state if ruling is not None else ControllerState.OFF
        if energy.counter_reset or not energy.complete:
            log.warning(
                "energy_incomplete",
                session_id=short_id(session_id),
                counter_reset=energy.counter_reset,
                complete=energy.complete,
            )
        if session.spec.mode is ExecutionMode.ASYNC:
            for peer in self._sessions.peers(session):
                with peer.lock:
                    if not peer.closed:
                        self._observe(peer, observation, now_s)
        observers = self._phase_observers
        if observers:  # metrics on: tell them (nothing to build otherwise)
            record = PhaseRecord(
                session_id=session_id,
                job_id=session.spec.job_id,
                rank=session.spec.rank,
                kind=kind,
                iteration=iteration,
                duration_s=energy.duration_s,
                energy_mj=energy.energy_mj,
                tokens=workload.tokens,
                valid_tokens=workload.valid_tokens,
                sm_clock_mhz=active.sm_clock_mhz,
                gpu_indices=session.gpu_indices,
                state=state,
            )
            for observer in observers:
                try:
                    observer(record)
                except Exception:
                    log.exception("phase_observer_error")
        return EndedPhase(
            energy.duration_s,
            energy.energy_mj,
            energy.mean_power_w,
            state,
            sm_clock_mhz=active.sm_clock_mhz,
            applied_epoch=active.applied_epoch,
            verdict=active.verdict,
            gpus=len(session.gpu_indices),
        )

    def _observe(self, session: HeldSession, observation: PhaseObservation, now_s: float) -> None:
        try:
            session.controller.observe(observation, now_s)
        except Exception:
            log.exception("controller_error", session_id=short_id(session.session_id))

    def _state_of(self, session: HeldSession, kind: PhaseKind) -> ControllerState:
        try:
            state = session.controller.state_of(kind)
        except Exception:
            log.exception("controller_error", session_id=short_id(session.session_id))
            state = None
        if state is not None:
            return state
        last = session.last_decision.get(kind)
        return last.state if last else ControllerState.OFF

    # -- admin (eerld.daemon.admin) -----------------------------------------------------------------

    def pin(
        self,
        selectors: Sequence[GpuSelector] | None,
        sm_clock_mhz: int,
        mem_clock_mhz: int,
        duration_s: float,
        reason: str,
        *,
        replace: bool = False,
        set_by: str = "",
    ) -> PinOutcome:
        """Pin GPUs (None: all) to a supported clock, durably, until unpinned or expired; a pinned GPU
        only with ``replace`` (the outcome names the pins replaced)."""
        self._check_running()
        return self._admin.pin(
            selectors, sm_clock_mhz, mem_clock_mhz, duration_s, reason, replace=replace, set_by=set_by
        )

    def unpin(self, selectors: Sequence[GpuSelector] | None) -> UnpinOutcome:
        """Remove pins; the holding session or the default governor decides again."""
        self._check_running()
        return self._admin.unpin(selectors)

    def reset(
        self, selectors: Sequence[GpuSelector] | None, reason: str, *, keep_pins: bool = False
    ) -> ResetOutcome:
        """Close the sessions holding the GPUs and return them to default clocks (or to their pins, with
        ``keep_pins``; otherwise the pins are removed too)."""
        self._check_running()
        return self._admin.reset(selectors, reason, keep_pins=keep_pins)

    def drain(
        self,
        selectors: Sequence[GpuSelector] | None,
        duration_s: float,
        reason: str,
        *,
        keep_sessions: bool = False,
        set_by: str = "",
    ) -> DrainOutcome:
        """No new claims of the GPUs until undrained or ``duration_s`` (0: until undrained) has passed;
        the sessions holding them are closed unless ``keep_sessions``; pins stay."""
        self._check_running()
        with self._lock:  # a claim in flight either added its session already or sees the drain
            indices = self._admin.put_drains(selectors, duration_s, reason, set_by)
        return self._admin.evict(indices, reason, keep_sessions=keep_sessions)

    def undrain(self, selectors: Sequence[GpuSelector] | None) -> UndrainOutcome:
        """End the drains of the GPUs: they may be claimed again."""
        self._check_running()
        return self._admin.undrain(selectors)

    def open_grants(self) -> None:
        """Open the per-GPU sockets and the persisted grants (after :meth:`start`, once serving)."""
        self._admin.open_grants()

    def grant(self, spec: GrantSpec) -> GrantOutcome:
        """Create a scoped worker socket for the spec's GPUs (with replace: revoke the grants in its way)."""
        self._check_running()
        grant, replaced = self._admin.grant(spec)
        return GrantOutcome(self._status.grant_view(grant), tuple(g.name for g in replaced))

    def revoke(self, name: str | None, job_id: str | None, reason: str) -> RevokeOutcome:
        """Remove grants by name or job: their sockets close, their sessions end, their GPUs reset."""
        self._check_running()
        return self._admin.revoke(name, job_id, reason)

    def issue_claim_ticket(self, grant: str) -> TicketView:
        """A one-time ticket for the GPUs of ``grant``'s socket, to show on another socket of the job."""
        self._check_running()
        return self._admin.issue_claim_ticket(grant)

    # -- reads (eerld.daemon.status) ----------------------------------------------------------------

    def daemon_info(self) -> DaemonView:
        """Version, backend, controller, mode and uptime."""
        return self._status.daemon_info()

    def gpu_status(self) -> tuple[GpuStatusView, ...]:
        """Every GPU of the node now (reads the backend; a failed read shows as zero and a reason)."""
        return self._status.gpu_status()

    def sessions(self) -> tuple[SessionView, ...]:
        """Every open session with its per-phase view."""
        return self._status.sessions()

    def grants(self) -> tuple[GrantView, ...]:
        """Every worker socket with its GPUs and open sessions."""
        return self._status.grants()

    def status(self) -> StatusView:
        """The whole node: daemon, GPUs, sessions, grants."""
        return self._status.status()

    def decisions(
        self,
        session_id: str | None = None,
        kind: PhaseKind | None = None,
        limit: int = DEFAULT_DECISIONS_LIMIT,
    ) -> tuple[DecisionView, ...]:
        """Controller decisions, oldest first, the newest ``limit``; NotFound for an unknown session."""
        return self._status.decisions(session_id, kind, limit)


def _without(observers: tuple[_T, ...], observer: _T | None) -> tuple[_T, ...]:
    if observer is None or observer not in observers:
        return observers
    index = observers.index(observer)
    return observers[:index] + observers[index + 1 :]


def _totals(session: HeldSession) -> ClosedSession:
    return ClosedSession(
        energy_mj=sum(t.energy_mj for t in session.totals.values()),
        valid_tokens=sum(t.valid_tokens for t in session.totals.values()),
    )


def _check_begin(session: HeldSession, kind: PhaseKind, iteration: int) -> ActivePhase | None:
    """Under the session's lock: NotFound for a closed session, the order checks of a BeginPhase; the phase
    it abandons (one that began and never ended), logged, else None."""
    if session.closed:
        raise NotFound("session_id: no open session with this id")
    session.check_begin(kind, iteration)
    abandoned = session.active
    if abandoned is not None:
        log.warning(
            "phase_abandoned",
            session_id=short_id(session.session_id),
            kind=abandoned.kind.value,
            iteration=abandoned.iteration,
            reason="a new phase began before it ended (its EndPhase was lost or refused)",
        )
    return abandoned


def _gap(session: HeldSession, begin: CounterReading) -> float:
    """Time since the session's previous EndPhase on the backend clock (0 for its first phase)."""
    last = session.last_end_time_s
    return max(0.0, begin.time_s - last) if last is not None else 0.0


def _held_clock(clocks: Sequence[AppliedClock], wanted: int | None) -> int | None:
    """The lock that holds during the phase: the pin's when pinned, none in dry-run, else the decision's."""
    if any(c.dry_run for c in clocks):
        return None
    for c in clocks:
        if c.source is ClockSource.ADMIN_PIN and c.requested_sm_clock_mhz is not None:
            return c.requested_sm_clock_mhz
    return wanted


__all__ = ["DEFAULT_LEASE_TTL_S", "DEFAULT_THROUGHPUT_THRESHOLD", "Attachment", "Daemon"]
