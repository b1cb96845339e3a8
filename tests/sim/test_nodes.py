"""The multi-node model (eerl_sim.nodes) and its scenario table ([workload.nodes])."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from eerl.phases import PhaseKind
from eerl_sim.evaluate import evaluate_phase, sample_iteration
from eerl_sim.meter import EnergyCounters
from eerl_sim.nodes import (
    NodePhaseTable,
    draw_nodes,
    meter_nodes,
    node_counters,
    phase_factors,
    price_nodes,
    uniform_job_phase,
)
from eerl_sim.pricing import clock_grid
from eerl_sim.scenario import NodesSpec, Scenario, builtin_scenario_names, load_scenario, nodes_fields

from eerld.errors import ConfigError

GEN, TRAIN = PhaseKind.GENERATION, PhaseKind.TRAINING
MULTINODE = ("multinode-16-h100", "multinode-32-h100", "multinode-4-h100", "multinode-8-gb200")


def scenario_text(nodes: str, mode: str = "sync") -> str:
    base = (Path(load_scenario("sync-h100").source)).read_text()
    base = base.replace('mode = "sync"', f'mode = "{mode}"')
    if mode == "async":
        base = base.replace("# [workload.async]", "[workload.async]").replace(
            "# generation_gpus", "generation_gpus"
        )
        base = base.replace("# training_gpus", "training_gpus").replace("# staleness", "staleness")
    return base + "\n[workload.nodes]\n" + nodes


def load_text(tmp_path: Path, text: str) -> Scenario:
    path = tmp_path / "nodes.toml"
    path.write_text(text)
    return load_scenario(path)


def with_nodes(scenario: Scenario, **changes: object) -> Scenario:
    spec = scenario.workload.nodes
    assert spec is not None
    workload = dataclasses.replace(scenario.workload, nodes=dataclasses.replace(spec, **changes))  # type: ignore[arg-type]
    return dataclasses.replace(scenario, workload=workload)


def quiet(scenario: Scenario) -> Scenario:
    gpu = scenario.gpu.with_overrides({"noise_duration": 0.0, "noise_power": 0.0})
    return dataclasses.replace(scenario, gpu=gpu)


def table(scenario: Scenario, iteration: int, kind: PhaseKind) -> NodePhaseTable:
    spec = scenario.workload.nodes
    assert spec is not None
    sample = sample_iteration(scenario, iteration)
    clocks: list[int | None] = [int(c) for c in clock_grid(scenario.gpu).sm_clocks_mhz]
    priced = evaluate_phase(scenario, sample, kind, clocks)
    draws = draw_nodes(spec, scenario.workload.seed, 0.1)
    factors = phase_factors(spec, draws, scenario.workload.seed, iteration, kind)
    return NodePhaseTable(kind, priced.gpu_busy_s, priced.gpu_busy_energy_j, factors, priced.workload)


class TestScenarioTable:
    def test_the_builtins_are_listed_apart_from_the_single_node_ones(self) -> None:
        assert set(builtin_scenario_names(multinode=True)) == set(MULTINODE)
        assert not set(builtin_scenario_names()) & set(MULTINODE)

    @pytest.mark.parametrize("name", MULTINODE)
    def test_each_builtin_loads_and_spells_out_every_key(self, name: str) -> None:
        scenario = load_scenario(name)
        assert scenario.name == name
        assert scenario.workload.nodes is not None
        text = Path(scenario.source).read_text()
        for key in nodes_fields():
            assert f"\n{key} =" in text, f"{name}: workload.nodes.{key}"

    def test_the_defaults_are_the_specs(self, tmp_path: Path) -> None:
        spec = load_text(tmp_path, scenario_text("count = 4\n")).workload.nodes
        assert spec == NodesSpec(count=4, gpus=8)
        assert spec.speed_sigma == 0.02
        assert spec.straggle_factor == (1.15, 1.4)

    @pytest.mark.parametrize(
        ("body", "message"),
        [
            ("count = 4\nspeed = 0.1\n", "unknown key 'workload.nodes.speed'"),
            ("gpus = 8\n", "'workload.nodes.count' is missing"),
            ("count = 0\n", "'workload.nodes.count' must be in"),
            ("count = 4\ngpus = 4\n", "'workload.nodes.gpus' must equal workload.gpus"),
            ("count = 4\nstraggle_probability = 1.5\n", "'workload.nodes.straggle_probability' must be in"),
            ("count = 4\nstraggle_factor = [1.4, 1.15]\n", "low <= high"),
            ("count = 4\nstraggle_factor = [1.2]\n", "must be a list [low, high]"),
            ("count = 4\nstraggle_factor = [0.5, 1.2]\n", "'workload.nodes.straggle_factor' must be in"),
            ('count = "4"\n', "'workload.nodes.count' must be an integer"),
        ],
    )
    def test_bad_values_are_refused_with_one_message(self, tmp_path: Path, body: str, message: str) -> None:
        with pytest.raises(ConfigError, match=r"nodes\.toml") as error:
            load_text(tmp_path, scenario_text(body))
        assert message in str(error.value)

    def test_async_jobs_have_no_nodes_model(self, tmp_path: Path) -> None:
        with pytest.raises(ConfigError, match="only supported with mode"):
            load_text(tmp_path, scenario_text("count = 4\n", mode="async"))


class TestModel:
    def test_draws_depend_on_the_seed_only(self) -> None:
        spec = NodesSpec(count=8, gpus=8, straggle_probability=0.3)
        a = phase_factors(spec, draw_nodes(spec, 3, 0.1), 3, 5, GEN)
        b = phase_factors(spec, draw_nodes(spec, 3, 0.1), 3, 5, GEN)
        c = phase_factors(spec, draw_nodes(spec, 4, 0.1), 4, 5, GEN)
        assert np.array_equal(a.duration, b.duration)
        assert not np.array_equal(a.duration, c.duration)

    def test_speed_factors_spread_as_their_sigma(self) -> None:
        spec = NodesSpec(count=4000, gpus=1, speed_sigma=0.03)
        speed = draw_nodes(spec, 1, 0.1).speed
        assert np.std(np.log(speed)) == pytest.approx(0.03, rel=0.05)

    def test_stragglers_are_drawn_per_node_and_phase_within_their_range(self) -> None:
        spec = NodesSpec(
            count=2000, gpus=1, speed_sigma=0.0, straggle_probability=0.1, noise_phase_duration=0.0
        )
        draws = draw_nodes(spec, 1, 0.1)
        gen = phase_factors(spec, draws, 1, 0, GEN)
        train = phase_factors(spec, draws, 1, 0, TRAIN)
        assert gen.straggling.mean() == pytest.approx(0.1, abs=0.02)
        assert not np.array_equal(gen.straggling, train.straggling)
        slowed = gen.duration[gen.straggling, 0]
        assert slowed.min() >= 1.15
        assert slowed.max() <= 1.4
        assert np.all(gen.duration[~gen.straggling, 0] == 1.0)

    def test_identical_nodes_are_the_single_node_model_times_the_count(self) -> None:
        """No spread, no straggler, no phase noise: every node is the single-node evaluation."""
        scenario = with_nodes(
            load_scenario("multinode-4-h100"),
            speed_sigma=0.0,
            straggle_probability=0.0,
            noise_phase_duration=0.0,
            noise_phase_power=0.0,
        )
        for kind in (GEN, TRAIN):
            priced = table(scenario, 2, kind)
            column = clock_grid(scenario.gpu).sm_clocks_mhz.tolist().index(1200)
            outcome = price_nodes(priced, np.full(4, column), scenario.gpu.idle_power_w)
            single = evaluate_phase(scenario, sample_iteration(scenario, 2), kind, [1200])
            assert outcome.duration_s == pytest.approx(float(single.duration_s[0]), rel=1e-9)
            assert outcome.total_energy_j == pytest.approx(4 * float(single.energy_j[0]), rel=1e-9)

    def test_the_slowest_node_ends_the_phase_and_the_others_wait_at_idle(self) -> None:
        scenario = quiet(load_scenario("multinode-4-h100"))
        priced = table(scenario, 0, TRAIN)
        top = len(clock_grid(scenario.gpu).sm_clocks_mhz) - 1
        outcome = price_nodes(priced, np.full(4, top), scenario.gpu.idle_power_w)
        assert outcome.duration_s == outcome.node_duration_s.max()
        idle = scenario.gpu.idle_power_w * (outcome.duration_s - outcome.busy_s)
        assert np.allclose(outcome.energy_j, (outcome.busy_energy_j + idle).sum(axis=1))
        assert outcome.total_energy_j == pytest.approx(outcome.energy_j.sum())

    def test_a_straggling_node_gates_the_job(self) -> None:
        scenario = with_nodes(
            quiet(load_scenario("multinode-4-h100")),
            speed_sigma=0.0,
            straggle_probability=1.0,
            straggle_factor=(1.3, 1.3),
            noise_phase_duration=0.0,
        )
        straggling = table(scenario, 0, GEN)
        calm = table(with_nodes(scenario, straggle_probability=0.0), 0, GEN)
        top = np.full(4, len(straggling.busy_s[0]) - 1)
        idle = scenario.gpu.idle_power_w
        assert price_nodes(straggling, top, idle).duration_s == pytest.approx(
            1.3 * price_nodes(calm, top, idle).duration_s
        )

    def test_a_node_at_its_own_clock_is_priced_at_that_clock(self) -> None:
        scenario = load_scenario("multinode-4-h100")
        priced = table(scenario, 1, GEN)
        columns = np.array([10, 50, 80, 109])
        outcome = price_nodes(priced, columns, scenario.gpu.idle_power_w)
        for node, column in enumerate(columns):
            expected = (priced.busy_s[:, column] * priced.factors.duration[node]).max()
            assert outcome.node_duration_s[node] == pytest.approx(expected)

    def test_the_uniform_tables_match_pricing_column_by_column(self) -> None:
        scenario = load_scenario("multinode-16-h100")
        priced = table(scenario, 3, TRAIN)
        duration, energy = uniform_job_phase(priced, scenario.gpu.idle_power_w)
        for column in (0, 40, 90, len(duration) - 1):
            outcome = price_nodes(priced, np.full(16, column), scenario.gpu.idle_power_w)
            assert duration[column] == pytest.approx(outcome.duration_s)
            assert energy[column] == pytest.approx(outcome.total_energy_j)


class TestMetering:
    def test_counter_readings_telescope_to_the_true_energy(self) -> None:
        """Each phase's reading is off by at most the energy of one counter step; the run's sum is exact
        but for the last unread step."""
        scenario = load_scenario("multinode-4-h100")
        spec = scenario.workload.nodes
        assert spec is not None
        period = scenario.gpu.energy_counter_period_ms / 1000.0
        idle = scenario.gpu.idle_power_w
        counters = node_counters(draw_nodes(spec, 1, period), period, idle)
        true_total = measured_total = 0.0
        for i in range(4):
            for kind in (GEN, TRAIN):
                outcome = price_nodes(table(scenario, i, kind), np.full(4, 60), idle)
                measured = meter_nodes(counters, outcome)
                step = scenario.gpu.power_limit_w * spec.gpus * period
                assert np.all(np.abs(measured - outcome.energy_j) <= step)
                true_total += outcome.total_energy_j
                measured_total += float(measured.sum())
        last_step = scenario.gpu.power_limit_w * spec.gpus * spec.count * period
        assert 0 <= true_total - measured_total <= last_step

    def test_each_node_reads_its_own_gpus_counters(self) -> None:
        """The job's one bank of counters reads each node as that node's GPUs' own counters would."""
        scenario = load_scenario("multinode-4-h100")
        spec = scenario.workload.nodes
        assert spec is not None
        period = scenario.gpu.energy_counter_period_ms / 1000.0
        idle = scenario.gpu.idle_power_w
        draws = draw_nodes(spec, 1, period)
        bank = node_counters(draws, period, idle)
        own = [EnergyCounters(draws.counter_offset_s[n], period, idle) for n in range(spec.count)]
        for i in range(3):
            for kind in (GEN, TRAIN):
                outcome = price_nodes(table(scenario, i, kind), np.array([20, 60, 90, 109]), idle)
                measured = meter_nodes(bank, outcome)
                for n, counters in enumerate(own):
                    alone = counters.meter(outcome.duration_s, outcome.busy_s[n], outcome.busy_energy_j[n])
                    assert measured[n] == pytest.approx(float(alone.sum()), rel=1e-12)
