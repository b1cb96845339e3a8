"""The bench measures as the daemon does: counter-difference energy, no future hints, phase-level noise."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from eerl.control.base import Controller, ControllerSettings, Decision, PhaseObservation
from eerl.phases import PhaseKind, Workload
from eerl_sim.bench.runner import OnlineRun, ScenarioRun
from eerl_sim.bench.wrapped import WrappedController
from eerl_sim.evaluate import evaluate_phase, sample_iteration
from eerl_sim.meter import EnergyCounters
from eerl_sim.pricing import clock_grid
from eerl_sim.scenario import Scenario, load_scenario
from eerl_sim.sweep import KINDS

ITERATIONS = 14


class Spy(WrappedController):
    """The EE-RL controller, recording every hint and observation it is given."""

    def __init__(self, settings: ControllerSettings) -> None:
        super().__init__(settings)
        self.hints: list[tuple[PhaseKind, int, Workload | None]] = []
        self.observations: list[PhaseObservation] = []

    def decide(self, kind: PhaseKind, iteration: int, hints: Workload | None, now_s: float) -> Decision:
        self.hints.append((kind, iteration, hints))
        return self.inner.decide(kind, iteration, hints, now_s)

    def observe(self, observation: PhaseObservation, now_s: float) -> Decision | None:
        self.observations.append(observation)
        return self.inner.observe(observation, now_s)


def spied_run(name: str) -> tuple[ScenarioRun, OnlineRun, list[Spy]]:
    spies: list[Spy] = []

    def factory(settings: ControllerSettings) -> Controller:
        spies.append(Spy(settings))
        return spies[-1]

    run = ScenarioRun(load_scenario(name), ITERATIONS)
    return run, run.run_online(factory, 0.95), spies


@pytest.fixture(scope="module", params=["sync-h100", "async-h100"])
def spied(request: pytest.FixtureRequest) -> tuple[ScenarioRun, OnlineRun, list[Spy]]:
    return spied_run(request.param)


def reference_counter(
    times: list[float], powers: list[float], offset_s: float, period_s: float, at_s: float
) -> float:
    """Brute force: the true energy (piecewise-constant power) at the last counter step at or before at_s."""
    step = offset_s + period_s * np.floor((at_s - offset_s) / period_s)
    if step < 0:
        return 0.0
    energy, start = 0.0, 0.0
    for end, power in zip(times, powers, strict=True):
        energy += power * max(0.0, min(end, step) - start)
        start = end
    return energy


class TestCounters:
    def test_a_read_is_the_true_energy_at_the_last_step(self) -> None:
        """Against a brute-force integration, over phases shorter and longer than the period, with gaps."""
        rng = np.random.default_rng(3)
        period, idle = 0.1, 70.0
        offsets = rng.uniform(0.0, period, 3)
        counters = EnergyCounters(offsets, period, idle)
        history: list[tuple[list[float], list[float]]] = [([], []) for _ in offsets]
        now = 0.0
        for _ in range(40):
            duration = float(rng.choice([0.03, 0.12, 0.7, 2.5]))
            if rng.uniform() < 0.2:
                counters.advance(duration)
                for times, powers in history:
                    times.append(now + duration)
                    powers.append(idle)
            else:
                busy = rng.uniform(0.5, 1.0, 3) * duration
                power = rng.uniform(150.0, 700.0, 3)
                counters.advance(duration, busy, busy * power)
                for g, (times, powers) in enumerate(history):
                    times.extend([now + float(busy[g]), now + duration])
                    powers.extend([float(power[g]), idle])
            now += duration
            read = counters.read()
            for g, (times, powers) in enumerate(history):
                assert read[g] == pytest.approx(reference_counter(times, powers, offsets[g], period, now))


class TestMeteredLikeTheDaemon:
    def test_the_controller_sees_the_sum_of_the_counter_differences(
        self, spied: tuple[ScenarioRun, OnlineRun, list[Spy]]
    ) -> None:
        """Each observed energy is what the counters gave; over the run they telescope to the true total
        (within one counter step per GPU), while single phases differ from their true energy."""
        run, online, spies = spied
        observed = {
            (o.kind, o.iteration): o.energy_j for spy in spies for o in spy.observations if o.energy_j > 0
        }
        for kind in KINDS:
            for i, metered in enumerate(online.timeline.metered_energy_j[kind]):
                if metered > 0:
                    assert observed[(kind, i)] == metered
        scenario = run.scenario
        spec = scenario.workload
        step_j = spec.gpus * scenario.gpu.power_limit_w * scenario.gpu.energy_counter_period_ms / 1000.0
        true_phases = 0.0
        differs = 0
        for kind in KINDS:
            for i, clock in enumerate(online.timeline.sm_clock_mhz[kind]):
                metered = online.timeline.metered_energy_j[kind][i]
                true = float(_true_phase_energy(run, kind, i, clock, online))
                true_phases += true
                assert abs(metered - true) <= 2 * step_j
                differs += metered != pytest.approx(true, rel=1e-9)
        assert differs > 0
        metered_total = sum(sum(v) for v in online.timeline.metered_energy_j.values())
        assert metered_total == pytest.approx(true_phases, abs=step_j)

    def test_decide_never_receives_the_realised_workload_of_its_phase(
        self, spied: tuple[ScenarioRun, OnlineRun, list[Spy]]
    ) -> None:
        """Hints carry the batch's shape only: no realised token count, no longest response."""
        run, _, spies = spied
        for spy in spies:
            assert spy.hints
            for kind, iteration, hints in spy.hints:
                realised = run.sample(iteration).phase(kind).workload
                assert hints is not None
                assert hints.tokens == hints.valid_tokens == hints.max_response_tokens == 0
                assert hints.sequences == realised.sequences
                if realised.tokens:
                    assert hints != realised


def _true_phase_energy(
    run: ScenarioRun, kind: PhaseKind, i: int, clock: int | None, online: OnlineRun
) -> float:
    """The phase's true energy at the clock it ran at, with the clock switch the online run paid."""
    scenario = run.scenario
    top = int(clock_grid(scenario.gpu).sm_clocks_mhz[-1])
    lock = top if clock is None else clock
    clocks = online.timeline.sm_clock_mhz
    if scenario.workload.mode.value == "sync":
        if kind is PhaseKind.GENERATION:
            previous = None if i == 0 else clocks[PhaseKind.TRAINING][i - 1]
        else:
            previous = clocks[PhaseKind.GENERATION][i]
        previous_lock: int | None = (
            None if (kind is PhaseKind.GENERATION and i == 0) else (top if previous is None else previous)
        )
    else:
        before = None if i == 0 else clocks[kind][i - 1]
        before_lock = None if i == 0 else (top if before is None else before)
        previous_lock = before_lock if before_lock != lock else None
    return float(evaluate_phase(scenario, run.sample(i), kind, [clock], previous_lock).energy_j[0])


class TestPhaseNoise:
    @staticmethod
    def noisy(phase_sigma: float, name: str = "sync-h100") -> Scenario:
        scenario = load_scenario(name)
        gpu = scenario.gpu.with_overrides(
            {
                "noise_duration": 0.0,
                "noise_power": 0.0,
                "noise_phase_duration": phase_sigma,
                "noise_phase_power": phase_sigma,
            }
        )
        return dataclasses.replace(scenario, gpu=gpu)

    def test_each_gpu_draws_one_factor_per_phase_shared_by_its_segments(self) -> None:
        sample = sample_iteration(self.noisy(0.05), 3)
        for kind in KINDS:
            segments = sample.phase(kind).segments
            factors = []
            for g in range(segments.gpus):
                rows = slice(segments.gpu_bounds[g], segments.gpu_bounds[g + 1])
                for noise in (segments.duration_noise[rows], segments.power_noise[rows]):
                    assert np.allclose(noise, noise[0])
                factors.append(segments.duration_noise[rows][0])
            assert np.std(np.log(factors)) > 0.01

    def test_the_profile_default_is_one_percent(self) -> None:
        profile = load_scenario("sync-h100").gpu
        assert profile.noise_phase_duration == profile.noise_phase_power == 0.01

    def test_a_multi_node_scenario_leaves_phase_noise_to_the_nodes_model(self) -> None:
        """The nodes model draws it per node and GPU; the single-node sample must not draw it too."""
        sample = sample_iteration(self.noisy(0.05, "multinode-4-h100"), 3)
        for kind in KINDS:
            assert np.all(sample.phase(kind).segments.duration_noise == 1.0)
