"""An in-memory daemon and its link, for tests: fast, no socket, no thread of its own.

A :class:`MemoryDaemon` answers the phase service as eerld does in outline (sessions, one open phase per
session, ``Attach`` streams that bind a session, claim tickets, job-mode verdicts), records every call, and
fails on demand: :meth:`MemoryDaemon.fail` queues failures for one RPC, :attr:`MemoryDaemon.down` refuses
every call as an absent daemon would, :meth:`MemoryDaemon.restart` forgets every session (later calls for
them answer ``NOT_FOUND``) and ends every stream. Give :meth:`MemoryDaemon.connect` where a
:data:`eerl.link.Connect` is taken (``eerl.connect(link=...)``, :class:`eerl.job.node.NodeLink`)::

    daemon = MemoryDaemon()
    with eerl.connect(gpus=[0], link=daemon.connect) as session:
        ...
    assert daemon.rpcs("BeginPhase")

What it is not: a model of the controller or the clocks (each begin answers :attr:`MemoryDaemon.sm_clock_mhz`)
or of eerld's checks (every field is taken as it is). Those are the real daemon's tests.
"""

from __future__ import annotations

import itertools
import queue
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from eerl.link.base import Code, LinkError
from eerl.v1 import eerl_pb2

__all__ = ["MemoryDaemon", "MemoryLink", "Rpc"]


@dataclass(frozen=True, slots=True)
class Rpc:
    """One call the daemon took: its name, its request and the socket it came in on (None: the session's)."""

    name: str
    request: Any
    socket_path: str | None


@dataclass(slots=True)
class _Session:
    session_id: str
    gpus: int
    link: MemoryLink
    open_phase: tuple[int, int] | None = None
    streams: list[_MemoryAttach] = field(default_factory=list)


class MemoryDaemon:
    """The daemon's phase service in memory; see the module docstring. Thread-safe."""

    def __init__(
        self,
        *,
        gpus: int = 1,
        supported_sm_clocks_mhz: tuple[int, ...] = (1005, 1410, 1980),
        lease_ttl_s: float = 10.0,
        offer_attach: bool = True,
    ) -> None:
        self.gpus = gpus
        self.supported_sm_clocks_mhz = supported_sm_clocks_mhz
        self.lease_ttl_s = lease_ttl_s
        self.offer_attach = offer_attach
        """False: ``Attach`` answers UNIMPLEMENTED (an older daemon; the client heartbeats)."""
        self.down = False
        """True: every call answers UNAVAILABLE, as an absent daemon would."""
        self.sm_clock_mhz = 1410
        """The clock each begin answers with (0: the default governor)."""
        self.verdict: eerl_pb2.DirectiveVerdict.ValueType = eerl_pb2.DIRECTIVE_VERDICT_ACCEPTED
        """The verdict a job-mode begin gets."""
        self._lock = threading.Lock()
        self._sessions: dict[str, _Session] = {}
        self._failures: dict[str, list[LinkError]] = {}
        self._calls: list[Rpc] = []
        self._ids = itertools.count(1)
        self.links_opened = 0
        self.closed_sessions: list[str] = []

    # -- for tests ---------------------------------------------------------------------------------

    def connect(self, socket_path: str | None = None) -> MemoryLink:
        """A new link to this daemon (a :data:`eerl.link.Connect`)."""
        with self._lock:
            self.links_opened += 1
        return MemoryLink(self, socket_path)

    def fail(self, rpc: str, code: Code, details: str = "", *, times: int = 1) -> None:
        """The next ``times`` calls of ``rpc`` (``"BeginPhase"``, ``"OpenSession"``, …) fail with ``code``."""
        with self._lock:
            self._failures.setdefault(rpc, []).extend(LinkError(code, details) for _ in range(times))

    def restart(self) -> None:
        """Forgets every session (calls for them answer NOT_FOUND) and ends every Attach stream."""
        with self._lock:
            sessions = list(self._sessions.values())
            self._sessions.clear()
        for session in sessions:
            for stream in session.streams:
                stream.end(LinkError(Code.UNAVAILABLE, "the daemon restarted"))

    def rpcs(self, name: str | None = None) -> list[Rpc]:
        """The calls taken so far (of ``name`` only, if given), oldest first."""
        with self._lock:
            return [call for call in self._calls if name is None or call.name == name]

    @property
    def sessions(self) -> list[str]:
        """The ids of the sessions open now."""
        with self._lock:
            return list(self._sessions)

    # -- the service -------------------------------------------------------------------------------

    def _enter(self, name: str, request: object, link: MemoryLink) -> None:
        """Records a call and raises the failure it should meet; holds no lock after."""
        with self._lock:
            self._calls.append(Rpc(name, request, link.socket_path))
            if link.closed:
                raise LinkError(Code.CANCELLED, "the channel is closed")
            if self.down:
                raise LinkError(Code.UNAVAILABLE, "the daemon is down")
            pending = self._failures.get(name)
            if pending:
                raise pending.pop(0)

    def _session(self, session_id: str) -> _Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise LinkError(Code.NOT_FOUND, "no such session")
        return session

    def open_session(
        self, link: MemoryLink, request: eerl_pb2.OpenSessionRequest
    ) -> eerl_pb2.OpenSessionResponse:
        self._enter("OpenSession", request, link)
        gpus = len(request.gpus) or self.gpus
        with self._lock:
            session_id = f"memory-session-{next(self._ids)}"
            self._sessions[session_id] = _Session(session_id, gpus, link)
        infos = [
            eerl_pb2.GpuInfo(
                index=i, uuid=f"GPU-memory-{i}", supported_sm_clocks_mhz=self.supported_sm_clocks_mhz
            )
            for i in range(gpus)
        ]
        return eerl_pb2.OpenSessionResponse(
            session_id=session_id, lease_ttl_s=request.lease_ttl_s or self.lease_ttl_s, gpus=infos
        )

    def begin_phase(
        self, link: MemoryLink, request: eerl_pb2.BeginPhaseRequest
    ) -> eerl_pb2.BeginPhaseResponse:
        self._enter("BeginPhase", request, link)
        with self._lock:
            session = self._session(request.session_id)
            resynced = session.open_phase is not None
            session.open_phase = (request.kind, request.iteration)
        reply = eerl_pb2.BeginPhaseResponse(
            target_sm_clock_mhz=self.sm_clock_mhz,
            state=eerl_pb2.CONTROLLER_STATE_EXPLORING,
            resynced=resynced,
            clocks=[
                eerl_pb2.GpuClock(
                    index=i, sm_clock_mhz=self.sm_clock_mhz, requested_sm_clock_mhz=self.sm_clock_mhz
                )
                for i in range(session.gpus)
            ],
        )
        if request.HasField("directive"):
            reply.verdict = self.verdict
            reply.applied_epoch = request.directive.epoch
        return reply

    def end_phase(self, link: MemoryLink, request: eerl_pb2.EndPhaseRequest) -> eerl_pb2.EndPhaseResponse:
        self._enter("EndPhase", request, link)
        with self._lock:
            session = self._session(request.session_id)
            if session.open_phase != (request.kind, request.iteration):
                raise LinkError(Code.FAILED_PRECONDITION, "no such phase is open")
            session.open_phase = None
        return eerl_pb2.EndPhaseResponse(
            duration_s=0.5,
            energy_mj=150_000.0,
            mean_power_w=300.0,
            sm_clock_mhz=self.sm_clock_mhz,
            gpus=session.gpus,
        )

    def heartbeat(self, link: MemoryLink, session_id: str) -> None:
        self._enter("Heartbeat", session_id, link)
        with self._lock:
            self._session(session_id)

    def close_session(self, link: MemoryLink, session_id: str) -> None:
        self._enter("CloseSession", session_id, link)
        self._end(session_id)

    def attach(self, link: MemoryLink, session_id: str) -> _MemoryAttach:
        stream = _MemoryAttach(self, session_id)
        try:
            self._enter("Attach", session_id, link)
            if not self.offer_attach:
                raise LinkError(Code.UNIMPLEMENTED, "Method not found!")
            with self._lock:
                self._session(session_id).streams.append(stream)
        except LinkError as e:
            stream.end(e)
            return stream
        stream.put(eerl_pb2.SessionEvent(timestamp_unix_s=time.time(), message="attached"))
        return stream

    def issue_claim_ticket(self, link: MemoryLink) -> str:
        self._enter("IssueClaimTicket", None, link)
        return f"ticket:{link.socket_path}"

    def _end(self, session_id: str) -> None:
        """Ends a session (closed, or its stream or channel ended): its streams end too."""
        with self._lock:
            session = self._sessions.pop(session_id, None)
            if session is None:
                return
            self.closed_sessions.append(session_id)
        for stream in session.streams:
            stream.end(None)

    def _link_closed(self, link: MemoryLink) -> None:
        with self._lock:
            bound = [s.session_id for s in self._sessions.values() if s.link is link]
        for session_id in bound:
            self._end(session_id)


_END = object()


class _MemoryAttach:
    """An Attach stream: the daemon puts events; the reader iterates until it ends."""

    def __init__(self, daemon: MemoryDaemon, session_id: str) -> None:
        self._daemon = daemon
        self._session_id = session_id
        self._events: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._error: LinkError | None = None
        self._ended = False

    def put(self, event: eerl_pb2.SessionEvent) -> None:
        self._events.put(event)

    def end(self, error: LinkError | None) -> None:
        if not self._ended:
            self._ended = True
            self._error = error
            self._events.put(_END)

    def __iter__(self) -> Iterator[eerl_pb2.SessionEvent]:
        while True:
            item = self._events.get()
            if item is _END:
                if self._error is not None:
                    raise self._error
                return
            assert isinstance(item, eerl_pb2.SessionEvent)
            yield item

    def cancel(self) -> None:
        """Cancels the stream: the daemon ends the session it binds, as eerld does."""
        self.end(LinkError(Code.CANCELLED, "Locally cancelled by application!"))
        self._daemon._end(self._session_id)


class MemoryLink:
    """A :class:`eerl.link.DaemonLink` to a :class:`MemoryDaemon` (one per connection)."""

    def __init__(self, daemon: MemoryDaemon, socket_path: str | None = None) -> None:
        self.daemon = daemon
        self.socket_path = socket_path
        self.closed = False

    def open_session(
        self, request: eerl_pb2.OpenSessionRequest, timeout_s: float
    ) -> eerl_pb2.OpenSessionResponse:
        return self.daemon.open_session(self, request)

    def begin_phase(
        self, request: eerl_pb2.BeginPhaseRequest, timeout_s: float
    ) -> eerl_pb2.BeginPhaseResponse:
        return self.daemon.begin_phase(self, request)

    def end_phase(self, request: eerl_pb2.EndPhaseRequest, timeout_s: float) -> eerl_pb2.EndPhaseResponse:
        return self.daemon.end_phase(self, request)

    def heartbeat(self, session_id: str, timeout_s: float) -> None:
        self.daemon.heartbeat(self, session_id)

    def close_session(self, session_id: str, timeout_s: float) -> None:
        self.daemon.close_session(self, session_id)

    def attach(self, session_id: str) -> _MemoryAttach:
        return self.daemon.attach(self, session_id)

    def issue_claim_ticket(self, timeout_s: float) -> str:
        return self.daemon.issue_claim_ticket(self)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.daemon._link_closed(self)
