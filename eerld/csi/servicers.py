# ruff: noqa: N802 - method names are the RPC names of the CSI spec
"""The CSI Identity and Node services, thin: decode the request, call :class:`~eerld.csi.node.NodePlugin`,
encode the answer; errors of :mod:`eerld.errors` become one gRPC status each, in :func:`_status`, by the
mapping eerld's own interceptor uses (:func:`eerld.api.interceptors.status_code_for`).

Only what an inline ephemeral volume needs is served: NodePublishVolume and NodeUnpublishVolume, no stage
(no ``STAGE_UNSTAGE_VOLUME`` capability), no controller service; the rest answer UNIMPLEMENTED.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NoReturn, TypeVar

import grpc
import structlog
from google.protobuf import wrappers_pb2

from eerld import __version__
from eerld.api.interceptors import status_code_for
from eerld.csi import DRIVER_NAME
from eerld.csi.node import NodePlugin
from eerld.csi.proto import csi_pb2 as pb
from eerld.csi.proto import csi_pb2_grpc as pb_grpc
from eerld.errors import DaemonError, ValidationError

log = structlog.get_logger("eerld.csi")

T = TypeVar("T")


def _status(context: grpc.ServicerContext, method: str, call: Callable[[], T]) -> T:
    """Run ``call``; an eerl error aborts with its code (eerld's own mapping, :func:`status_code_for`) and its
    one-line message, anything else INTERNAL."""
    try:
        return call()
    except DaemonError as e:
        code = status_code_for(e)
        message = " ".join(str(e).split())
        log.warning("csi_refused", method=method, code=code.name, error=message)
        context.abort(code, message)
    except Exception:
        log.exception("csi_internal_error", method=method)
        context.abort(grpc.StatusCode.INTERNAL, f"{method}: internal error (see eerl-csi's log)")
    raise AssertionError("unreachable: abort raises")


class IdentityServicer(pb_grpc.IdentityServicer):
    """Who the plugin is: ``csi.eerl.dev``, a node plugin only, always ready once it serves."""

    def GetPluginInfo(
        self, request: pb.GetPluginInfoRequest, context: grpc.ServicerContext
    ) -> pb.GetPluginInfoResponse:
        return pb.GetPluginInfoResponse(name=DRIVER_NAME, vendor_version=__version__)

    def GetPluginCapabilities(
        self, request: pb.GetPluginCapabilitiesRequest, context: grpc.ServicerContext
    ) -> pb.GetPluginCapabilitiesResponse:
        return pb.GetPluginCapabilitiesResponse()  # no controller service, no topology

    def Probe(self, request: pb.ProbeRequest, context: grpc.ServicerContext) -> pb.ProbeResponse:
        return pb.ProbeResponse(ready=wrappers_pb2.BoolValue(value=True))


class NodeServicer(pb_grpc.NodeServicer):
    """Publish and unpublish through :class:`NodePlugin`; the node's id for the kubelet's registration."""

    def __init__(self, plugin: NodePlugin, node_id: str) -> None:
        self._plugin = plugin
        self._node_id = node_id

    def NodeGetInfo(
        self, request: pb.NodeGetInfoRequest, context: grpc.ServicerContext
    ) -> pb.NodeGetInfoResponse:
        return pb.NodeGetInfoResponse(node_id=self._node_id)

    def NodeGetCapabilities(
        self, request: pb.NodeGetCapabilitiesRequest, context: grpc.ServicerContext
    ) -> pb.NodeGetCapabilitiesResponse:
        return pb.NodeGetCapabilitiesResponse()  # publish and unpublish only: no stage, stats or expand

    def NodePublishVolume(
        self, request: pb.NodePublishVolumeRequest, context: grpc.ServicerContext
    ) -> pb.NodePublishVolumeResponse:
        mount_access = request.HasField("volume_capability") and request.volume_capability.HasField("mount")

        def publish() -> pb.NodePublishVolumeResponse:
            self._plugin.publish(
                request.volume_id,
                request.target_path,
                dict(request.volume_context),
                mount_access=mount_access,
            )
            return pb.NodePublishVolumeResponse()

        return _status(context, "NodePublishVolume", publish)

    def NodeUnpublishVolume(
        self, request: pb.NodeUnpublishVolumeRequest, context: grpc.ServicerContext
    ) -> pb.NodeUnpublishVolumeResponse:
        def unpublish() -> pb.NodeUnpublishVolumeResponse:
            if not request.volume_id:
                raise ValidationError("volume_id", "required")
            self._plugin.unpublish(request.volume_id, request.target_path)
            return pb.NodeUnpublishVolumeResponse()

        return _status(context, "NodeUnpublishVolume", unpublish)

    # -- not served: a socket has no stage, no stats, no size -------------------------------------------

    def NodeStageVolume(
        self, request: pb.NodeStageVolumeRequest, context: grpc.ServicerContext
    ) -> pb.NodeStageVolumeResponse:
        _unimplemented(context, "NodeStageVolume")

    def NodeUnstageVolume(
        self, request: pb.NodeUnstageVolumeRequest, context: grpc.ServicerContext
    ) -> pb.NodeUnstageVolumeResponse:
        _unimplemented(context, "NodeUnstageVolume")

    def NodeGetVolumeStats(
        self, request: pb.NodeGetVolumeStatsRequest, context: grpc.ServicerContext
    ) -> pb.NodeGetVolumeStatsResponse:
        _unimplemented(context, "NodeGetVolumeStats")

    def NodeExpandVolume(
        self, request: pb.NodeExpandVolumeRequest, context: grpc.ServicerContext
    ) -> pb.NodeExpandVolumeResponse:
        _unimplemented(context, "NodeExpandVolume")


def _unimplemented(context: grpc.ServicerContext, method: str) -> NoReturn:
    """UNIMPLEMENTED, as the spec asks of a capability the plugin does not report."""
    context.abort(grpc.StatusCode.UNIMPLEMENTED, f"{method}: eerl-csi serves inline ephemeral volumes only")
    raise AssertionError("unreachable: abort raises")


__all__ = ["IdentityServicer", "NodeServicer"]
