"""eerld's admin socket as eerl-csi uses it: Grant, Revoke and ListGrants, errors as :mod:`eerld.errors`.

eerl-csi runs as root beside eerld (the DaemonSet's pod) and reaches the admin socket there, as eerlctl
does. Each call waits at most ``timeout_s``: a CSI call must answer, and the kubelet retries.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import grpc
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.csi.grant import GrantedSocket, GrantPlan
from eerld.errors import Conflict, DaemonError, NotFound, PermissionDenied, Unavailable, ValidationError

TIMEOUT_S = 5.0
CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
)
"""gRPC's reconnect back-off grows to two minutes by default: the reconcile that follows eerld's return
must reach it (a pending volume's grant), so it is kept to a second."""


class EerldAdmin:
    """An :class:`~eerld.csi.grant.EerldGrants` over ``socket_path`` (its channel connects on first use)."""

    def __init__(self, socket_path: Path, *, timeout_s: float = TIMEOUT_S) -> None:
        self.socket_path = socket_path
        self._timeout_s = timeout_s
        self._channel = grpc.insecure_channel(f"unix:{socket_path}", options=CHANNEL_OPTIONS)
        self._admin = pb_grpc.AdminServiceStub(self._channel)

    def grant(self, plan: GrantPlan) -> GrantedSocket:
        """Grant(own_directory) for the plan; its socket as eerld reports it."""
        request = pb.GrantRequest(
            name=plan.name,
            gpus=[pb.GpuRef(uuid=g.uuid) if g.uuid else pb.GpuRef(index=g.index or 0) for g in plan.gpus],
            uid=plan.uid,
            job_id=plan.job_id,
            reason=plan.reason,
            own_directory=True,
        )
        if plan.gid is not None:
            request.gid = plan.gid
        try:
            reply = self._admin.Grant(request, timeout=self._timeout_s)
        except grpc.RpcError as e:
            raise _error(e, "Grant") from None
        return _granted(reply.grant)

    def revoke(self, name: str, reason: str) -> bool:
        """Revoke by name; False when eerld has no grant of that name (already revoked)."""
        try:
            self._admin.Revoke(pb.RevokeRequest(name=name, reason=reason), timeout=self._timeout_s)
        except grpc.RpcError as e:
            error = _error(e, "Revoke")
            if isinstance(error, NotFound):
                return False
            raise error from None
        return True

    def grants(self) -> Sequence[GrantedSocket]:
        """Every grant of kind ``grant``."""
        try:
            reply = self._admin.ListGrants(pb.ListGrantsRequest(), timeout=self._timeout_s)
        except grpc.RpcError as e:
            raise _error(e, "ListGrants") from None
        return tuple(_granted(g) for g in reply.grants if g.kind == "grant")

    def close(self) -> None:
        """Close the channel; idempotent."""
        self._channel.close()


def _granted(info: pb.GrantInfo) -> GrantedSocket:
    return GrantedSocket(info.name, Path(info.socket_path), info.job_id, tuple(g.index for g in info.gpus))


def _error(e: grpc.RpcError, method: str) -> DaemonError:
    """eerld's status as one of our errors, its message kept (it names the field or the GPU)."""
    code = e.code() if isinstance(e, grpc.Call) else grpc.StatusCode.UNKNOWN
    detail = (e.details() if isinstance(e, grpc.Call) else None) or str(e)
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return Unavailable(f"eerld does not answer on its admin socket ({method}): {detail}")
    if code is grpc.StatusCode.NOT_FOUND:
        return NotFound(f"eerld: {detail}")
    if code in (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.ALREADY_EXISTS):
        return Conflict(f"eerld refused the grant: {detail}")
    if code is grpc.StatusCode.INVALID_ARGUMENT:
        return ValidationError("grant", f"eerld refused it: {detail}")
    if code is grpc.StatusCode.PERMISSION_DENIED:
        return PermissionDenied(f"eerld: {detail}")
    return Unavailable(f"eerld answered {method} with {code.name}: {detail}")


__all__ = ["EerldAdmin"]
