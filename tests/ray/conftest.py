"""A local Ray cluster of 4 nodes (``ray.cluster_utils.Cluster``), each with its own eerld on the sim backend.

One cluster per test module (start-up is 12–17 s on a 2-core box). Each node's daemon is a subprocess
(``python -m eerld.main --backend sim``, :class:`soak.daemon.DaemonProcess`) with its own sockets, ledger
and sim state file; the node's raylet gets ``EERL_SOCKET`` in its ``env_vars``, so the node agent Ray starts
there finds its own daemon. Tests read each node's GPUs as the hardware shows them
(:meth:`~soak.daemon.DaemonProcess.hardware_locks`: the sim state file's SM clock locks).
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.cluster_utils import Cluster

from soak.daemon import DaemonProcess

NODES = 4
SIM_GPUS = 2
OBJECT_STORE_BYTES = 80 * 1024 * 1024
MAX_TRIALS = 3
"""Each daemon's trial budget (``--job-max-trials``), small enough for a test to exhaust."""


@dataclass
class SimNode(DaemonProcess):
    """One simulated node's eerld (:class:`soak.daemon.DaemonProcess`), restartable, and its Ray node once
    added: real time, no controller, a small trial budget."""

    gpus: int = SIM_GPUS
    sim_speedup: float = 1.0
    controller: str = "off"
    extra_args: list[str] = field(
        default_factory=lambda: [f"--job-max-trials={MAX_TRIALS}", "--job-trial-window-s=600"]
    )
    ray_node: Any = None

    @property
    def node_id(self) -> str:
        return str(self.ray_node.node_id)

    def kill(self) -> None:
        """SIGKILL: no clean-up at all (locks stay in the sim state, as on a real GPU); its socket goes."""
        super().kill()
        self.socket_path.unlink(missing_ok=True)


@dataclass
class LocalCluster:
    cluster: Any
    nodes: list[SimNode]

    def node_args(self, node: SimNode) -> dict[str, Any]:
        return {
            "num_cpus": 1,
            "num_gpus": SIM_GPUS,
            "object_store_memory": OBJECT_STORE_BYTES,
            "env_vars": {"EERL_SOCKET": str(node.socket_path)},
        }

    def by_node_id(self) -> dict[str, SimNode]:
        return {node.node_id: node for node in self.nodes}

    def remove(self, node: SimNode) -> None:
        self.cluster.remove_node(node.ray_node, allow_graceful=False)

    def add_back(self, node: SimNode) -> None:
        node.ray_node = self.cluster.add_node(**self.node_args(node))
        self.cluster.wait_for_nodes()


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[LocalCluster]:
    directories = [Path(tempfile.mkdtemp(prefix=f"eerl-ray{i}-", dir="/tmp")) for i in range(NODES)]
    nodes = [SimNode(d) for d in directories]
    cluster: Any = None
    try:
        for node in nodes:
            node.launch()
        for node in nodes:
            node.wait_ready()
        holder = LocalCluster(None, nodes)
        head_args = {**holder.node_args(nodes[0]), "include_dashboard": False}
        cluster = Cluster(initialize_head=True, head_node_args=head_args)
        holder.cluster = cluster
        nodes[0].ray_node = cluster.head_node
        for node in nodes[1:]:
            node.ray_node = cluster.add_node(**holder.node_args(node))
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False, include_dashboard=False)
        yield holder
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        for node in nodes:
            node.stop()
        for directory in directories:
            shutil.rmtree(directory, ignore_errors=True)
