"""A recording fake of the daemon's worker service, for tests of code that uses the client.

:class:`FakeDaemon` serves ``PhaseService`` on a real gRPC server over a Unix socket and records every
call, so a test can check what a job told the daemon without a daemon, a GPU, or root. It can be stopped
and started again on the same socket to play a daemon that dies and comes back; a restarted fake forgets
its sessions, as a restarted daemon does. :meth:`FakeDaemon.refuse` and :meth:`FakeDaemon.delay` play a
daemon that refuses or stalls calls. Import it explicitly: ``from eerl.testing import FakeDaemon``.
"""

from __future__ import annotations

import secrets
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import grpc

from eerl.config import ClientConfig
from eerl.phases import PhaseKind, Workload
from eerl.v1 import eerl_pb2, eerl_pb2_grpc
from eerl.wire.enums import KIND_FROM_PB, workload_from_pb


@dataclass(frozen=True, slots=True)
class RecordedPhase:
    """One phase event as the fake daemon received it."""

    session_id: str
    begin: bool
    kind: PhaseKind
    iteration: int
    workload: Workload


@dataclass(slots=True)
class RecordedSession:
    """One session as the fake daemon saw it."""

    session_id: str
    request: eerl_pb2.OpenSessionRequest
    attached: bool = False
    closed: bool = False
    heartbeats: int = 0
    running: bool = False
    """A phase began and has not ended (the next begin answers ``resynced``)."""

    @property
    def claim_tickets(self) -> tuple[str, ...]:
        """The claim tickets the session was opened with."""
        return tuple(self.request.claim_tickets)


@dataclass(slots=True)
class _Refusal:
    code: grpc.StatusCode
    details: str
    times: int | None


@dataclass(slots=True)
class _State:
    lock: threading.Lock = field(default_factory=threading.Lock)
    sessions: dict[str, RecordedSession] = field(default_factory=dict)
    phases: list[RecordedPhase] = field(default_factory=list)
    live: set[str] = field(default_factory=set)
    stopping: threading.Event = field(default_factory=threading.Event)
    tickets: list[str] = field(default_factory=list)
    calls: dict[str, int] = field(default_factory=dict)
    refusals: dict[str, _Refusal] = field(default_factory=dict)
    delays_s: dict[str, float] = field(default_factory=dict)


class _Servicer(eerl_pb2_grpc.PhaseServiceServicer):
    """Records calls; rejects unknown sessions with NOT_FOUND as the daemon does."""

    def __init__(self, state: _State, *, attach: bool, begin_delay_s: float, scoped: bool) -> None:
        self._state = state
        self._attach = attach
        self._begin_delay_s = begin_delay_s
        self._scoped = scoped

    def _enter(self, method: str, context: grpc.ServicerContext) -> None:
        """Counts the call, then plays the delay and the refusal set for ``method``."""
        with self._state.lock:
            self._state.calls[method] = self._state.calls.get(method, 0) + 1
            delay_s = self._state.delays_s.get(method, 0.0)
        if delay_s:
            self._state.stopping.wait(delay_s)
        with self._state.lock:
            refusal = self._state.refusals.get(method)
            if refusal is not None and refusal.times is not None:
                refusal.times -= 1
                if refusal.times <= 0:
                    del self._state.refusals[method]
        if refusal is not None:
            context.abort(refusal.code, refusal.details)

    def _known(self, session_id: str, context: grpc.ServicerContext) -> RecordedSession:
        with self._state.lock:
            session = self._state.sessions.get(session_id)
            if session is None or session_id not in self._state.live:
                context.abort(grpc.StatusCode.NOT_FOUND, "unknown session")
            assert session is not None
            return session

    def OpenSession(  # noqa: N802 - gRPC method names are the proto's
        self, request: eerl_pb2.OpenSessionRequest, context: grpc.ServicerContext
    ) -> eerl_pb2.OpenSessionResponse:
        self._enter("OpenSession", context)
        if not request.gpus and not self._scoped:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "gpus: at least one GPU")
        session_id = secrets.token_hex(16)
        with self._state.lock:
            copy = eerl_pb2.OpenSessionRequest()
            copy.CopyFrom(request)
            self._state.sessions[session_id] = RecordedSession(session_id, copy)
            self._state.live.add(session_id)
        return eerl_pb2.OpenSessionResponse(session_id=session_id, lease_ttl_s=request.lease_ttl_s or 10.0)

    def Attach(  # noqa: N802 - gRPC method names are the proto's
        self, request: eerl_pb2.AttachRequest, context: grpc.ServicerContext
    ) -> Iterator[eerl_pb2.SessionEvent]:
        self._enter("Attach", context)
        if not self._attach:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "no Attach here")
        session = self._known(request.session_id, context)
        with self._state.lock:
            session.attached = True
        yield eerl_pb2.SessionEvent(timestamp_unix_s=time.time(), message="attached")
        while context.is_active() and not self._state.stopping.is_set():
            self._state.stopping.wait(0.05)
        with self._state.lock:  # the stream ended: the session dies with it
            self._state.live.discard(request.session_id)

    def BeginPhase(  # noqa: N802 - gRPC method names are the proto's
        self, request: eerl_pb2.BeginPhaseRequest, context: grpc.ServicerContext
    ) -> eerl_pb2.BeginPhaseResponse:
        self._enter("BeginPhase", context)
        session = self._known(request.session_id, context)
        if self._begin_delay_s:
            time.sleep(self._begin_delay_s)
        self._record(request.session_id, True, request.kind, request.iteration, request.hints)
        with self._state.lock:
            resynced, session.running = session.running, True
        return eerl_pb2.BeginPhaseResponse(resynced=resynced)

    def EndPhase(  # noqa: N802 - gRPC method names are the proto's
        self, request: eerl_pb2.EndPhaseRequest, context: grpc.ServicerContext
    ) -> eerl_pb2.EndPhaseResponse:
        self._enter("EndPhase", context)
        session = self._known(request.session_id, context)
        self._record(request.session_id, False, request.kind, request.iteration, request.workload)
        with self._state.lock:
            session.running = False
        return eerl_pb2.EndPhaseResponse()

    def Heartbeat(  # noqa: N802 - gRPC method names are the proto's
        self, request: eerl_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> eerl_pb2.HeartbeatResponse:
        self._enter("Heartbeat", context)
        session = self._known(request.session_id, context)
        with self._state.lock:
            session.heartbeats += 1
        return eerl_pb2.HeartbeatResponse(lease_remaining_s=10.0)

    def CloseSession(  # noqa: N802 - gRPC method names are the proto's
        self, request: eerl_pb2.CloseSessionRequest, context: grpc.ServicerContext
    ) -> eerl_pb2.CloseSessionResponse:
        self._enter("CloseSession", context)
        session = self._known(request.session_id, context)
        with self._state.lock:
            session.closed = True
            self._state.live.discard(request.session_id)
        return eerl_pb2.CloseSessionResponse()

    def IssueClaimTicket(  # noqa: N802 - gRPC method names are the proto's
        self, request: eerl_pb2.IssueClaimTicketRequest, context: grpc.ServicerContext
    ) -> eerl_pb2.IssueClaimTicketResponse:
        self._enter("IssueClaimTicket", context)
        ticket = secrets.token_urlsafe(24)
        with self._state.lock:
            self._state.tickets.append(ticket)
        return eerl_pb2.IssueClaimTicketResponse(ticket=ticket, expires_in_s=30.0)

    def _record(
        self,
        session_id: str,
        begin: bool,
        kind: eerl_pb2.PhaseKind.ValueType,
        iteration: int,
        workload: eerl_pb2.Workload,
    ) -> None:
        recorded = RecordedPhase(
            session_id=session_id,
            begin=begin,
            kind=KIND_FROM_PB[kind],
            iteration=iteration,
            workload=workload_from_pb(workload),
        )
        with self._state.lock:
            self._state.phases.append(recorded)


class FakeDaemon:
    """A recording ``PhaseService`` on a Unix socket; a context manager that starts and stops it.

    ``attach=False`` plays a daemon without the Attach stream (the client must heartbeat);
    ``begin_delay_s`` plays a slow daemon; ``scoped=True`` plays a scoped worker socket (a grant's or a
    GPU's), where OpenSession may name no GPUs. ``IssueClaimTicket`` answers a fresh random ticket.
    """

    def __init__(
        self,
        socket_path: str | Path,
        *,
        attach: bool = True,
        begin_delay_s: float = 0.0,
        scoped: bool = False,
    ) -> None:
        self.socket_path = Path(socket_path)
        self._attach = attach
        self._begin_delay_s = begin_delay_s
        self._scoped = scoped
        self._state = _State()
        self._server: grpc.Server | None = None

    @property
    def config(self) -> ClientConfig:
        """A client config that reaches this fake."""
        return ClientConfig.uds(self.socket_path)

    def start(self) -> FakeDaemon:
        """Serves on the socket (again, after :meth:`stop`, with no live sessions)."""
        if self._server is not None:
            return self
        self._state.stopping.clear()
        with self._state.lock:
            self._state.live.clear()
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        eerl_pb2_grpc.add_PhaseServiceServicer_to_server(
            _Servicer(
                self._state, attach=self._attach, begin_delay_s=self._begin_delay_s, scoped=self._scoped
            ),
            server,
        )
        self.socket_path.unlink(missing_ok=True)
        server.add_insecure_port(f"unix://{self.socket_path.absolute()}")
        server.start()
        self._server = server
        return self

    def stop(self) -> None:
        """Stops serving at once, as a killed daemon would; open streams end."""
        server, self._server = self._server, None
        if server is None:
            return
        self._state.stopping.set()
        server.stop(grace=None).wait(5)
        self.socket_path.unlink(missing_ok=True)

    def __enter__(self) -> FakeDaemon:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    @property
    def sessions(self) -> list[RecordedSession]:
        """Every session opened so far, oldest first."""
        with self._state.lock:
            return list(self._state.sessions.values())

    @property
    def phases(self) -> list[RecordedPhase]:
        """Every phase event received so far, in arrival order."""
        with self._state.lock:
            return list(self._state.phases)

    @property
    def tickets_issued(self) -> list[str]:
        """Every claim ticket IssueClaimTicket has answered, oldest first."""
        with self._state.lock:
            return list(self._state.tickets)

    def calls(self, method: str) -> int:
        """How many calls of ``method`` (``"OpenSession"``, ``"EndPhase"``, …) arrived, refused ones too."""
        with self._state.lock:
            return self._state.calls.get(method, 0)

    def refuse(
        self,
        method: str,
        code: grpc.StatusCode,
        details: str = "refused by the fake daemon",
        *,
        times: int | None = None,
    ) -> None:
        """Makes the next ``times`` calls of ``method`` fail with ``code`` (every call, when None, until
        :meth:`heal`); e.g. ``refuse("EndPhase", grpc.StatusCode.FAILED_PRECONDITION, times=1)``."""
        with self._state.lock:
            self._state.refusals[method] = _Refusal(code, details, times)

    def delay(self, method: str, seconds: float) -> None:
        """Makes every call of ``method`` take ``seconds`` longer (a stalled daemon), until :meth:`heal`."""
        with self._state.lock:
            self._state.delays_s[method] = seconds

    def heal(self) -> None:
        """Ends every refusal and delay."""
        with self._state.lock:
            self._state.refusals.clear()
            self._state.delays_s.clear()

    def live_sessions(self) -> list[str]:
        """Ids of the sessions neither closed nor ended by their stream."""
        with self._state.lock:
            return sorted(self._state.live)

    def wait_for(self, predicate: Callable[[FakeDaemon], bool], timeout_s: float = 5.0) -> bool:
        """Polls ``predicate(self)`` until it is true or ``timeout_s`` passes; returns its last value."""
        deadline_s = time.monotonic() + timeout_s
        while True:
            if predicate(self):
                return True
            if time.monotonic() >= deadline_s:
                return False
            time.sleep(0.01)
