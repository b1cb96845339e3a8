"""Job-level clock control for torch.distributed jobs (TRL, accelerate, torchrun): :class:`DistJob`.

Every rank builds one ``DistJob`` (a collective: it creates a side ``gloo`` process group, never touching
the training's NCCL group). Rank 0 runs the job-level controller (:class:`eerl.job.JobController`); each
node's local rank 0 holds that node's job-mode session (:class:`eerl.job.node.NodeLink`), the other ranks
none. Once per phase, rank 0 broadcasts the directive (``broadcast_object_list``) and, after the phase, the
node leaders' reports come back to it (``gather_object``); the aggregation counts nodes, not ranks.

Every rank must enter the same phases in the same order (as data-parallel trainers do); a rank that gets
the directive of another phase than its own turns job-level control off (the ranks no longer line up). Any
timeout or error on the side group turns job-level control off on that rank for the rest of the job, with
one warning; the job goes on, and its nodes return to their default clocks.

``eerl-sidecar --job-nodes`` (:mod:`eerl.sidecar._seat`) runs a ``DistJob`` too, one rank per node: the
same collectives for a job that does not run its phases in Python.

    job = eerl.dist.DistJob(job_id="my-grpo-run")        # after torch.distributed.init_process_group
    eerl.integrations.trl.instrument(trainer, job)        # the one changed line
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from eerl.config import ClientConfig
from eerl.control.base import ControllerSettings
from eerl.directives import Directive
from eerl.errors import one_line
from eerl.job.controller import JobController, NodeReport, common_clocks, make_job_controller
from eerl.job.node import NodeBegin, NodeLink
from eerl.job.runner import JobRunner
from eerl.phases import PhaseKind, Workload

__all__ = ["DistJob"]

logger = logging.getLogger("eerl")


class DistJob(JobRunner):
    """One decision per phase for all the nodes of a torch.distributed job; see the module docstring.

    ``config``: how the node leader reaches its daemon (default :meth:`ClientConfig.from_env`).
    ``local_rank``: this rank's rank on its node (default ``LOCAL_RANK``; else found by host name).
    ``gpus``: the node's GPUs its leader claims (default ``EERL_GPUS``, else every GPU torch sees on the node,
    else ``CUDA_VISIBLE_DEVICES``). ``timeout_s``: the side group's timeout, and the deadline of every
    daemon call. ``policy``/``fixed_clocks``/``threshold``: the controller rank 0 runs.
    """

    def __init__(
        self,
        *,
        job_id: str | None = None,
        config: ClientConfig | None = None,
        local_rank: int | None = None,
        gpus: Sequence[int | str] | None = None,
        timeout_s: float = 5.0,
        policy: str = "eerl",
        fixed_clocks: Mapping[PhaseKind, int] | None = None,
        threshold: float = 0.95,
        incarnation: int | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        super().__init__(clock=clock)
        self._dist: Any = None
        self._group: Any = None
        self._rank = 0
        self._world = 1
        self._link: NodeLink | None = None
        self._controller: JobController | None = None
        self.nodes = 0
        self.node_rank: int | None = None
        self.last_begin: NodeBegin | None = None
        """This node's answer to the phase begun last (None: not a node leader, or control is off)."""
        self.last_report: NodeReport | None = None
        """What this node metered of the phase ended last (None: as for ``last_begin``)."""
        self.last_observation: Any = None
        """Rank 0: what the controller made of the phase ended last (None: it observed nothing)."""
        self.disabled_reason = ""
        """Why job-level control is off on this rank (empty while it is on)."""
        self.fanout_s: list[float] = []
        try:
            self._start(
                job_id=job_id,
                config=config,
                local_rank=local_rank,
                gpus=gpus,
                timeout_s=timeout_s,
                policy=policy,
                fixed_clocks=fixed_clocks or {},
                threshold=threshold,
                incarnation=incarnation,
            )
        except Exception as e:
            self._disable(f"its start failed: {one_line(e)}", exc_info=True)

    @property
    def enabled(self) -> bool:
        """True while the side group works on this rank."""
        return self._group is not None

    @property
    def is_leader(self) -> bool:
        """True on the rank that holds its node's session."""
        return self._link is not None

    @property
    def controller(self) -> JobController | None:
        """The job-level controller (rank 0 only)."""
        return self._controller

    @property
    def link(self) -> NodeLink | None:
        return self._link

    # -- JobRunner ------------------------------------------------------------------------------------

    def _begin(self, kind: PhaseKind, iteration: int) -> None:
        self.last_begin = None
        if self._group is None:
            return
        started = time.monotonic()
        directive: Directive | None = None
        if self._controller is not None:
            try:
                directive = self._controller.plan(kind, iteration, self._clock())
            except Exception:
                self._warn_once(
                    "plan", "the job-level controller failed to plan; the nodes fall back", exc_info=True
                )
        box: list[Any] = [directive]
        if not self._collective(
            "broadcast", lambda: self._dist.broadcast_object_list(box, src=0, group=self._group)
        ):
            return
        planned: Directive | None = box[0] if isinstance(box[0], Directive) else None
        if planned is not None and (planned.kind, planned.iteration) != (kind, iteration):
            # Rank 0 planned another phase: from here on every collective would pair mismatched phases.
            self._disable(
                f"this rank is in the {kind.value} phase {iteration}, rank 0 in the "
                f"{planned.kind.value} phase {planned.iteration}: the ranks' phases do not line up"
            )
            return
        self._remember_directive(kind, iteration, planned)
        if self._link is not None:
            self.last_begin = self._link.begin(planned, kind, iteration)
        self.fanout_s.append(time.monotonic() - started)

    def _end(self, kind: PhaseKind, iteration: int, workload: Workload) -> None:
        self.last_report = None
        self.last_observation = None
        if self._group is None:
            return
        started = time.monotonic()
        report = self._link.end(kind, iteration, workload) if self._link is not None else None
        self.last_report = report
        gathered: list[Any] | None = [None] * self._world if self._rank == 0 else None
        if not self._collective(
            "gather", lambda: self._dist.gather_object(report, gathered, dst=0, group=self._group)
        ):
            return
        self.fanout_s.append(time.monotonic() - started)
        if self._controller is None or gathered is None or self.directive(kind, iteration) is None:
            return
        reports = [r for r in gathered if isinstance(r, NodeReport)]
        try:
            self.last_observation = self._controller.observe(
                kind, iteration, reports, workload, self._clock()
            )
        except Exception:
            self._warn_once("observe", "the job-level controller failed to observe a phase", exc_info=True)

    def _iteration_done(self, iteration: int, wall_s: float, valid_tokens: int) -> None:
        if self._controller is not None and self._group is not None:
            self._controller.end_iteration(iteration, wall_s, valid_tokens, self._clock())

    def _close(self) -> None:
        link, self._link = self._link, None
        if link is not None:
            link.close()
        group, self._group = self._group, None
        if group is not None:
            try:
                self._dist.destroy_process_group(group)
            except Exception:
                logger.debug("eerl: destroying the side group failed", exc_info=True)

    # -- internals ------------------------------------------------------------------------------------

    def _start(
        self,
        *,
        job_id: str | None,
        config: ClientConfig | None,
        local_rank: int | None,
        gpus: Sequence[int | str] | None,
        timeout_s: float,
        policy: str,
        fixed_clocks: Mapping[PhaseKind, int],
        threshold: float,
        incarnation: int | None,
    ) -> None:
        import torch.distributed as dist  # noqa: PLC0415 - eerl never needs torch unless a DistJob is made

        self._dist = dist
        if not dist.is_available() or not dist.is_initialized():
            self._off("init", "torch.distributed is not initialised")
            return
        self._rank = dist.get_rank()
        self._world = dist.get_world_size()
        self._group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout_s))
        host = socket.gethostname()
        if local_rank is None and os.environ.get("LOCAL_RANK", "").isdigit():
            local_rank = int(os.environ["LOCAL_RANK"])
        # One exchange: every rank's host, leader flag, job id and incarnation (rank 0's win).
        job = job_id or os.environ.get("EERL_JOB_ID") or f"{host}-{os.getpid()}"
        mine = (host, local_rank, job, incarnation or time.time_ns() // 1_000_000)
        everyone: list[Any] = [None] * self._world
        if not self._collective(
            "all_gather", lambda: dist.all_gather_object(everyone, mine, group=self._group)
        ):
            return
        leaders = _leaders(everyone)
        self.nodes = len(leaders)
        job, incarnation = everyone[0][2], everyone[0][3]
        assert incarnation is not None
        if self._rank in leaders:
            self.node_rank = leaders.index(self._rank)
            try:
                chosen_config = config or ClientConfig.from_env()
            except Exception:
                chosen_config = ClientConfig.disabled_config()
            self._link = NodeLink(
                chosen_config,
                job_id=job,
                node_rank=self.node_rank,
                incarnation=incarnation,
                gpus=gpus if gpus is not None else _node_gpus(chosen_config),
                world_size=self.nodes,
                timeout_s=min(timeout_s, 2.0),
            )
            self._link.connect()
        grid = self._link.supported_sm_clocks_mhz if self._link is not None else None
        grids: list[Any] | None = [None] * self._world if self._rank == 0 else None
        if not self._collective("gather", lambda: dist.gather_object(grid, grids, dst=0, group=self._group)):
            return
        if grids is not None:
            self._controller = self._make_controller(grids, policy, fixed_clocks, threshold, incarnation)
        # Everyone learns whether there is a controller: without one, no rank touches the side group again
        # and the leaders close their sessions (their nodes run at the default clocks).
        decided: list[Any] = [self._controller is not None]
        if not self._collective(
            "broadcast", lambda: dist.broadcast_object_list(decided, src=0, group=self._group)
        ):
            return
        if not decided[0]:
            self.disabled_reason = self.disabled_reason or "rank 0 has no job-level controller (see its log)"
            self._group = None
            link, self._link = self._link, None
            if link is not None:
                link.close()

    def _make_controller(
        self,
        grids: Sequence[Any],
        policy: str,
        fixed_clocks: Mapping[PhaseKind, int],
        threshold: float,
        incarnation: int,
    ) -> JobController | None:
        offered = [grid for grid in grids if grid is not None]
        if len(offered) < self.nodes or not all(offered):
            self._off("grid", "not every node reported its GPUs' clock grid")
            return None
        settings = ControllerSettings(
            supported_sm_clocks_mhz=common_clocks(offered),
            throughput_threshold=threshold,
            fixed_clocks_mhz=dict(fixed_clocks),
        )
        try:
            return make_job_controller(settings, self.nodes, incarnation, policy)
        except Exception as e:
            self._off("controller", f"cannot build the job-level controller ({one_line(e)})", exc_info=True)
            return None

    def _collective(self, what: str, call: Callable[[], object]) -> bool:
        """Runs one side-group collective; on any error or timeout turns job-level control off here."""
        try:
            call()
        except Exception as e:
            self._disable(f"{what} on the side gloo group failed or timed out: {one_line(e)}")
            return False
        return True

    def _off(self, key: str, why: str, *, exc_info: bool = False) -> None:
        """Job-level control will not start here: the first reason kept, one warning per ``key``."""
        self.disabled_reason = self.disabled_reason or why
        self._warn_once(key, f"{why}; job-level control is off for this job", exc_info=exc_info)

    def _disable(self, why: str, *, exc_info: bool = False) -> None:
        self.disabled_reason = self.disabled_reason or why
        self._warn_once(
            "disabled",
            f"job-level control is off from now on ({why}); "
            "the job goes on, its nodes at their default clocks",
            exc_info=exc_info,
        )
        self._group = None
        self._controller = None
        link, self._link = self._link, None
        if link is not None:
            link.close()


def _leaders(everyone: Sequence[Any]) -> list[int]:
    """The global ranks that hold their node's session: local rank 0, or the first rank of each host."""
    leaders: list[int] = []
    seen: set[str] = set()
    explicit = all(entry[1] is not None for entry in everyone)
    for rank, (host, local_rank, _job, _incarnation) in enumerate(everyone):
        if explicit:
            if local_rank == 0:
                leaders.append(rank)
        elif host not in seen:
            seen.add(host)
            leaders.append(rank)
    return leaders


def _node_gpus(config: ClientConfig) -> list[int | str] | None:
    """The leader's default claim: ``EERL_GPUS``, else every GPU torch sees on the node, else None."""
    if config.gpus is not None:
        return list(config.gpus)
    try:
        import torch  # noqa: PLC0415 - as above

        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    except Exception:
        count = 0
    return list(range(count)) if count > 0 else None
