"""Job-level control of a disaggregated job: one controller per GPU pool, each told the other's times.

With disaggregated placement (slime's ``train_async.py``; NeMo-RL's or SkyRL's async variants when asked)
each pool of nodes runs one phase kind, and the two pools run at once: the job's iteration lasts as long as
the slower pool. :class:`PoolControllers` keeps one :class:`~eerl.job.controller.JobController` per pool,
each over that pool's nodes in async mode with its one kind, and after every phase of one pool tells the
other pool's controller that phase's job-level time (:meth:`JobController.observe_peer`). The inner EE-RL
controller takes it as async slack (:class:`eerl.control.slack.PeerSlack`): the pool that waits for the other
(not the pipeline's bottleneck) gets its clock lowered first, down to the time the bottleneck takes over the
threshold; the bottleneck keeps its own budget (its own default time over the threshold). Each pool's
iteration guard judges the job's iteration as the slower pool's time.

Pure like :mod:`eerl.job.controller`: no I/O and no clock reads.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from eerl.control.base import ControllerSettings
from eerl.control.registry import DEFAULT_CONTROLLER
from eerl.directives import Directive
from eerl.errors import ValidationError
from eerl.job.controller import (
    JobController,
    JobObservation,
    NodeReport,
    make_job_controller,
    typical_duration,
)
from eerl.phases import ExecutionMode, PhaseKind, Workload

__all__ = ["PoolControllers", "pool_settings"]


def pool_settings(settings: ControllerSettings, kind: PhaseKind) -> ControllerSettings:
    """``settings`` for the pool that runs ``kind``: that kind only, in async mode."""
    return dataclasses.replace(
        settings,
        kinds=(kind,),
        mode=ExecutionMode.ASYNC,
        fixed_clocks_mhz={k: v for k, v in settings.fixed_clocks_mhz.items() if k is kind},
    )


class PoolControllers:
    """One job-level controller per pool (by the kind it runs); the same calls as one JobController."""

    def __init__(self, controllers: Mapping[PhaseKind, JobController]) -> None:
        if not controllers:
            raise ValidationError("pools", "at least one pool is needed")
        self._controllers = dict(controllers)

    @classmethod
    def build(
        cls,
        settings: ControllerSettings,
        nodes: Mapping[PhaseKind, int],
        incarnation: int,
        policy: str = DEFAULT_CONTROLLER,
    ) -> PoolControllers:
        """A controller per pool over ``nodes[kind]`` nodes, with :func:`pool_settings` of ``settings``."""
        return cls(
            {
                kind: make_job_controller(pool_settings(settings, kind), count, incarnation, policy)
                for kind, count in nodes.items()
            }
        )

    @property
    def controllers(self) -> Mapping[PhaseKind, JobController]:
        """The pool controllers by the kind each runs."""
        return self._controllers

    def plan(self, kind: PhaseKind, iteration: int, now_s: float) -> Directive | None:
        """The directive for ``kind``'s pool (None: no pool runs that kind)."""
        controller = self._controllers.get(kind)
        return None if controller is None else controller.plan(kind, iteration, now_s)

    def observe(
        self, kind: PhaseKind, iteration: int, reports: Sequence[NodeReport], workload: Workload, now_s: float
    ) -> JobObservation:
        """Judge the pool's reports (its controller) and tell the other pools the phase's job-level time:
        the counted observation's duration, else the :func:`typical_duration` of what its nodes reported."""
        controller = self._controllers.get(kind)
        if controller is None:
            return JobObservation(False, f"no pool runs {kind.value}", None)
        observation = controller.observe(kind, iteration, reports, workload, now_s)
        duration_s: float | None = None
        if observation.observation is not None:
            duration_s = observation.observation.duration_s
        elif reports:
            duration_s = typical_duration([report.duration_s for report in reports])
        if duration_s is not None:
            for other, peer in self._controllers.items():
                if other is not kind:
                    peer.observe_peer(kind, iteration, duration_s, now_s)
        return observation

    def end_iteration(self, iteration: int, wall_s: float, valid_tokens: int, now_s: float) -> None:
        """Every pool's iteration guard."""
        for controller in self._controllers.values():
            controller.end_iteration(iteration, wall_s, valid_tokens, now_s)
