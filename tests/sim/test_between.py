"""Whole iterations: the work between the phases (``[workload.between]``) in the simulator and the bench.

The daemon ends a phase's lock with the phase, so that work runs at the default governor; the bench must do
exactly that, count it in the iteration's wall time and energy, and tell the controller how long it took.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from eerl.control.base import Controller, ControllerSettings, Decision, PhaseObservation, PhaseSnapshot
from eerl.control.budget import KindOptions, allocate_sync
from eerl.phases import ControllerState, PhaseKind, Workload
from eerl_sim import physics
from eerl_sim.bench.runner import ScenarioRun
from eerl_sim.evaluate import evaluate_between, evaluate_phase, run_fixed, sample_iteration
from eerl_sim.pricing import clock_grid
from eerl_sim.scenario import BetweenSpec, load_scenario, parse_scenario
from eerl_sim.workload import training_tokens

from eerld.errors import ConfigError

ITERATIONS = 12
GEN_MHZ, TRAIN_MHZ = 1200, 1500


class FixedSpy:
    """Locks generation at 1200 MHz and training at 1500 MHz; records every observation."""

    def __init__(self, settings: ControllerSettings) -> None:
        self.observations: list[PhaseObservation] = []

    def decide(self, kind: PhaseKind, iteration: int, hints: Workload | None, now_s: float) -> Decision:
        clock = GEN_MHZ if kind is PhaseKind.GENERATION else TRAIN_MHZ
        return Decision(kind, iteration, clock, ControllerState.FIXED, "test", now_s)

    def observe(self, observation: PhaseObservation, now_s: float) -> Decision | None:
        self.observations.append(observation)
        return None

    def snapshot(self) -> Sequence[PhaseSnapshot]:
        return []

    def state_of(self, kind: PhaseKind) -> ControllerState | None:
        return ControllerState.FIXED

    def decisions(self) -> Sequence[Decision]:
        return []


def scenario_table(name: str, **between: object) -> dict[str, Any]:
    with open(load_scenario(name).source, "rb") as f:
        data = tomllib.load(f)
    data["workload"]["between"] = between
    return data


class TestScenario:
    def test_verl_h100_has_two_forward_passes_and_a_few_seconds_of_other_work(self) -> None:
        spec = load_scenario("verl-h100").workload.between
        assert spec.forward_passes == 2
        assert 1.0 <= spec.fixed_s <= 10.0

    def test_the_reference_scenario_has_no_work_between(self) -> None:
        scenario = load_scenario("sync-h100")
        assert scenario.workload.between == BetweenSpec()
        assert sample_iteration(scenario, 0).between is None

    @pytest.mark.parametrize(
        ("between", "message"),
        [
            ({"forward_passes": -1}, "'workload.between.forward_passes' must be in"),
            ({"forward_passes": 1.5}, "'workload.between.forward_passes' must be an integer"),
            ({"fixed_s": "3"}, "'workload.between.fixed_s' must be a number"),
            ({"passes": 2}, "unknown key 'workload.between.passes'"),
        ],
    )
    def test_a_bad_value_is_refused_naming_the_key(self, between: dict[str, object], message: str) -> None:
        with pytest.raises(ConfigError, match=message):
            parse_scenario(scenario_table("verl-h100", **between), source="x.toml")

    def test_async_scenarios_refuse_it(self) -> None:
        data = scenario_table("async-h100", forward_passes=1)
        with pytest.raises(ConfigError, match='only supported with mode = "sync" on one node'):
            parse_scenario(data, source="a.toml")


class TestPhysics:
    def test_forward_passes_cost_a_third_of_training_per_token_each(self) -> None:
        scenario = load_scenario("verl-h100")
        sample = sample_iteration(scenario, 2)
        assert sample.between is not None
        work, training = sample.between.segments, sample.training.segments
        spec = scenario.workload.between
        training_compute = training.compute_mhz_s.sum()
        fixed = work.memory_s[work.compute_mhz_s == 0].sum()
        assert work.compute_mhz_s.sum() == pytest.approx(training_compute * spec.forward_passes / 3)
        assert fixed == pytest.approx(spec.fixed_s * scenario.workload.gpus)
        assert training_tokens(sample.rollout) > 0

    def test_it_is_compute_bound_so_a_generation_lock_would_slow_it_down(self) -> None:
        """Why the lock must end with its phase: at generation's clock the work takes far longer."""
        scenario = load_scenario("verl-h100")
        sample = sample_iteration(scenario, 0)
        work = sample.between
        assert work is not None
        segments = work.segments
        at_lock = physics.segment_duration_s(segments.compute_mhz_s, segments.memory_s, float(GEN_MHZ))
        per_gpu = np.add.reduceat(at_lock * segments.duration_noise, segments.gpu_bounds[:-1])
        assert float(per_gpu.max()) > 1.2 * evaluate_between(scenario, sample).duration_s


class TestBenchMirrorsTheDaemon:
    @pytest.fixture(scope="class")
    @staticmethod
    def spied() -> tuple[ScenarioRun, list[FixedSpy], object]:
        spies: list[FixedSpy] = []

        def factory(settings: ControllerSettings) -> Controller:
            spies.append(FixedSpy(settings))
            return spies[-1]

        run = ScenarioRun(load_scenario("verl-h100"), ITERATIONS)
        return run, spies, run.run_online(factory, 0.95)

    def test_each_iteration_is_generation_then_the_work_at_default_then_training(self, spied) -> None:  # type: ignore[no-untyped-def]
        """Wall time and energy of every iteration: generation at its lock, the work between at the default
        governor (after the reset's switch window), training switching from the default to its lock. A bench
        that left generation's lock in place, or dropped the work, fails here."""
        run, _, online = spied
        scenario = run.scenario
        top = int(clock_grid(scenario.gpu).sm_clocks_mhz[-1])
        for i in range(ITERATIONS):
            sample = run.sample(i)
            gen = evaluate_phase(scenario, sample, PhaseKind.GENERATION, [GEN_MHZ], TRAIN_MHZ if i else None)
            between = evaluate_between(scenario, sample, GEN_MHZ)
            train = evaluate_phase(scenario, sample, PhaseKind.TRAINING, [TRAIN_MHZ], top)
            held = evaluate_phase(scenario, sample, PhaseKind.TRAINING, [TRAIN_MHZ], GEN_MHZ)
            wall = float(gen.duration_s[0] + between.duration_s + train.duration_s[0])
            energy = float(gen.energy_j[0] + between.energy_j + train.energy_j[0])
            assert between.duration_s > 0.1 * wall
            assert online.timeline.wall_s[i] == pytest.approx(wall, rel=1e-12)
            assert online.timeline.energy_j[i] == pytest.approx(energy, rel=1e-12)
            assert held.energy_j[0] != pytest.approx(train.energy_j[0], rel=1e-12)

    def test_the_controller_is_told_the_gap_before_training(self, spied) -> None:  # type: ignore[no-untyped-def]
        run, spies, _ = spied
        (spy,) = spies
        by_phase = {(o.kind, o.iteration): o for o in spy.observations}
        for i in range(ITERATIONS):
            between = evaluate_between(run.scenario, run.sample(i), GEN_MHZ)
            assert by_phase[(PhaseKind.TRAINING, i)].gap_before_s == pytest.approx(between.duration_s)
            assert by_phase[(PhaseKind.GENERATION, i)].gap_before_s == 0.0

    def test_fixed_runs_and_the_oracle_count_it_too(self, spied) -> None:  # type: ignore[no-untyped-def]
        run, _, online = spied
        fixed = run_fixed(
            run.scenario, {PhaseKind.GENERATION: GEN_MHZ, PhaseKind.TRAINING: TRAIN_MHZ}, ITERATIONS
        )
        assert fixed.wall_s == pytest.approx(sum(online.timeline.wall_s), rel=1e-9)
        table = run.price_table()
        clocks = table.sm_clocks_mhz
        totals = run.totals((clocks.index(GEN_MHZ), clocks.index(TRAIN_MHZ)))
        assert totals.wall_s == pytest.approx(fixed.wall_s, rel=2e-3)  # the sweep ignores switch windows
        assert float(table.between_duration_s.sum()) > 0


class TestBudget:
    def test_the_work_between_widens_the_phases_budget_by_its_share(self) -> None:
        """The iteration's default time includes the work between, which takes the same time at any phase
        clock: a phase may take the threshold's share of it as well."""
        options = [
            KindOptions(
                PhaseKind.GENERATION,
                (None, 1200, 1000),
                np.array([1.0, 1.04, 1.08]),
                np.array([1.0, 0.8, 0.7]),
                default_duration_s=80.0,
                default_energy_j=80.0,
            )
        ]
        assert allocate_sync(options, 0.95).sm_clock_mhz[PhaseKind.GENERATION] == 1200
        wide = allocate_sync(options, 0.95, between_s=60.0)
        assert wide.sm_clock_mhz[PhaseKind.GENERATION] == 1000
        assert wide.throughput_ratio == pytest.approx(140.0 / (80.0 * 1.08 + 60.0))
