"""eerl.ray on a local 4-node Ray cluster, one sim eerld per node (see conftest.py).

The test order matters a little: the node-removal case is last, and it puts the node back.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import ray
from eerl.directives import Directive, DirectivePurpose, DirectiveVerdict
from eerl.job.node import NodeBegin
from eerl.phases import PhaseKind
from eerl.ray import RayJob
from ray.util import placement_group_table
from ray.util.placement_group import placement_group, remove_placement_group

from tests.ray.conftest import MAX_TRIALS, NODES, LocalCluster

pytestmark = pytest.mark.slow

GEN, TRAIN = PhaseKind.GENERATION, PhaseKind.TRAINING
CLOCKS = {GEN: 1200, TRAIN: 1500}


def wait_until(predicate: Callable[[], bool], timeout_s: float) -> bool:
    """Whether ``predicate`` held by the deadline ``timeout_s`` from now (polled every 20 ms)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


def _is_dead(actor: object) -> bool:
    """Whether the controller actor's liveness probe fails because the actor has died."""
    try:
        ray.get(actor.ready.remote(), timeout=1.0)  # type: ignore[attr-defined]
    except ray.exceptions.RayActorError:
        return True
    except ray.exceptions.GetTimeoutError:
        pass
    return False


def fixed_job(job_id: str, **kwargs: object) -> RayJob:
    options: dict[str, object] = {"policy": "fixed", "fixed_clocks": CLOCKS, "deadline_s": 2.0}
    options.update(kwargs)
    return RayJob(job_id=job_id, **options)  # type: ignore[arg-type]


def test_without_ray_the_job_runs_on_without_control(caplog: pytest.LogCaptureFixture) -> None:
    # First in the module: the module's cluster (and ray.init) comes up with the first test that uses it.
    assert not ray.is_initialized()
    job = RayJob(job_id="no-ray")
    ran = []
    for iteration in range(2):
        with job.phase(GEN, iteration) as phase:
            phase.report(tokens=1)
            ran.append(iteration)
    job.close()
    assert ran == [0, 1]
    assert not job.enabled
    assert [r.getMessage() for r in caplog.records if r.levelname == "WARNING"] == [
        "eerl: Ray is not initialised (ray.init()); job-level control is off"
    ]


def test_a_job_s_phases_clock_every_node_alike(local_cluster: LocalCluster) -> None:
    job = fixed_job("alike")
    try:
        assert job.nodes == NODES
        assert all(info is not None and info.connected for info in job.infos)
        by_id = local_cluster.by_node_id()
        assert set(job.node_ids) == set(by_id)
        for iteration in range(3):
            for kind in (GEN, TRAIN):
                with job.phase(kind, iteration) as phase:
                    assert len(job.last_begins) == NODES
                    assert {b.verdict for b in job.last_begins} == {DirectiveVerdict.ACCEPTED}
                    for node in local_cluster.nodes:
                        assert node.hardware_locks() == [CLOCKS[kind]] * 2, node.node_id
                    time.sleep(0.25)  # the sim energy counters step every 100 ms
                    phase.report(tokens=1000, valid_tokens=500)
                reports = job.last_reports
                assert len(reports) == NODES
                assert {r.sm_clock_mhz for r in reports} == {CLOCKS[kind]}
                assert len({r.applied_epoch for r in reports}) == 1
                assert job.last_observation is not None
                assert job.last_observation.accepted
        # Every begin and end went to every node and every node answered before the deadline.
        assert len(job.fanouts) == 2 * 2 * 3
        assert {(f.asked, f.answered) for f in job.fanouts} == {(NODES, NODES)}
    finally:
        job.close()
    for node in local_cluster.nodes:
        assert wait_until(lambda node=node: node.hardware_locks() == [None, None], 3.0)  # type: ignore[misc]


def test_the_nodes_are_those_of_the_job_s_placement_groups(local_cluster: LocalCluster) -> None:
    group = placement_group([{"GPU": 2}] * 2, strategy="STRICT_SPREAD")
    ray.get(group.ready(), timeout=30)
    job = fixed_job("placed", placement_groups=[group])
    try:
        placed = set(placement_group_table(group)["bundles_to_node_id"].values())
        assert job.nodes == 2
        assert set(job.node_ids) == placed
        with job.phase(GEN, 0):
            assert {b.verdict for b in job.last_begins} == {DirectiveVerdict.ACCEPTED}
            for node in local_cluster.nodes:
                expected = [CLOCKS[GEN]] * 2 if node.node_id in placed else [None, None]
                assert node.hardware_locks() == expected
    finally:
        job.close()
        remove_placement_group(group)


def test_an_actor_controller_plans_the_job_s_first_phase(local_cluster: LocalCluster) -> None:
    # An actor needs its own worker process, which takes longer to start than a phase's deadline: the job
    # waits for it at start-up, so its first phase is planned, not left to the daemons' fallback.
    job = fixed_job("first", controller="actor", deadline_s=0.5)
    try:
        with job.phase(GEN, 0):
            directive = job.directive(GEN, 0)
            assert directive is not None
            assert directive.sm_clock_mhz == CLOCKS[GEN]
    finally:
        job.close()


def test_the_controller_killed_every_daemon_falls_back(local_cluster: LocalCluster) -> None:
    job = fixed_job("killed", controller="actor")
    try:
        with job.phase(GEN, 0):
            assert {b.verdict for b in job.last_begins} == {DirectiveVerdict.ACCEPTED}
        ray.kill(job.controller, no_restart=True)
        # ray.kill only sends the signal: a call made at once may still reach the live actor.
        assert wait_until(lambda: _is_dead(job.controller), 10.0)
        with job.phase(GEN, 1):
            # The dead controller planned nothing, and every node still answered within the one deadline
            # the plan and the begin fan-out share.
            assert job.directive(GEN, 1) is None
            assert (job.fanouts[-1].asked, job.fanouts[-1].answered) == (NODES, NODES)
            assert len(job.last_begins) == NODES
            assert {b.verdict for b in job.last_begins} == {DirectiveVerdict.MISSING}
            # The fallback: the last accepted committed clock of the phase kind (never a trial).
            assert {b.sm_clock_mhz for b in job.last_begins} == {CLOCKS[GEN]}
        with job.phase(TRAIN, 1):
            # No committed training clock was ever accepted: the default governor.
            assert {b.verdict for b in job.last_begins} == {DirectiveVerdict.MISSING}
            for node in local_cluster.nodes:
                assert node.hardware_locks() == [None, None]
    finally:
        job.close()


def test_a_stale_second_controller_is_fenced_off(local_cluster: LocalCluster) -> None:
    newer = fixed_job("fenced", incarnation=20)
    older = None
    try:
        with newer.phase(GEN, 0):
            assert {b.verdict for b in newer.last_begins} == {DirectiveVerdict.ACCEPTED}
        newer.close()  # the newer controller's sessions end; each daemon remembers incarnation 20
        older = fixed_job("fenced", incarnation=10, start_timeout_s=10.0)
        with older.phase(TRAIN, 0):
            # Refused at every node (its sessions are not opened): no node applies its directive.
            assert not any(b.reached for b in older.last_begins)
            for node in local_cluster.nodes:
                assert node.hardware_locks() == [None, None]
    finally:
        newer.close()
        if older is not None:
            older.close()


def test_bad_directives_are_refused_on_every_node(local_cluster: LocalCluster) -> None:
    """Sent through the real node agents: off the grid, under the floor, and a flood of trials."""
    job = RayJob(job_id="refused", controller="off", deadline_s=2.0)
    try:

        def begin_end(directive: Directive, iteration: int) -> list[NodeBegin]:
            begins = ray.get([a.begin.remote(directive, GEN, iteration) for a in job.agents], timeout=10)
            ray.get([a.end.remote(GEN, iteration, None) for a in job.agents], timeout=10)
            return list(begins)

        def directive(iteration: int, clock: int, purpose: DirectivePurpose, epoch: int = 1) -> Directive:
            return Directive(job.incarnation, epoch, iteration, GEN, clock, purpose)

        committed = DirectivePurpose.COMMITTED
        assert {b.verdict for b in begin_end(directive(0, 1201, committed), 0)} == {DirectiveVerdict.OFF_GRID}
        assert {b.verdict for b in begin_end(directive(1, 345, committed), 1)} == {
            DirectiveVerdict.BELOW_FLOOR
        }
        verdicts = [
            {
                b.verdict
                for b in begin_end(directive(2 + i, 1200 + 15 * (i % 2), DirectivePurpose.TRIAL), 2 + i)
            }
            for i in range(MAX_TRIALS + 1)
        ]
        assert verdicts == [{DirectiveVerdict.ACCEPTED}] * MAX_TRIALS + [{DirectiveVerdict.TRIAL_BUDGET}]
        # Refused: the fallback, never a trial clock (no committed clock yet: the default governor).
        last = begin_end(directive(9, 1200, DirectivePurpose.TRIAL), 9)
        assert {(b.verdict, b.sm_clock_mhz) for b in last} == {(DirectiveVerdict.TRIAL_BUDGET, None)}
    finally:
        job.close()


def test_a_daemon_killed_and_restarted_resets_and_the_agent_reopens(local_cluster: LocalCluster) -> None:
    job = fixed_job("restart")
    victim = local_cluster.nodes[1]
    rank = job.node_ids.index(victim.node_id)
    try:
        with job.phase(GEN, 0):
            assert victim.hardware_locks() == [CLOCKS[GEN]] * 2
        first_epoch = {r.node_rank: r.session_epoch for r in job.last_reports}[rank]
        with job.phase(TRAIN, 0):
            victim.kill()
            assert victim.hardware_locks() == [CLOCKS[TRAIN]] * 2  # SIGKILL leaves the lock on the "hardware"
        # The phase's end found no daemon on that node: it did not report, and the job went on.
        assert rank not in {
            r.node_rank for r in job.last_reports if r.verdict is not DirectiveVerdict.MISSING
        }
        victim.start()  # boots, and resets the GPUs its ledger says were locked
        assert victim.hardware_locks() == [None, None]
        reopened = None
        for iteration in range(1, 6):
            with job.phase(GEN, iteration):
                pass
            mine = [r for r in job.last_reports if r.node_rank == rank]
            if mine and mine[0].verdict is DirectiveVerdict.ACCEPTED:
                reopened = mine[0]
                break
            time.sleep(0.3)
        assert reopened is not None
        assert reopened.session_epoch == first_epoch + 1
    finally:
        job.close()


def test_a_node_removed_mid_phase_goes_to_default_and_the_job_goes_on(local_cluster: LocalCluster) -> None:
    job = fixed_job("removed", deadline_s=1.0)
    victim = local_cluster.nodes[-1]
    try:
        with job.phase(GEN, 0):
            assert victim.hardware_locks() == [CLOCKS[GEN]] * 2
            local_cluster.remove(victim)
            # Its daemon saw the agent's session end and returned the GPUs to default within 2 s.
            assert wait_until(lambda: victim.hardware_locks() == [None, None], 2.0)
        for iteration in range(1, 3):
            for kind in (GEN, TRAIN):
                with job.phase(kind, iteration):
                    pass
                assert (
                    len([b for b in job.last_begins if b.verdict is DirectiveVerdict.ACCEPTED]) == NODES - 1
                )
                # The job no longer waits on the removed node: it is not asked, and the others all answer.
                assert [(f.asked, f.answered) for f in job.fanouts[-2:]] == [(NODES - 1, NODES - 1)] * 2
        assert job.last_observation is not None
        assert not job.last_observation.accepted
    finally:
        job.close()
        local_cluster.add_back(victim)
