"""Which Kubernetes container each GPU is allocated to, from the kubelet's pod-resources API.

dcgm-exporter labels a GPU's series with the ``namespace``, ``pod`` and ``container`` the kubelet allocated
the GPU to, read from the kubelet's pod-resources socket (``v1.PodResourcesLister/List``); eerld does the
same for its per-session series, so that energy per job joins on the labels operators already use.

This module is plain Python: the gRPC client (:mod:`eerld.api.podresources`) is a
:class:`PodResourcesLister`, and :class:`GpuOwners` caches what it lists. A scrape asks :meth:`GpuOwners.
owners`, which lists again when the last answer is older than ``refresh_s``, waiting at most ``timeout_s``;
when the kubelet does not answer, the last answer serves for up to ``max_stale_s`` (then nothing), so that
a slow or restarting kubelet never slows or fails a scrape. :func:`pods_by_uuid` gives every pod of each GPU
for the watch that ends the sessions of GPUs that left their pod (:mod:`eerld.pods.claims`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

__all__ = [
    "DEFAULT_POD_RESOURCES_SOCKET",
    "GPU_RESOURCE_NAMES",
    "DeviceAllocation",
    "GpuOwners",
    "PodDevices",
    "PodOwner",
    "PodResourcesError",
    "PodResourcesLister",
    "owners_by_uuid",
    "pods_by_uuid",
]

log = structlog.get_logger("eerld.pods.owners")

DEFAULT_POD_RESOURCES_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
GPU_RESOURCE_NAMES = ("nvidia.com/gpu", "nvidia.com/gpu.shared")
"""Extended resources whose device ids name whole GPUs (the NVIDIA device plugin's; ``.shared`` under
time-slicing, whose ids carry a ``::N`` replica suffix)."""
REFRESH_S = 5.0
TIMEOUT_S = 1.0
MAX_STALE_S = 60.0


class PodResourcesError(Exception):
    """Listing the kubelet's pod resources failed (no socket, no answer in time, a malformed answer)."""


@dataclass(frozen=True, slots=True)
class DeviceAllocation:
    """Devices of one resource the kubelet allocated to one container."""

    namespace: str
    pod: str
    container: str
    resource_name: str
    device_ids: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PodDevices:
    """One pod the kubelet runs and every device it allocated to the pod's containers (maybe none): eerl-csi
    tells a pod it does not know from a pod without GPUs."""

    namespace: str
    name: str
    allocations: tuple[DeviceAllocation, ...]


@dataclass(frozen=True, slots=True)
class PodOwner:
    """The Kubernetes container a GPU is allocated to."""

    namespace: str
    pod: str
    container: str


class PodResourcesLister(Protocol):
    """The kubelet's ``PodResourcesLister.List``, flattened to device allocations."""

    def list_allocations(self, timeout_s: float) -> Sequence[DeviceAllocation]:
        """Every device allocation of the node's pods now; :class:`PodResourcesError` when that fails."""
        ...

    def close(self) -> None:
        """Release the connection; idempotent."""
        ...


def owners_by_uuid(
    allocations: Iterable[DeviceAllocation], gpus: Iterable[tuple[int, str]]
) -> dict[str, PodOwner]:
    """GPU UUID -> owner, for the GPUs ``gpus`` (index, UUID) of this node.

    A device id is a GPU UUID (the device plugin's default), a UUID with a time-slicing replica suffix
    (``GPU-…::1``), or a GPU index (``deviceIDStrategy=index``). Other resources (MIG slices, NICs) are
    ignored: eerld controls whole GPUs.
    """
    return {uuid: owners[0] for uuid, owners in pods_by_uuid(allocations, gpus).items()}


def pods_by_uuid(
    allocations: Iterable[DeviceAllocation], gpus: Iterable[tuple[int, str]]
) -> dict[str, tuple[PodOwner, ...]]:
    """GPU UUID -> every container it is allocated to, in the kubelet's order (several under time-slicing),
    for the GPUs ``gpus`` (index, UUID) of this node; a GPU allocated to none is absent.

    Device ids are read as :func:`owners_by_uuid` says.
    """
    by_id: dict[str, str] = {}
    for index, gpu_uuid in gpus:
        by_id[str(index)] = by_id[gpu_uuid] = gpu_uuid
    out: dict[str, list[PodOwner]] = {}
    for a in allocations:
        if a.resource_name not in GPU_RESOURCE_NAMES:
            continue
        owner = PodOwner(a.namespace, a.pod, a.container)
        for device_id in a.device_ids:
            uuid = by_id.get(device_id.split("::", 1)[0])  # any other id, however odd, is not a GPU of ours
            if uuid is not None and owner not in out.setdefault(uuid, []):
                out[uuid].append(owner)
    return {uuid: tuple(owners) for uuid, owners in out.items()}


class GpuOwners:
    """What :meth:`owners` last learnt from ``lister``, refreshed at most every ``refresh_s``."""

    def __init__(
        self,
        lister: PodResourcesLister,
        *,
        refresh_s: float = REFRESH_S,
        timeout_s: float = TIMEOUT_S,
        max_stale_s: float = MAX_STALE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lister = lister
        self._refresh_s = refresh_s
        self._timeout_s = timeout_s
        self._max_stale_s = max_stale_s
        self._clock = clock
        self._lock = threading.Lock()
        self._allocations: Sequence[DeviceAllocation] = ()
        self._listed_at: float | None = None
        self._tried_at: float | None = None
        self._failing = False
        self.errors = 0
        """How many lists failed (a test reads it)."""

    def owners(self, gpus: Iterable[tuple[int, str]]) -> Mapping[str, PodOwner]:
        """GPU UUID -> owner for ``gpus`` (index, UUID): the kubelet's answer of at most ``refresh_s`` ago,
        else a new one (waiting at most ``timeout_s``), else the last for ``max_stale_s``, else nothing."""
        with self._lock:  # one scrape lists at a time; another waits at most timeout_s for it
            now = self._clock()
            if self._tried_at is None or now - self._tried_at >= self._refresh_s:
                self._tried_at = now
                self._list(now)
            fresh = self._listed_at is not None and now - self._listed_at <= self._max_stale_s
            allocations = self._allocations if fresh else ()
        return owners_by_uuid(allocations, gpus)

    def _list(self, now: float) -> None:
        try:
            self._allocations = tuple(self._lister.list_allocations(self._timeout_s))
        except Exception as e:  # PodResourcesError, or a lister's bug: never the scrape's failure
            self.errors += 1
            if not self._failing:  # once per outage, not once per scrape
                log.warning(
                    "pod_resources_unavailable", error=str(e), effect="no pod labels until it answers"
                )
            self._failing = True
            return
        if self._failing:
            log.info("pod_resources_available")
        self._failing = False
        self._listed_at = now

    def close(self) -> None:
        """Close the lister."""
        self._lister.close()
