"""The six calibration checks of sim-model.md, on both built-in profiles (check 6 is the gb200 parameter).

Power figures are the spec's H100 numbers mapped onto each profile's span from idle to the power limit
(200–420 W of 70–700 W is 20.6–55.6% of that span), so one check reads the same on both chips.
"""

from __future__ import annotations

import numpy as np
from eerl.phases import PhaseKind
from eerl_sim.evaluate import evaluate_phase, sample_iteration
from eerl_sim.pricing import clock_grid
from eerl_sim.scenario import Scenario, load_scenario
from eerl_sim.sweep import SweepResult

from .conftest import CALIBRATION_ITERATIONS


def _phase_totals(
    scenario: Scenario, kind: PhaseKind, clocks: list[int | None]
) -> tuple[np.ndarray, np.ndarray]:
    duration = np.zeros(len(clocks))
    energy = np.zeros(len(clocks))
    for i in range(CALIBRATION_ITERATIONS):
        outcome = evaluate_phase(scenario, sample_iteration(scenario, i), kind, clocks)
        duration += outcome.duration_s
        energy += outcome.energy_j
    return duration, energy


def _power_band_w(scenario: Scenario) -> tuple[float, float]:
    idle, limit = scenario.gpu.idle_power_w, scenario.gpu.power_limit_w
    span = limit - idle
    return idle + (200 - 70) / 630 * span, idle + (420 - 70) / 630 * span


class TestCheck1GenerationDominates:
    def test_generation_is_55_to_80_percent_of_the_iteration(self, reference: Scenario) -> None:
        gen, _ = _phase_totals(reference, PhaseKind.GENERATION, [None])
        train, _ = _phase_totals(reference, PhaseKind.TRAINING, [None])
        assert 0.55 <= gen[0] / (gen[0] + train[0]) <= 0.80

    def test_average_generation_power_is_well_below_the_limit(self, reference: Scenario) -> None:
        duration, energy = _phase_totals(reference, PhaseKind.GENERATION, [None])
        power_w = energy[0] / duration[0] / reference.workload.gpus
        low, high = _power_band_w(reference)
        assert low <= power_w <= high


class TestCheck2TrainingHitsThePowerLimit:
    def test_training_segments_run_between_1500_and_1850_mhz_under_the_default_governor(
        self, reference: Scenario
    ) -> None:
        grid = clock_grid(reference.gpu).sm_clocks_mhz
        micro_batches = reference.workload.training.micro_batches
        sample = sample_iteration(reference, 0)
        bounds = sample.training.segments.gpu_bounds
        for g in range(sample.training.segments.gpus):
            compute_segments = sample.training.capped_index[bounds[g] : bounds[g] + micro_batches]
            clocks = grid[compute_segments]
            assert np.all((clocks >= 1500) & (clocks <= 1850))

    def test_training_draws_close_to_the_power_limit(self, reference: Scenario) -> None:
        duration, energy = _phase_totals(reference, PhaseKind.TRAINING, [None])
        power_w = energy[0] / duration[0] / reference.workload.gpus
        assert 0.8 * reference.gpu.power_limit_w <= power_w <= reference.gpu.power_limit_w


class TestCheck3GenerationAt1200Mhz:
    def test_generation_at_1200_mhz_is_at_most_8_percent_slower(self, reference: Scenario) -> None:
        duration, _ = _phase_totals(reference, PhaseKind.GENERATION, [None, 1200])
        assert duration[1] / duration[0] <= 1.08

    def test_generation_at_1200_mhz_draws_at_least_20_percent_less_energy(self, reference: Scenario) -> None:
        _, energy = _phase_totals(reference, PhaseKind.GENERATION, [None, 1200])
        assert energy[1] / energy[0] <= 0.80


class TestCheck4TrainingScalesWithOneOverF:
    def test_training_time_grows_roughly_as_one_over_the_clock_below_the_cap(
        self, reference: Scenario
    ) -> None:
        clocks = [900, 1200, 1500]
        duration, _ = _phase_totals(reference, PhaseKind.TRAINING, list(clocks))
        for low, high, t_low, t_high in (
            (900, 1500, duration[0], duration[2]),
            (1200, 1500, duration[1], duration[2]),
        ):
            proportionality = (t_low / t_high) / (high / low)
            # The optimizer and weight-sync segments do not scale, so slightly less than proportional.
            assert 0.85 <= proportionality <= 1.0


class TestCheck5SweepFindsSavings:
    def test_a_fixed_pair_at_95_percent_throughput_saves_15_to_30_percent(
        self, reference_sweep: SweepResult
    ) -> None:
        best = reference_sweep.best(0.95)
        assert best.throughput_ratio >= 0.95
        assert 0.15 <= best.energy_saving_fraction <= 0.30

    def test_the_best_pair_locks_generation_lower_than_training(self, reference_sweep: SweepResult) -> None:
        best = reference_sweep.best(0.95)
        assert best.generation_sm_clock_mhz is not None
        assert best.training_sm_clock_mhz is not None
        assert best.generation_sm_clock_mhz < best.training_sm_clock_mhz


class TestComputeHeavierDecoding:
    """`decode-heavy-h100` is there for a generation phase whose time really moves with its clock."""

    def test_its_generation_slows_about_twice_as_much_at_the_knee_as_the_reference(self) -> None:
        """At 1065 MHz its generation takes 5-9% longer than at the default governor, the reference's 1-4%."""
        slowdowns = {}
        for name in ("sync-h100", "decode-heavy-h100"):
            duration, _ = _phase_totals(load_scenario(name), PhaseKind.GENERATION, [None, 1065])
            slowdowns[name] = duration[1] / duration[0] - 1.0
        assert 0.01 <= slowdowns["sync-h100"] <= 0.04
        assert 0.05 <= slowdowns["decode-heavy-h100"] <= 0.09

    def test_training_is_a_larger_share_of_its_iteration(self) -> None:
        """Training is 35-50% of its default iteration (the reference: 20-45%, check 1)."""
        scenario = load_scenario("decode-heavy-h100")
        gen, _ = _phase_totals(scenario, PhaseKind.GENERATION, [None])
        train, _ = _phase_totals(scenario, PhaseKind.TRAINING, [None])
        assert 0.35 <= train[0] / (gen[0] + train[0]) <= 0.50
