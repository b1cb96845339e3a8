"""The node agent: a Ray actor pinned to one node, holding that node's job-mode session (a NodeLink)."""

from __future__ import annotations

import os
import socket
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import ray

from eerl.config import ClientConfig
from eerl.directives import Directive
from eerl.job.controller import NodeReport
from eerl.job.node import NodeBegin, NodeLink
from eerl.phases import GpuRole, PhaseKind, Workload

__all__ = ["AgentInfo", "NodeAgent", "NodeAgentImpl"]


@dataclass(frozen=True, slots=True)
class AgentInfo:
    """What an agent says once started: where it runs and what its node's session offers."""

    node_rank: int
    node_id: str
    hostname: str
    pid: int
    connected: bool
    session_epoch: int
    gpus: int
    supported_sm_clocks_mhz: tuple[int, ...]


class NodeAgentImpl:
    """The agent's body (plain Python, so that tests and other actor systems can host it).

    ``socket``: this node's daemon worker socket; None: discovered in the agent's environment as
    :meth:`eerl.ClientConfig.from_env` does (``EERL_SOCKET``, ``EERL_RUN_DIR``…, e.g. per-node ``env_vars``).
    ``role``: ``"both"``, or a pool's one kind (``"generation"``, ``"training"``), as
    :class:`eerl.job.node.NodeLink` takes it.
    """

    def __init__(
        self,
        job_id: str,
        node_rank: int,
        incarnation: int,
        *,
        socket_path: str | None = None,
        gpus: Sequence[int | str] | None = None,
        nodes: int = 0,
        timeout_s: float = 1.0,
        role: str = "both",
    ) -> None:
        try:
            config = ClientConfig.uds(socket_path) if socket_path else ClientConfig.from_env()
        except Exception:  # a bad environment: a link that never connects (it warns)
            config = ClientConfig.disabled_config()
        self._link = NodeLink(
            config,
            job_id=job_id,
            node_rank=node_rank,
            incarnation=incarnation,
            gpus=gpus,
            world_size=nodes,
            role=GpuRole(role),
            timeout_s=timeout_s,
        )
        self._node_rank = node_rank

    def start(self) -> AgentInfo:
        """Opens the session (bounded) and says what the node offers."""
        self._link.connect()
        return self.info()

    def info(self) -> AgentInfo:
        link = self._link
        try:
            node_id = ray.get_runtime_context().get_node_id()
        except Exception:
            node_id = ""
        return AgentInfo(
            node_rank=self._node_rank,
            node_id=node_id,
            hostname=socket.gethostname(),
            pid=os.getpid(),
            connected=link.connected,
            session_epoch=link.session_epoch,
            gpus=link.gpu_count,
            supported_sm_clocks_mhz=link.supported_sm_clocks_mhz,
        )

    def begin(self, directive: Directive | None, kind: PhaseKind, iteration: int) -> NodeBegin:
        return self._link.begin(directive, kind, iteration)

    def end(self, kind: PhaseKind, iteration: int, workload: Workload | None) -> NodeReport:
        return self._link.end(kind, iteration, workload)

    def close(self) -> None:
        self._link.close()


NodeAgent: Any = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(NodeAgentImpl)
"""The Ray actor class; :class:`eerl.ray.RayJob` starts one per node with node-affinity scheduling."""
