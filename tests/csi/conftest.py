"""Fixtures of the eerl-csi tests: a multi-tenant eerld (fake GPUs), a fake kubelet, a running eerl-csi."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from eerld.testing import DaemonHandle, FakeGpuBackend, running_daemon
from tests.conftest import short_socket_dir
from tests.csi.harness import CsiPlugin, FakeKubelet, fake_kubelet, running_plugin


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
    with running_daemon(csi_dir, backend=FakeGpuBackend(4), reaper=False, tenancy="multi") as handle:
        yield handle


@pytest.fixture
def kubelet(csi_dir: Path) -> Iterator[FakeKubelet]:
    with fake_kubelet(csi_dir) as k:
        yield k


@pytest.fixture
def plugin(csi_dir: Path, kubelet: FakeKubelet, node: DaemonHandle) -> Iterator[CsiPlugin]:
    with running_plugin(csi_dir, kubelet, node.admin_socket_path) as p:
        yield p


def uuids(handle: DaemonHandle) -> list[str]:
    """The node's GPU UUIDs, by index."""
    return [g.uuid for g in handle.backend.inventory()]


def grant_names(handle: DaemonHandle) -> list[str]:
    """Every grant of eerld but the shared socket."""
    return [g.grant.name for g in handle.daemon.grants() if g.grant.name != "shared"]


def holders(handle: DaemonHandle) -> dict[int, str]:
    """GPU index → the job id of the session holding it."""
    return {g.info.index: g.job_id for g in handle.daemon.gpu_status() if g.job_id is not None}
