"""Job mode in the daemon: what it remembers of each job-mode session and job (docs/multinode.md).

The policy — which directive is applied and what runs instead — is not here: it is the pure
:mod:`eerl.job.admission` (``judge``, the fallback, the verdicts in order), next to the job-level controller
that writes the directives. This module holds the daemon's state that the policy reads and that accepted
directives change: the newest incarnation per job (:class:`IncarnationBook`), each session's accepted epochs,
committed clocks and trials (:class:`JobState`, an :class:`eerl.job.admission.Accepted`), and each session's
decision history (for GetDecisions).
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field

from eerl.control.base import Decision
from eerl.directives import DirectivePurpose, DirectiveVerdict
from eerl.job.admission import DEFAULT_TRIAL_WINDOW_S, CommittedClock, ReceivedDirective, Ruling
from eerl.phases import PhaseKind

from eerld.sessions import JobModeSpec

MAX_JOBS_REMEMBERED = 4096
"""Newest incarnations kept per worker socket (least recently used dropped first), so that job ids cannot grow
memory, and the jobs one socket opens never push another socket's out of the book."""
HISTORY = 512
"""Job-mode decisions kept per session (for GetDecisions)."""


@dataclass(frozen=True, slots=True)
class JobDecision:
    """A job-mode phase's decision with the directive it carried and the verdict."""

    decision: Decision
    directive: ReceivedDirective | None
    verdict: DirectiveVerdict


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
    """A job-mode session's memory of accepted directives (an :class:`eerl.job.admission.Accepted`); guarded
    by the session's lock."""

    key: tuple[str, str]
    """(worker socket, job id): the :class:`IncarnationBook` key."""
    spec: JobModeSpec
    trial_window_s: float = DEFAULT_TRIAL_WINDOW_S
    """The policy's trial window: trials older than this are forgotten when a new one is recorded."""
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

    def record(self, ruling: Ruling, kind: PhaseKind, now_s: float) -> None:
        """Take an applied ruling in: an accepted directive raises the epoch, counts a trial, or commits."""
        self.last[kind] = ruling
        got = ruling.directive
        if not ruling.accepted or got is None:
            return
        self.epochs[kind] = (got.incarnation, got.epoch)
        if got.purpose is DirectivePurpose.TRIAL and got.sm_clock_mhz is not None:
            while self.trials and self.trials[0] <= now_s - self.trial_window_s:
                self.trials.popleft()  # out of every later window too: the deque stays bounded
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


__all__ = [
    "HISTORY",
    "MAX_JOBS_REMEMBERED",
    "IncarnationBook",
    "JobDecision",
    "JobSessions",
    "JobState",
]
