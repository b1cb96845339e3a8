"""Where the job-level controller runs for a Ray job: in the driver, or in a small named actor.

:class:`LocalController` wraps a :class:`eerl.job.JobController` in the driver (synchronous trainers: verl's
``RayPPOTrainer.fit``, OpenRLHF's trainer). :class:`ActorController` calls one hosted by a
:class:`JobControllerActor` (asynchronous trainers), each call with a deadline; when the actor is gone or
late, :meth:`ActorController.plan` gives None and every node's daemon falls back at its BeginPhase.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import ray

from eerl.control.base import ControllerSettings
from eerl.directives import Directive
from eerl.job.controller import JobController, NodeReport, make_job_controller
from eerl.job.pools import PoolControllers
from eerl.phases import PhaseKind, Workload

__all__ = [
    "ActorController",
    "ControllerPort",
    "JobControllerActor",
    "LocalController",
]


class ControllerPort(Protocol):
    """What :class:`eerl.ray.RayJob` needs of its controller, wherever it runs."""

    def plan(self, kind: PhaseKind, iteration: int, now_s: float) -> Directive | None: ...

    def observe(
        self, kind: PhaseKind, iteration: int, reports: Sequence[NodeReport], workload: Workload, now_s: float
    ) -> Any: ...

    def end_iteration(self, iteration: int, wall_s: float, valid_tokens: int, now_s: float) -> None: ...

    def close(self) -> None: ...


class LocalController:
    """The controller in the driver's process: one JobController, or one per pool (PoolControllers)."""

    def __init__(self, controller: JobController | PoolControllers) -> None:
        self.controller = controller

    def plan(self, kind: PhaseKind, iteration: int, now_s: float) -> Directive | None:
        return self.controller.plan(kind, iteration, now_s)

    def observe(
        self, kind: PhaseKind, iteration: int, reports: Sequence[NodeReport], workload: Workload, now_s: float
    ) -> Any:
        return self.controller.observe(kind, iteration, reports, workload, now_s)

    def end_iteration(self, iteration: int, wall_s: float, valid_tokens: int, now_s: float) -> None:
        self.controller.end_iteration(iteration, wall_s, valid_tokens, now_s)

    def close(self) -> None:
        return None


class JobControllerImpl:
    """The named actor's body: one JobController."""

    def __init__(
        self,
        settings: ControllerSettings,
        nodes: int,
        incarnation: int,
        policy: str = "eerl",
    ) -> None:
        self._controller = make_job_controller(settings, nodes, incarnation, policy)

    def plan(self, kind: PhaseKind, iteration: int, now_s: float) -> Directive:
        return self._controller.plan(kind, iteration, now_s)

    def observe(
        self, kind: PhaseKind, iteration: int, reports: Sequence[NodeReport], workload: Workload, now_s: float
    ) -> Any:
        return self._controller.observe(kind, iteration, reports, workload, now_s)

    def end_iteration(self, iteration: int, wall_s: float, valid_tokens: int, now_s: float) -> None:
        self._controller.end_iteration(iteration, wall_s, valid_tokens, now_s)

    def ready(self) -> bool:
        """Answers once the actor is up (its worker process started, its controller built)."""
        return True

    def snapshot(self) -> Any:
        return list(self._controller.snapshot())

    def decisions(self) -> Any:
        return list(self._controller.decisions())


JobControllerActor: Any = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(JobControllerImpl)
"""The named actor class (``num_cpus=0``, no restarts); its owner is the process that creates it, so it
dies with that trainer."""


class ActorController:
    """Calls a :class:`JobControllerActor` with a deadline; a late or dead actor plans nothing (None)."""

    def __init__(self, handle: Any, *, deadline_s: float, owned: bool = True) -> None:
        self.handle = handle
        self._deadline_s = deadline_s
        self._owned = owned
        self._pending: list[Any] = []

    def plan(self, kind: PhaseKind, iteration: int, now_s: float) -> Directive | None:
        ref = self.handle.plan.remote(kind, iteration, now_s)
        ready, _ = ray.wait([ref], timeout=self._deadline_s)
        if not ready:
            return None
        directive: Directive = ray.get(ready[0])
        return directive

    def observe(
        self, kind: PhaseKind, iteration: int, reports: Sequence[NodeReport], workload: Workload, now_s: float
    ) -> Any:
        # Not waited for: the job only needs the next plan, which the actor runs after this (actor order).
        self._pending = [r for r in self._pending if not ray.wait([r], timeout=0)[0]]
        self._pending.append(self.handle.observe.remote(kind, iteration, list(reports), workload, now_s))
        return None

    def end_iteration(self, iteration: int, wall_s: float, valid_tokens: int, now_s: float) -> None:
        self.handle.end_iteration.remote(iteration, wall_s, valid_tokens, now_s)

    def close(self) -> None:
        if self._owned:
            ray.kill(self.handle, no_restart=True)
