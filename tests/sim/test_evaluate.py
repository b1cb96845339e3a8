"""Phase evaluation, iteration totals and fixed-clock runs in virtual time."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from eerl.phases import PhaseKind
from eerl_sim.evaluate import evaluate_phase, iteration_totals, run_fixed, sample_iteration
from eerl_sim.scenario import Scenario

from eerld.errors import InvalidArgument

GEN, TRAIN = PhaseKind.GENERATION, PhaseKind.TRAINING


class TestEvaluatePhase:
    def test_the_default_governor_equals_a_lock_at_the_top_clock(self, sync_h100: Scenario) -> None:
        sample = sample_iteration(sync_h100, 0)
        outcome = evaluate_phase(sync_h100, sample, TRAIN, [None, 1980])
        assert outcome.duration_s[0] == outcome.duration_s[1]
        assert outcome.energy_j[0] == outcome.energy_j[1]

    def test_lower_locks_slow_training_and_cut_its_power(self, sync_h100: Scenario) -> None:
        sample = sample_iteration(sync_h100, 0)
        outcome = evaluate_phase(sync_h100, sample, TRAIN, [1500, 1200, 900])
        power = outcome.energy_j / outcome.duration_s
        assert np.all(np.diff(outcome.duration_s) > 0)
        assert np.all(np.diff(power) < 0)

    def test_the_mean_clock_reports_the_clock_that_held(self, sync_h100: Scenario) -> None:
        sample = sample_iteration(sync_h100, 0)
        outcome = evaluate_phase(sync_h100, sample, GEN, [1200, 900])
        assert outcome.mean_clock_mhz == pytest.approx([1200, 900])
        capped = evaluate_phase(sync_h100, sample, TRAIN, [None])
        assert 1500 <= capped.mean_clock_mhz[0] < 1980

    def test_phase_energy_includes_the_idle_wait_for_the_slowest_gpu(self, sync_h100: Scenario) -> None:
        sample = sample_iteration(sync_h100, 0)
        outcome = evaluate_phase(sync_h100, sample, GEN, [None])
        floor_j = sync_h100.gpu.idle_power_w * outcome.duration_s[0] * sync_h100.workload.gpus
        assert outcome.energy_j[0] > floor_j
        assert outcome.gpus == 8

    def test_a_clock_off_the_grid_is_rejected(self, sync_h100: Scenario) -> None:
        with pytest.raises(InvalidArgument, match="1201"):
            evaluate_phase(sync_h100, sample_iteration(sync_h100, 0), GEN, [1201])

    def test_a_clock_switch_costs_only_when_the_clock_changes(self, sync_h100: Scenario) -> None:
        sample = sample_iteration(sync_h100, 0)
        plain = evaluate_phase(sync_h100, sample, TRAIN, [900, 1500])
        switched = evaluate_phase(sync_h100, sample, TRAIN, [900, 1500], previous_sm_clock_mhz=900)
        assert switched.duration_s[0] == plain.duration_s[0]
        # Starting from 900 MHz, the first 15 ms run slower than 1500 MHz would.
        assert switched.duration_s[1] > plain.duration_s[1]
        assert switched.duration_s[1] - plain.duration_s[1] < 0.015

    def test_the_outcome_carries_the_phase_workload(self, sync_h100: Scenario) -> None:
        sample = sample_iteration(sync_h100, 0)
        assert evaluate_phase(sync_h100, sample, TRAIN, [None]).workload == sample.training.workload


class TestIterationTotals:
    def test_sync_iterations_add_their_phases(self, sync_h100: Scenario) -> None:
        sample = sample_iteration(sync_h100, 0)
        gen = evaluate_phase(sync_h100, sample, GEN, [None, 1200])
        train = evaluate_phase(sync_h100, sample, TRAIN, [None, 1500])
        totals = iteration_totals(sync_h100, gen, train)
        assert totals.wall_s == pytest.approx(gen.duration_s + train.duration_s)
        assert totals.energy_j == pytest.approx(gen.energy_j + train.energy_j)
        assert totals.valid_tokens == sample.valid_tokens

    def test_async_iterations_last_as_long_as_the_slower_pool_which_the_other_waits_for_at_idle(
        self, async_h100: Scenario
    ) -> None:
        sample = sample_iteration(async_h100, 3)
        gen = evaluate_phase(async_h100, sample, GEN, [None])
        train = evaluate_phase(async_h100, sample, TRAIN, [None])
        totals = iteration_totals(async_h100, gen, train)
        wall = max(gen.duration_s[0], train.duration_s[0])
        idle_j = async_h100.gpu.idle_power_w * (
            4 * (wall - gen.duration_s[0]) + 4 * (wall - train.duration_s[0])
        )
        assert totals.wall_s[0] == pytest.approx(wall)
        assert totals.energy_j[0] == pytest.approx(gen.energy_j[0] + train.energy_j[0] + idle_j)


class TestRunFixed:
    def test_totals_are_the_sums_of_the_iterations(self, sync_h100: Scenario) -> None:
        result = run_fixed(sync_h100, {}, iterations=4)
        assert result.iterations == 4
        assert result.energy_j == pytest.approx(result.iteration_energy_j.sum())
        assert result.wall_s == pytest.approx(result.iteration_wall_s.sum())
        assert result.energy_per_valid_token_j == pytest.approx(result.energy_j / result.valid_tokens)
        assert result.throughput_tokens_per_s == pytest.approx(result.valid_tokens / result.wall_s)

    def test_a_run_is_reproducible(self, sync_h100: Scenario) -> None:
        first = run_fixed(sync_h100, {GEN: 1200, TRAIN: 1500}, iterations=3)
        second = run_fixed(sync_h100, {GEN: 1200, TRAIN: 1500}, iterations=3)
        assert np.array_equal(first.iteration_energy_j, second.iteration_energy_j)

    def test_every_clock_setting_sees_the_same_workload(self, sync_h100: Scenario) -> None:
        default = run_fixed(sync_h100, {}, iterations=3)
        locked = run_fixed(sync_h100, {GEN: 900, TRAIN: 1200}, iterations=3)
        assert np.array_equal(default.iteration_valid_tokens, locked.iteration_valid_tokens)

    def test_progress_is_reported_after_each_iteration(self, sync_h100: Scenario) -> None:
        seen: list[tuple[int, int]] = []
        run_fixed(sync_h100, {}, iterations=3, progress=lambda done, total: seen.append((done, total)))
        assert seen == [(1, 3), (2, 3), (3, 3)]

    def test_the_run_covers_the_scenario_iterations_by_default(self, async_h100: Scenario) -> None:
        short = dataclasses.replace(
            async_h100, workload=dataclasses.replace(async_h100.workload, iterations=3)
        )
        assert run_fixed(short, {}).iterations == 3
