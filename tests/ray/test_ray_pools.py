"""eerl.ray pools (disaggregated placement) on a local 4-node Ray cluster, one sim eerld per node.

Nodes 0 and 1 are the generation pool, nodes 2 and 3 the training pool (see conftest.py for the cluster).
"""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest
import ray
from eerl.directives import DirectivePurpose, DirectiveVerdict
from eerl.errors import ConfigError
from eerl.integrations import slime
from eerl.job.pools import PoolControllers
from eerl.phases import PhaseKind
from eerl.ray import RayJob
from ray.util import placement_group_table
from ray.util.placement_group import placement_group, remove_placement_group

from tests.ray.conftest import LocalCluster, SimNode
from tests.ray.test_ray_job import CLOCKS, GEN, TRAIN, wait_until

pytestmark = pytest.mark.slow

FREE = [None, None]


def pools_job(cluster: LocalCluster, job_id: str, **kwargs: object) -> RayJob:
    nodes = cluster.nodes
    options: dict[str, object] = {
        "policy": "fixed",
        "fixed_clocks": CLOCKS,
        "deadline_s": 2.0,
        "pools": {
            "generation": [nodes[0].node_id, nodes[1].node_id],
            "training": [nodes[2].node_id, nodes[3].node_id],
        },
    }
    options.update(kwargs)
    return RayJob(job_id=job_id, **options)  # type: ignore[arg-type]


def pool(cluster: LocalCluster, kind: PhaseKind) -> list[SimNode]:
    return cluster.nodes[:2] if kind is GEN else cluster.nodes[2:]


def locks(nodes: list[SimNode]) -> list[list[int | None]]:
    return [node.hardware_locks() for node in nodes]


def test_pools_refuse_an_actor_controller_and_extra_nodes() -> None:
    with pytest.raises(ConfigError, match="driver"):
        RayJob(job_id="x", pools={"generation": ["a"]}, controller="actor")
    with pytest.raises(ConfigError, match="per pool"):
        RayJob(job_id="x", pools={"generation": ["a"]}, node_ids=["b"])
    with pytest.raises(ConfigError, match="mixes"):
        RayJob(job_id="x", pools={"training": ["a", object()]})


def test_each_pool_s_nodes_run_only_their_kind_both_at_once(local_cluster: LocalCluster) -> None:
    job = pools_job(local_cluster, "pools")
    try:
        assert job.pools == (GEN, TRAIN)
        assert job.agent_kinds == (GEN, GEN, TRAIN, TRAIN)
        assert all(info is not None and info.connected for info in job.infos)
        assert isinstance(job.controller, PoolControllers)
        assert {k: c.nodes for k, c in job.controller.controllers.items()} == {GEN: 2, TRAIN: 2}
        with job.phase(GEN, 0):
            assert locks(pool(local_cluster, GEN)) == [[CLOCKS[GEN]] * 2] * 2
            assert locks(pool(local_cluster, TRAIN)) == [FREE] * 2
            time.sleep(0.25)
        # As slime's train_async.py: iteration i trains while iteration i + 1 generates.
        for i in range(3):
            with job.phase(GEN, i + 1) as generation:
                with job.phase(TRAIN, i) as training:
                    assert locks(pool(local_cluster, GEN)) == [[CLOCKS[GEN]] * 2] * 2
                    assert locks(pool(local_cluster, TRAIN)) == [[CLOCKS[TRAIN]] * 2] * 2
                    time.sleep(0.25)  # the sim energy counters step every 100 ms
                    training.report(tokens=1000, valid_tokens=500)
                assert {r.kind for r in job.last_reports} == {TRAIN}
                assert {r.node_rank for r in job.last_reports} == {0, 1}
                assert job.last_observation is not None
                assert job.last_observation.accepted, job.last_observation.reason
                assert locks(pool(local_cluster, TRAIN)) == [FREE] * 2
                assert locks(pool(local_cluster, GEN)) == [[CLOCKS[GEN]] * 2] * 2
                generation.report(tokens=2000)
            assert {r.kind for r in job.last_reports} == {GEN}
            assert job.last_observation.accepted, job.last_observation.reason
            for kind in (GEN, TRAIN):
                directive = job.directive(kind, i)
                assert directive is not None
                assert directive.sm_clock_mhz == CLOCKS[kind]
                assert directive.purpose is DirectivePurpose.COMMITTED
        # Every fan-out asked its own pool's two nodes only, and both answered.
        assert {(f.asked, f.answered) for f in job.fanouts} == {(2, 2)}
        # A generation node's session has the generation role: its daemon refuses a training phase there.
        refused = ray.get(job.agents[0].begin.remote(None, TRAIN, 9), timeout=10)
        assert refused.verdict is DirectiveVerdict.MISSING
        assert locks(pool(local_cluster, GEN))[0] == FREE
    finally:
        job.close()
    for node in local_cluster.nodes:
        assert wait_until(lambda node=node: node.hardware_locks() == FREE, 3.0)  # type: ignore[misc]


def test_two_threads_drive_the_two_pools(local_cluster: LocalCluster) -> None:
    """The driver trains while a second thread reports generation, as a hook waiting on a rollout does."""
    job = pools_job(local_cluster, "threads")
    failures: list[BaseException] = []

    def run(kind: PhaseKind) -> None:
        try:
            for i in range(4):
                with job.phase(kind, i) as phase:
                    assert locks(pool(local_cluster, kind)) == [[CLOCKS[kind]] * 2] * 2
                    time.sleep(0.2)
                    phase.report(tokens=1000, valid_tokens=500 if kind is TRAIN else 0)
        except BaseException as e:
            failures.append(e)

    try:
        threads = [threading.Thread(target=run, args=(kind,)) for kind in (GEN, TRAIN)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not failures, failures
        assert all(job.directive(kind, 3) is not None for kind in (GEN, TRAIN))
        assert len(job.fanouts) == 2 * 2 * 4
        assert {(f.asked, f.answered) for f in job.fanouts} == {(2, 2)}
    finally:
        job.close()


def test_a_pool_whose_agents_die_falls_open_and_the_other_keeps_its_clock(
    local_cluster: LocalCluster,
) -> None:
    job = pools_job(local_cluster, "pool-dies", deadline_s=1.0)
    try:
        with job.phase(TRAIN, 0):
            assert locks(pool(local_cluster, TRAIN)) == [[CLOCKS[TRAIN]] * 2] * 2
            for handle, kind in zip(job.agents, job.agent_kinds, strict=True):
                if kind is TRAIN:
                    ray.kill(handle, no_restart=True)
            # Each daemon saw its agent's session end and returned the pool's GPUs to default.
            assert wait_until(lambda: locks(pool(local_cluster, TRAIN)) == [FREE] * 2, 3.0)
        for i in range(1, 3):
            with job.phase(GEN, i):
                assert locks(pool(local_cluster, GEN)) == [[CLOCKS[GEN]] * 2] * 2
            with job.phase(TRAIN, i):
                assert locks(pool(local_cluster, TRAIN)) == [FREE] * 2
            assert job.fanouts[-1].answered == 0  # the training pool is gone, and the job ran on
        assert [(f.asked, f.answered) for f in job.fanouts if f.kind is GEN] == [(2, 2)] * 4
    finally:
        job.close()


def test_a_pool_whose_agents_never_start_is_late_and_the_job_runs_on(
    local_cluster: LocalCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The training pool's one node does not exist: its phases run unclocked and nothing waits on it; the
    generation pool is clocked and counted. On a starved machine the live agent itself may miss the start
    timeout (a Ray worker's start-up took over 20 s under two busy loops): then that pool falls open too
    (the job runs on, unclocked), which is checked instead of its clock."""
    absent = "ab" * 28  # a node id no node has: its agent is never placed
    nodes = local_cluster.nodes
    job = pools_job(
        local_cluster,
        "pool-late",
        deadline_s=3.0,  # generous: on a loaded machine the live pool's agent answers late, not never
        start_timeout_s=8.0,
        pools={"generation": [nodes[0].node_id], "training": [absent]},
    )
    try:
        assert "the node agent of training node 0 (abababab) did not start" in caplog.text
        generation_started = "the node agent of generation node 0" not in caplog.text
        for i in range(2):
            with job.phase(TRAIN, i):
                pass  # a pool with no agent: the phase runs, unclocked
            with job.phase(GEN, i):
                if generation_started:
                    assert wait_until(lambda: nodes[0].hardware_locks() == [CLOCKS[GEN]] * 2, 10.0)
                else:
                    assert nodes[0].hardware_locks() == [None, None]
                time.sleep(0.25)  # the sim energy counters step every 100 ms
            if generation_started:
                assert job.last_observation is not None
                assert job.last_observation.accepted, job.last_observation.reason
        assert all(f.answered == 0 for f in job.fanouts if f.kind is TRAIN)
    finally:
        job.close()


def slime_stand_ins() -> tuple[type, type]:
    """slime's rollout manager and a train actor, shaped as in tests/frameworks/test_slime.py (made in a
    function so that Ray ships them by value)."""

    class Sample:
        def __init__(self, response: int) -> None:
            self.tokens = list(range(2 + response))
            self.response_length, self.loss_mask = response, [1] * response

    class RolloutManager:
        def __init__(self) -> None:
            self.rollout_id = -1

        def generate(self, rollout_id: int) -> list[Any]:
            self.rollout_id = rollout_id
            samples, _ = self._get_rollout_data(rollout_id=rollout_id)
            return [ray.put(self._convert_samples_to_train_data(samples))]

        def _get_rollout_data(self, rollout_id: int) -> tuple[list[Any], dict[str, float]]:
            time.sleep(0.6)  # the engines sampling: longer than training (generation is the bottleneck)
            return [Sample(3), Sample(5)], {}

        def _convert_samples_to_train_data(self, samples: list[Any]) -> dict[str, Any]:
            return {
                "tokens": [s.tokens for s in samples],
                "response_lengths": [s.response_length for s in samples],
                "loss_masks": [s.loss_mask for s in samples],
            }

    class TrainActor:
        def train(self, rollout_id: int, rollout_data_ref: Any) -> int:
            time.sleep(0.3)
            return rollout_id

    return RolloutManager, TrainActor


class TrainGroup:
    """slime's ``RayTrainGroup`` as the hook sees it: ``async_train``, one ref per train actor (one)."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def async_train(self, rollout_id: int, rollout_data_ref: Any) -> list[Any]:
        return [self.actor.train.remote(rollout_id, rollout_data_ref)]


def test_slime_s_async_loop_reports_each_pool_through_a_pools_job(local_cluster: LocalCluster) -> None:
    """train_async.py's loop (generation k + 1 while training k) with the slime hook given a pools job: each
    pool's phases reach its own nodes with its own directives, and training k runs inside generation k + 1."""
    group = placement_group([{"GPU": 1}] * 8, strategy="PACK")
    ray.get(group.ready(), timeout=30)
    try:
        table = placement_group_table(group)["bundles_to_node_id"]
        ordered = sorted(table, key=lambda index: (table[index], index))  # slime orders bundles by node
        gpu_ids = [
            [table[b] for b in ordered[:i]].count(table[ordered[i]]) for i in range(8)
        ]  # 0, 1 per node
        pgs = {"actor": (group, ordered, gpu_ids), "rollout": (group, ordered[4:], gpu_ids[4:])}
        args = SimpleNamespace(actor_num_nodes=2, actor_num_gpus_per_node=2)
        pools, gpus = slime.ray_pools(pgs, args)
        nodes = sorted(set(table.values()))
        assert pools == {"generation": nodes[2:], "training": nodes[:2]}
        assert gpus == {
            "generation": {n: [0, 1] for n in nodes[2:]},
            "training": {n: [0, 1] for n in nodes[:2]},
        }

        manager_class, actor_class = slime_stand_ins()
        manager = ray.remote(num_cpus=0)(manager_class).remote()
        actor_model = TrainGroup(ray.remote(num_cpus=0)(actor_class).remote())
        job = RayJob(
            job_id="slime-pools", pools=pools, gpus=gpus, policy="fixed", fixed_clocks=CLOCKS, deadline_s=2.0
        )
        eerl_job = slime.instrument_job(manager, actor_model, overlap=True, job=job)
        assert eerl_job is not None
        assert eerl_job.attached_in_manager
        # train_async.py's loop at slime 624b824a898a, update_weights_interval = 1, no critic
        rollouts = 3
        rollout_data_next_future = manager.generate.remote(0)
        for rollout_id in range(rollouts):
            if rollout_data_next_future is not None:
                rollout_data_curr_ref = ray.get(rollout_data_next_future)
            if rollout_id + 1 < rollouts:
                rollout_data_next_future = manager.generate.remote(rollout_id + 1)
            ray.get(actor_model.async_train(rollout_id, rollout_data_curr_ref))
            rollout_data_curr_ref = ray.get(x) if (x := rollout_data_next_future) is not None else None
            rollout_data_next_future = None
        eerl_job.close()

        events = [(f.kind, f.iteration, f.begin) for f in job.fanouts]
        assert sorted(events) == sorted(
            (k, i, b) for k in (GEN, TRAIN) for i in range(rollouts) for b in (True, False)
        )
        assert {(f.asked, f.answered) for f in job.fanouts} == {(2, 2)}
        assert events.index((TRAIN, 0, True)) < events.index((GEN, 1, False))  # the pools overlapped
        for kind in (GEN, TRAIN):
            for i in range(rollouts):
                directive = job.directive(kind, i)
                assert directive is not None
                assert directive.sm_clock_mhz == CLOCKS[kind]
    finally:
        remove_placement_group(group)
    for node in local_cluster.nodes:
        assert wait_until(lambda node=node: node.hardware_locks() == FREE, 3.0)  # type: ignore[misc]
