"""Sessions: who holds which GPUs, for how long, and where each session is in its phase sequence.

A session owns its GPUs exclusively from OpenSession to its end (close, lease expiry, stream end, admin
reset, daemon stop). This module keeps the bookkeeping and the phase-order rules; it never touches a GPU
and takes time as an argument, so the rules can be tested without a daemon.
"""

from __future__ import annotations

import secrets
import threading
from collections import deque
from dataclasses import dataclass, field

from eerl.control.base import Controller, Decision
from eerl.directives import DirectiveVerdict
from eerl.errors import ValidationError as RefusedReference
from eerl.gpus import GpuId, parse_gpu_ref
from eerl.phases import ExecutionMode, GpuRole, PhaseKind

from eerld.energy import CounterReading
from eerld.errors import Conflict, NotFound, ValidationError

SESSION_ID_BYTES = 24
RECENT_WINDOW = 8
PIN_DECISIONS_KEPT = 64
DEFAULT_MAX_LEASE_TTL_S = 30.0
"""No session's lease is longer, whatever it asks for (``--max-lease-ttl``): a job that dies without closing
and without an Attach stream holds its GPUs at most this long after its last heartbeat or phase event."""


def short_id(session_id: str) -> str:
    """A log-safe prefix of a session token (the full token is a credential)."""
    return session_id[:8]


@dataclass(frozen=True, slots=True)
class GpuSelector:
    """A GPU named by index or UUID in a request; ``field`` is where it came from (``gpus[1]``)."""

    field: str
    index: int | None = None
    uuid: str | None = None

    @classmethod
    def parse(cls, field: str, value: int | str, *, part: str = "") -> GpuSelector:
        """The selector for a reference, by the one rule (:func:`eerl.gpus.parse_gpu_ref`); a value it refuses
        is a :class:`~eerld.errors.ValidationError` on ``field`` + ``part`` (``gpus[1]`` + ``.uuid``)."""
        try:
            ref: GpuId = parse_gpu_ref(value, field=field + part)
        except RefusedReference as e:
            raise ValidationError(e.field, e.problem) from None
        return cls(field, index=ref) if isinstance(ref, int) else cls(field, uuid=ref)


@dataclass(frozen=True, slots=True)
class JobModeSpec:
    """What a job-mode session is opened with (multi-node control; :mod:`eerld.daemon.jobmode`)."""

    incarnation: int
    """The job-level controller's incarnation; an older one than the newest seen for the job is refused."""
    node_rank: int


@dataclass(frozen=True, slots=True)
class SessionSpec:
    """A validated OpenSession request."""

    job_id: str
    rank: int
    world_size: int
    gpus: tuple[GpuSelector, ...]
    mode: ExecutionMode
    role: GpuRole
    throughput_threshold: float | None
    """None: the daemon's default."""
    lease_ttl_s: float | None
    """None: the daemon's default."""
    client_name: str = ""
    claim_tickets: tuple[str, ...] = ()
    """Tickets from other worker sockets, each adding that socket's GPUs to the session's authority."""
    job: JobModeSpec | None = None
    """Job mode: clocks come from the job-level controller's directives; None: the daemon's controller."""


@dataclass(slots=True)
class ActivePhase:
    """A phase between its BeginPhase and EndPhase."""

    kind: PhaseKind
    iteration: int
    sm_clock_mhz: int | None
    begin: CounterReading
    verdict: DirectiveVerdict = DirectiveVerdict.NOT_JOB_MODE
    """The verdict on the phase's directive (job mode), NOT_JOB_MODE otherwise."""
    applied_epoch: int = 0
    """Job mode: the plan epoch of the clock applied (0: the default governor)."""
    gap_before_s: float = 0.0
    """Backend-clock time from the session's previous EndPhase to this begin: the work between the phases,
    at the default governor (0 for the session's first phase)."""
    pinned: bool = False
    """An admin pin held one of the session's GPUs at its begin: the controller neither chose nor learns."""


@dataclass(slots=True)
class PhaseTotals:
    """Metered totals of one phase kind of a session, plus a recent window for rates."""

    phases: int = 0
    energy_mj: float = 0.0
    valid_tokens: int = 0
    tokens: int = 0
    duration_s: float = 0.0
    pinned_phases: int = 0
    """Phases an admin pin held (metered, not fed to the controller)."""
    recent: deque[tuple[float, int, int, float]] = field(default_factory=lambda: deque(maxlen=RECENT_WINDOW))

    def add(self, energy_mj: float, valid_tokens: int, tokens: int, duration_s: float) -> None:
        """Credit one metered phase."""
        self.phases += 1
        self.energy_mj += energy_mj
        self.valid_tokens += valid_tokens
        self.tokens += tokens
        self.duration_s += duration_s
        self.recent.append((energy_mj, valid_tokens, tokens, duration_s))

    def energy_per_valid_token_j(self) -> float:
        """Energy per valid token over the recent window; 0 when no valid tokens were reported."""
        valid = sum(r[1] for r in self.recent)
        return sum(r[0] for r in self.recent) / 1000.0 / valid if valid else 0.0

    def throughput_tokens_per_s(self) -> float:
        """Tokens per second over the recent window; 0 when unknown."""
        duration = sum(r[3] for r in self.recent)
        return sum(r[2] for r in self.recent) / duration if duration > 0 else 0.0


class HeldSession:
    """One open session as the daemon holds it: its GPUs, lease, controller and phase state (the client's
    handle is :class:`eerl.session.Session`). Phase calls of a session are serialised by ``lock``."""

    def __init__(
        self,
        session_id: str,
        spec: SessionSpec,
        gpu_indices: tuple[int, ...],
        controller: Controller,
        *,
        supported_sm_clocks_mhz: tuple[int, ...],
        throughput_threshold: float,
        lease_ttl_s: float,
        opened_at_unix_s: float,
        now_s: float,
        grant: str = "shared",
        authority: frozenset[int] = frozenset(),
        granted_by: frozenset[str] = frozenset({"shared"}),
    ) -> None:
        self.session_id = session_id
        self.grant = grant
        """The name of the worker socket it was opened through."""
        self.authority = authority
        """The GPUs it proved it may claim (its socket's and its tickets'); async peers must share some."""
        self.granted_by = granted_by
        """The grants its authority came from: revoking any of them closes it."""
        self.spec = spec
        self.gpu_indices = gpu_indices
        self.supported_sm_clocks_mhz = supported_sm_clocks_mhz
        """SM clocks every GPU of the session supports, ascending."""
        self.kinds = spec.role.kinds()
        self.controller = controller
        self.throughput_threshold = throughput_threshold
        self.lease_ttl_s = lease_ttl_s
        self.opened_at_unix_s = opened_at_unix_s
        self.lease_expires_s = now_s + lease_ttl_s
        self.attached = False
        self.closed = False
        self.active: ActivePhase | None = None
        self.last_iteration: int | None = None
        self.last_ended: dict[PhaseKind, int] = {}
        self.last_end_time_s: float | None = None
        """Backend-clock time of the last EndPhase's reading (the next phase's gap starts there)."""
        self.held_since_unix_s: float | None = None
        """When the last phase ended (wall clock). Its lock ends with it; a GPU still locked after that
        (a release that failed) shows as held since then."""
        self.totals: dict[PhaseKind, PhaseTotals] = {k: PhaseTotals() for k in self.kinds}
        self.last_decision: dict[PhaseKind, Decision] = {}
        self.pinned_gpus: tuple[int, ...] = ()
        """The session's GPUs an admin pin held at its latest begin (a change is logged once)."""
        self.pin_decisions: deque[Decision] = deque(maxlen=PIN_DECISIONS_KEPT)
        """eerld's own decisions while pinned (the controller's history has none of them)."""
        self.lock = threading.Lock()

    def renew(self, now_s: float) -> None:
        """Push the lease out by one TTL."""
        self.lease_expires_s = now_s + self.lease_ttl_s

    def lease_remaining_s(self, now_s: float) -> float:
        """Seconds until the lease runs out (never negative)."""
        return max(0.0, self.lease_expires_s - now_s)

    def check_begin(self, kind: PhaseKind, iteration: int) -> None:
        """Raise unless ``kind`` may begin at ``iteration`` now; changes nothing.

        A phase still running does not stop a new one: its EndPhase was lost or refused, and refusing
        every later event for it would wedge the session for good (the caller abandons it unmetered).
        """
        if kind not in self.kinds:
            raise ValidationError("kind", f"this session runs {', '.join(k.value for k in self.kinds)} only")
        if self.last_iteration is not None and iteration < self.last_iteration:
            raise Conflict(f"iteration {iteration} goes backwards (last was {self.last_iteration})")
        ended = self.last_ended.get(kind)
        if ended is not None and iteration <= ended:
            raise Conflict(f"phase {kind.value} of iteration {iteration} was already metered")

    def check_end(self, kind: PhaseKind, iteration: int) -> ActivePhase:
        """The running phase if ``kind``/``iteration`` match it; Conflict otherwise; changes nothing."""
        if self.active is None:
            raise Conflict(f"no phase is running; EndPhase({kind.value}, {iteration}) has no BeginPhase")
        if self.active.kind != kind or self.active.iteration != iteration:
            raise Conflict(
                f"the running phase is {self.active.kind.value} of iteration {self.active.iteration}, "
                f"not {kind.value} of iteration {iteration}"
            )
        return self.active


class SessionRegistry:
    """Open sessions by id and the exclusive claim of each GPU; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sessions: dict[str, HeldSession] = {}
        self._claims: dict[int, str] = {}

    @staticmethod
    def new_session_id() -> str:
        """An unguessable token (192 bits from the OS's CSPRNG)."""
        return secrets.token_urlsafe(SESSION_ID_BYTES)

    def add(self, session: HeldSession) -> None:
        """Register a session and claim its GPUs; Conflict naming the holder when one is held."""
        with self._lock:
            for index in session.gpu_indices:
                holder_id = self._claims.get(index)
                if holder_id is not None:
                    holder = self._sessions[holder_id]
                    raise Conflict(
                        f"GPU {index} is held by job {holder.spec.job_id!r} rank {holder.spec.rank} "
                        f"(session opened at {holder.opened_at_unix_s:.0f})"
                    )
            self._sessions[session.session_id] = session
            for index in session.gpu_indices:
                self._claims[index] = session.session_id

    def get(self, session_id: str) -> HeldSession:
        """The open session with this id; NotFound otherwise."""
        session = self._sessions.get(session_id)
        if session is None or session.closed:
            raise NotFound("session_id: no open session with this id")
        return session

    def remove(self, session: HeldSession) -> None:
        """Forget a session and free its GPUs."""
        with self._lock:
            if self._sessions.pop(session.session_id, None) is not None:
                for index in session.gpu_indices:
                    if self._claims.get(index) == session.session_id:
                        del self._claims[index]

    def holder(self, index: int) -> HeldSession | None:
        """The session holding a GPU, if any."""
        with self._lock:
            session_id = self._claims.get(index)
            return self._sessions.get(session_id) if session_id else None

    def all(self) -> list[HeldSession]:
        """Every open session, oldest first."""
        with self._lock:
            return sorted(self._sessions.values(), key=lambda s: s.opened_at_unix_s)

    def expired(self, now_s: float) -> list[HeldSession]:
        """Lease-bound sessions whose lease has run out at ``now_s``."""
        with self._lock:
            return [s for s in self._sessions.values() if not s.attached and now_s >= s.lease_expires_s]

    def peers(self, session: HeldSession) -> list[HeldSession]:
        """Other async sessions of the same job and authority that run another phase kind (the peer pool).

        The job id alone is what a client declares; sharing authority (GPUs proved through the same
        grant, or tickets of each other's sockets) is what the kernel checked.
        """
        with self._lock:
            return [
                s
                for s in self._sessions.values()
                if s is not session
                and s.spec.mode is ExecutionMode.ASYNC
                and s.spec.job_id == session.spec.job_id
                and s.authority & session.authority
                and not set(s.kinds) & set(session.kinds)
            ]

    def of_grants(self, names: set[str]) -> list[HeldSession]:
        """The open sessions whose authority came from any of these grants."""
        with self._lock:
            return [s for s in self._sessions.values() if s.granted_by & names]
