"""The daemon's sender: the pump (:mod:`eerl._pump`) with the session held here, over a link of its own.

Its thread opens the session (:mod:`eerl.link.opening`: claim tickets, then ``OpenSession`` on a new link,
one connection per session), holds the ``Attach`` stream that binds the session's life (or heartbeats when
the daemon does not offer it), sends the phase events, and reopens with back-off when the daemon is absent,
slow or restarted.

Rules that keep a session from wedging:

* The next phase begin is sent whatever happened to the events before it. When an end was lost or refused,
  the daemon abandons that phase unmetered at the next begin and says so (``resynced``, counted).
* A failure that means the connection is gone (:data:`eerl.link.CONNECTION_LOST`) drops the session and
  reconnects with back-off; one that means the daemon forgot the session (:data:`eerl.link.SESSION_LOST`:
  a restart, an expired lease) drops it and reopens at once.
* When ``_FAILURES_BEFORE_REOPEN`` events in a row fail (refused, or past their deadline: a stalled
  daemon), the session is dropped and reopened, so ``connected`` never vouches for a session that no
  longer works.
* If the thread stops on an unexpected error, it closes its session on the way out (a short CloseSession,
  then it cancels the Attach stream and closes the link), so the daemon returns the GPUs to their default
  clocks.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from eerl._pump import BackgroundSender, Event
from eerl.config import ClientConfig
from eerl.link import grpc_connect
from eerl.link.base import Code, Connect, DaemonLink, LinkError
from eerl.link.opening import claim_tickets, gpu_ref, open_session, refused_by_kernel, watch_attach
from eerl.v1 import eerl_pb2
from eerl.wire.reports import report_from_pb

__all__ = ["OpenRequest", "Sender"]

logger = logging.getLogger("eerl")

_RETRYING = "the job runs on without clock control and eerl keeps retrying"
_GRANT_HINT = "ask for a grant: eerlctl grant, see docs/security.md"
_FAILURES_BEFORE_REOPEN = 3
"""Phase events in a row that fail (refused, or past their deadline) before the session is reopened."""
_TICKET_TIMEOUT_S = 1.0
"""The deadline of one IssueClaimTicket call, and of the CloseSession of a dying sender (at most
``rpc_timeout_s``)."""


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


class _Held:
    """One daemon session: its link, id, lease, and how its life is bound (stream or heartbeats)."""

    __slots__ = (
        "cancel_attach",
        "epoch",
        "heartbeat_mode",
        "lease_ttl_s",
        "link",
        "next_heartbeat_s",
        "session_id",
    )

    def __init__(self, link: DaemonLink, session_id: str, lease_ttl_s: float, epoch: int) -> None:
        self.link = link
        self.session_id = session_id
        self.lease_ttl_s = lease_ttl_s
        self.epoch = epoch
        self.cancel_attach: Callable[[], None] | None = None
        self.heartbeat_mode = False
        self.next_heartbeat_s = 0.0


class Sender(BackgroundSender):
    """Owns the session at the daemon; :meth:`submit` is the only method the caller's thread uses.

    ``connect``: how to reach the daemon (default: gRPC to ``config``'s socket; tests give
    :meth:`eerl.link.memory.MemoryDaemon.connect`).
    """

    def __init__(self, config: ClientConfig, request: OpenRequest, *, connect: Connect | None = None) -> None:
        super().__init__(config)
        self._request = request
        self._connect = connect if connect is not None else grpc_connect(config)
        self._held: _Held | None = None
        self._epochs = itertools.count(1)
        self._broken_epoch = 0
        self._attached_epoch = 0
        self._attach_unimplemented = False
        self._failures_in_a_row = 0
        self._backoff_s = config.reconnect_initial_s

    def _session_view(self) -> tuple[str | None, bool]:
        held = self._held
        return (held.session_id, self._attached_epoch == held.epoch) if held is not None else (None, False)

    def _route(self) -> tuple[DaemonLink, str] | None:
        held = self._held
        return (held.link, held.session_id) if held is not None else None

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
        link closed, either of which makes the daemon return the GPUs to their default clocks.
        """
        held = self._held
        self._connected.clear()  # before the close: ``connected`` never vouches for a session being ended
        try:
            if held is not None:
                held.link.close_session(held.session_id, min(_TICKET_TIMEOUT_S, self._config.rpc_timeout_s))
        except Exception:  # noqa: S110 - best effort on the way out; the stream's end closes it too
            pass
        try:
            self._drop()
        except Exception:  # pragma: no cover - closing a channel does not raise; never die louder
            logger.debug("eerl: closing the session's channel failed", exc_info=True)
        self._queue.release_all(close=True)

    def _step(self) -> None:
        held = self._held
        if held is None:
            if not self._open():
                self._discard_stale(time.monotonic())
                self._closing.wait(self._next_backoff())
            return
        if self._broken_epoch == held.epoch:
            self._lose("the Attach stream ended")
            return
        event = self._pop()
        if event is None:
            self._maybe_heartbeat(held)
            self._queue.wait(self._idle_wait_s(held))
            return
        self._handle(event, self._config.rpc_timeout_s)

    def _idle_wait_s(self, held: _Held) -> float:
        if held.heartbeat_mode:
            return max(0.01, held.next_heartbeat_s - time.monotonic())
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
        config = self._config
        tickets = claim_tickets(
            self._connect, config.ticket_socket_paths, min(_TICKET_TIMEOUT_S, config.rpc_timeout_s)
        )
        request = self._request
        try:
            link, reply = open_session(
                self._connect,
                eerl_pb2.OpenSessionRequest(
                    job_id=request.job_id,
                    rank=request.rank,
                    world_size=request.world_size,
                    gpus=[gpu_ref(gpu) for gpu in request.gpus],
                    mode=request.mode,
                    role=request.role,
                    policy=eerl_pb2.Policy(throughput_threshold=request.throughput_threshold),
                    lease_ttl_s=config.lease_ttl_s,
                    client_name=request.client_name,
                    claim_tickets=tickets.tickets,
                ),
                config.rpc_timeout_s,
            )
        except LinkError as e:
            self._counters.connect_failures += 1
            denial = self._denial(e)
            for path, why in tickets.missing:  # the failure to open says what matters
                logger.debug("eerl: no claim ticket from eerld's socket %s (%s)", path, why)
            if denial is not None:  # retrying soon will not help: back off as far as allowed
                self._backoff_s = config.reconnect_max_s
                hint = "" if "eerlctl grant" in denial else f"; {_GRANT_HINT}"  # said once, not twice
                self._warn_once(
                    f"{denial}{hint}. The job runs on without clock control; eerl retries every "
                    f"{config.reconnect_max_s:g} s",
                    key="denied",
                )
            else:
                self._warn_once(
                    f"cannot open a session with eerld at {config.target} ({e.describe()}); {_RETRYING}"
                )
            return False
        lease_ttl_s = reply.lease_ttl_s if reply.lease_ttl_s > 0 else 10.0
        held = _Held(link, reply.session_id, lease_ttl_s, epoch=next(self._epochs))
        self._held = held
        self._begun = set()
        self._counters.opens += 1
        self._backoff_s = config.reconnect_initial_s
        self._failures_in_a_row = 0
        for path, why in tickets.missing:
            self._warn_once(
                f"no claim ticket from eerld's socket {path} ({why}); the session goes on without that "
                "socket's GPUs",
                key=f"ticket:{path}",
            )
        self._attach(held)
        self._connected.set()
        if self._counters.opens > 1 or self._warned & {"connection", "denied"}:
            logger.info("eerl: session %s open with eerld at %s", held.session_id[:8], config.target)
        return True

    def _denial(self, error: LinkError) -> str | None:
        """Why the daemon or the kernel refuses this client a session, or None for any other failure."""
        if error.code is Code.PERMISSION_DENIED:
            return f"eerld at {self._config.target} refused the session ({error.describe()})"
        path = self._config.socket_path
        if error.code is Code.UNAVAILABLE and path is not None and refused_by_kernel(path):
            return (
                f"permission denied connecting to eerld's socket {path} (its owner and mode decide who "
                "may connect)"
            )
        return None

    def _attach(self, held: _Held) -> None:
        """Binds the session's life to a stream read by its own thread; heartbeats if there is none."""
        if self._attach_unimplemented:
            self._start_heartbeats(held)
            return

        def on_event(event: eerl_pb2.SessionEvent) -> None:
            self._attached_epoch = held.epoch
            logger.debug("eerl: %s", event.message)

        held.cancel_attach = watch_attach(
            held.link,
            held.session_id,
            name="eerl-attach",
            on_event=on_event,
            on_end=lambda error: self._attach_ended(held, error),
        )

    def _attach_ended(self, held: _Held, error: LinkError | None) -> None:
        """Runs in the attach thread when the stream ends: tells the sender (unless it ended it)."""
        if error is not None:
            if error.code is Code.CANCELLED and self._held is not held:
                return  # we cancelled it ourselves
            if error.code is Code.UNIMPLEMENTED:
                self._attach_unimplemented = True
                self._start_heartbeats(held)
                logger.debug("eerl: the daemon offers no Attach stream; heartbeating instead")
                self._queue.wake()
                return
            logger.debug("eerl: the Attach stream ended (%s)", error.describe())
        if self._held is held:
            self._broken_epoch = held.epoch
            self._queue.wake()

    def _start_heartbeats(self, held: _Held) -> None:
        held.heartbeat_mode = True
        held.next_heartbeat_s = time.monotonic()

    def _maybe_heartbeat(self, held: _Held) -> None:
        if not held.heartbeat_mode or time.monotonic() < held.next_heartbeat_s:
            return
        held.next_heartbeat_s = time.monotonic() + held.lease_ttl_s / 3
        try:
            held.link.heartbeat(held.session_id, self._config.rpc_timeout_s)
        except LinkError as e:
            self._on_link_error(e, "Heartbeat")

    def _lose(self, reason: str) -> None:
        """Forgets the session: cancels its stream and closes its link (the daemon then ends it)."""
        if self._drop() is not None:
            self._warn_once(f"lost the session with eerld at {self._config.target} ({reason}); {_RETRYING}")

    def _drop(self) -> _Held | None:
        """Forgets the session without a word: the daemon ends it when its stream or lease ends."""
        held = self._held
        if held is None:
            return None
        self._held = None
        self._connected.clear()
        self._failures_in_a_row = 0
        if held.cancel_attach is not None:
            held.cancel_attach()
        held.link.close()
        return held

    def _shutdown(self) -> None:
        """Flushes queued events within ``close_timeout_s``, then closes the session."""
        held = self._held
        deadline_s = time.monotonic() + self._config.close_timeout_s
        while held is not None and self._held is held:
            remaining_s = deadline_s - time.monotonic()
            event = self._pop()
            if event is None or remaining_s <= 0:
                break
            self._handle(event, min(self._config.rpc_timeout_s, remaining_s))
        self._queue.release_all()
        held = self._held
        if held is None:
            return
        self._held = None
        self._connected.clear()
        try:
            reply = held.link.close_session(
                held.session_id, max(0.05, min(self._config.rpc_timeout_s, deadline_s - time.monotonic()))
            )
        except LinkError as e:
            logger.debug("eerl: CloseSession failed (%s)", e.describe())
        else:
            if reply is not None and reply.HasField("report"):
                self._report = report_from_pb(reply.report)
        if held.cancel_attach is not None:
            held.cancel_attach()
        held.link.close()

    # -- what a failed event means -----------------------------------------------------------------------

    def _on_sent(self) -> None:
        self._failures_in_a_row = 0

    def _on_link_error(self, error: LinkError, rpc: str, event: Event | None = None) -> None:
        if error.connection_lost:
            self._lose(f"{rpc}: {error.describe()}")
        elif error.session_lost:
            self._lose(f"{rpc}: the daemon no longer knows the session ({error.describe()})")
            self._backoff_s = self._config.reconnect_initial_s
        else:
            # The daemon refused this one event (order, range) or it ran past its deadline (a stalled
            # daemon): drop it and keep the session, unless events keep failing.
            self._failures_in_a_row += 1
            logger.debug("eerl: %s failed (%s)", rpc, error.describe())
            if self._failures_in_a_row >= _FAILURES_BEFORE_REOPEN:
                self._counters.resets += 1
                self._lose(
                    f"{self._failures_in_a_row} phase events in a row failed, the last {rpc}: "
                    f"{error.describe()}; the session is reopened"
                )
                self._backoff_s = self._config.reconnect_initial_s
