"""What the eerl-csi tests share: a fake kubelet (its pod-resources socket, its volume paths and the CSI calls
it makes), an eerl-csi process, and the cleanup of any mount a test leaves behind.

The kubelet's part is played as it is played on a node: pod-resources ``List`` on a Unix socket (as the
kubelet answers it, a pod with no device included), and NodePublishVolume / NodeUnpublishVolume over the
plugin's real socket with the generated CSI stubs, with the volume context the kubelet builds for an inline
volume (``podInfoOnMount``) and a target path under its pods directory.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from eerld.api.podresources import api_pb2 as kpb
from eerld.csi.mounts import mount_points, unmount
from eerld.csi.proto import csi_pb2 as csi
from eerld.csi.proto import csi_pb2_grpc as csi_grpc
from eerld.testing import DaemonHandle, FakeGpuBackend, running_daemon
from soak.daemon import stop_process
from tests.kubelet import pod_resources_server
from tests.security.conftest import call, run_as

POD_USER = 65532
"""The sidecar's uid and gid in deploy/kubernetes/rl-job-sidecar-pod.yaml."""
START_TIMEOUT_S = 30.0


def csi_eerld(directory: Path) -> AbstractContextManager[DaemonHandle]:
    """eerld as the DaemonSet runs it: multi-tenant, grants under ``directory/grants``, 4 fake GPUs; again
    over the same directory, it is eerld restarted (same sockets, same grant directory)."""
    return running_daemon(directory, backend=FakeGpuBackend(4), reaper=False, tenancy="multi")


def open_call(*gpus: int, job_id: str) -> dict[str, Any]:
    """OpenSession of ``gpus`` (none: the socket's own) for ``job_id``, for :func:`as_pod_user`."""
    return call("PhaseService", "OpenSession", {"jobId": job_id, "gpus": [{"index": i} for i in gpus]})


def as_pod_user(target: Path, calls: list[dict[str, Any]]) -> list[str]:
    """The status codes of ``calls`` made by the pod's user through the socket at the volume's path."""
    return [o.code for o in run_as(f"unix:{target / 'eerld.sock'}", calls, uid=POD_USER, gid=POD_USER)]


@dataclass
class Pod:
    """A pod the fake kubelet runs: its GPUs are device ids of ``nvidia.com/gpu``."""

    namespace: str
    name: str
    gpus: tuple[str, ...] = ()
    uid: str = field(default_factory=lambda: str(uuid.uuid4()))
    extra: tuple[tuple[str, tuple[str, ...]], ...] = ()
    """Other resources: (resource name, device ids)."""

    def resources(self) -> kpb.PodResources:
        devices = [kpb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=list(self.gpus))]
        devices = devices if self.gpus else []
        devices += [kpb.ContainerDevices(resource_name=r, device_ids=list(ids)) for r, ids in self.extra]
        containers = [kpb.ContainerResources(name="trainer", devices=devices)]
        containers.append(kpb.ContainerResources(name="eerl-sidecar"))
        return kpb.PodResources(name=self.name, namespace=self.namespace, containers=containers)


@dataclass
class FakeKubelet:
    """Pod-resources on ``socket_path`` listing ``pods``; the kubelet's directory for volume paths."""

    socket_path: Path
    kubelet_dir: Path
    pods: list[Pod] = field(default_factory=list)
    server: grpc.Server | None = None

    def stop(self) -> None:
        """The kubelet goes away (its pod-resources server stops)."""
        if self.server is not None:
            self.server.stop(0)

    def list(self, request: kpb.ListPodResourcesRequest, context: grpc.ServicerContext) -> Any:
        return kpb.ListPodResourcesResponse(pod_resources=[p.resources() for p in self.pods])

    def target_path(self, pod: Pod, volume: str = "e") -> Path:
        """The kubelet's mount point of ``pod``'s inline volume ``volume``; it creates the parent."""
        parent = self.kubelet_dir / "pods" / pod.uid / "volumes" / "kubernetes.io~csi" / volume
        parent.mkdir(parents=True, exist_ok=True)
        for directory in (parent, *parent.parents):
            if directory == self.kubelet_dir.parent:
                break
            directory.chmod(0o755)  # the pod's user must reach the mount through them, as in a container
        return parent / "mount"


@contextmanager
def fake_kubelet(directory: Path) -> Iterator[FakeKubelet]:
    """A kubelet's pod-resources socket in ``directory``, and its root ``directory/k``; every mount left
    under that root is unmounted at the end."""
    kubelet = FakeKubelet(directory / "kubelet.sock", directory / "k")
    kubelet.kubelet_dir.mkdir(mode=0o755)
    try:
        with pod_resources_server(kubelet.socket_path, kubelet.list) as server:
            kubelet.server = server
            yield kubelet
    finally:
        unmount_all_under(kubelet.kubelet_dir)


def unmount_all_under(root: Path) -> None:
    """Unmount every mount point at or under ``root`` (a test's leftovers), the deepest first."""
    real = Path(os.path.realpath(root))
    points = [p for p in mount_points() if p == real or real in p.parents]
    for point in sorted(points, key=lambda p: len(p.parts), reverse=True):
        unmount(point)


def volume_context(pod: Pod, **attributes: str) -> dict[str, str]:
    """The context the kubelet sends for an inline volume of ``pod``: its attributes, then its own keys."""
    return {
        **attributes,
        "csi.storage.k8s.io/pod.name": pod.name,
        "csi.storage.k8s.io/pod.namespace": pod.namespace,
        "csi.storage.k8s.io/pod.uid": pod.uid,
        "csi.storage.k8s.io/serviceAccount.name": "default",
        "csi.storage.k8s.io/ephemeral": "true",
    }


def volume_id(pod: Pod, volume: str = "e") -> str:
    """The kubelet's id of an inline volume: ``csi-`` and a SHA-256 of the pod's uid and the volume's name."""
    return "csi-" + hashlib.sha256(f"{pod.uid}{volume}".encode()).hexdigest()


def publish_request(
    pod: Pod, target: Path, context: Mapping[str, str] | None = None, *, volume: str = "e"
) -> csi.NodePublishVolumeRequest:
    """NodePublishVolume as the kubelet sends it for an inline volume (mount access, read-only)."""
    return csi.NodePublishVolumeRequest(
        volume_id=volume_id(pod, volume),
        target_path=str(target),
        volume_capability=csi.VolumeCapability(
            mount=csi.VolumeCapability.MountVolume(),
            access_mode=csi.VolumeCapability.AccessMode(
                mode=csi.VolumeCapability.AccessMode.SINGLE_NODE_WRITER
            ),
        ),
        readonly=True,
        volume_context=dict(
            context if context is not None else volume_context(pod, uid=str(POD_USER), gid=str(POD_USER))
        ),
    )


@dataclass
class CsiPlugin:
    """A running eerl-csi process and stubs on its socket."""

    process: subprocess.Popen[bytes]
    socket_path: Path
    state_dir: Path
    channel: grpc.Channel
    log_path: Path

    @property
    def node(self) -> csi_grpc.NodeStub:
        return csi_grpc.NodeStub(self.channel)

    @property
    def identity(self) -> csi_grpc.IdentityStub:
        return csi_grpc.IdentityStub(self.channel)

    def publish(self, request: csi.NodePublishVolumeRequest) -> grpc.StatusCode:
        """NodePublishVolume; its status code (OK or the error's)."""
        return _code(lambda: self.node.NodePublishVolume(request, timeout=30))

    def unpublish(self, volume: str, target: Path) -> grpc.StatusCode:
        """NodeUnpublishVolume; its status code."""
        request = csi.NodeUnpublishVolumeRequest(volume_id=volume, target_path=str(target))
        return _code(lambda: self.node.NodeUnpublishVolume(request, timeout=30))


def publish_error(plugin: CsiPlugin, request: csi.NodePublishVolumeRequest) -> tuple[grpc.StatusCode, str]:
    """The status of a NodePublishVolume that is expected to fail, and its message."""
    try:
        plugin.node.NodePublishVolume(request, timeout=30)
    except grpc.RpcError as e:
        return e.code(), e.details() or ""
    return grpc.StatusCode.OK, ""


def _code(rpc: Any) -> grpc.StatusCode:
    try:
        rpc()
    except grpc.RpcError as e:
        return e.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@contextmanager
def running_plugin(
    directory: Path, kubelet: FakeKubelet, admin_socket: Path, *, extra: Sequence[str] = ()
) -> Iterator[CsiPlugin]:
    """``python -m eerld.csi.main``, its socket in ``directory/csi``, its state in ``directory/state-csi``,
    eerld's grant directory ``directory/grants`` (as :func:`eerld.testing.running_daemon` has it); SIGTERM at
    the end."""
    socket_path = directory / "csi" / "csi.sock"
    state_dir = directory / "state-csi"
    command = [
        sys.executable,
        "-m",
        "eerld.csi.main",
        f"--csi-socket={socket_path}",
        "--node-id=node-a",
        f"--admin-socket={admin_socket}",
        f"--grant-dir={directory / 'grants'}",
        f"--pod-resources-socket={kubelet.socket_path}",
        f"--kubelet-dir={kubelet.kubelet_dir}",
        f"--state-dir={state_dir}",
        "--reconcile-s=0",
        "--log-format=json",
        *extra,
    ]
    log_path = directory / "eerl-csi.log"
    with log_path.open("ab") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while not socket_path.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(
                    f"eerl-csi did not start: {log_path.read_text(errors='replace')[-2000:]}"
                )
            time.sleep(0.05)
        channel = grpc.insecure_channel(f"unix:{socket_path}")
        grpc.channel_ready_future(channel).result(timeout=START_TIMEOUT_S)
        try:
            yield CsiPlugin(process, socket_path, state_dir, channel, log_path)
        finally:
            channel.close()
    finally:
        stop_process(process, timeout_s=30)
