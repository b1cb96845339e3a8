"""The gRPC link: one channel to one worker socket of the daemon; the only link module that imports grpc.

Each link is a channel of its own with a connection of its own (:mod:`eerl._channel`: a local subchannel
pool), so one session costs the process one connection. gRPC's errors become :class:`LinkError` here, in
one place, with the same code names.
"""

from __future__ import annotations

from collections.abc import Iterator

import grpc

from eerl._channel import make_channel
from eerl.config import ClientConfig
from eerl.link.base import Code, Connect, LinkError
from eerl.v1 import eerl_pb2, eerl_pb2_grpc

__all__ = ["GrpcLink", "grpc_connect", "link_error"]


def link_error(error: grpc.RpcError) -> LinkError:
    """The :class:`LinkError` for a gRPC failure (its code by name, its details)."""
    code = error.code() if hasattr(error, "code") else None
    details = error.details() if hasattr(error, "details") else ""
    name = code.name if code is not None else "UNKNOWN"
    return LinkError(Code.__members__.get(name, Code.UNKNOWN), details or "")


class _GrpcAttach:
    """The ``Attach`` call, read as an :class:`eerl.link.AttachStream`."""

    def __init__(self, call: grpc.CallIterator[eerl_pb2.SessionEvent]) -> None:
        self._call = call

    def __iter__(self) -> Iterator[eerl_pb2.SessionEvent]:
        try:
            yield from self._call
        except grpc.RpcError as e:
            raise link_error(e) from None

    def cancel(self) -> None:
        self._call.cancel()  # type: ignore[no-untyped-call]  # grpc-stubs leaves RpcContext.cancel untyped


class GrpcLink:
    """A :class:`eerl.link.DaemonLink` over gRPC to ``config``'s daemon (or, ``socket_path``, another worker
    socket of it)."""

    def __init__(self, config: ClientConfig, *, socket_path: str | None = None) -> None:
        self._channel = make_channel(config, socket_path=socket_path)
        self._stub = eerl_pb2_grpc.PhaseServiceStub(self._channel)

    def open_session(
        self, request: eerl_pb2.OpenSessionRequest, timeout_s: float
    ) -> eerl_pb2.OpenSessionResponse:
        try:
            return self._stub.OpenSession(request, timeout=timeout_s)
        except grpc.RpcError as e:
            raise link_error(e) from None

    def begin_phase(
        self, request: eerl_pb2.BeginPhaseRequest, timeout_s: float
    ) -> eerl_pb2.BeginPhaseResponse:
        try:
            return self._stub.BeginPhase(request, timeout=timeout_s)
        except grpc.RpcError as e:
            raise link_error(e) from None

    def end_phase(self, request: eerl_pb2.EndPhaseRequest, timeout_s: float) -> eerl_pb2.EndPhaseResponse:
        try:
            return self._stub.EndPhase(request, timeout=timeout_s)
        except grpc.RpcError as e:
            raise link_error(e) from None

    def heartbeat(self, session_id: str, timeout_s: float) -> None:
        try:
            self._stub.Heartbeat(eerl_pb2.HeartbeatRequest(session_id=session_id), timeout=timeout_s)
        except grpc.RpcError as e:
            raise link_error(e) from None

    def close_session(self, session_id: str, timeout_s: float) -> eerl_pb2.CloseSessionResponse:
        try:
            reply: eerl_pb2.CloseSessionResponse = self._stub.CloseSession(
                eerl_pb2.CloseSessionRequest(session_id=session_id), timeout=timeout_s
            )
            return reply
        except grpc.RpcError as e:
            raise link_error(e) from None

    def attach(self, session_id: str) -> _GrpcAttach:
        try:
            return _GrpcAttach(self._stub.Attach(eerl_pb2.AttachRequest(session_id=session_id)))
        except grpc.RpcError as e:  # pragma: no cover - a unary-stream call reports errors when read
            raise link_error(e) from None

    def issue_claim_ticket(self, timeout_s: float) -> str:
        try:
            return self._stub.IssueClaimTicket(eerl_pb2.IssueClaimTicketRequest(), timeout=timeout_s).ticket
        except grpc.RpcError as e:
            raise link_error(e) from None

    def close(self) -> None:
        self._channel.close()


def grpc_connect(config: ClientConfig) -> Connect:
    """The :data:`eerl.link.Connect` for ``config``: a new :class:`GrpcLink` per call."""

    def connect(socket_path: str | None) -> GrpcLink:
        return GrpcLink(config, socket_path=socket_path)

    return connect
