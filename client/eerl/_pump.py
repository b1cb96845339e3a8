"""The pump: the hand-off from the job's thread to a sender thread, and the rules every sender keeps.

Why a thread: the training thread must never wait for the daemon. It only appends an event to a bounded
queue (:meth:`BackgroundSender.submit`, a few microseconds); a sender thread sends it over a
:class:`eerl.link.DaemonLink` and keeps the answers. Two senders run this pump: the daemon's
(:class:`eerl._sender.Sender`, which holds the session itself) and the sidecar's
(:class:`eerl.sidecar.client.SidecarSender`, whose sidecar holds it). What they share lives here:

* The queue is bounded; when it is full the oldest event is dropped and counted.
* A phase begin that waited longer than ``stale_after_s`` is dropped: the daemon would apply a clock for,
  and meter, a phase it did not see start.
* A phase end is sent only if its begin was taken within the same session; so a reopened session starts
  clean at the next phase begin, and nothing stale is re-sent.
* Every call has a deadline; a failed event is dropped, never retried.
* Nothing the daemon would refuse, or protobuf could not encode, is sent: every workload and iteration is
  checked first (:mod:`eerl.wire.limits`; a bad value is clamped or dropped, with one warning per kind).
* One event that raises something unexpected is dropped (one warning); the thread carries on.
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from eerl._answers import PhaseAnswer
from eerl.config import ClientConfig
from eerl.link.base import Code, DaemonLink, LinkError
from eerl.phases import PhaseKind, Workload
from eerl.reports import SessionReport
from eerl.v1 import eerl_pb2
from eerl.wire.enums import KIND_TO_PB, workload_to_pb
from eerl.wire.limits import Finding, Problem, check_iteration, check_workload

logger = logging.getLogger("eerl")

ANSWERS_KEPT = 64
"""The daemon's answers (begins and ends) that :meth:`BackgroundSender.answer` can still return; also the
begins whose end may still come."""

_Reply = eerl_pb2.BeginPhaseResponse | eerl_pb2.EndPhaseResponse


@dataclass(slots=True)
class Event:
    """One phase event, or a flush marker (``kind`` None) that only sets ``done``.

    ``iteration`` and the workload's fields are as the job gave them (checked by the sender);
    ``rejected`` counts the reported values the caller's thread could not read as numbers (dropped),
    ``rejected_what`` names the first.
    """

    begin: bool
    kind: PhaseKind | None
    iteration: object
    phase_id: int
    workload: Workload | None
    enqueued_s: float
    done: threading.Event | None = None
    rejected: int = 0
    rejected_what: str = ""


@dataclass(frozen=True, slots=True)
class ClientStats:
    """What the sender has done so far; for logs, tests and the curious.

    ``dropped_events``: lost because the queue was full. ``stale_events``: discarded as stale (a begin that
    waited too long, or an end whose begin the current daemon session never saw). ``failed_events``: the
    daemon answered with an error. ``opens``: sessions opened, the first one included.
    ``clamped_values``: reported values sent as the nearest acceptable one (negative → 0, ``valid_tokens``
    → ``tokens``). ``dropped_values``: reported values sent as 0 (not a whole number, or above the daemon's
    limit). ``invalid_events``: events not sent because their iteration was out of range. ``resyncs``:
    begins at which the daemon abandoned a phase whose end it never got. ``resets``: sessions dropped
    and reopened because events kept failing. ``sender_errors``: events dropped by an unexpected error
    in the sender.
    """

    connected: bool
    session_id: str | None
    attached: bool
    queued_events: int
    sent_events: int
    dropped_events: int
    stale_events: int
    failed_events: int
    opens: int
    connect_failures: int
    clamped_values: int
    dropped_values: int
    invalid_events: int
    resyncs: int
    resets: int
    sender_errors: int


class EventSink(Protocol):
    """What a :class:`eerl.Session` needs of its sender: the daemon's (:class:`Sender`) or a sidecar's."""

    @property
    def connected(self) -> bool: ...

    def start(self) -> None: ...

    def submit(self, event: Event) -> None: ...

    def stats(self) -> ClientStats: ...

    def wait_until_connected(self, timeout_s: float) -> bool: ...

    def answer(self, phase_id: int, begin: bool) -> PhaseAnswer | None: ...

    def report(self) -> SessionReport | None: ...

    def close(self) -> None: ...


@dataclass(slots=True)
class _Counters:
    sent: int = 0
    dropped: int = 0
    stale: int = 0
    failed: int = 0
    opens: int = 0
    connect_failures: int = 0
    clamped_values: int = 0
    dropped_values: int = 0
    invalid: int = 0
    resyncs: int = 0
    resets: int = 0
    errors: int = 0

    def snapshot(
        self, *, connected: bool, session_id: str | None, attached: bool, queued: int
    ) -> ClientStats:
        """The counters as :class:`ClientStats`, with what only the sender knows."""
        return ClientStats(
            connected=connected,
            session_id=session_id,
            attached=attached,
            queued_events=queued,
            sent_events=self.sent,
            dropped_events=self.dropped,
            stale_events=self.stale,
            failed_events=self.failed,
            opens=self.opens,
            connect_failures=self.connect_failures,
            clamped_values=self.clamped_values,
            dropped_values=self.dropped_values,
            invalid_events=self.invalid,
            resyncs=self.resyncs,
            resets=self.resets,
            sender_errors=self.errors,
        )


class _Wakeup:
    """A wake-up signal that is cheap to raise: one C-level lock release, no Python-level condition.

    The lock is held while no signal is pending; :meth:`set` releases it, :meth:`wait` acquires it (and so
    consumes the signal). ``threading.Event.set`` runs a Condition in Python on every call, which costs the
    caller several times more on a loaded machine.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._lock.acquire()

    def set(self) -> None:
        if self._lock.locked():
            try:  # noqa: SIM105 - the caller's hot path: contextlib.suppress would add a context manager
                self._lock.release()
            except RuntimeError:  # another thread raised it first
                pass

    def wait(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for a signal and consumes it; True if there was one."""
        return self._lock.acquire(timeout=timeout_s)


class EventQueue:
    """The hand-off from the caller's thread to a sender thread: bounded (when full the oldest event is
    dropped and counted), cheap for the caller (one lock and one :class:`_Wakeup`), and closed for good when
    its sender stops, after which an event is released at once instead of queued. Every event that leaves
    unsent has its ``done`` set, so a flush never waits for it. Used by :class:`Sender` and the sidecar's."""

    def __init__(self, capacity: int, counters: _Counters) -> None:
        self._events: collections.deque[Event] = collections.deque()
        self._lock = threading.Lock()
        self._wake = _Wakeup()
        self._capacity = capacity
        self._counters = counters
        self._closed = False

    def __len__(self) -> int:
        return len(self._events)

    def put(self, event: Event) -> None:
        """Queues ``event`` without blocking and wakes the sender."""
        with self._lock:
            if self._closed:  # the sender stopped: nothing will send it
                _release(event)
                return
            if len(self._events) >= self._capacity:
                self._counters.dropped += 1
                _release(self._events.popleft())
            self._events.append(event)
        self._wake.set()

    def pop(self) -> Event | None:
        """The oldest queued event, or None."""
        with self._lock:
            return self._events.popleft() if self._events else None

    def wake(self) -> None:
        """Wakes the sender without an event (close, a lost stream)."""
        self._wake.set()

    def wait(self, timeout_s: float) -> bool:
        """The sender's idle wait: up to ``timeout_s`` for an event or a wake-up."""
        return self._wake.wait(timeout_s)

    def discard(self, unsendable: Callable[[Event], bool]) -> int:
        """Releases the queued events ``unsendable`` picks; returns how many."""
        with self._lock:
            keep: collections.deque[Event] = collections.deque()
            gone = 0
            for event in self._events:
                if unsendable(event):
                    _release(event)
                    gone += 1
                else:
                    keep.append(event)
            self._events = keep
        return gone

    def release_all(self, *, close: bool = False) -> None:
        """Releases every queued event unsent; with ``close`` also every later one."""
        with self._lock:
            self._closed = self._closed or close
            for event in self._events:
                _release(event)
            self._events.clear()


def _release(event: Event) -> None:
    if event.done is not None:
        event.done.set()


class BackgroundSender:
    """What the daemon's :class:`eerl._sender.Sender` and the sidecar's
    (:class:`eerl.sidecar.client.SidecarSender`) share: the caller's side (a bounded :class:`EventQueue`, the
    counters, the last answers) and the sending of one event over a link (:meth:`_handle`), with the rules
    that keep the numbers honest (:meth:`_admit`, :meth:`_checked_workload`, one warning per kind of
    problem). A subclass runs :meth:`_run` on the thread, says which link and session an event goes to
    (:meth:`_route`) and what a failure means for its session (:meth:`_on_link_error`)."""

    _THREAD_NAME = "eerl-sender"

    def __init__(self, config: ClientConfig) -> None:
        self._config = config
        self._closing = threading.Event()
        self._connected = threading.Event()
        self._counters = _Counters()
        self._queue = EventQueue(config.queue_size, self._counters)
        self._warned: set[str] = set()
        self._answers: dict[tuple[int, bool], _Reply] = {}
        self._begun: set[int] = set()
        """The begins the current session took whose end may still come (a new session starts empty)."""
        self._thread = threading.Thread(target=self._run, name=self._THREAD_NAME, daemon=True)
        self._report: SessionReport | None = None
        """The report the daemon gave when the session closed (None: none yet, or none came)."""

    # -- caller side ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Starts the background thread; returns at once."""
        self._thread.start()

    def submit(self, event: Event) -> None:
        """Queues an event without blocking; drops (and counts) the oldest event when the queue is full."""
        self._queue.put(event)

    @property
    def connected(self) -> bool:
        """True while a daemon session is open."""
        return self._connected.is_set()

    def wait_until_connected(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for the session to be open; True if it is."""
        return self._connected.wait(timeout_s)

    def stats(self) -> ClientStats:
        """A snapshot of the counters."""
        session_id, attached = self._session_view()
        return self._counters.snapshot(
            connected=self.connected, session_id=session_id, attached=attached, queued=len(self._queue)
        )

    def answer(self, phase_id: int, begin: bool) -> PhaseAnswer | None:
        """The daemon's answer to the begin (or end) of phase ``phase_id``; None if there was none (yet).

        The answers to the last 64 events are kept, as the sender's thread got them (a dict insert per
        event there), and converted here, on the caller's thread, only when asked for.
        """
        reply = self._answers.get((phase_id, begin))
        if reply is None:
            return None
        if isinstance(reply, eerl_pb2.BeginPhaseResponse):
            return PhaseAnswer.from_begin(reply)
        return PhaseAnswer.from_end(reply)

    def report(self) -> SessionReport | None:
        """The daemon's report of the session it closed (None before the close, or when none came)."""
        return self._report

    def close(self) -> None:
        """Flushes what it can within ``close_timeout_s`` and stops the thread."""
        self._closing.set()
        self._queue.wake()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            # Bounded even if a request hangs: the thread is a daemon thread (and the daemon's Attach
            # stream ends with the process, which ends the session at the daemon anyway).
            self._thread.join(self._config.close_timeout_s + 0.1)

    # -- what a subclass says --------------------------------------------------------------------------

    def _run(self) -> None:
        raise NotImplementedError

    def _session_view(self) -> tuple[str | None, bool]:
        """The session's id (None: none open) and whether it is bound to an Attach stream."""
        raise NotImplementedError

    def _route(self) -> tuple[DaemonLink, str] | None:
        """The link and the session id the next event goes to; None: it is not sent (counted stale)."""
        raise NotImplementedError

    def _on_link_error(self, error: LinkError, rpc: str, event: Event | None) -> None:
        """What a failed call means for the session (``event``: the one it cost, already counted failed)."""
        raise NotImplementedError

    def _on_sent(self) -> None:
        """An event went through."""

    # -- the sender's thread ---------------------------------------------------------------------------

    def _pop(self) -> Event | None:
        """The next queued event, or None."""
        return self._queue.pop()

    def _handle(self, event: Event, timeout_s: float) -> None:
        """Sends one event; an unexpected error while doing so costs that event, never the thread."""
        try:
            self._send(event, timeout_s)
        except Exception:
            self._on_bug()
        finally:
            if event.done is not None:
                event.done.set()

    def _send(self, event: Event, timeout_s: float) -> None:
        kind = event.kind
        if kind is None:
            return
        begun = self._begun
        iteration = self._admit(event, begun)
        if iteration is None:
            return
        route = self._route()
        if route is None:
            self._counters.stale += 1
            return
        link, session_id = route
        workload = self._checked_workload(event)
        wire = workload_to_pb(workload) if workload is not None else None
        kind_pb = KIND_TO_PB[kind]
        try:
            if event.begin:
                began = link.begin_phase(
                    eerl_pb2.BeginPhaseRequest(
                        session_id=session_id, kind=kind_pb, iteration=iteration, hints=wire
                    ),
                    timeout_s,
                )
                reply: _Reply | None = began
                begun.add(event.phase_id)
                if len(begun) > ANSWERS_KEPT:  # ends that never came
                    begun.discard(min(begun))
                if began is not None and began.resynced:
                    self._counters.resyncs += 1
                    logger.debug("eerl: eerld abandoned a phase it never saw end (%s %d)", kind, iteration)
            else:
                reply = link.end_phase(
                    eerl_pb2.EndPhaseRequest(
                        session_id=session_id, kind=kind_pb, iteration=iteration, workload=wire
                    ),
                    timeout_s,
                )
        except LinkError as e:
            self._counters.failed += 1
            if event.begin and e.code is Code.DEADLINE_EXCEEDED:
                begun.add(event.phase_id)  # the daemon most likely began it: let the end follow
            self._on_link_error(e, "BeginPhase" if event.begin else "EndPhase", event)
            return
        if reply is not None:
            self._remember(event.phase_id, event.begin, reply)
        self._counters.sent += 1
        self._on_sent()

    def _remember(self, phase_id: int, begin: bool, reply: _Reply) -> None:
        """Keeps an answer for :meth:`answer`; forgets the oldest beyond ``ANSWERS_KEPT``."""
        answers = self._answers
        answers[(phase_id, begin)] = reply
        if len(answers) > ANSWERS_KEPT:
            del answers[next(iter(answers))]

    def _admit(self, event: Event, begun: set[int]) -> int | None:
        """The iteration to send ``event`` with, or None (counted) if it is not sent: a bad iteration, a
        begin that waited past ``stale_after_s``, an end whose begin is not in ``begun`` (the begins this
        session took; an end admitted takes its begin out)."""
        iteration = check_iteration(event.iteration)
        if iteration is None:
            self._counters.invalid += 1
            if event.begin:  # its end is the same mistake: one word for both
                self._note(Finding(Problem.BAD_ITERATION, f"iteration={_shown(event.iteration)}"), event)
            return None
        if event.begin:
            if time.monotonic() - event.enqueued_s > self._config.stale_after_s:
                self._counters.stale += 1
                return None
        elif event.phase_id in begun:
            begun.discard(event.phase_id)
        else:
            self._counters.stale += 1
            return None
        return iteration

    def _checked_workload(self, event: Event) -> Workload | None:
        """The event's workload as the daemon accepts it; counts and reports what had to change."""
        if event.rejected:
            self._counters.dropped_values += event.rejected
            self._note(Finding(Problem.NOT_A_NUMBER, event.rejected_what), event)
        if event.workload is None:
            return None
        checked = check_workload(event.workload)
        if checked.findings:
            self._counters.clamped_values += checked.clamped
            self._counters.dropped_values += checked.dropped
            for finding in checked.findings:
                self._note(finding, event)
        return checked.workload

    def _note(self, finding: Finding, event: Event) -> None:
        """One warning per kind of problem for the whole session; debug after that."""
        kind = event.kind.value if event.kind is not None else "?"
        where = f"a {kind} phase" if finding.problem is Problem.BAD_ITERATION else f"the {kind} phase of "
        if finding.problem is not Problem.BAD_ITERATION:
            where += f"iteration {event.iteration}"
        key = f"value:{finding.problem.name}"
        if key in self._warned:
            logger.debug("eerl: %s in %s: %s", finding.what, where, finding.problem.value)
            return
        self._warned.add(key)
        logger.warning(
            "eerl: %s in %s: %s (eerl warns once per kind of problem; ClientStats counts them)",
            finding.what,
            where,
            finding.problem.value,
        )

    def _on_bug(self) -> None:
        """An unexpected error while sending cost one event: counted, warned once (with the trace)."""
        self._counters.errors += 1
        if "bug" in self._warned:
            logger.debug("eerl: an unexpected error while sending a phase event", exc_info=True)
            return
        self._warned.add("bug")
        logger.warning(
            "eerl: an unexpected error while sending a phase event; the event is dropped and eerl "
            "carries on (later ones: debug log)",
            exc_info=True,
        )

    def _warn_once(self, message: str, key: str = "connection") -> None:
        """Logs ``message`` as a warning the first time for ``key``, as debug after."""
        if key in self._warned:
            logger.debug("eerl: %s", message)
            return
        self._warned.add(key)
        logger.warning("eerl: %s", message)


def _shown(value: object) -> str:
    """A reported value for a log line: its repr when short and plain, else its type."""
    if isinstance(value, int | float | str) and len(text := repr(value)) <= 40:
        return text
    return f"<{type(value).__name__}>"
