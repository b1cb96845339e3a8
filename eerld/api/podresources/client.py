"""A client of the kubelet's ``v1.PodResourcesLister/List`` on its Unix socket."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path

import grpc

from eerld.api.podresources import api_pb2 as pb
from eerld.pods.owners import DeviceAllocation, PodDevices, PodResourcesError

__all__ = ["LIST_METHOD", "MAX_RESPONSE_BYTES", "KubeletPodResources"]

LIST_METHOD = "/v1.PodResourcesLister/List"
MAX_RESPONSE_BYTES = 16 * 1024 * 1024
"""The kubelet's own limit on a List answer (podresources.DefaultMaxMsgSize)."""


class KubeletPodResources:
    """Lists the node's pod resources over ``socket_path``; the channel is opened on first use.

    With ``optional`` (``--pod-resources-socket auto``) a socket that does not exist lists nothing and is
    no error: eerld runs the same off Kubernetes.
    """

    def __init__(self, socket_path: Path, *, optional: bool = False) -> None:
        self.socket_path = socket_path
        self._optional = optional
        self._lock = threading.Lock()
        self._channel: grpc.Channel | None = None
        self._list: (
            grpc.UnaryUnaryMultiCallable[pb.ListPodResourcesRequest, pb.ListPodResourcesResponse] | None
        ) = None

    def list_allocations(self, timeout_s: float) -> Sequence[DeviceAllocation]:
        """Every device allocated to a container now; PodResourcesError when the kubelet does not answer
        within ``timeout_s`` or answers an error."""
        return tuple(a for pod in self.list_pods(timeout_s) for a in pod.allocations)

    def list_pods(self, timeout_s: float) -> Sequence[PodDevices]:
        """Every pod the kubelet lists now, each with its device allocations (a pod with none included)."""
        if self._optional and not self.socket_path.exists():
            return ()
        call = self._call()
        try:
            reply = call(pb.ListPodResourcesRequest(), timeout=timeout_s, wait_for_ready=False)
        except grpc.RpcError as e:
            code = e.code() if isinstance(e, grpc.Call) else None
            detail = e.details() if isinstance(e, grpc.Call) else str(e)
            name = code.name if code is not None else "UNKNOWN"
            raise PodResourcesError(f"{self.socket_path}: List: {name}: {detail}") from None
        return tuple(
            PodDevices(
                namespace=pod.namespace,
                name=pod.name,
                allocations=tuple(
                    DeviceAllocation(
                        namespace=pod.namespace,
                        pod=pod.name,
                        container=container.name,
                        resource_name=devices.resource_name,
                        device_ids=tuple(devices.device_ids),
                    )
                    for container in pod.containers
                    for devices in container.devices
                ),
            )
            for pod in reply.pod_resources
        )

    def _call(self) -> grpc.UnaryUnaryMultiCallable[pb.ListPodResourcesRequest, pb.ListPodResourcesResponse]:
        with self._lock:
            if self._list is None:
                self._channel = grpc.insecure_channel(
                    f"unix:{self.socket_path}",
                    options=[("grpc.max_receive_message_length", MAX_RESPONSE_BYTES)],
                )
                self._list = self._channel.unary_unary(
                    LIST_METHOD,
                    request_serializer=pb.ListPodResourcesRequest.SerializeToString,
                    response_deserializer=pb.ListPodResourcesResponse.FromString,
                )
            return self._list

    def close(self) -> None:
        """Close the channel; idempotent."""
        with self._lock:
            channel, self._channel, self._list = self._channel, None, None
        if channel is not None:
            channel.close()
