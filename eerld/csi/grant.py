"""The grant eerl-csi asks eerld for, per volume, and the one small interface it asks through.

One grant per volume: named ``csi-`` and a digest of the volume id (a kubelet's inline volume id is
``csi-<sha256>``, too long for a grant name), so that NodeUnpublishVolume, which carries only the volume id
and the target path, finds it without any state; the job id is the pod's uid, so that only the pod's own
sessions (``EERL_JOB_ID`` from the downward API's ``metadata.uid``) open through it, and a pod re-created
under the same name is another job. Its socket is ``<grant dir>/<name>/eerld.sock`` in a directory of its
own (``own_directory``), which is what gets mounted. Pure: :class:`EerldGrants` is implemented over gRPC by
:mod:`eerld.csi.eerld_admin`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from eerld.csi.pods import GpuRef
from eerld.csi.volume import PodVolume

GRANT_PREFIX = "csi-"
"""Every grant eerl-csi makes is named so, and eerl-csi revokes no other."""


@dataclass(frozen=True, slots=True)
class GrantPlan:
    """What to ask eerld: a scoped socket for these GPUs, owned by uid (and gid), for this job only."""

    name: str
    gpus: tuple[GpuRef, ...]
    uid: int
    gid: int | None
    job_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class GrantedSocket:
    """A grant as eerld reports it."""

    name: str
    socket_path: Path
    job_id: str
    gpu_indices: tuple[int, ...]


def grant_name(volume_id: str) -> str:
    """The name of the grant of ``volume_id`` (40 characters, a valid grant name)."""
    return GRANT_PREFIX + hashlib.sha256(volume_id.encode()).hexdigest()[:36]


def plan_grant(volume: PodVolume, gpus: Sequence[GpuRef]) -> GrantPlan:
    """The grant for ``volume``: the pod's GPUs, the socket's owner from the volume attributes."""
    return GrantPlan(
        name=grant_name(volume.volume_id),
        gpus=tuple(gpus),
        uid=volume.uid,
        gid=volume.gid,
        job_id=volume.pod_uid,
        reason=f"eerl-csi: pod {volume.pod} (uid {volume.pod_uid}), volume {volume.volume_id}",
    )


class EerldGrants(Protocol):
    """eerld's admin socket, as far as eerl-csi uses it. Errors are of :mod:`eerld.errors`: Unavailable
    when eerld does not answer, and eerld's own verdict otherwise (NotFound, Conflict, ValidationError…)."""

    def grant(self, plan: GrantPlan) -> GrantedSocket:
        """Make the grant (a socket in a directory of its own)."""
        ...

    def revoke(self, name: str, reason: str) -> bool:
        """Revoke the grant; False when there was none of that name."""
        ...

    def grants(self) -> Sequence[GrantedSocket]:
        """Every grant of kind ``grant`` in force."""
        ...

    def close(self) -> None:
        """Close the channel."""
        ...


__all__ = ["GRANT_PREFIX", "EerldGrants", "GrantPlan", "GrantedSocket", "grant_name", "plan_grant"]
