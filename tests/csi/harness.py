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
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from eerld.api.csi import csi_pb2 as csi
from eerld.api.csi import csi_pb2_grpc as csi_grpc
from eerld.api.podresources import api_pb2 as kpb
from eerld.csi.mounts import unmount
from tests.kubelet import pod_resources_server

POD_USER = 65532
"""The sidecar's uid and gid in deploy/kubernetes/rl-job-sidecar-pod.yaml."""


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
    """Unmount every mount point at or under ``root`` (a test's leftovers)."""
    prefix = os.fsencode(os.path.realpath(root))
    points = []
    for line in Path("/proc/self/mountinfo").read_bytes().splitlines():
        point = line.split(b" ")[4]
        if point == prefix or point.startswith(prefix + b"/"):
            points.append(point)
    for point in sorted(points, key=len, reverse=True):
        unmount(Path(os.fsdecode(point)))


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

    process: subprocess.Popen[str]
    socket_path: Path
    state_dir: Path
    channel: grpc.Channel

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


def _code(call: Any) -> grpc.StatusCode:
    try:
        call()
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
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while not socket_path.exists():
            if process.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"eerl-csi did not start: {process.communicate(timeout=5)[1][-2000:]}")
            time.sleep(0.05)
        channel = grpc.insecure_channel(f"unix:{socket_path}")
        grpc.channel_ready_future(channel).result(timeout=30)
        try:
            yield CsiPlugin(process, socket_path, state_dir, channel)
        finally:
            channel.close()
    finally:
        process.terminate()
        try:
            process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
