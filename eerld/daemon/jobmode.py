"""Job mode: the daemon's checks on a job-level controller's directive, and the fallback (docs/multinode.md).

A session opened in job mode takes its clock per phase from the directive its BeginPhase carries; its own
controller stays off. The daemon stays the only actuator and judges every directive, in this order (the first
check that fails is the verdict):

1. ``MISSING``: no directive;
2. ``STALE_INCARNATION``: older than the newest incarnation accepted for the job (per worker socket and job
   id);
3. ``STALE_EPOCH``: older than the newest plan epoch accepted in this session for that phase kind and
   incarnation (epochs never go back; the same epoch again is the same plan, resent);
4. ``WRONG_PHASE``: it names another iteration or phase kind than the BeginPhase it rides on;
5. ``BAD_PURPOSE``: no purpose, or an unknown one;
6. ``OFF_GRID``: a clock not on the grid of every GPU of the session (never snapped; 0, the default
   governor, is always on it);
7. ``BELOW_FLOOR``: below the admin's floor;
8. ``TRIAL_BUDGET``: a trial when the session already had ``max_trials`` trials accepted in the window;
9. ``RATE_LIMITED``: the GPUs' clock-change rate limit would refuse the change (checked by the daemon,
   which owns the arbiter, after :func:`judge`).

Anything but ``ACCEPTED`` runs the phase at the fallback: the last accepted committed clock of that phase kind
in this session, else the default governor — never a trial. A refused directive changes nothing: only an
accepted one (or a session that opened) raises the job's incarnation, and only an accepted one the session's
epoch, its trial count or its committed clock.

Pure logic: time comes in as an argument; nothing here touches a GPU or imports gRPC.
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from eerl.control.base import Decision
from eerl.directives import Directive, DirectivePurpose, DirectiveVerdict
from eerl.phases import ControllerState, PhaseKind

from eerld.sessions import JobModeSpec

AUTO_FLOOR_FRACTION = 0.40
"""``--job-clock-floor-mhz auto``: this fraction of the session's top clock. The built-in EE-RL controller's
coarse descent (0.77 × top, then × 0.88 a rung) has its sixth rung at 0.406 × top; its lowest trial in every
built-in bench scenario was the fifth (0.46 × top: 915 of 1980 MHz on H100, 952 of 2062 MHz on GB200)."""
DEFAULT_MAX_TRIALS = 64
"""Trials per window: the EE-RL search makes at most 24 exploration phases per phase kind (48 for a
synchronous session's two kinds), and 22 + 22 in the most restless built-in scenario over 300 iterations."""
DEFAULT_TRIAL_WINDOW_S = 600.0
MAX_JOBS_REMEMBERED = 4096
"""Newest incarnations kept per worker socket (least recently used dropped first), so that job ids cannot grow
memory, and the jobs one socket opens never push another socket's out of the book."""
HISTORY = 512
"""Job-mode decisions kept per session (for GetDecisions)."""

_STATE_OF_PURPOSE = {
    DirectivePurpose.TRIAL: ControllerState.EXPLORING,
    DirectivePurpose.COMMITTED: ControllerState.COMMITTED,
    DirectivePurpose.CONTROL: ControllerState.BASELINE,
}


@dataclass(frozen=True, slots=True)
class JobPolicy:
    """The admin's envelope for job mode (``--job-mode``, ``--job-clock-floor-mhz``, ``--job-max-trials``,
    ``--job-trial-window-s``)."""

    allowed: bool = True
    clock_floor_mhz: int | None = None
    """None: ``auto`` (:data:`AUTO_FLOOR_FRACTION` of the session's top clock); 0: no floor but the grid."""
    max_trials: int = DEFAULT_MAX_TRIALS
    trial_window_s: float = DEFAULT_TRIAL_WINDOW_S

    def floor_mhz(self, supported_mhz: Sequence[int]) -> int:
        """The floor for a session whose GPUs all support ``supported_mhz`` (ascending)."""
        if self.clock_floor_mhz is not None:
            return self.clock_floor_mhz
        return math.ceil(AUTO_FLOOR_FRACTION * supported_mhz[-1]) if supported_mhz else 0


@dataclass(frozen=True, slots=True)
class ReceivedDirective:
    """A directive as it arrived: its kind or purpose may be unknown (the verdict says so, not an error)."""

    incarnation: int
    epoch: int
    iteration: int
    kind: PhaseKind | None
    sm_clock_mhz: int | None
    """None: the default governor (0 on the wire)."""
    purpose: DirectivePurpose | None

    @classmethod
    def of(cls, directive: Directive) -> ReceivedDirective:
        """The received form of a well-formed directive."""
        return cls(
            directive.incarnation,
            directive.epoch,
            directive.iteration,
            directive.kind,
            directive.sm_clock_mhz,
            directive.purpose,
        )

    def describe(self) -> str:
        """``trial 1200 MHz (incarnation 2, epoch 5)``."""
        clock = "default" if self.sm_clock_mhz is None else f"{self.sm_clock_mhz} MHz"
        purpose = self.purpose.value if self.purpose is not None else "no purpose"
        return f"{purpose} {clock} (incarnation {self.incarnation}, epoch {self.epoch})"


@dataclass(frozen=True, slots=True)
class Ruling:
    """The verdict on one phase's directive and the clock the session asks the arbiter for."""

    verdict: DirectiveVerdict
    detail: str
    """Why, in words, when the verdict is not ACCEPTED."""
    directive: ReceivedDirective | None
    sm_clock_mhz: int | None
    """The clock of the phase: the directive's when accepted, else the fallback's."""
    applied_epoch: int
    """The plan epoch of that clock (the fallback's committed directive; 0 for the default governor)."""
    state: ControllerState

    @property
    def accepted(self) -> bool:
        """True when the directive is applied as asked."""
        return self.verdict is DirectiveVerdict.ACCEPTED

    def reason(self) -> str:
        """The decision's reason, for GetDecisions and logs."""
        clock = "default" if self.sm_clock_mhz is None else f"{self.sm_clock_mhz} MHz"
        if self.accepted:
            assert self.directive is not None
            return f"job directive accepted: {self.directive.describe()}"
        epoch = f" (epoch {self.applied_epoch})" if self.applied_epoch else ""
        return f"job directive refused ({self.verdict.value}: {self.detail}); fallback {clock}{epoch}"


@dataclass(frozen=True, slots=True)
class JobDecision:
    """A job-mode phase's decision with the directive it carried and the verdict."""

    decision: Decision
    directive: ReceivedDirective | None
    verdict: DirectiveVerdict


@dataclass(frozen=True, slots=True)
class CommittedClock:
    """The last accepted committed clock of a phase kind: the fallback."""

    sm_clock_mhz: int | None
    epoch: int


class IncarnationBook:
    """The newest incarnation accepted per job, keyed by (worker socket, job id); thread-safe, bounded per
    socket (``capacity`` jobs each).

    Keyed by the socket too, so that a user of another grant cannot fence a job by claiming its job id (a
    job id is only what a client declares; the socket is what the kernel checked); bounded per socket, so
    that such a user cannot unfence one either, by opening job after job until the job's entry is dropped.
    """

    def __init__(self, capacity: int = MAX_JOBS_REMEMBERED) -> None:
        self._capacity = capacity
        self._newest: dict[str, OrderedDict[str, int]] = {}
        self._lock = threading.Lock()

    def newest(self, key: tuple[str, str]) -> int | None:
        """The newest incarnation accepted for the job, None when none was."""
        socket, job_id = key
        with self._lock:
            jobs = self._newest.get(socket)
            return jobs.get(job_id) if jobs is not None else None

    def forget_sockets(self, sockets: set[str]) -> None:
        """Forgets every job of these sockets: their tenancy ended (a grant revoked, expired or replaced; a
        per-GPU socket's GPU left its pod), so a former tenant's incarnation fences nobody who comes next."""
        with self._lock:
            for socket in sockets:
                self._newest.pop(socket, None)

    def accept(self, key: tuple[str, str], incarnation: int) -> None:
        """The incarnation of a session that opened, or of an accepted directive: the newest, if newer."""
        socket, job_id = key
        with self._lock:
            jobs = self._newest.setdefault(socket, OrderedDict())
            newest = jobs.pop(job_id, None)
            jobs[job_id] = incarnation if newest is None else max(newest, incarnation)
            while len(jobs) > self._capacity:
                jobs.popitem(last=False)


@dataclass(slots=True)
class JobState:
    """A job-mode session's memory of accepted directives; guarded by the session's lock."""

    key: tuple[str, str]
    """(worker socket, job id): the :class:`IncarnationBook` key."""
    spec: JobModeSpec
    epochs: dict[PhaseKind, tuple[int, int]] = field(default_factory=dict)
    """Per phase kind: (incarnation, epoch) of the newest accepted directive."""
    committed: dict[PhaseKind, CommittedClock] = field(default_factory=dict)
    trials: deque[float] = field(default_factory=deque)
    """When each accepted trial began (monotonic seconds), oldest first, within the window."""
    last: dict[PhaseKind, Ruling] = field(default_factory=dict)
    _history: deque[JobDecision] = field(default_factory=lambda: deque(maxlen=HISTORY))
    _history_lock: threading.Lock = field(default_factory=threading.Lock)

    def remember(self, decision: JobDecision) -> None:
        """Add a phase's decision to the history (the newest :data:`HISTORY` are kept)."""
        with self._history_lock:
            self._history.append(decision)

    def history(self) -> tuple[JobDecision, ...]:
        """The decisions kept, oldest first (safe to call from any thread)."""
        with self._history_lock:
            return tuple(self._history)

    def fallback(
        self, kind: PhaseKind, verdict: DirectiveVerdict, detail: str, got: ReceivedDirective | None
    ) -> Ruling:
        """The ruling for a refused directive: the last accepted committed clock, else the default."""
        committed = self.committed.get(kind)
        if committed is None or committed.sm_clock_mhz is None:
            return Ruling(verdict, detail, got, None, 0, ControllerState.OFF)
        return Ruling(
            verdict, detail, got, committed.sm_clock_mhz, committed.epoch, ControllerState.COMMITTED
        )

    def trials_in_window(self, now_s: float, window_s: float) -> int:
        """Accepted trials that began within the window ending ``now_s`` (older ones are dropped)."""
        while self.trials and self.trials[0] <= now_s - window_s:
            self.trials.popleft()
        return len(self.trials)

    def record(self, ruling: Ruling, kind: PhaseKind, now_s: float) -> None:
        """Take an applied ruling in: an accepted directive raises the epoch, counts a trial, or commits."""
        self.last[kind] = ruling
        got = ruling.directive
        if not ruling.accepted or got is None:
            return
        self.epochs[kind] = (got.incarnation, got.epoch)
        if got.purpose is DirectivePurpose.TRIAL and got.sm_clock_mhz is not None:
            self.trials.append(now_s)
        elif got.purpose is DirectivePurpose.COMMITTED:
            self.committed[kind] = CommittedClock(got.sm_clock_mhz, got.epoch)


class JobSessions:
    """The job state of every open job-mode session, by session id; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._states: dict[str, JobState] = {}

    def add(self, session_id: str, state: JobState) -> None:
        """Track a job-mode session that just opened."""
        with self._lock:
            self._states[session_id] = state

    def get(self, session_id: str) -> JobState | None:
        """The session's job state; None for a session not in job mode."""
        with self._lock:
            return self._states.get(session_id)

    def remove(self, session_id: str) -> JobState | None:
        """Forget a closed session; its state (for the closed sessions' decisions), None if none."""
        with self._lock:
            return self._states.pop(session_id, None)


def judge(
    job: JobState,
    policy: JobPolicy,
    book: IncarnationBook,
    got: ReceivedDirective | None,
    *,
    kind: PhaseKind,
    iteration: int,
    supported_mhz: Sequence[int],
    now_s: float,
) -> Ruling:
    """Checks 1-8 of the module docstring on one BeginPhase's directive; changes nothing."""

    def refuse(verdict: DirectiveVerdict, detail: str) -> Ruling:
        return job.fallback(kind, verdict, detail, got)

    if got is None:
        return refuse(DirectiveVerdict.MISSING, "this BeginPhase carried no directive")
    newest = book.newest(job.key)
    if newest is not None and got.incarnation < newest:
        return refuse(
            DirectiveVerdict.STALE_INCARNATION,
            f"incarnation {got.incarnation} is older than incarnation {newest} of this job",
        )
    accepted = job.epochs.get(kind)
    if accepted is not None and accepted[0] == got.incarnation and got.epoch < accepted[1]:
        return refuse(
            DirectiveVerdict.STALE_EPOCH,
            f"epoch {got.epoch} is older than epoch {accepted[1]}, already accepted for {kind.value}",
        )
    if got.kind is not kind or got.iteration != iteration:
        named = got.kind.value if got.kind is not None else "no phase kind"
        return refuse(
            DirectiveVerdict.WRONG_PHASE,
            f"the directive is for {named} of iteration {got.iteration}, "
            f"not {kind.value} of iteration {iteration}",
        )
    if got.purpose is None:
        return refuse(DirectiveVerdict.BAD_PURPOSE, "the purpose must be trial, committed or control")
    clock = got.sm_clock_mhz
    if clock is not None:
        if clock not in supported_mhz:
            low, high = (supported_mhz[0], supported_mhz[-1]) if supported_mhz else (0, 0)
            return refuse(
                DirectiveVerdict.OFF_GRID,
                f"{clock} MHz is not a supported clock of every GPU of the session "
                f"({low}-{high} MHz; never snapped)",
            )
        floor = policy.floor_mhz(supported_mhz)
        if clock < floor:
            return refuse(DirectiveVerdict.BELOW_FLOOR, f"{clock} MHz is below the floor of {floor} MHz")
        if got.purpose is DirectivePurpose.TRIAL:
            used = job.trials_in_window(now_s, policy.trial_window_s)
            if used >= policy.max_trials:
                return refuse(
                    DirectiveVerdict.TRIAL_BUDGET,
                    f"{used} trials in the last {policy.trial_window_s:g} s (at most {policy.max_trials})",
                )
    return Ruling(DirectiveVerdict.ACCEPTED, "", got, clock, got.epoch, _STATE_OF_PURPOSE[got.purpose])


def rate_limited(job: JobState, ruling: Ruling, kind: PhaseKind) -> Ruling:
    """Check 9: the ruling for a directive whose change the rate limit refuses (the fallback)."""
    clock = "default" if ruling.sm_clock_mhz is None else f"{ruling.sm_clock_mhz} MHz"
    return job.fallback(
        kind,
        DirectiveVerdict.RATE_LIMITED,
        f"the GPUs' clock-change rate limit refuses {clock} now",
        ruling.directive,
    )


def to_default(ruling: Ruling) -> Ruling:
    """The ruling at the default governor (a committed fallback the rate limit refuses too: a reset is never
    held back)."""
    return Ruling(ruling.verdict, ruling.detail, ruling.directive, None, 0, ControllerState.OFF)


__all__ = [
    "AUTO_FLOOR_FRACTION",
    "DEFAULT_MAX_TRIALS",
    "DEFAULT_TRIAL_WINDOW_S",
    "CommittedClock",
    "IncarnationBook",
    "JobDecision",
    "JobPolicy",
    "JobSessions",
    "JobState",
    "ReceivedDirective",
    "Ruling",
    "judge",
    "rate_limited",
    "to_default",
]
