"""Which GPUs a pod gets: those the kubelet's device manager allocated to its containers, nothing else.

The kubelet allocates devices when it admits a pod, before it mounts the pod's volumes, and lists them on
its pod-resources socket (:class:`eerld.api.podresources.KubeletPodResources`); so when NodePublishVolume
comes the pod's GPUs are known, and they come from the kubelet, never from the pod's spec or attributes.
Pure: the listing is an argument.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol

from eerld.errors import Conflict, NotFound
from eerld.pods.owners import GPU_RESOURCE_NAMES, PodDevices

_GPU_UUID = re.compile(r"GPU-[0-9A-Za-z-]{1,92}")  # eerld checks that it names a GPU of the node
_INDEX = re.compile(r"[0-9]{1,4}")


class PodLister(Protocol):
    """The kubelet's pod-resources ``List``, per pod; :class:`~eerld.pods.owners.PodResourcesError` when it
    fails."""

    def list_pods(self, timeout_s: float) -> Sequence[PodDevices]:
        """Every pod the kubelet runs now, with its device allocations."""
        ...

    def close(self) -> None:
        """Release the connection; idempotent."""
        ...


@dataclass(frozen=True, slots=True)
class GpuRef:
    """A GPU as eerld takes it: by UUID (the device plugin's default ids) or by index."""

    uuid: str = ""
    index: int | None = None

    def __str__(self) -> str:
        return self.uuid or str(self.index)


def pod_gpus(pods: Iterable[PodDevices], namespace: str, name: str) -> tuple[GpuRef, ...]:
    """The GPUs allocated to the pod ``namespace/name``, every container together, each once, in order.

    NotFound when the kubelet does not list the pod; Conflict when it lists it with no GPU. A device id is
    a GPU UUID, a UUID with a time-slicing replica suffix (``GPU-…::1``) or an index
    (``deviceIDStrategy=index``); other resources (MIG slices, NICs) are not GPUs eerld controls.
    """
    pod = next((p for p in pods if (p.namespace, p.name) == (namespace, name)), None)
    if pod is None:
        raise NotFound(f"pod {namespace}/{name} is not among the kubelet's pods (pod-resources List)")
    refs: dict[str, GpuRef] = {}
    for allocation in pod.allocations:
        if allocation.resource_name not in GPU_RESOURCE_NAMES:
            continue
        for device_id in allocation.device_ids:
            base = device_id.split("::", 1)[0]
            if _GPU_UUID.fullmatch(base):
                refs.setdefault(base, GpuRef(uuid=base))
            elif _INDEX.fullmatch(base):
                refs.setdefault(base, GpuRef(index=int(base)))
    if not refs:
        raise Conflict(
            f"pod {namespace}/{name} has no GPU allocated by the kubelet "
            f"({' or '.join(GPU_RESOURCE_NAMES)}): there is nothing to grant"
        )
    return tuple(refs.values())


def live_pods(pods: Iterable[PodDevices]) -> frozenset[tuple[str, str]]:
    """(namespace, name) of every pod listed."""
    return frozenset((p.namespace, p.name) for p in pods)


__all__ = ["GpuRef", "PodLister", "live_pods", "pod_gpus"]
