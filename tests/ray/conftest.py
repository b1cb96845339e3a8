"""A local Ray cluster of 4 nodes (``ray.cluster_utils.Cluster``), each with its own eerld on the sim backend.

One cluster per test module (start-up is 12–17 s on a 2-core box). Each node's daemon is a subprocess
(``python -m eerld.main --backend sim``) with its own sockets, ledger and sim state file; the node's raylet
gets ``EERL_SOCKET`` in its ``env_vars``, so the node agent Ray starts there finds its own daemon. Tests read
each node's GPUs as the hardware shows them: the sim state file's ``sm_lock_mhz``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
import ray
from ray.cluster_utils import Cluster

ROOT = Path(__file__).resolve().parents[2]
NODES = 4
SIM_GPUS = 2
OBJECT_STORE_BYTES = 80 * 1024 * 1024
MAX_TRIALS = 3
"""Each daemon's trial budget (``--job-max-trials``), small enough for a test to exhaust."""


@dataclass
class SimNode:
    """One simulated node's eerld (a subprocess), restartable, and its Ray node once added."""

    directory: Path
    proc: subprocess.Popen[bytes] | None = None
    ray_node: Any = None
    starts: int = 0
    log: Path = field(init=False)

    def __post_init__(self) -> None:
        self.log = self.directory / "eerld.log"

    @property
    def socket_path(self) -> Path:
        return self.directory / "eerld.sock"

    @property
    def sim_state(self) -> Path:
        return self.directory / "sim-state.json"

    @property
    def node_id(self) -> str:
        return str(self.ray_node.node_id)

    def start(self) -> SimNode:
        args = [
            sys.executable,
            "-m",
            "eerld.main",
            "--backend=sim",
            f"--sim-gpus={SIM_GPUS}",
            f"--sim-state={self.sim_state}",
            f"--socket={self.socket_path}",
            f"--admin-socket={self.directory / 'admin.sock'}",
            f"--state-dir={self.directory / 'state'}",
            "--tenancy=single",
            "--metrics-address=off",
            "--controller=off",
            f"--job-max-trials={MAX_TRIALS}",
            "--job-trial-window-s=600",
            "--log-format=json",
        ]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        with self.log.open("ab") as log_file:
            self.proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
        self.starts += 1
        self._wait_serving(30.0)
        return self

    def _wait_serving(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        assert self.proc is not None
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"eerld exited: {self.log.read_text()[-2000:]}")
            if self.socket_path.exists():
                with grpc.insecure_channel(f"unix:{self.socket_path}") as channel:
                    try:
                        grpc.channel_ready_future(channel).result(timeout=1.0)
                        return
                    except grpc.FutureTimeoutError:
                        pass
            time.sleep(0.05)
        raise AssertionError(f"eerld not serving after {timeout_s} s: {self.log.read_text()[-2000:]}")

    def kill(self) -> None:
        """SIGKILL: no clean-up at all (locks stay in the sim state, as on a real GPU)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        self.socket_path.unlink(missing_ok=True)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def locks(self) -> list[int | None]:
        """Each GPU's SM clock lock as the simulated hardware holds it (None: default governor)."""
        for _ in range(50):
            try:
                state = json.loads(self.sim_state.read_text())
                return [gpu["sm_lock_mhz"] for gpu in state["gpus"]]
            except (OSError, ValueError):  # between an atomic rename and the read
                time.sleep(0.01)
        raise AssertionError(f"cannot read {self.sim_state}")


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
            node.start()
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
