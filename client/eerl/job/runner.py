"""What a job object (:class:`eerl.ray.RayJob`, :class:`eerl.dist.DistJob`) shares with :class:`eerl.Session`:
``phase(kind, iteration)`` as a context manager with ``report(...)``, so that a framework hook takes either.

:class:`JobRunner` keeps the phase bookkeeping (the iteration counter per kind, the open phases, each
iteration's wall time and valid tokens for the job-level controller's iteration guard) and leaves the fan-out
to its subclass: ``_begin`` before a phase, ``_end`` after it, ``_iteration_done`` when the next iteration's
first phase begins (or at :meth:`JobRunner.close`). Fail-open: an exception in any of them is swallowed
with one warning, and the phase runs whatever happened.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from types import TracebackType

from eerl._tally import ReportsToInnermost, WorkloadTally
from eerl.directives import Directive
from eerl.errors import ConfigError
from eerl.phases import PhaseKind, Workload
from eerl.wire.limits import to_count

__all__ = ["JobPhase", "JobRunner"]

logger = logging.getLogger("eerl")

Clock = Callable[[], float]

_DIRECTIVES_KEPT = 64
"""Directives remembered for :meth:`JobRunner.directive` (the oldest half is forgotten beyond this)."""


class JobPhase(WorkloadTally):
    """One phase of one iteration of the whole job.

    ``with job.phase("generation", i) as p: p.report(...)``, as with :meth:`eerl.Session.phase`.
    """

    __slots__ = ("_iteration", "_iteration_spec", "_job", "_kind", "hints")

    def __init__(
        self, job: JobRunner, kind: PhaseKind, iteration: int | None, hints: Workload | None
    ) -> None:
        self._job = job
        self._kind = kind
        self._iteration_spec = iteration
        self._iteration = -1
        self.hints = hints
        super().__init__()

    @property
    def kind(self) -> PhaseKind:
        return self._kind

    @property
    def iteration(self) -> int:
        """The iteration of this phase (-1 before it began)."""
        return self._iteration

    def __enter__(self) -> JobPhase:
        self._job._enter(self)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._job._exit(self)


class JobRunner(ReportsToInnermost, ABC):
    """The phase bookkeeping of a job object; see the module docstring."""

    def __init__(self, *, clock: Clock = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.RLock()
        self._next_iteration: dict[PhaseKind, int] = {}
        self._stack: list[JobPhase] = []
        self._current: int | None = None
        self._current_start_s = 0.0
        self._current_valid_tokens = 0
        self._last_done = -1
        self._directives: dict[tuple[PhaseKind, int], Directive | None] = {}
        self._warned: set[str] = set()
        self._closed = False

    # -- the Session-like surface ---------------------------------------------------------------------

    def phase(
        self,
        kind: str | PhaseKind,
        iteration: int | None = None,
        *,
        hints: Workload | None = None,
        wait_for_clock_s: float = 0.0,
    ) -> JobPhase:
        """A phase of ``kind`` for the whole job (``iteration`` None: counts up per kind).

        ``wait_for_clock_s`` is accepted for :meth:`eerl.Session.phase`'s sake: the begin fan-out is
        synchronous (bounded by the job's deadline), so the clock has landed when the phase starts.
        """
        if hints is not None and not isinstance(hints, Workload):
            raise ConfigError(f"hints: {type(hints).__name__} is not an eerl.Workload")
        return JobPhase(self, PhaseKind.parse(kind), iteration, hints)

    def _innermost(self) -> JobPhase | None:
        """The phase :meth:`report` reports to: the innermost open one."""
        return self._stack[-1] if self._stack else None

    def directive(self, kind: PhaseKind, iteration: int) -> Directive | None:
        """The directive sent for a recent phase (None: none was)."""
        return self._directives.get((kind, iteration))

    def end_iteration(
        self, iteration: int, wall_s: float | None = None, valid_tokens: int | None = None
    ) -> None:
        """Closes ``iteration`` for the controller's iteration guard (done on its own when the next
        iteration's first phase begins; call it to give the job's own wall time or token count)."""
        with self._lock:
            if iteration <= self._last_done:
                return
            now = self._clock()
            if wall_s is None:
                wall_s = now - self._current_start_s if self._current == iteration else 0.0
            if valid_tokens is None:
                valid_tokens = self._current_valid_tokens if self._current == iteration else 0
            self._last_done = iteration
            if self._current == iteration:
                self._current = None
            self._guarded("end_iteration", self._iteration_done, iteration, wall_s, valid_tokens)

    def close(self) -> None:
        """Ends the open iteration and releases the nodes (idempotent)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            if self._current is not None:
                self.end_iteration(self._current)
        self._guarded("close", self._close)

    def __enter__(self) -> JobRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- for subclasses -------------------------------------------------------------------------------

    @abstractmethod
    def _begin(self, kind: PhaseKind, iteration: int) -> None: ...

    @abstractmethod
    def _end(self, kind: PhaseKind, iteration: int, workload: Workload) -> None: ...

    @abstractmethod
    def _iteration_done(self, iteration: int, wall_s: float, valid_tokens: int) -> None: ...

    def _close(self) -> None:
        return None

    def _remember_directive(self, kind: PhaseKind, iteration: int, directive: Directive | None) -> None:
        """Keeps the directive sent for a phase, for :meth:`directive` (the most recent ones only)."""
        directives = self._directives
        directives[(kind, iteration)] = directive
        if len(directives) > _DIRECTIVES_KEPT:
            for key in list(directives)[: -(_DIRECTIVES_KEPT // 2)]:
                del directives[key]

    def _warn_once(self, key: str, message: str, *, exc_info: bool = False) -> None:
        if key in self._warned:
            logger.debug("eerl: %s", message, exc_info=exc_info)
            return
        self._warned.add(key)
        logger.warning("eerl: %s", message, exc_info=exc_info)

    # -- called by JobPhase ---------------------------------------------------------------------------

    def _enter(self, phase: JobPhase) -> None:
        with self._lock:
            given = phase._iteration_spec
            kind = phase.kind
            if given is None:
                iteration = self._next_iteration.get(kind, 0)
            else:
                counted = to_count(given) if type(given) is not int else given
                iteration = -1 if counted is None else counted
            phase._iteration = iteration
            self._stack.append(phase)
            if iteration < 0 or self._closed:
                return
            self._next_iteration[kind] = iteration + 1
            if self._current != iteration:
                if self._current is not None and self._current < iteration:
                    self.end_iteration(self._current)
                if iteration > self._last_done:
                    self._current = iteration
                    self._current_start_s = self._clock()
                    self._current_valid_tokens = 0
        self._guarded("begin", self._begin, kind, iteration)

    def _exit(self, phase: JobPhase) -> None:
        with self._lock:
            if phase in self._stack:
                self._stack.remove(phase)
            if phase.iteration < 0 or self._closed:
                return
            workload = phase.workload
            if self._current == phase.iteration:
                self._current_valid_tokens += workload.valid_tokens
        self._guarded("end", self._end, phase.kind, phase.iteration, workload)

    def _guarded(self, what: str, function: Callable[..., None], *args: object) -> None:
        try:
            function(*args)
        except Exception:
            self._warn_once(
                f"bug:{what}",
                f"job-level control failed in {what}; the job goes on (the nodes fall back)",
                exc_info=True,
            )
