"""What a NodePublishVolume request asks for, checked: which pod, who in it may connect, where to mount.

The kubelet (``podInfoOnMount: true`` in the CSIDriver) adds ``csi.storage.k8s.io/pod.name``,
``pod.namespace``, ``pod.uid`` and ``ephemeral`` to the volume context, over whatever the pod author wrote
under those keys; the author's ``volumeAttributes`` may add only ``uid`` and ``gid``, which decide who
inside the pod may connect to the socket, never which GPUs it claims (those come from the kubelet's
allocation, :mod:`eerld.csi.pods`). Any other attribute is refused, so that a mistyped or hopeful one
(``gpus: "0-7"``) is an error, not ignored. The target path must be the kubelet's directory of that very
pod's volume, which ties the request's pod uid to the path the kubelet mounts into the pod. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import PurePosixPath

from eerld.errors import ValidationError

POD_NAME = "csi.storage.k8s.io/pod.name"
POD_NAMESPACE = "csi.storage.k8s.io/pod.namespace"
POD_UID = "csi.storage.k8s.io/pod.uid"
EPHEMERAL = "csi.storage.k8s.io/ephemeral"
SERVICE_ACCOUNT = "csi.storage.k8s.io/serviceAccount.name"
KUBELET_KEYS = frozenset({POD_NAME, POD_NAMESPACE, POD_UID, EPHEMERAL, SERVICE_ACCOUNT})
AUTHOR_KEYS = frozenset({"uid", "gid"})
MAX_UNIX_ID = 2**32 - 2
_UID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")
_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")
_VOLUME_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True, slots=True)
class PodVolume:
    """A checked publish request: the pod (as the kubelet names it), the socket's owner, the mount point."""

    volume_id: str
    target_path: str
    namespace: str
    pod_name: str
    pod_uid: str
    uid: int
    gid: int | None

    @property
    def pod(self) -> str:
        """``namespace/name``, as logs and messages show it."""
        return f"{self.namespace}/{self.pod_name}"


def parse_publish(
    volume_id: str, target_path: str, context: Mapping[str, str], *, kubelet_dir: str, mount_access: bool
) -> PodVolume:
    """The request's volume, or ValidationError naming the first field that is wrong.

    ``mount_access``: the capability asks for a mounted file system (a block volume cannot carry a socket).
    ``kubelet_dir``: the kubelet's root (``/var/lib/kubelet``), under which every pod's volumes live.
    """
    if not _VOLUME_ID.fullmatch(volume_id):
        raise ValidationError("volume_id", f"{volume_id[:80]!r} is not a volume id the kubelet makes")
    if not mount_access:
        raise ValidationError("volume_capability", "eerl-csi serves a socket: only mount access is supported")
    unknown = sorted(k for k in context if k not in KUBELET_KEYS | AUTHOR_KEYS)
    if unknown:
        raise ValidationError(
            "volume_context",
            f"unknown attribute {unknown[0][:80]!r}: volumeAttributes take uid and gid only (the GPUs come "
            "from the kubelet's allocation, never from the pod)",
        )
    for key in (POD_NAME, POD_NAMESPACE, POD_UID):
        if not context.get(key):
            raise ValidationError(
                "volume_context",
                f"no {key}: the pod is unknown (the CSIDriver csi.eerl.dev needs podInfoOnMount: true)",
            )
    if context.get(EPHEMERAL) != "true":
        raise ValidationError(
            "volume_context",
            "not an inline ephemeral volume (csi.storage.k8s.io/ephemeral is not 'true'): eerl-csi serves "
            "only inline csi volumes of a pod",
        )
    namespace, name, pod_uid = context[POD_NAMESPACE], context[POD_NAME], context[POD_UID]
    if not _DNS_LABEL.fullmatch(namespace):
        raise ValidationError("volume_context", f"{POD_NAMESPACE}: {namespace[:80]!r} is not a namespace")
    if not _DNS_SUBDOMAIN.fullmatch(name):
        raise ValidationError("volume_context", f"{POD_NAME}: {name[:80]!r} is not a pod name")
    if not _UID.fullmatch(pod_uid):
        raise ValidationError("volume_context", f"{POD_UID}: {pod_uid[:80]!r} is not a pod uid")
    uid = _unix_id(context.get("uid"), "uid")
    if uid is None:
        raise ValidationError("volume_context", "uid: required (the user in the pod that may connect)")
    gid = _unix_id(context.get("gid"), "gid")
    check_target_path(target_path, kubelet_dir, pod_uid)
    return PodVolume(volume_id, target_path, namespace, name, pod_uid, uid, gid)


def check_target_path(target_path: str, kubelet_dir: str, pod_uid: str | None) -> None:
    """ValidationError unless the path is ``<kubelet_dir>/pods/<pod uid>/volumes/kubernetes.io~csi/<v>/mount``
    (of ``pod_uid`` when given): eerl-csi mounts nowhere else."""
    path = PurePosixPath(target_path)
    root = PurePosixPath(kubelet_dir)
    parts = path.parts[len(root.parts) :]
    if (
        "\0" in target_path
        or not path.is_absolute()
        or ".." in path.parts
        or path.parts[: len(root.parts)] != root.parts
        or len(parts) != 6
        or parts[0] != "pods"
        or not _UID.fullmatch(parts[1])
        or parts[2:4] != ("volumes", "kubernetes.io~csi")
        or parts[5] != "mount"
    ):
        raise ValidationError(
            "target_path",
            f"{target_path[:200]!r} is not a pod volume's mount point under {kubelet_dir}/pods/",
        )
    if pod_uid is not None and parts[1] != pod_uid:
        raise ValidationError("target_path", f"{target_path[:200]!r} is not a volume of pod uid {pod_uid}")


def _unix_id(value: str | None, key: str) -> int | None:
    if value is None:
        return None
    if not re.fullmatch(r"[0-9]{1,10}", value) or int(value) > MAX_UNIX_ID:
        raise ValidationError("volume_context", f"{key}: {value[:40]!r} is not a numeric id")
    return int(value)


__all__ = ["AUTHOR_KEYS", "KUBELET_KEYS", "PodVolume", "check_target_path", "parse_publish"]
