"""The driver's side of a Ray job: one node agent per node, and the fan-out of every phase to them."""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

import ray
from ray.exceptions import RayActorError, RayError
from ray.util import placement_group_table
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from eerl.control.base import ControllerSettings
from eerl.directives import Directive
from eerl.errors import ConfigError
from eerl.job.controller import NodeReport, common_clocks, make_job_controller
from eerl.job.node import NodeBegin
from eerl.job.pools import PoolControllers, pool_settings
from eerl.job.runner import JobRunner
from eerl.phases import PhaseKind, Workload
from eerl.ray._agent import AgentInfo, NodeAgent
from eerl.ray._controller import ActorController, ControllerPort, JobControllerActor, LocalController
from eerl.ray._pools import PoolPlace, PoolProgress, parse_pools

__all__ = ["FanOut", "RayJob"]

logger = logging.getLogger("eerl")

ControllerPlace = Literal["driver", "actor", "off"]
GpuSpec = Sequence[int | str] | Mapping[str, Sequence[int | str]]
"""GPUs of each node: one list for all, or lists by node id."""


@dataclass(frozen=True, slots=True)
class FanOut:
    """One begin or end fan-out as the driver saw it."""

    kind: PhaseKind
    iteration: int
    begin: bool
    seconds: float
    """Wall time from the first call sent to the last reply taken (or the deadline)."""
    answered: int
    asked: int


@dataclass(slots=True)
class _Agent:
    rank: int
    node_id: str
    handle: Any
    info: AgentInfo | None = None
    pending: Any = None
    alive: bool = True
    kind: PhaseKind | None = None
    """The pool's kind (``pools``): this node gets that kind's phases only; None: every phase."""

    @property
    def name(self) -> str:
        """``node 2``, or with pools ``training node 0`` (ranks count within a pool)."""
        return f"node {self.rank}" if self.kind is None else f"{self.kind.value} node {self.rank}"


class RayJob(JobRunner):
    """One decision per phase for all the nodes of a Ray job; a drop-in for :class:`eerl.Session`.

    Call it in the driver after ``ray.init()`` (and after the job's placement groups are created)::

        job = eerl.ray.RayJob(job_id="my-ppo-run", placement_groups=[pg])
        eerl.integrations.verl.instrument(trainer, job)      # the one changed line
        trainer.fit()
        job.close()

    ``placement_groups``: the job's nodes are those their bundles were placed on
    (``placement_group_table()["bundles_to_node_id"]``); else ``node_ids``; else every alive node with a
    GPU (every alive node if none has one). One :class:`eerl.ray.NodeAgent` per node, pinned there
    (``NodeAffinitySchedulingStrategy(soft=False)``, ``num_cpus=0``), holds its daemon session.
    ``sockets``: each node's daemon socket by node id (default: discovered in the agent's environment).
    ``gpus``: the GPUs of each node the job uses, one list for all or by node id (default: as many as the
    node's ``GPU`` resource, 0…n-1, else ``EERL_GPUS`` / ``CUDA_VISIBLE_DEVICES`` in the agent).
    ``policy``: the controller the job-level controller wraps (``eerl``, ``fixed`` with ``fixed_clocks``,
    ``off``), as ``eerld --controller`` names them. ``controller``: ``"driver"`` (synchronous trainers: the
    controller in this process), ``"actor"`` (a small named actor owned by this process, for asynchronous
    trainers) or ``"off"`` (no directives: each
    daemon's fallback). ``deadline_s``: the longest any fan-out waits; a node that has not answered by then
    is absent from that phase (the phase runs anyway). ``start_timeout_s``: how long start-up waits for
    the node agents and the controller actor. ``clock``: the time the controller sees.

    ``pools`` (disaggregated placement: each GPU pool runs one phase kind, the two at once), e.g.
    ``pools={"generation": rollout_pg, "training": actor_pg}``: each kind's pool is a placement group, a list
    of them or a list of node ids, in place of ``placement_groups`` / ``node_ids``. Each pool's nodes hold
    async sessions with the pool's role (ranks 0…n-1 within the pool), ``phase(kind)`` goes to that kind's
    pool only, a phase of each pool may be open at once (from two threads), and one job-level controller per
    pool plans them, each told the other pool's times (:class:`eerl.job.pools.PoolControllers`): the pool
    that waits for the other gets its clock lowered first. An iteration ends when both pools have ended
    it. Pools need ``controller="driver"`` (or ``"off"``): ``"actor"`` is refused (ConfigError). A node in
    both pools gets an agent per pool, which need ``gpus`` by pool (``{"generation": [0, 1], …}``) to
    hold disjoint GPUs (each pool's ``gpus`` one list or lists by node id, as for the whole job).

    Fail-open: nothing here raises into the job; a failure costs one warning and the job goes on, with the
    nodes at their daemons' fallback clocks.
    """

    def __init__(
        self,
        *,
        job_id: str | None = None,
        placement_groups: Sequence[Any] | None = None,
        node_ids: Sequence[str] | None = None,
        controller: ControllerPlace = "driver",
        policy: str = "eerl",
        fixed_clocks: Mapping[PhaseKind, int] | None = None,
        controller_name: str | None = None,
        threshold: float = 0.95,
        incarnation: int | None = None,
        deadline_s: float = 1.0,
        start_timeout_s: float = 60.0,
        sockets: Mapping[str, str] | None = None,
        gpus: GpuSpec | Mapping[str, GpuSpec] | None = None,
        clock: Callable[[], float] = time.monotonic,
        pools: Mapping[str | PhaseKind, Any] | None = None,
    ) -> None:
        super().__init__(clock=clock)
        places = parse_pools(pools) if pools else []
        if places and controller == "actor":
            raise ConfigError('pools: the pool controllers run in the driver (controller="driver" or "off")')
        if places and (placement_groups or node_ids):
            raise ConfigError("pools: give the nodes per pool, not placement_groups or node_ids as well")
        self.pools: tuple[PhaseKind, ...] = tuple(place.kind for place in places)
        """The kinds that have a pool of their own (empty: every node runs every phase)."""
        self._progress = PoolProgress(self.pools)
        self._port_lock = threading.Lock()
        self.job_id = job_id or os.environ.get("EERL_JOB_ID") or f"{socket.gethostname()}-{os.getpid()}"
        self.incarnation = incarnation if incarnation is not None else time.time_ns() // 1_000_000
        self.deadline_s = deadline_s
        self.controller_name = controller_name or f"eerl-job-controller-{self.job_id}"
        self._agents: list[_Agent] = []
        self._port: ControllerPort | None = None
        self.fanouts: list[FanOut] = []
        """Every fan-out so far (bounded to the last 10 000)."""
        self.last_begins: list[NodeBegin] = []
        self.last_reports: list[NodeReport] = []
        self.last_observation: Any = None
        self.settings: ControllerSettings | None = None
        try:
            self._start(placement_groups, node_ids, sockets, gpus, start_timeout_s, places=places)
            self._start_controller(controller, policy, threshold, fixed_clocks or {}, start_timeout_s)
        except Exception:
            self._warn_once(
                "start", "cannot start job-level control on Ray; the job runs on without it", exc_info=True
            )

    # -- what the job reads ---------------------------------------------------------------------------

    @property
    def enabled(self) -> bool:
        """True when at least one node agent is up."""
        return any(agent.alive for agent in self._agents)

    @property
    def nodes(self) -> int:
        return len(self._agents)

    @property
    def node_ids(self) -> tuple[str, ...]:
        return tuple(agent.node_id for agent in self._agents)

    @property
    def agents(self) -> tuple[Any, ...]:
        """The agents' actor handles, by node rank."""
        return tuple(agent.handle for agent in self._agents)

    @property
    def agent_kinds(self) -> tuple[PhaseKind | None, ...]:
        """Each agent's pool (the kind it runs), in the order of :attr:`agents`; None without pools."""
        return tuple(agent.kind for agent in self._agents)

    @property
    def infos(self) -> tuple[AgentInfo | None, ...]:
        return tuple(agent.info for agent in self._agents)

    @property
    def controller(self) -> Any:
        """The JobController in this process (``controller="driver"``), the actor handle
        (``"actor"``), or None."""
        port = self._port
        if isinstance(port, LocalController):
            return port.controller
        if isinstance(port, ActorController):
            return port.handle
        return None

    # -- the phases (JobRunner) -----------------------------------------------------------------------

    def _begin(self, kind: PhaseKind, iteration: int) -> None:
        started = time.monotonic()  # one deadline for the plan and the fan-out together
        directive: Directive | None = None
        port = self._port
        if self.pools:
            self._progress.begun(iteration, self._clock())
        if port is not None:
            try:
                with self._port_lock:
                    directive = port.plan(kind, iteration, self._clock())
            except Exception as e:
                self._warn_once(
                    "plan", f"the job-level controller did not plan ({type(e).__name__}); the nodes fall back"
                )
                directive = None
        with self._port_lock:
            self._remember_directive(kind, iteration, directive)
        answers = self._fan(
            kind, iteration, True, lambda a: a.handle.begin.remote(directive, kind, iteration), started
        )
        self.last_begins = [answer for answer in answers.values() if isinstance(answer, NodeBegin)]

    def _end(self, kind: PhaseKind, iteration: int, workload: Workload) -> None:
        answers = self._fan(
            kind, iteration, False, lambda a: a.handle.end.remote(kind, iteration, workload), time.monotonic()
        )
        reports = [answer for answer in answers.values() if isinstance(answer, NodeReport)]
        self.last_reports = reports
        port = self._port
        if port is None:
            return
        with self._port_lock:
            if self.directive(kind, iteration) is not None:
                self.last_observation = port.observe(kind, iteration, reports, workload, self._clock())
            if self.pools:
                done = self._progress.ended(kind, iteration, workload.valid_tokens, self._clock())
                if done is not None:
                    port.end_iteration(iteration, done[0], done[1], self._clock())

    def _iteration_done(self, iteration: int, wall_s: float, valid_tokens: int) -> None:
        port = self._port
        if port is not None and not self.pools:  # pools: when both have ended it (``_end``)
            with self._port_lock:
                port.end_iteration(iteration, wall_s, valid_tokens, self._clock())

    def _close(self) -> None:
        refs = []
        for agent in self._agents:
            if agent.alive:
                try:
                    refs.append(agent.handle.close.remote())
                except Exception:  # noqa: S112 - best effort on the way out
                    continue
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=self.deadline_s)
        for agent in self._agents:
            try:
                ray.kill(agent.handle, no_restart=True)
            except Exception:  # noqa: S112 - already gone
                continue
        port, self._port = self._port, None
        if port is not None:
            port.close()

    # -- internals ------------------------------------------------------------------------------------

    def _fan(
        self, kind: PhaseKind, iteration: int, begin: bool, call: Callable[[_Agent], Any], started: float
    ) -> dict[int, object]:
        """Sends ``call`` to every live agent of ``kind`` (all of them without pools) that is not still busy
        with an earlier call; waits for the replies until ``deadline_s`` after ``started``; returns them by
        node rank (absent: no reply in time)."""
        asked: dict[Any, _Agent] = {}
        for agent in self._agents:
            if agent.kind not in (None, kind):
                continue
            if not agent.alive or not self._ready_for_more(agent):
                continue
            ref = call(agent)
            agent.pending = ref
            asked[ref] = agent
        answers: dict[int, object] = {}
        if asked:
            left_s = max(0.0, self.deadline_s - (time.monotonic() - started))
            ready, _ = ray.wait(list(asked), num_returns=len(asked), timeout=left_s)
            for ref in ready:
                agent = asked[ref]
                agent.pending = None
                answer = self._take(agent, ref)
                if answer is not None:
                    answers[agent.rank] = answer
        self.fanouts.append(
            FanOut(kind, iteration, begin, time.monotonic() - started, len(answers), len(asked))
        )
        if len(self.fanouts) > 10_000:
            del self.fanouts[:5_000]
        return answers

    def _ready_for_more(self, agent: _Agent) -> bool:
        """False while the agent's previous call has not returned (a node that is down or stuck): the job
        does not wait for it again, and does not queue more work behind it."""
        if agent.pending is None:
            return True
        ready, _ = ray.wait([agent.pending], timeout=0)
        if not ready:
            return False
        ref, agent.pending = agent.pending, None
        self._take(agent, ref)
        return agent.alive

    def _take(self, agent: _Agent, ref: Any) -> object | None:
        try:
            answer: object = ray.get(ref, timeout=0)
        except RayActorError:
            agent.alive = False
            self._warn_once(
                f"dead:{agent.name}",
                f"the node agent of {agent.name} ({agent.node_id[:8]}) is gone; the job goes on without it",
            )
            return None
        except RayError as e:
            logger.debug("eerl: %s: %s", agent.name, e)
            return None
        return answer

    def _start(
        self,
        placement_groups: Sequence[Any] | None,
        node_ids: Sequence[str] | None,
        sockets: Mapping[str, str] | None,
        gpus: GpuSpec | Mapping[str, GpuSpec] | None,
        start_timeout_s: float,
        *,
        places: Sequence[PoolPlace] = (),
    ) -> None:
        if not ray.is_initialized():
            self._warn_once("ray", "Ray is not initialised (ray.init()); job-level control is off")
            return
        resources = {
            node["NodeID"]: node.get("Resources", {})
            for node in ray.nodes()  # type: ignore[no-untyped-call]
            if node.get("Alive", False)
        }
        groups: list[tuple[PhaseKind | None, list[str]]] = [
            (place.kind, _job_nodes(place.placement_groups, place.node_ids, resources, start_timeout_s))
            for place in places
        ] or [(None, _job_nodes(placement_groups, node_ids, resources, start_timeout_s))]
        for kind, chosen in groups:
            if not chosen and kind is None:
                self._warn_once("nodes", "found no node for the job; job-level control is off")
            elif not chosen:
                self._warn_once(
                    f"nodes:{kind}",
                    f"found no node for the {kind} pool; that pool runs without job-level control",
                )
            pool_gpus = _pool_gpus(gpus, kind)
            for rank, node_id in enumerate(chosen):
                node_gpus = _node_gpus(node_id, pool_gpus, resources.get(node_id, {}))
                handle = NodeAgent.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False),
                ).remote(
                    self.job_id,
                    rank,
                    self.incarnation,
                    socket_path=(sockets or {}).get(node_id),
                    gpus=node_gpus,
                    nodes=len(chosen),
                    timeout_s=max(0.05, self.deadline_s * 0.8),
                    role="both" if kind is None else kind.value,
                )
                self._agents.append(_Agent(rank, node_id, handle, kind=kind))
        if not self._agents:
            return
        refs = {agent.handle.start.remote(): agent for agent in self._agents}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=start_timeout_s)
        for ref in ready:
            agent = refs[ref]
            info = self._take(agent, ref)
            if isinstance(info, AgentInfo):
                agent.info = info
        for agent in self._agents:
            if agent.info is None and agent.alive:
                self._warn_once(
                    f"start:{agent.name}",
                    f"the node agent of {agent.name} ({agent.node_id[:8]}) did not start in "
                    f"{start_timeout_s:g} s; that node runs at its daemon's fallback",
                )
            elif agent.info is not None and not agent.info.connected:
                self._warn_once(
                    f"connect:{agent.name}",
                    f"{agent.name} ({agent.node_id[:8]}) has no job-mode session with its eerld yet",
                )

    def _start_controller(
        self,
        place: ControllerPlace,
        policy: str,
        threshold: float,
        fixed_clocks: Mapping[PhaseKind, int],
        start_timeout_s: float,
    ) -> None:
        if place == "off" or not self._agents:
            return
        grids = [
            agent.info.supported_sm_clocks_mhz
            for agent in self._agents
            if agent.info is not None and agent.info.supported_sm_clocks_mhz
        ]
        if self.pools and grids:
            self._start_pools(policy, threshold, fixed_clocks)
            return
        if not grids:
            self._warn_once(
                "grid",
                "no node reported its GPUs' clock grid; the job runs at the daemons' fallback clocks",
            )
            return
        settings = ControllerSettings(
            supported_sm_clocks_mhz=common_clocks(grids),
            throughput_threshold=threshold,
            fixed_clocks_mhz=dict(fixed_clocks),
        )
        self.settings = settings
        if place == "driver":
            self._port = LocalController(make_job_controller(settings, self.nodes, self.incarnation, policy))
            return
        handle = JobControllerActor.options(name=self.controller_name).remote(
            settings, self.nodes, self.incarnation, policy
        )
        self._port = ActorController(handle, deadline_s=self.deadline_s)
        # An actor's worker process takes longer to start than a phase's deadline: wait for it here, or the
        # first phases would go to the daemons' fallback. Not up in time: it still plans once it answers.
        ready, _ = ray.wait([handle.ready.remote()], timeout=start_timeout_s)
        if not ready:
            self._warn_once(
                "controller",
                f"the job-level controller actor did not start within {start_timeout_s:g} s; "
                "the nodes fall back until it answers",
            )

    def _start_pools(self, policy: str, threshold: float, fixed_clocks: Mapping[PhaseKind, int]) -> None:
        """One job-level controller per pool, over its nodes and on their common clocks, in this process."""
        controllers = {}
        for kind in self.pools:
            agents = [agent for agent in self._agents if agent.kind is kind]
            grid = common_clocks(a.info.supported_sm_clocks_mhz for a in agents if a.info is not None)
            if not grid:
                self._warn_once(
                    f"grid:{kind.value}",
                    f"no node of the {kind.value} pool reported its clock grid; that pool runs at its "
                    "daemons' fallback clocks",
                )
                continue
            settings = ControllerSettings(
                supported_sm_clocks_mhz=grid,
                throughput_threshold=threshold,
                fixed_clocks_mhz=dict(fixed_clocks),
            )
            controllers[kind] = make_job_controller(
                pool_settings(settings, kind), len(agents), self.incarnation, policy
            )
            self.settings = self.settings or settings
        if controllers:
            self._port = LocalController(PoolControllers(controllers))


def _job_nodes(
    placement_groups: Sequence[Any] | None,
    node_ids: Sequence[str] | None,
    resources: Mapping[str, Mapping[str, float]],
    timeout_s: float,
) -> list[str]:
    if placement_groups:
        chosen: list[str] = []
        for group in placement_groups:
            ray.get(group.ready(), timeout=timeout_s)
            table = placement_group_table(group)
            for _, node_id in sorted(table.get("bundles_to_node_id", {}).items()):
                if node_id and node_id not in chosen:
                    chosen.append(node_id)
        return chosen
    if node_ids:
        return list(dict.fromkeys(node_ids))
    with_gpus = [node for node, res in resources.items() if res.get("GPU", 0) > 0]
    return sorted(with_gpus or resources)


def _pool_gpus(gpus: GpuSpec | Mapping[str, GpuSpec] | None, kind: PhaseKind | None) -> GpuSpec | None:
    """The GPUs of ``kind``'s pool when ``gpus`` names them by pool, else ``gpus`` (for every node)."""
    if kind is not None and isinstance(gpus, Mapping) and kind.value in gpus:
        return gpus[kind.value]
    return cast("GpuSpec | None", gpus)


def _node_gpus(
    node_id: str,
    gpus: GpuSpec | None,
    resources: Mapping[str, float],
) -> list[int | str] | None:
    if isinstance(gpus, Mapping):
        listed = gpus.get(node_id)
        return list(listed) if listed is not None else None
    if gpus is not None:
        return list(gpus)
    count = int(resources.get("GPU", 0))
    return list(range(count)) if count > 0 else None
