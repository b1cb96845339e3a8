"""Job-level clock control for Ray jobs (verl, OpenRLHF): ``pip install 'eerl-client[ray]'``.

:class:`RayJob` (in the driver) starts one :class:`NodeAgent` per node of the job, pinned there, each
holding its node's job-mode session at the local eerld; every phase is then planned once by one
:class:`eerl.job.JobController` and fanned out to the nodes with a deadline. With ``pools`` (disaggregated
placement) each pool's nodes get only their kind's phases, planned by one controller per pool
(:class:`eerl.job.pools.PoolControllers`). See docs/multinode.md.
"""

from __future__ import annotations

from eerl.ray._agent import AgentInfo, NodeAgent, NodeAgentImpl
from eerl.ray._controller import ActorController, JobControllerActor, JobControllerImpl, LocalController
from eerl.ray._job import FanOut, RayJob

__all__ = [
    "ActorController",
    "AgentInfo",
    "FanOut",
    "JobControllerActor",
    "JobControllerImpl",
    "LocalController",
    "NodeAgent",
    "NodeAgentImpl",
    "RayJob",
]
