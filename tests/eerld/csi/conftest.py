"""Fixtures of the eerl-csi tests: a multi-tenant eerld (fake GPUs), a fake kubelet, a running eerl-csi."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from eerld.csi.eerld_admin import EerldAdmin
from eerld.csi.node import NodePlugin
from eerld.csi.records import VolumeRecords
from eerld.pods.owners import DeviceAllocation, PodDevices, PodResourcesError
from eerld.testing import DaemonHandle
from tests.conftest import short_socket_dir
from tests.eerld.csi.harness import (
    POD_USER,
    CsiPlugin,
    FakeKubelet,
    Pod,
    csi_eerld,
    fake_kubelet,
    running_plugin,
    volume_context,
    volume_id,
)
from tests.sidecar.conftest import start_sidecar  # noqa: F401 - a fixture: the sidecar beside a pod's volume


@pytest.fixture
def csi_dir() -> Iterator[Path]:
    """A very short directory (``/tmp/cXXXXXXXX``): the socket at a pod volume's target path must fit in a
    Unix socket path (107 bytes) under the kubelet's long volume directory."""
    with short_socket_dir(prefix="c") as path:
        path.chmod(0o755)
        yield path


@pytest.fixture
def node(csi_dir: Path) -> Iterator[DaemonHandle]:
    """eerld as the DaemonSet runs it: multi-tenant, grants under ``csi_dir/grants``; 4 fake GPUs."""
    with csi_eerld(csi_dir) as handle:
        yield handle


@pytest.fixture
def kubelet(csi_dir: Path) -> Iterator[FakeKubelet]:
    with fake_kubelet(csi_dir) as k:
        yield k


@pytest.fixture
def plugin(csi_dir: Path, kubelet: FakeKubelet, node: DaemonHandle) -> Iterator[CsiPlugin]:
    with running_plugin(csi_dir, kubelet, node.admin_socket_path) as p:
        yield p


class Listing:
    """The kubelet's pod-resources, as a list the test changes (``None``: the kubelet does not answer)."""

    def __init__(self) -> None:
        self.pods: list[Pod] | None = []

    def list_pods(self, timeout_s: float) -> Sequence[PodDevices]:
        if self.pods is None:
            raise PodResourcesError("kubelet.sock: List: UNAVAILABLE")
        return [PodDevices(p.namespace, p.name, tuple(_allocations(p))) for p in self.pods]

    def close(self) -> None:
        pass


def _allocations(pod: Pod) -> list[DeviceAllocation]:
    return (
        [DeviceAllocation(pod.namespace, pod.name, "trainer", "nvidia.com/gpu", pod.gpus)] if pod.gpus else []
    )


@pytest.fixture
def listing() -> Listing:
    return Listing()


def make_plugin(csi_dir: Path, kubelet: FakeKubelet, node: DaemonHandle, listing: Listing) -> NodePlugin:
    """The plugin eerl-csi serves, in process (a second one over the same state is a restarted eerl-csi)."""
    records = VolumeRecords(csi_dir / "state-csi")
    return NodePlugin(
        listing,
        EerldAdmin(node.admin_socket_path),
        records,
        kubelet_dir=kubelet.kubelet_dir,
        grant_dir=csi_dir / "grants",
    )


def publish(plugin: NodePlugin, kubelet: FakeKubelet, pod: Pod) -> Path:
    target = kubelet.target_path(pod)
    context = volume_context(pod, uid=str(POD_USER))
    plugin.publish(volume_id(pod), str(target), context, mount_access=True)
    return target


def uuids(handle: DaemonHandle) -> list[str]:
    """The node's GPU UUIDs, by index."""
    return [g.uuid for g in handle.backend.inventory()]


def grant_names(handle: DaemonHandle) -> list[str]:
    """Every grant of eerld but the shared socket."""
    return [g.grant.name for g in handle.daemon.reads.grants() if g.grant.name != "shared"]


def holders(handle: DaemonHandle) -> dict[int, str]:
    """GPU index → the job id of the session holding it."""
    return {g.info.index: g.job_id for g in handle.daemon.reads.gpu_status() if g.job_id is not None}
