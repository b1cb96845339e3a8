"""Pool controllers (eerl.job.pools): one async job-level controller per pool, each told the other's times.

Pure tests: two pools of simulated H100 nodes (the sim's roofline physics), the real EE-RL controller inside,
no daemon and no Ray.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from eerl.control.base import ControllerSettings, Decision, PhaseObservation, PhaseSnapshot
from eerl.directives import DirectiveVerdict
from eerl.errors import ValidationError
from eerl.job import GuardConfig, JobController, NodeReport
from eerl.job.pools import PoolControllers, pool_settings
from eerl.phases import ControllerState, ExecutionMode, PhaseKind, Workload
from eerl_sim import physics
from eerl_sim.profiles import H100_SXM

GEN, TRAIN = PhaseKind.GENERATION, PhaseKind.TRAINING
GRID = H100_SXM.sm_clock_grid_mhz()
SETTINGS = ControllerSettings(GRID)
WORK = Workload(tokens=1_000_000, valid_tokens=500_000, sequences=2048, max_response_tokens=8192)
NODES = 2


@dataclass(frozen=True)
class Pool:
    """A pool's phase on one simulated H100 node: compute work (MHz·s) and memory time (s)."""

    compute: float
    memory: float

    def default_mhz(self) -> int:
        """The default governor's clock: the top of the grid, held back by the power limit."""
        for clock in reversed(GRID):
            if physics.segment_power_w(H100_SXM, self.compute, self.memory, float(clock)) <= (
                H100_SXM.power_limit_w
            ):
                return clock
        return GRID[0]

    def cost(self, clock: int | None) -> tuple[float, float]:
        """(duration_s, energy_j) of one node's phase at ``clock`` (None: the default governor)."""
        capped = self.default_mhz()
        mhz = float(capped if clock is None else min(clock, capped))
        duration = float(physics.segment_duration_s(self.compute, self.memory, mhz))
        power = float(physics.segment_power_w(H100_SXM, self.compute, self.memory, mhz))
        return duration, power * duration * 8


# Generation is the pipeline's bottleneck (about 2.6x the training pool's time at the default governor);
# both are compute-bound, so neither has a free lunch of its own below the threshold.
GEN_POOL = Pool(compute=85_000.0, memory=2.0)
TRAIN_POOL = Pool(compute=32_000.0, memory=1.0)


def node_reports(
    kind: PhaseKind, iteration: int, epoch: int, clock: int | None, pool: Pool
) -> list[NodeReport]:
    duration, energy = pool.cost(clock)
    return [
        NodeReport(rank, 1, iteration, kind, epoch, clock, DirectiveVerdict.ACCEPTED, duration, energy, 8)
        for rank in range(NODES)
    ]


def drive(pools: PoolControllers, iterations: int) -> dict[PhaseKind, list[int | None]]:
    """Both pools at once each iteration (the training pool's phase ends first); the planned clocks."""
    clocks: dict[PhaseKind, list[int | None]] = {GEN: [], TRAIN: []}
    now_s = 0.0
    for i in range(iterations):
        gen = pools.plan(GEN, i, now_s)
        train = pools.plan(TRAIN, i, now_s)
        assert gen is not None
        assert train is not None
        clocks[GEN].append(gen.sm_clock_mhz)
        clocks[TRAIN].append(train.sm_clock_mhz)
        gen_s, _ = GEN_POOL.cost(gen.sm_clock_mhz)
        train_s, _ = TRAIN_POOL.cost(train.sm_clock_mhz)
        pools.observe(
            TRAIN,
            i,
            node_reports(TRAIN, i, train.epoch, train.sm_clock_mhz, TRAIN_POOL),
            WORK,
            now_s + train_s,
        )
        pools.observe(
            GEN, i, node_reports(GEN, i, gen.epoch, gen.sm_clock_mhz, GEN_POOL), WORK, now_s + gen_s
        )
        now_s += max(gen_s, train_s)
        pools.end_iteration(i, max(gen_s, train_s), WORK.valid_tokens, now_s)
    return clocks


class TestPoolSettings:
    def test_a_pool_runs_its_one_kind_in_async_mode(self) -> None:
        settings = pool_settings(ControllerSettings(GRID, fixed_clocks_mhz={GEN: 1200, TRAIN: 1500}), TRAIN)
        assert settings.kinds == (TRAIN,)
        assert settings.mode is ExecutionMode.ASYNC
        assert settings.fixed_clocks_mhz == {TRAIN: 1500}

    def test_build_gives_each_pool_its_own_node_count(self) -> None:
        pools = PoolControllers.build(SETTINGS, {GEN: 3, TRAIN: 2}, incarnation=7)
        assert {kind: c.nodes for kind, c in pools.controllers.items()} == {GEN: 3, TRAIN: 2}
        assert all(c.incarnation == 7 for c in pools.controllers.values())

    def test_no_pool_is_refused(self) -> None:
        with pytest.raises(ValidationError):
            PoolControllers({})

    def test_a_kind_without_a_pool_gets_no_directive(self) -> None:
        pools = PoolControllers.build(SETTINGS, {TRAIN: 1}, incarnation=1)
        assert pools.plan(GEN, 0, 0.0) is None
        assert not pools.observe(GEN, 0, [], WORK, 0.0).accepted


class TestBottleneck:
    def test_the_pool_that_waits_gets_its_clock_lowered_first(self) -> None:
        """Generation gates the iteration: the training pool, which waits for it, commits well below the
        default, while generation stays near the default; the job keeps the threshold on its iteration
        time (the slower pool's)."""
        pools = PoolControllers.build(SETTINGS, {GEN: NODES, TRAIN: NODES}, incarnation=1)
        clocks = drive(pools, 80)
        gen_clock, train_clock = clocks[GEN][-1], clocks[TRAIN][-1]
        states = {s.kind: s.state for c in pools.controllers.values() for s in c.snapshot()}
        assert states == {GEN: ControllerState.COMMITTED, TRAIN: ControllerState.COMMITTED}
        assert train_clock is not None
        assert train_clock < 0.7 * TRAIN_POOL.default_mhz()
        assert gen_clock is None or gen_clock >= 0.95 * GEN_POOL.default_mhz()
        assert gen_clock is None or train_clock < gen_clock
        default_s = max(GEN_POOL.cost(None)[0], TRAIN_POOL.cost(None)[0])
        iteration_s = max(GEN_POOL.cost(gen_clock)[0], TRAIN_POOL.cost(train_clock)[0])
        assert default_s / iteration_s >= 0.95 - 0.01
        assert TRAIN_POOL.cost(train_clock)[1] < 0.9 * TRAIN_POOL.cost(None)[1]

    def test_without_the_peers_times_the_waiting_pool_keeps_its_own_budget(self) -> None:
        """The same training pool told nothing of generation holds its own threshold: a higher clock."""
        alone = PoolControllers.build(SETTINGS, {TRAIN: NODES}, incarnation=1)
        together = PoolControllers.build(SETTINGS, {GEN: NODES, TRAIN: NODES}, incarnation=1)
        now_s = 0.0
        for i in range(80):
            train = alone.plan(TRAIN, i, now_s)
            assert train is not None
            now_s += TRAIN_POOL.cost(train.sm_clock_mhz)[0]
            sent = node_reports(TRAIN, i, train.epoch, train.sm_clock_mhz, TRAIN_POOL)
            alone.observe(TRAIN, i, sent, WORK, now_s)
        lone_clock = alone.plan(TRAIN, 80, now_s).sm_clock_mhz  # type: ignore[union-attr]
        paired_clock = drive(together, 80)[TRAIN][-1]
        assert lone_clock is not None
        assert paired_clock is not None
        assert paired_clock < lone_clock

    def test_a_dropped_phase_still_tells_the_peer_its_typical_time(self) -> None:
        pools = PoolControllers(
            {GEN: JobController(pool_settings(SETTINGS, GEN), NODES), TRAIN: Recording.pool(TRAIN)}
        )
        gen = pools.plan(GEN, 0, 0.0)
        assert gen is not None
        sent = node_reports(GEN, 0, gen.epoch, gen.sm_clock_mhz, GEN_POOL)[:1]  # one node missing
        assert not pools.observe(GEN, 0, sent, WORK, 1.0).accepted
        recording = pools.controllers[TRAIN]._inner  # type: ignore[attr-defined]
        assert [(o.kind, o.duration_s) for o in recording.observed] == [(GEN, sent[0].duration_s)]


@dataclass
class Recording:
    """An inner controller that commits a scripted clock and records what it observes."""

    kind: PhaseKind
    clock: int | None = 1200
    observed: list[PhaseObservation] = field(default_factory=list)

    @classmethod
    def pool(cls, kind: PhaseKind, guard: GuardConfig | None = None) -> JobController:
        return JobController(pool_settings(SETTINGS, kind), NODES, controller=cls(kind), guard=guard)

    def decide(self, kind: PhaseKind, iteration: int, hints: Workload | None, now_s: float) -> Decision:
        state = ControllerState.BASELINE if self.clock is None else ControllerState.COMMITTED
        return Decision(kind, iteration, self.clock, state, "scripted", now_s)

    def observe(self, observation: PhaseObservation, now_s: float) -> Decision | None:
        self.observed.append(observation)
        return None

    def snapshot(self) -> Sequence[PhaseSnapshot]:
        return [PhaseSnapshot(self.kind, ControllerState.COMMITTED, self.clock)]

    def state_of(self, kind: PhaseKind) -> ControllerState | None:
        return ControllerState.COMMITTED

    def decisions(self) -> Sequence[Decision]:
        return []


class TestPeerTimes:
    def test_a_pool_refuses_its_own_kind_as_a_peer(self) -> None:
        with pytest.raises(ValidationError):
            Recording.pool(TRAIN).observe_peer(TRAIN, 0, 1.0, 0.0)

    def test_peer_times_reach_the_inner_controller_as_the_other_kind(self) -> None:
        pool = Recording.pool(TRAIN)
        pool.observe_peer(GEN, 3, 40.0, 1.0)
        pool.observe_peer(GEN, 4, 0.0, 2.0)  # no time: nothing to tell
        inner = pool._inner  # type: ignore[attr-defined]
        assert [(o.kind, o.iteration, o.duration_s) for o in inner.observed] == [(GEN, 3, 40.0)]


def guarded_training_pool(train_s: float, peer_s: float) -> JobController:
    """A training pool's guard after 6 default iterations (20 s) and 8 committed ones of ``train_s``, with
    the generation pool taking ``peer_s`` each iteration."""
    pool = Recording.pool(TRAIN, GuardConfig(window=8))
    inner: Recording = pool._inner  # type: ignore[attr-defined]
    for i in range(14):
        inner.clock = None if i < 6 else 1200
        own_s = 20.0 if i < 6 else train_s
        directive = pool.plan(TRAIN, i, float(i))
        sent = [
            NodeReport(
                r,
                1,
                i,
                TRAIN,
                directive.epoch,
                directive.sm_clock_mhz,
                DirectiveVerdict.ACCEPTED,
                own_s,
                1e3,
                8,
            )
            for r in range(NODES)
        ]
        pool.observe(TRAIN, i, sent, WORK, float(i))
        pool.observe_peer(GEN, i, peer_s, float(i))
        pool.end_iteration(i, 1.0, WORK.valid_tokens, float(i))
    return pool


class TestGuardOnTheSlowerPool:
    def test_a_pool_that_slows_but_still_waits_for_the_peer_is_not_backed_off(self) -> None:
        """Training 40 % slower than its default but still shorter than generation: the job's iteration
        (generation's) did not move, so the guard holds."""
        assert guarded_training_pool(train_s=28.0, peer_s=45.0).lift_steps <= 0

    def test_a_pool_that_becomes_the_bottleneck_under_the_threshold_is_backed_off(self) -> None:
        """Training now gates the iteration, 10 % past the default's: the guard lifts its clock."""
        assert guarded_training_pool(train_s=49.5, peer_s=45.0).lift_steps == 1
