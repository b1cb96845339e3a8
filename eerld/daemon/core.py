"""The daemon's domain object: every RPC of both services is one method here, with no gRPC in sight.

Data flows one way: a validated request enters here, updates :mod:`eerld.sessions`, is metered by
:mod:`eerld.energy`, judged by the session's controller, and the decision is applied through the
:class:`~eerld.clocks.arbiter.ClockArbiter`. Read methods return frozen dataclasses for the admin RPCs,
metrics and eerlctl. Time comes from injectable clocks (monotonic for leases and phases, wall for
timestamps and pin expiry), so tests drive leases and expiry without sleeping.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import structlog
from eerl.control.base import ControllerFactory, ControllerSettings, Decision, PhaseObservation, PhaseSnapshot
from eerl.control.clocks import nearest_supported_mhz, nearest_supported_text
from eerl.errors import ValidationError as ControllerSettingsError
from eerl.phases import ControllerState, ExecutionMode, GpuRole, PhaseKind, Workload

from eerld import files
from eerld.access import Access
from eerld.clocks.arbiter import APPLY_TIMEOUT_S, AppliedClock, ClockArbiter, ClockSource
from eerld.clocks.ledger import Ledger
from eerld.clocks.pins import Pin, PinStore, pin_problem
from eerld.clocks.ratelimit import DEFAULT_MAX_CHANGES_PER_S, ClockChangeLimiter
from eerld.energy import phase_energy, read_counters
from eerld.errors import (
    ConfigError,
    Conflict,
    Exhausted,
    GpuError,
    NotFound,
    Unavailable,
    ValidationError,
)
from eerld.gpu.base import ClockEventReasons, GpuBackend, GpuClocks, GpuIdentity, GpuUtilization
from eerld.gpu.observe_only import ObserveOnlyBackend
from eerld.grants import SHARED_NAME, Grant, GrantSpec
from eerld.sessions import ActivePhase, GpuSelector, Session, SessionRegistry, SessionSpec

log = structlog.get_logger("eerld.daemon")
_T = TypeVar("_T")

VERSION = "0.1.0"
DEFAULT_LEASE_TTL_S = 10.0
DEFAULT_THROUGHPUT_THRESHOLD = 0.95
DEFAULT_DECISIONS_LIMIT = 1000
CLOSED_SESSIONS_KEPT = 64


# --------------------------------------------------------------------------------------------------
# Views (frozen results for the API, metrics and eerlctl)
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class GpuInfoView:
    """Static facts about a GPU."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    min_sm_clock_mhz: int
    max_sm_clock_mhz: int


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


@dataclass(frozen=True, slots=True)
class EndedPhase:
    """The answer to EndPhase: what the phase cost."""

    duration_s: float
    energy_mj: float
    mean_power_w: float
    state: ControllerState


@dataclass(frozen=True, slots=True)
class ClosedSession:
    """The answer to CloseSession: the session's totals."""

    energy_mj: float
    valid_tokens: int


@dataclass(frozen=True, slots=True)
class ResetOutcome:
    """The answer to ResetAll."""

    clocks: tuple[AppliedClock, ...]
    closed_session_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PhaseRecord:
    """A metered phase, handed to phase observers (metrics)."""

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


RpcObserver = Callable[[str, str, float], None]
"""Called after every RPC with (method, status code name, duration_s)."""
PhaseObserver = Callable[[PhaseRecord], None]
"""Called after every metered phase."""


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


# --------------------------------------------------------------------------------------------------
# The daemon
# --------------------------------------------------------------------------------------------------


class Daemon:
    """Sessions, phases, pins and status over one GPU backend."""

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
    ) -> None:
        # Dry-run: the arbiter skips actuation, and the backend itself refuses any clock change.
        backend = ObserveOnlyBackend(backend) if dry_run else backend
        self._backend = backend
        self._controller_name = controller_name
        self._controller_factory = controller_factory
        self._fixed_clocks_mhz = dict(fixed_clocks_mhz or {})
        self._default_lease_ttl_s = default_lease_ttl_s
        self._clock = clock
        self._wall = wall_clock
        # Phases are timed on the backend's clock when it has its own (the simulator's accelerated
        # time), so durations and energy agree; leases and pins stay on the real clocks.
        self._phase_clock = phase_clock if phase_clock is not None else clock
        self._started_s = clock()
        self._mono_to_unix_s = wall_clock() - clock()
        self._lock = threading.RLock()
        self._stopping = False
        self._sessions = SessionRegistry()
        self._attachments: dict[str, Attachment] = {}
        self._closed_decisions: deque[tuple[str, tuple[Decision, ...]]] = deque(maxlen=CLOSED_SESSIONS_KEPT)
        self._identities: tuple[GpuIdentity, ...] = tuple(backend.inventory())
        self._by_uuid = {g.uuid: g.index for g in self._identities}
        self._by_index = {g.index: g for g in self._identities}
        self._supported: dict[int, tuple[int, ...]] = {
            g.index: _supported_or_none(backend, g.index) for g in self._identities
        }
        self._check_fixed_clocks()
        files.ensure_private_dir(state_dir, "--state-dir")
        self.access = Access(
            self._identities,
            state_dir,
            tenancy=tenancy,
            shared_socket=socket_path,
            grant_dir=grant_dir,
            gpu_socket_dir=gpu_socket_dir,
            clock=clock,
            wall_clock=wall_clock,
        )
        self._pins = PinStore(state_dir)
        self._arbiter = ClockArbiter(
            backend,
            Ledger(state_dir),
            dry_run=dry_run,
            clock=clock,
            max_workers=clock_workers,
            apply_timeout_s=apply_timeout_s,
            change_limiter=ClockChangeLimiter(max_clock_changes_per_s),
        )
        self.rpc_observers: list[RpcObserver] = []
        self.phase_observers: list[PhaseObserver] = []
        self._reaper: threading.Thread | None = None
        self._reaper_stop = threading.Event()

    # -- life cycle ---------------------------------------------------------------------------------

    def _check_fixed_clocks(self) -> None:
        for kind, mhz in self._fixed_clocks_mhz.items():
            for index, supported in self._supported.items():
                if supported and mhz not in supported:
                    raise ConfigError(
                        f"--fixed-clocks: {kind.value}={mhz} MHz is not supported by GPU {index}; "
                        + nearest_supported_text(supported, mhz)
                    )

    def start(self) -> None:
        """Reset every GPU a previous daemon left locked, then re-apply the persisted admin pins.

        A corrupt ledger names nothing: every GPU is reset and the file set aside (the arbiter). A pin read
        from disk is checked as the Pin RPC checks one: a pin for a GPU not on this node, or of a clock its
        GPU does not support, is dropped with one ``pin_dropped`` warning (never applied, degraded and
        retried forever); wrong types were dropped when the file was read (:mod:`eerld.clocks.pins`).
        """
        reset = self._arbiter.recover_from_ledger()
        log.info("daemon_start", gpus=len(self._identities), ledger_reset=reset, dry_run=self.dry_run)
        now_unix = self._wall()
        pins: list[Pin] = []
        indices: list[int] = []
        dropped: list[str] = []
        for uuid, pin in self._pins.all().items():
            index = self._by_uuid.get(uuid)
            if pin.expired(now_unix):
                dropped.append(uuid)
                continue
            if index is None:
                self._pins.warn_dropped(uuid, "no GPU with this UUID on this node")
                dropped.append(uuid)
                continue
            try:
                mems: Sequence[int] = (
                    self._backend.supported_mem_clocks_mhz(index) if pin.mem_clock_mhz else ()
                )
            except GpuError:
                mems = ()
            problem = pin_problem(pin, self._supported[index], mems)
            if problem:
                self._pins.warn_dropped(uuid, f"GPU {index}: {problem}")
                dropped.append(uuid)
                continue
            pins.append(pin)
            indices.append(index)
        self._pins.remove_many(dropped)
        self._pins.flush()
        if pins:
            self._arbiter.set_pins(pins, indices)
            log.info("pins_restored", gpu_indices=indices)

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
        """Expire leases and pins, retry degraded GPUs (the reaper calls this; tests call it directly)."""
        now_s = self._clock()
        for session in self._sessions.expired(now_s):
            self._close(session, reason="lease expired")
        expired_grants = self.access.expired()
        if expired_grants:
            self._close_granted(expired_grants, reason="grant expired")
        now_unix = self._wall()
        expired = [p for p in self._pins.all().values() if p.expired(now_unix)]
        if expired:
            indices = [self._by_uuid[p.uuid] for p in expired if p.uuid in self._by_uuid]
            self._pins.remove_many([p.uuid for p in expired])
            self._arbiter.clear_pins(indices)
            log.info("pins_expired", gpu_indices=indices)
        self._arbiter.retry_degraded()
        self._pins.flush()

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

    def resolve_gpus(self, selectors: Sequence[GpuSelector]) -> tuple[int, ...]:
        """Indices of the selected GPUs; NotFound naming the field for an unknown GPU."""
        indices: list[int] = []
        for sel in selectors:
            if sel.uuid is not None:
                if sel.uuid not in self._by_uuid:
                    raise NotFound(f"{sel.field}: no GPU with UUID {sel.uuid!r} on this node")
                index = self._by_uuid[sel.uuid]
            else:
                assert sel.index is not None
                if sel.index not in self._by_index:
                    raise NotFound(
                        f"{sel.field}: no GPU with index {sel.index} on this node "
                        f"({len(self._identities)} GPUs: 0-{len(self._identities) - 1})"
                    )
                index = sel.index
            if index in indices:
                raise ValidationError(sel.field, f"GPU {index} is listed twice")
            indices.append(index)
        return tuple(indices)

    def open_session(self, spec: SessionSpec, grant: str = SHARED_NAME) -> OpenedSession:
        """Claim the spec's GPUs exclusively (if ``grant``'s socket may) and start a session."""
        self._check_running()
        requested = self.resolve_gpus(spec.gpus) if spec.gpus else ()
        authorization = self.access.authorize(grant, spec.job_id, requested, spec.claim_tickets)
        indices = authorization.gpu_indices
        supported = self._common_clocks(indices)
        kinds = spec.role.kinds()
        threshold = spec.throughput_threshold or DEFAULT_THROUGHPUT_THRESHOLD
        settings = ControllerSettings(
            supported_sm_clocks_mhz=supported,
            kinds=kinds,
            mode=spec.mode,
            throughput_threshold=threshold,
            fixed_clocks_mhz={k: v for k, v in self._fixed_clocks_mhz.items() if k in kinds},
        )
        now_s = self._clock()
        try:
            controller = self._controller_factory(settings)
        except ControllerSettingsError as e:  # the controller's own error tree, in the daemon's words
            raise ValidationError(e.field, e.problem) from e
        session = Session(
            SessionRegistry.new_session_id(),
            spec,
            indices,
            controller,
            supported_sm_clocks_mhz=supported,
            throughput_threshold=threshold,
            lease_ttl_s=spec.lease_ttl_s or self._default_lease_ttl_s,
            opened_at_unix_s=self._wall(),
            now_s=now_s,
            grant=grant,
            authority=authorization.authority,
            granted_by=authorization.granted_by,
        )
        with self._lock:
            self._check_running()
            self._sessions.add(session)
        self._arbiter.set_session(indices, session.session_id, None)
        log.info(
            "session_open",
            session_id=_short(session.session_id),
            job_id=spec.job_id,
            rank=spec.rank,
            gpu_indices=list(indices),
            gpu_uuids=[self._by_index[i].uuid for i in indices],
            mode=spec.mode.value,
            role=spec.role.value,
            client=spec.client_name,
            grant=grant,
        )
        return OpenedSession(session.session_id, session.lease_ttl_s, tuple(self._info(i) for i in indices))

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
        log.info("session_attached", session_id=_short(session_id))
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

    def _close(self, session: Session, *, reason: str, reset: bool = True) -> ClosedSession:
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
        try:
            history = tuple(session.controller.decisions())
        except Exception:
            history = ()
        self._closed_decisions.append((session.session_id, history))
        totals = _totals(session)
        log.info(
            "session_close",
            session_id=_short(session.session_id),
            job_id=session.spec.job_id,
            rank=session.spec.rank,
            gpu_indices=list(session.gpu_indices),
            gpu_uuids=[self._by_index[i].uuid for i in session.gpu_indices],
            reason=reason,
            energy_mj=totals.energy_mj,
        )
        return totals

    # -- phases -------------------------------------------------------------------------------------

    def begin_phase(
        self, session_id: str, kind: PhaseKind, iteration: int, hints: Workload | None
    ) -> BeganPhase:
        """Decide the phase's clock, apply it to the session's GPUs, read it back, start metering."""
        self._check_running()
        session = self._sessions.get(session_id)
        with session.lock:
            if session.closed:
                raise NotFound("session_id: no open session with this id")
            session.check_begin(kind, iteration)
            abandoned = session.active
            if abandoned is not None:
                log.warning(
                    "phase_abandoned",
                    session_id=_short(session.session_id),
                    kind=abandoned.kind.value,
                    iteration=abandoned.iteration,
                    reason="a new phase began before it ended (its EndPhase was lost or refused)",
                )
            now_s = self._clock()
            decision = self._decide(session, kind, iteration, hints, self._phase_clock())
            clocks = self._arbiter.set_session(session.gpu_indices, session.session_id, decision.sm_clock_mhz)
            begin = read_counters(self._backend, session.gpu_indices, self._phase_clock())
            held = _held_clock(clocks, decision.sm_clock_mhz)
            session.active = ActivePhase(kind, iteration, held, begin)
            session.last_iteration = iteration
            session.last_decision[kind] = decision
            session.renew(now_s)
        return BeganPhase(tuple(clocks), decision.state, decision.sm_clock_mhz, abandoned is not None)

    def _decide(
        self, session: Session, kind: PhaseKind, iteration: int, hints: Workload | None, now_s: float
    ) -> Decision:
        try:
            decision = session.controller.decide(kind, iteration, hints, now_s)
        except Exception:
            log.exception("controller_error", session_id=_short(session.session_id), kind=kind.value)
            return Decision(kind, iteration, None, ControllerState.OFF, "controller error: default", now_s)
        supported = session.supported_sm_clocks_mhz
        if decision.sm_clock_mhz is not None and supported and decision.sm_clock_mhz not in supported:
            log.warning(
                "controller_unsupported_clock",
                session_id=_short(session.session_id),
                sm_clock_mhz=decision.sm_clock_mhz,
            )
            snapped = nearest_supported_mhz(supported, decision.sm_clock_mhz)
            decision = Decision(kind, iteration, snapped, decision.state, decision.reason, decision.time_s)
        return decision

    def _common_clocks(self, indices: Sequence[int]) -> tuple[int, ...]:
        supported = set(self._supported[indices[0]])
        for index in indices[1:]:
            supported &= set(self._supported[index])
        return tuple(sorted(supported))

    def end_phase(self, session_id: str, kind: PhaseKind, iteration: int, workload: Workload) -> EndedPhase:
        """Meter the running phase, attribute it to (session, kind, iteration) and tell the controller."""
        self._check_running()
        session = self._sessions.get(session_id)
        with session.lock:
            if session.closed:
                raise NotFound("session_id: no open session with this id")
            active = session.check_end(kind, iteration)
            end = read_counters(self._backend, session.gpu_indices, self._phase_clock())
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
            )
            session.active = None
            session.last_ended[kind] = iteration
            session.totals[kind].add(
                energy.energy_mj, workload.valid_tokens, workload.tokens, energy.duration_s
            )
            session.renew(self._clock())
            self._observe(session, observation, now_s)
            state = self._state_of(session, kind)
        if energy.counter_reset or not energy.complete:
            log.warning(
                "energy_incomplete",
                session_id=_short(session_id),
                counter_reset=energy.counter_reset,
                complete=energy.complete,
            )
        if session.spec.mode is ExecutionMode.ASYNC:
            for peer in self._sessions.peers(session):
                with peer.lock:
                    if not peer.closed:
                        self._observe(peer, observation, now_s)
        if self.phase_observers:  # metrics on: tell them (nothing to build otherwise)
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
            for observer in list(self.phase_observers):
                try:
                    observer(record)
                except Exception:
                    log.exception("phase_observer_error")
        return EndedPhase(energy.duration_s, energy.energy_mj, energy.mean_power_w, state)

    def _observe(self, session: Session, observation: PhaseObservation, now_s: float) -> None:
        try:
            session.controller.observe(observation, now_s)
        except Exception:
            log.exception("controller_error", session_id=_short(session.session_id))

    def _state_of(self, session: Session, kind: PhaseKind) -> ControllerState:
        try:
            state = session.controller.state_of(kind)
        except Exception:
            log.exception("controller_error", session_id=_short(session.session_id))
            state = None
        if state is not None:
            return state
        last = session.last_decision.get(kind)
        return last.state if last else ControllerState.OFF

    @staticmethod
    def _snapshots(session: Session) -> Sequence[PhaseSnapshot]:
        try:
            return session.controller.snapshot()
        except Exception:
            log.exception("controller_error", session_id=_short(session.session_id))
            return ()

    # -- admin --------------------------------------------------------------------------------------

    def pin(
        self,
        selectors: Sequence[GpuSelector] | None,
        sm_clock_mhz: int,
        mem_clock_mhz: int,
        duration_s: float,
        reason: str,
    ) -> list[AppliedClock]:
        """Pin GPUs (None: all) to a supported clock, durably, until unpinned or expired."""
        self._check_running()
        indices = self._select(selectors)
        for index in indices:
            supported = self._supported[index]
            if supported and sm_clock_mhz not in supported:
                raise ValidationError(
                    "sm_clock_mhz",
                    f"{sm_clock_mhz} MHz is not supported by GPU {index}; "
                    + nearest_supported_text(supported, sm_clock_mhz),
                )
            if mem_clock_mhz:
                try:
                    mems = self._backend.supported_mem_clocks_mhz(index)
                except GpuError:
                    mems = []
                if mems and mem_clock_mhz not in mems:
                    raise ValidationError(
                        "mem_clock_mhz",
                        f"{mem_clock_mhz} MHz is not supported by GPU {index}; "
                        f"supported: {', '.join(str(c) for c in sorted(mems))} MHz",
                    )
        spent = self._arbiter.over_rate(indices)
        if spent and not self.dry_run:
            raise Exhausted(
                f"GPU {spent[0]} changed clocks more often than its limit allows in the last seconds; "
                "retry in a second (--max-clock-changes-per-s)"
            )
        now_unix = self._wall()
        pins = [
            Pin(
                uuid=self._by_index[i].uuid,
                sm_clock_mhz=sm_clock_mhz,
                mem_clock_mhz=mem_clock_mhz,
                reason=reason,
                created_at_unix_s=now_unix,
                expires_at_unix_s=now_unix + duration_s if duration_s > 0 else 0.0,
            )
            for i in indices
        ]
        self._pins.put_many(pins)
        results = self._arbiter.set_pins(pins, indices)
        log.info(
            "pin", gpu_indices=list(indices), sm_clock_mhz=sm_clock_mhz, reason=reason, duration_s=duration_s
        )
        self._notify(indices, f"admin pin at {sm_clock_mhz} MHz on GPU(s) {_fmt(indices)}: {reason}")
        return results

    def unpin(self, selectors: Sequence[GpuSelector] | None) -> list[AppliedClock]:
        """Remove pins; the holding session or the default governor decides again."""
        self._check_running()
        indices = self._select(selectors)
        self._pins.remove_many([self._by_index[i].uuid for i in indices])
        results = self._arbiter.clear_pins(indices)
        log.info("unpin", gpu_indices=list(indices))
        self._notify(indices, f"admin pin removed on GPU(s) {_fmt(indices)}")
        return results

    def reset(self, selectors: Sequence[GpuSelector] | None, reason: str) -> ResetOutcome:
        """Remove pins of the GPUs, close the sessions holding them, and return them to default clocks."""
        self._check_running()
        indices = self._select(selectors)
        closed: list[str] = []
        for index in indices:
            holder = self._sessions.holder(index)
            if holder is not None and holder.session_id not in closed:
                self._notify(holder.gpu_indices, f"session closed by admin reset: {reason}")
                self._close(holder, reason=f"admin reset: {reason}")
                closed.append(holder.session_id)
        self._pins.remove_many([self._by_index[i].uuid for i in indices])
        results = self._arbiter.clear_pins(indices)
        log.info("admin_reset", gpu_indices=list(indices), reason=reason, closed_sessions=len(closed))
        return ResetOutcome(tuple(results), tuple(closed))

    def _select(self, selectors: Sequence[GpuSelector] | None) -> tuple[int, ...]:
        if selectors is None:
            return tuple(g.index for g in self._identities)
        return self.resolve_gpus(selectors)

    def _notify(self, indices: Sequence[int], message: str) -> None:
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

    # -- grants -------------------------------------------------------------------------------------

    def open_grants(self) -> None:
        """Open the per-GPU sockets and the persisted grants (after :meth:`start`, once serving)."""
        self.access.restore()

    def grant(self, spec: GrantSpec) -> GrantOutcome:
        """Create a scoped worker socket for the spec's GPUs (with replace: revoke the grants in its way)."""
        self._check_running()
        indices = self.resolve_gpus(spec.gpus)
        grant, replaced = self.access.create(spec, indices)
        if replaced:
            self._close_granted(replaced, reason=f"grant replaced by {grant.name}")
        log.info(
            "grant",
            grant=grant.name,
            gpu_indices=list(indices),
            uid=grant.uid,
            gid=grant.gid,
            job_id=grant.job_id,
            expires_at_unix_s=grant.expires_at_unix_s,
            replaced=[g.name for g in replaced],
            reason=grant.reason,
        )
        return GrantOutcome(self._grant_view(grant), tuple(g.name for g in replaced))

    def revoke(self, name: str | None, job_id: str | None, reason: str) -> RevokeOutcome:
        """Remove grants by name or job: their sockets close, their sessions end, their GPUs reset."""
        self._check_running()
        removed = self.access.remove(name, job_id)
        closed, clocks = self._close_granted(removed, reason=f"grant revoked: {reason}")
        log.info("revoke", grants=[g.name for g in removed], reason=reason, closed_sessions=len(closed))
        return RevokeOutcome(tuple(g.name for g in removed), tuple(clocks), tuple(closed))

    def _close_granted(self, grants: Sequence[Grant], *, reason: str) -> tuple[list[str], list[AppliedClock]]:
        """Close every session whose authority came from these grants, and return their GPUs to default."""
        sessions = self._sessions.of_grants({g.name for g in grants})
        for session in sessions:
            self._notify(session.gpu_indices, f"session closed: {reason}")
            self._close(session, reason=reason)
        indices = sorted({i for g in grants for i in self.access.indices(g)})
        free = [i for i in indices if self._sessions.holder(i) is None]
        clocks = self._arbiter.set_session(free, None, None) if free else []
        return [s.session_id for s in sessions], clocks

    def grants(self) -> tuple[GrantView, ...]:
        """Every worker socket with its GPUs and open sessions."""
        return tuple(self._grant_view(g) for g in self.access.all())

    def _grant_view(self, grant: Grant) -> GrantView:
        sessions = len(self._sessions.of_grants({grant.name}))
        return GrantView(grant, tuple(self._info(i) for i in self.access.indices(grant)), sessions)

    def issue_claim_ticket(self, grant: str) -> TicketView:
        """A one-time ticket for the GPUs of ``grant``'s socket, to show on another socket of the job."""
        self._check_running()
        ticket = self.access.issue_ticket(grant)
        gpus = tuple(self._info(i) for i in self.access.indices(ticket.grant))
        return TicketView(ticket.ticket, gpus, max(0.0, ticket.expires_s - self._clock()))

    # -- reads --------------------------------------------------------------------------------------

    def _info(self, index: int) -> GpuInfoView:
        identity = self._by_index[index]
        supported = self._supported[index]
        return GpuInfoView(
            index=index,
            uuid=identity.uuid,
            name=identity.name,
            pci_bus_id=identity.pci_bus_id,
            min_sm_clock_mhz=min(supported) if supported else 0,
            max_sm_clock_mhz=max(supported) if supported else 0,
        )

    def daemon_info(self) -> DaemonView:
        """Version, backend, controller, mode and uptime."""
        return DaemonView(
            version=VERSION,
            backend=self._backend.name,
            controller=self._controller_name,
            dry_run=self.dry_run,
            uptime_s=self._clock() - self._started_s,
            hostname=socket.gethostname(),
        )

    def gpu_status(self) -> tuple[GpuStatusView, ...]:
        """Every GPU of the node now (reads the backend; a failed read shows as zero and a reason)."""
        return tuple(self._gpu_status(g.index) for g in self._identities)

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
            info=self._info(index),
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
        )

    def sessions(self) -> tuple[SessionView, ...]:
        """Every open session with its per-phase view."""
        return tuple(self._session_view(s) for s in self._sessions.all())

    def _session_view(self, session: Session) -> SessionView:
        now_s = self._clock()
        snaps = {s.kind: s for s in self._snapshots(session)}
        phases: list[PhaseStatusView] = []
        for kind in session.kinds:
            totals = session.totals[kind]
            snap = snaps.get(kind)
            last = session.last_decision.get(kind)
            state = snap.state if snap else (last.state if last else ControllerState.OFF)
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
        )

    def status(self) -> StatusView:
        """The whole node: daemon, GPUs, sessions."""
        return StatusView(self.daemon_info(), self.gpu_status(), self.sessions(), self.grants())

    def decisions(
        self,
        session_id: str | None = None,
        kind: PhaseKind | None = None,
        limit: int = DEFAULT_DECISIONS_LIMIT,
    ) -> tuple[DecisionView, ...]:
        """Controller decisions, oldest first, the newest ``limit``; NotFound for an unknown session."""
        histories: list[tuple[str, Sequence[Decision]]] = list(self._closed_decisions)
        for session in self._sessions.all():
            try:
                histories.append((session.session_id, session.controller.decisions()))
            except Exception:
                log.exception("controller_error", session_id=_short(session.session_id))
        if session_id is not None:
            histories = [h for h in histories if h[0] == session_id]
            if not histories:
                raise NotFound("session_id: no session with this id")
        views = [
            DecisionView(sid, d, d.time_s + self._mono_to_unix_s)
            for sid, history in histories
            for d in history
            if kind is None or d.kind == kind
        ]
        views.sort(key=lambda v: v.timestamp_unix_s)
        return tuple(views[-limit:]) if limit > 0 else ()


def _supported_or_none(backend: GpuBackend, index: int) -> tuple[int, ...]:
    """A GPU's supported SM clocks; () when the query fails, so one bad GPU never stops the daemon."""
    try:
        return tuple(sorted(backend.supported_sm_clocks_mhz(index)))
    except GpuError as e:
        log.warning("gpu_clocks_unknown", gpu_index=index, reason=f"{type(e).__name__}: {e}")
        return ()


def _totals(session: Session) -> ClosedSession:
    return ClosedSession(
        energy_mj=sum(t.energy_mj for t in session.totals.values()),
        valid_tokens=sum(t.valid_tokens for t in session.totals.values()),
    )


def _held_clock(clocks: Sequence[AppliedClock], wanted: int | None) -> int | None:
    """The lock that holds during the phase: the pin's when pinned, none in dry-run, else the decision's."""
    if any(c.dry_run for c in clocks):
        return None
    for c in clocks:
        if c.source is ClockSource.ADMIN_PIN and c.requested_sm_clock_mhz is not None:
            return c.requested_sm_clock_mhz
    return wanted


def _short(session_id: str) -> str:
    """A log-safe prefix of a session token (the full token is a credential)."""
    return session_id[:8]


def _fmt(indices: Sequence[int]) -> str:
    return ", ".join(str(i) for i in indices)


__all__ = [
    "Attachment",
    "BeganPhase",
    "ClosedSession",
    "Daemon",
    "DaemonView",
    "DecisionView",
    "EndedPhase",
    "GpuInfoView",
    "GpuStatusView",
    "GrantOutcome",
    "GrantView",
    "OpenedSession",
    "PhaseRecord",
    "PhaseStatusView",
    "ResetOutcome",
    "RevokeOutcome",
    "SessionView",
    "StatusView",
    "TicketView",
]
