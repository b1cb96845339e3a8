"""The admin socket's client: one channel to eerld's AdminService, for eerlctl and for tools that read it.

``AdminClient(socket)`` opens an insecure channel to a Unix socket path (or a full gRPC target) and offers
the reads by name (:meth:`AdminClient.status`, :meth:`~AdminClient.sessions`, :meth:`~AdminClient.decisions`)
and the stub for every other call. A failing call raises :class:`grpc.RpcError`, as the stub does: what a
failure means is the caller's to say (eerlctl explains it in one ``Error:`` line; the live demo carries on
without the reading). Close it, or use it as a context manager.
"""

from __future__ import annotations

import os
from types import TracebackType

import grpc
from eerl.phases import PhaseKind
from eerl.v1 import eerl_pb2, eerl_pb2_grpc
from eerl.wire.enums import KIND_TO_PB
from eerl.wire.metadata import CALLER_METADATA

__all__ = ["CALLER_METADATA", "DEFAULT_TIMEOUT_S", "AdminClient", "socket_target"]

DEFAULT_TIMEOUT_S = 10.0
"""How long a call waits for eerld unless told otherwise (eerlctl's ``--timeout`` default)."""

_FULL_TARGETS = ("unix:", "unix-abstract:", "dns:", "ipv4:", "ipv6:")


def socket_target(socket: str | os.PathLike[str]) -> str:
    """A gRPC target for the socket path (full targets such as ``unix:///…`` pass through)."""
    text = os.fspath(socket)
    return text if text.startswith(_FULL_TARGETS) else f"unix:{text}"


class AdminClient:
    """A channel to eerld's admin socket and its ``AdminService`` stub."""

    def __init__(self, socket: str | os.PathLike[str]) -> None:
        self.target = socket_target(socket)
        self.channel = grpc.insecure_channel(self.target)
        self.stub = eerl_pb2_grpc.AdminServiceStub(self.channel)

    def wait_ready(self, timeout_s: float) -> bool:
        """True once the channel is up and Status answers, each within ``timeout_s``; False otherwise."""
        try:
            grpc.channel_ready_future(self.channel).result(timeout=timeout_s)
            self.status(timeout_s=timeout_s)
        except (grpc.FutureTimeoutError, grpc.RpcError):
            return False
        return True

    def status(self, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> eerl_pb2.StatusResponse:
        """The node's GPUs, clocks, owners and sessions."""
        reply: eerl_pb2.StatusResponse = self.stub.Status(eerl_pb2.StatusRequest(), timeout=timeout_s)
        return reply

    def sessions(self, *, timeout_s: float = DEFAULT_TIMEOUT_S) -> list[eerl_pb2.SessionInfo]:
        """The open sessions."""
        reply = self.stub.ListSessions(eerl_pb2.ListSessionsRequest(), timeout=timeout_s)
        return list(reply.sessions)

    def decisions(
        self,
        *,
        session_id: str = "",
        kind: PhaseKind | None = None,
        limit: int = 0,
        timeout_s: float = DEFAULT_TIMEOUT_S,
    ) -> list[eerl_pb2.Decision]:
        """The controllers' decisions, oldest first: of one session and one phase kind when given, the last
        ``limit`` when not 0 (else the daemon's whole history)."""
        request = eerl_pb2.GetDecisionsRequest(session_id=session_id, limit=limit)
        if kind is not None:
            request.kind = KIND_TO_PB[kind]
        reply = self.stub.GetDecisions(request, timeout=timeout_s)
        return list(reply.decisions)

    def reports(
        self, *, job_id: str = "", timeout_s: float = DEFAULT_TIMEOUT_S
    ) -> list[eerl_pb2.SessionReport]:
        """The finished sessions' reports the daemon keeps, oldest first (one job's when given)."""
        reply = self.stub.Report(eerl_pb2.ReportRequest(job_id=job_id), timeout=timeout_s)
        return list(reply.reports)

    def close(self) -> None:
        """Close the channel."""
        self.channel.close()

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
