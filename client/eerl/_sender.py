"""The background sender: the only code that talks to the daemon.

Why a thread: the training thread must never wait for the daemon. It only appends an event to a bounded
queue (:meth:`Sender.submit`, a few microseconds); this thread opens the session, holds the ``Attach``
stream that binds the session's life (or heartbeats when the daemon does not offer it), sends the phase
events, and reconnects with back-off when the daemon is absent, slow or restarted.

Rules that keep the numbers honest after trouble:

* The queue is bounded; when it is full the oldest event is dropped and counted.
* A phase begin that waited longer than ``stale_after_s`` is dropped: the daemon would apply a clock for,
  and meter, a phase it did not see start.
* A phase end is sent only if its begin was sent within the same daemon session; so a reopened session
  starts clean at the next phase begin, and nothing stale is re-sent.
* Every RPC has a deadline; a failed event is dropped, never retried.
* Nothing the daemon would refuse, or protobuf could not encode, is sent: every workload and iteration is
  checked first (:mod:`eerl.wire.limits`; a bad value is clamped or dropped, with one warning per kind).

Rules that keep a session from wedging:

* The next phase begin is sent whatever happened to the events before it. When an end was lost or refused,
  the daemon abandons that phase unmetered at the next begin and says so (``resynced``, counted).
* When ``_FAILURES_BEFORE_REOPEN`` events in a row fail (refused, or past their deadline: a stalled
  daemon), the session is dropped and reopened, so ``connected`` never vouches for a session that no
  longer works.
* One event that raises something unexpected is dropped (one warning); the thread carries on. If the
  thread stops anyway, it closes its session on the way out (a short CloseSession, then it cancels the
  Attach stream and closes the channel), so the daemon returns the GPUs to their default clocks.
"""

from __future__ import annotations

import collections
import itertools
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar

import grpc

from eerl._channel import make_channel, refused_by_kernel
from eerl.config import ClientConfig
from eerl.phases import ControllerState, PhaseKind, Workload
from eerl.v1 import eerl_pb2, eerl_pb2_grpc
from eerl.wire.enums import KIND_TO_PB, STATE_FROM_PB, workload_to_pb
from eerl.wire.limits import Finding, Problem, check_iteration, check_workload

logger = logging.getLogger("eerl")

_RETRYING = "the job runs on without clock control and eerl keeps retrying"
_GRANT_HINT = "ask for a grant: eerlctl grant, see docs/security.md"
_FAILURES_BEFORE_REOPEN = 3
"""Phase events in a row that fail (refused, or past their deadline) before the session is reopened."""
_ANSWERS_KEPT = 64
"""The daemon's answers (begins and ends) that :meth:`Sender.answer` can still return."""
_TICKET_TIMEOUT_S = 1.0
"""The deadline of one IssueClaimTicket call, and of the CloseSession of a dying sender (at most
``rpc_timeout_s``)."""

# Codes that mean "the daemon (or the path to it) is gone": drop the session, reconnect with back-off.
_CONNECTION_LOST = frozenset({grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED})
# Codes that mean "the daemon no longer knows this session" (restart, lease expiry): reopen at once.
_SESSION_LOST = frozenset({grpc.StatusCode.NOT_FOUND, grpc.StatusCode.PERMISSION_DENIED})


@dataclass(frozen=True, slots=True)
class OpenRequest:
    """What the sender asks for when it (re)opens the session."""

    job_id: str
    rank: int
    world_size: int
    gpus: tuple[int | str, ...]
    mode: eerl_pb2.ExecutionMode.ValueType
    role: eerl_pb2.GpuRole.ValueType
    throughput_threshold: float
    client_name: str


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


@dataclass(frozen=True, slots=True)
class GpuClockReading:
    """One GPU's clock as the daemon read it back after applying a phase's decision."""

    index: int
    uuid: str
    sm_clock_mhz: int
    """What holds now."""
    requested_sm_clock_mhz: int
    """The lock requested; 0: the default governor."""
    source: str
    """Who decides the clock: ``default``, ``session`` or ``admin_pin`` (``""``: not said)."""


@dataclass(frozen=True, slots=True)
class PhaseAnswer:
    """The daemon's answer to one phase event of this session (:meth:`eerl.Session.answer`).

    For a begin: ``sm_clock_mhz`` is the clock the controller chose (0: the default governor), ``clocks``
    what each GPU holds now, ``resynced`` that an earlier phase was abandoned unmetered. For an end: the
    phase as the daemon metered it (``duration_s``, ``energy_j``, ``mean_power_w`` over ``gpus`` GPUs) and
    the clock that held over it. ``state``: the controller's state for the phase kind, None if not said.
    """

    begin: bool
    sm_clock_mhz: int
    state: ControllerState | None
    clocks: tuple[GpuClockReading, ...] = ()
    resynced: bool = False
    duration_s: float = 0.0
    energy_j: float = 0.0
    mean_power_w: float = 0.0
    gpus: int = 0

    @classmethod
    def from_begin(cls, reply: eerl_pb2.BeginPhaseResponse) -> PhaseAnswer:
        """The answer a ``BeginPhaseResponse`` carries."""
        return cls(
            begin=True,
            sm_clock_mhz=reply.target_sm_clock_mhz,
            state=STATE_FROM_PB.get(reply.state),
            clocks=tuple(
                GpuClockReading(
                    index=clock.index,
                    uuid=clock.uuid,
                    sm_clock_mhz=clock.sm_clock_mhz,
                    requested_sm_clock_mhz=clock.requested_sm_clock_mhz,
                    source=_source_name(clock.source),
                )
                for clock in reply.clocks
            ),
            resynced=reply.resynced,
        )

    @classmethod
    def from_end(cls, reply: eerl_pb2.EndPhaseResponse) -> PhaseAnswer:
        """The answer an ``EndPhaseResponse`` carries (energy in joules: the wire says millijoules)."""
        return cls(
            begin=False,
            sm_clock_mhz=reply.sm_clock_mhz,
            state=STATE_FROM_PB.get(reply.state),
            duration_s=reply.duration_s,
            energy_j=reply.energy_mj / 1000.0,
            mean_power_w=reply.mean_power_w,
            gpus=reply.gpus,
        )


class EventSink(Protocol):
    """What a :class:`eerl.Session` needs of its sender: the daemon's (:class:`Sender`) or a sidecar's."""

    @property
    def connected(self) -> bool: ...

    def start(self) -> None: ...

    def submit(self, event: Event) -> None: ...

    def stats(self) -> ClientStats: ...

    def wait_until_connected(self, timeout_s: float) -> bool: ...

    def answer(self, phase_id: int, begin: bool) -> PhaseAnswer | None: ...

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


@dataclass(slots=True)
class _Link:
    """One daemon session: its channel, stub, id and the Attach stream that binds it."""

    channel: grpc.Channel
    stub: eerl_pb2_grpc.PhaseServiceStub
    session_id: str
    lease_ttl_s: float
    epoch: int
    attach_call: grpc.CallIterator[eerl_pb2.SessionEvent] | None = None
    heartbeat_mode: bool = False
    next_heartbeat_s: float = 0.0
    open_phases: set[int] = field(default_factory=set)


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


_Reply = TypeVar("_Reply")


class BackgroundSender(Generic[_Reply]):
    """What the daemon's :class:`Sender` and the sidecar's (:mod:`eerl.sidecar.client`) share: the
    caller's side (a bounded :class:`EventQueue`, the counters, the last answers) and the rules that keep
    the numbers honest on the sender's thread (:meth:`_admit`, :meth:`_checked_workload`, one warning per
    kind of problem). A subclass runs :meth:`_run` on the thread and says what its session is."""

    _THREAD_NAME = "eerl-sender"

    def __init__(self, config: ClientConfig) -> None:
        self._config = config
        self._closing = threading.Event()
        self._connected = threading.Event()
        self._counters = _Counters()
        self._queue = EventQueue(config.queue_size, self._counters)
        self._warned: set[str] = set()
        self._answers: dict[tuple[int, bool], _Reply] = {}
        self._thread = threading.Thread(target=self._run, name=self._THREAD_NAME, daemon=True)

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
        return self._answer_from(reply) if reply is not None else None

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

    def _answer_from(self, reply: _Reply) -> PhaseAnswer:
        raise NotImplementedError

    # -- the sender's thread ---------------------------------------------------------------------------

    def _remember(self, phase_id: int, begin: bool, reply: _Reply) -> None:
        """Keeps an answer for :meth:`answer`; forgets the oldest beyond ``_ANSWERS_KEPT``."""
        answers = self._answers
        answers[(phase_id, begin)] = reply
        if len(answers) > _ANSWERS_KEPT:
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


class Sender(BackgroundSender[eerl_pb2.BeginPhaseResponse | eerl_pb2.EndPhaseResponse]):
    """Owns the connection to the daemon; :meth:`submit` is the only method the caller's thread uses."""

    def __init__(self, config: ClientConfig, request: OpenRequest) -> None:
        super().__init__(config)
        self._request = request
        self._link: _Link | None = None
        self._epochs = itertools.count(1)
        self._broken_epoch = 0
        self._attached_epoch = 0
        self._attach_unimplemented = False
        self._failures_in_a_row = 0
        self._backoff_s = config.reconnect_initial_s

    def _session_view(self) -> tuple[str | None, bool]:
        link = self._link
        return (link.session_id, self._attached_epoch == link.epoch) if link is not None else (None, False)

    def _answer_from(self, reply: eerl_pb2.BeginPhaseResponse | eerl_pb2.EndPhaseResponse) -> PhaseAnswer:
        if isinstance(reply, eerl_pb2.BeginPhaseResponse):
            return PhaseAnswer.from_begin(reply)
        return PhaseAnswer.from_end(reply)

    # -- the background thread -----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._closing.is_set():
                self._step()
            self._shutdown()
        except Exception:  # a bug here must never reach the training job
            logger.exception(
                "eerl: the background sender stopped on an unexpected error; eerl is off for this job "
                "(its daemon session is closed: the GPUs return to their default clocks)"
            )
        finally:
            self._stop()

    def _stop(self) -> None:
        """The thread's last act, however it ends: no session is left behind, no flush waits in vain.

        After a normal close there is no session left; after a bug, the session is closed here: a
        CloseSession with a short deadline (best effort), then the Attach stream is cancelled and the
        channel closed, either of which makes the daemon return the GPUs to their default clocks.
        """
        link = self._link
        try:
            if link is not None:
                link.stub.CloseSession(
                    eerl_pb2.CloseSessionRequest(session_id=link.session_id),
                    timeout=min(_TICKET_TIMEOUT_S, self._config.rpc_timeout_s),
                )
        except Exception:  # noqa: S110 - best effort on the way out; the stream's end closes it too
            pass
        try:
            self._drop_link()
        except Exception:  # pragma: no cover - closing a channel does not raise; never die louder
            logger.debug("eerl: closing the session's channel failed", exc_info=True)
        self._queue.release_all(close=True)

    def _step(self) -> None:
        link = self._link
        if link is None:
            if not self._open():
                self._discard_stale(time.monotonic())
                self._closing.wait(self._next_backoff())
            return
        if self._broken_epoch == link.epoch:
            self._lose("the Attach stream ended")
            return
        event = self._pop()
        if event is None:
            self._maybe_heartbeat(link)
            self._queue.wait(self._idle_wait_s(link))
            return
        self._handle(link, event, self._config.rpc_timeout_s)

    def _pop(self) -> Event | None:
        return self._queue.pop()

    def _idle_wait_s(self, link: _Link) -> float:
        if link.heartbeat_mode:
            return max(0.01, link.next_heartbeat_s - time.monotonic())
        return 1.0

    def _next_backoff(self) -> float:
        delay = self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, self._config.reconnect_max_s)
        return delay * random.uniform(0.8, 1.2)

    def _discard_stale(self, now_s: float) -> None:
        """While no session is open, drops events that can no longer be sent usefully."""
        stale_after_s = self._config.stale_after_s
        self._counters.stale += self._queue.discard(
            lambda event: event.kind is not None and now_s - event.enqueued_s > stale_after_s
        )

    # -- session life ----------------------------------------------------------------------------------

    def _open(self) -> bool:
        tickets, missing = self._claim_tickets()
        channel = make_channel(self._config)
        stub = eerl_pb2_grpc.PhaseServiceStub(channel)
        request = self._request
        try:
            reply = stub.OpenSession(
                eerl_pb2.OpenSessionRequest(
                    job_id=request.job_id,
                    rank=request.rank,
                    world_size=request.world_size,
                    gpus=[_gpu_ref(gpu) for gpu in request.gpus],
                    mode=request.mode,
                    role=request.role,
                    policy=eerl_pb2.Policy(throughput_threshold=request.throughput_threshold),
                    lease_ttl_s=self._config.lease_ttl_s,
                    client_name=request.client_name,
                    claim_tickets=tickets,
                ),
                timeout=self._config.rpc_timeout_s,
            )
        except grpc.RpcError as e:
            channel.close()
            self._counters.connect_failures += 1
            denial = self._denial(e)
            for path, why in missing:  # the failure to open says what matters
                logger.debug("eerl: no claim ticket from eerld's socket %s (%s)", path, why)
            if denial is not None:  # retrying soon will not help: back off as far as allowed
                self._backoff_s = self._config.reconnect_max_s
                self._warn_once(
                    f"{denial}; {_GRANT_HINT}. The job runs on without clock control; eerl retries every "
                    f"{self._config.reconnect_max_s:g} s",
                    key="denied",
                )
            else:
                self._warn_once(
                    f"cannot open a session with eerld at {self._config.target} ({_describe(e)}); {_RETRYING}"
                )
            return False
        lease_ttl_s = reply.lease_ttl_s if reply.lease_ttl_s > 0 else 10.0
        link = _Link(channel, stub, reply.session_id, lease_ttl_s, epoch=next(self._epochs))
        self._link = link
        self._counters.opens += 1
        self._backoff_s = self._config.reconnect_initial_s
        self._failures_in_a_row = 0
        for path, why in missing:
            self._warn_once(
                f"no claim ticket from eerld's socket {path} ({why}); the session goes on without that "
                "socket's GPUs",
                key=f"ticket:{path}",
            )
        self._attach(link)
        self._connected.set()
        if self._counters.opens > 1 or self._warned & {"connection", "denied"}:
            logger.info(
                "eerl: session %s open with eerld at %s", _short(link.session_id), self._config.target
            )
        return True

    def _claim_tickets(self) -> tuple[list[str], list[tuple[str, str]]]:
        """A fresh ticket from each of the other worker sockets, and the sockets that gave none (why)."""
        tickets: list[str] = []
        missing: list[tuple[str, str]] = []
        timeout_s = min(_TICKET_TIMEOUT_S, self._config.rpc_timeout_s)
        for path in self._config.ticket_socket_paths:
            channel = make_channel(self._config, socket_path=path)
            try:
                reply = eerl_pb2_grpc.PhaseServiceStub(channel).IssueClaimTicket(
                    eerl_pb2.IssueClaimTicketRequest(), timeout=timeout_s
                )
            except grpc.RpcError as e:
                missing.append((path, _describe(e)))
                continue
            finally:
                channel.close()
            if reply.ticket:
                tickets.append(reply.ticket)
        return tickets, missing

    def _denial(self, error: grpc.RpcError) -> str | None:
        """Why the daemon or the kernel refuses this client a session, or None for any other failure."""
        code = error.code()
        if code == grpc.StatusCode.PERMISSION_DENIED:
            return f"eerld at {self._config.target} refused the session ({_describe(error)})"
        path = self._config.socket_path
        if code == grpc.StatusCode.UNAVAILABLE and path is not None and refused_by_kernel(path):
            return (
                f"permission denied connecting to eerld's socket {path} (its owner and mode decide who "
                "may connect)"
            )
        return None

    def _attach(self, link: _Link) -> None:
        """Binds the session's life to a stream read by its own thread; heartbeats if there is none."""
        if self._attach_unimplemented:
            self._start_heartbeats(link)
            return
        try:
            call = link.stub.Attach(eerl_pb2.AttachRequest(session_id=link.session_id))
        except grpc.RpcError as e:  # pragma: no cover - a unary-stream call reports errors when read
            logger.debug("eerl: Attach failed (%s); heartbeating instead", _describe(e))
            self._start_heartbeats(link)
            return
        link.attach_call = call
        reader = threading.Thread(
            target=self._read_attach, args=(link, call), name="eerl-attach", daemon=True
        )
        reader.start()

    def _read_attach(self, link: _Link, call: grpc.CallIterator[eerl_pb2.SessionEvent]) -> None:
        """Runs in the attach thread: reads the stream until it ends, then tells the sender."""
        try:
            for event in call:
                self._attached_epoch = link.epoch
                logger.debug("eerl: %s", event.message)
        except grpc.RpcError as e:
            code = e.code()
            if code == grpc.StatusCode.CANCELLED and self._link is not link:
                return  # we cancelled it ourselves
            if code == grpc.StatusCode.UNIMPLEMENTED:
                self._attach_unimplemented = True
                link.heartbeat_mode = True
                link.next_heartbeat_s = time.monotonic()
                logger.debug("eerl: the daemon offers no Attach stream; heartbeating instead")
                self._queue.wake()
                return
            logger.debug("eerl: the Attach stream ended (%s)", _describe(e))
        except Exception:  # pragma: no cover - never let this thread die loudly
            logger.debug("eerl: the Attach stream failed", exc_info=True)
        if self._link is link:
            self._broken_epoch = link.epoch
            self._queue.wake()

    def _start_heartbeats(self, link: _Link) -> None:
        link.heartbeat_mode = True
        link.next_heartbeat_s = time.monotonic()

    def _maybe_heartbeat(self, link: _Link) -> None:
        if not link.heartbeat_mode or time.monotonic() < link.next_heartbeat_s:
            return
        link.next_heartbeat_s = time.monotonic() + link.lease_ttl_s / 3
        try:
            link.stub.Heartbeat(
                eerl_pb2.HeartbeatRequest(session_id=link.session_id), timeout=self._config.rpc_timeout_s
            )
        except grpc.RpcError as e:
            self._on_rpc_error(link, e, "Heartbeat")

    def _lose(self, reason: str) -> None:
        """Forgets the session: cancels its stream and closes its channel (the daemon then ends it)."""
        if self._drop_link() is not None:
            self._warn_once(f"lost the session with eerld at {self._config.target} ({reason}); {_RETRYING}")

    def _drop_link(self) -> _Link | None:
        """Forgets the session without a word: the daemon ends it when its stream or lease ends."""
        link = self._link
        if link is None:
            return None
        self._link = None
        self._connected.clear()
        self._failures_in_a_row = 0
        if link.attach_call is not None:
            _cancel(link.attach_call)
        link.channel.close()
        return link

    def _shutdown(self) -> None:
        """Flushes queued events within ``close_timeout_s``, then closes the session."""
        link = self._link
        deadline_s = time.monotonic() + self._config.close_timeout_s
        while link is not None and self._link is link:
            remaining_s = deadline_s - time.monotonic()
            event = self._pop()
            if event is None or remaining_s <= 0:
                break
            self._handle(link, event, min(self._config.rpc_timeout_s, remaining_s))
        self._queue.release_all()
        link = self._link
        if link is None:
            return
        self._link = None
        self._connected.clear()
        try:
            link.stub.CloseSession(
                eerl_pb2.CloseSessionRequest(session_id=link.session_id),
                timeout=max(0.05, min(self._config.rpc_timeout_s, deadline_s - time.monotonic())),
            )
        except grpc.RpcError as e:
            logger.debug("eerl: CloseSession failed (%s)", _describe(e))
        if link.attach_call is not None:
            _cancel(link.attach_call)
        link.channel.close()

    # -- events ----------------------------------------------------------------------------------------

    def _handle(self, link: _Link, event: Event, timeout_s: float) -> None:
        """Sends one event; an unexpected error while doing so costs that event, never the thread."""
        try:
            self._send(link, event, timeout_s)
        except Exception:
            self._on_bug()
        finally:
            if event.done is not None:
                event.done.set()

    def _send(self, link: _Link, event: Event, timeout_s: float) -> None:
        kind = event.kind
        if kind is None:
            return
        iteration = self._admit(event, link.open_phases)
        if iteration is None:
            return
        workload = self._checked(event)
        session_id, kind_pb = link.session_id, KIND_TO_PB[kind]
        try:
            if event.begin:
                reply = link.stub.BeginPhase(
                    eerl_pb2.BeginPhaseRequest(
                        session_id=session_id, kind=kind_pb, iteration=iteration, hints=workload
                    ),
                    timeout=timeout_s,
                )
                link.open_phases.add(event.phase_id)
                self._remember(event.phase_id, True, reply)
                if reply.resynced:
                    self._counters.resyncs += 1
                    logger.debug("eerl: eerld abandoned a phase it never saw end (%s %d)", kind, iteration)
            else:
                ended = link.stub.EndPhase(
                    eerl_pb2.EndPhaseRequest(
                        session_id=session_id, kind=kind_pb, iteration=iteration, workload=workload
                    ),
                    timeout=timeout_s,
                )
                self._remember(event.phase_id, False, ended)
        except grpc.RpcError as e:
            self._counters.failed += 1
            if event.begin and e.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                link.open_phases.add(event.phase_id)  # the daemon most likely began it: let the end follow
            self._on_rpc_error(link, e, "BeginPhase" if event.begin else "EndPhase")
            return
        self._counters.sent += 1
        self._failures_in_a_row = 0

    def _checked(self, event: Event) -> eerl_pb2.Workload | None:
        """The event's workload as the daemon accepts it, on the wire."""
        workload = self._checked_workload(event)
        if workload is None:
            return None
        return workload_to_pb(workload)

    def _on_rpc_error(self, link: _Link, error: grpc.RpcError, rpc: str) -> None:
        code = error.code()
        if code in _CONNECTION_LOST:
            self._lose(f"{rpc}: {_describe(error)}")
        elif code in _SESSION_LOST:
            self._lose(f"{rpc}: the daemon no longer knows the session ({_describe(error)})")
            self._backoff_s = self._config.reconnect_initial_s
        else:
            # The daemon refused this one event (order, range) or it ran past its deadline (a stalled
            # daemon): drop it and keep the session, unless events keep failing.
            self._failures_in_a_row += 1
            logger.debug("eerl: %s failed (%s)", rpc, _describe(error))
            if self._failures_in_a_row >= _FAILURES_BEFORE_REOPEN:
                self._counters.resets += 1
                self._lose(
                    f"{self._failures_in_a_row} phase events in a row failed, the last {rpc}: "
                    f"{_describe(error)}; the session is reopened"
                )
                self._backoff_s = self._config.reconnect_initial_s


def _cancel(call: grpc.CallIterator[eerl_pb2.SessionEvent]) -> None:
    call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves RpcContext.cancel untyped


def _source_name(source: eerl_pb2.ClockSource.ValueType) -> str:
    """``default``, ``session`` or ``admin_pin`` for a ``ClockSource``; ``""`` for UNSPECIFIED or unknown."""
    if source == eerl_pb2.CLOCK_SOURCE_UNSPECIFIED:
        return ""
    try:
        return eerl_pb2.ClockSource.Name(source).removeprefix("CLOCK_SOURCE_").lower()
    except ValueError:
        return ""


def _gpu_ref(gpu: int | str) -> eerl_pb2.GpuRef:
    return eerl_pb2.GpuRef(index=gpu) if isinstance(gpu, int) else eerl_pb2.GpuRef(uuid=gpu)


def _shown(value: object) -> str:
    """A reported value for a log line: its repr when short and plain, else its type."""
    if isinstance(value, int | float | str) and len(text := repr(value)) <= 40:
        return text
    return f"<{type(value).__name__}>"


def _describe(error: grpc.RpcError) -> str:
    code = error.code()
    details = error.details() if hasattr(error, "details") else ""
    name = code.name if code is not None else "UNKNOWN"
    return f"{name}: {details}" if details else name


def _short(session_id: str) -> str:
    return session_id[:8]
