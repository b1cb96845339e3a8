"""The whole-run fixed-clock sweep: consistent with fixed runs, and its best pair and front are sound."""

from __future__ import annotations

import numpy as np
import pytest
from eerl.phases import PhaseKind
from eerl_sim.evaluate import run_fixed
from eerl_sim.scenario import Scenario
from eerl_sim.sweep import SweepResult, sweep

GEN, TRAIN = PhaseKind.GENERATION, PhaseKind.TRAINING


class TestSweep:
    def test_the_default_point_matches_a_default_run(self, sync_h100: Scenario) -> None:
        result = sweep(sync_h100, iterations=3)
        run = run_fixed(sync_h100, {}, iterations=3)
        assert result.default.energy_j == pytest.approx(run.energy_j, rel=1e-9)
        assert result.default.wall_s == pytest.approx(run.wall_s, rel=1e-9)
        assert result.valid_tokens == run.valid_tokens

    def test_a_pair_matches_its_fixed_run_up_to_the_clock_switch_windows(self, sync_h100: Scenario) -> None:
        result = sweep(sync_h100, iterations=3)
        run = run_fixed(sync_h100, {GEN: 1110, TRAIN: 1470}, iterations=3)
        point = result.point(1110, 1470)
        assert point.energy_j == pytest.approx(run.energy_j, rel=5e-4)
        assert point.wall_s == pytest.approx(run.wall_s, rel=5e-4)

    def test_an_async_pair_matches_its_fixed_run(self, async_h100: Scenario) -> None:
        result = sweep(async_h100, iterations=3)
        run = run_fixed(async_h100, {GEN: 1200, TRAIN: 1095}, iterations=3)
        point = result.point(1200, 1095)
        assert point.energy_j == pytest.approx(run.energy_j, rel=1e-9)
        assert point.wall_s == pytest.approx(run.wall_s, rel=1e-9)


class TestBest:
    def test_the_best_pair_meets_the_threshold_and_no_qualifying_pair_is_cheaper(
        self, reference_sweep: SweepResult
    ) -> None:
        best = reference_sweep.best(0.9)
        assert best.throughput_ratio >= 0.9
        ratio = reference_sweep.default.wall_s / reference_sweep.wall_s
        assert reference_sweep.energy_j[ratio >= 0.9].min() == pytest.approx(best.energy_j)

    def test_a_looser_threshold_never_saves_less(self, reference_sweep: SweepResult) -> None:
        savings = [reference_sweep.best(t).energy_saving_fraction for t in (1.0, 0.95, 0.9, 0.8)]
        assert savings == sorted(savings)
        assert savings[0] >= 0.0

    def test_a_threshold_outside_zero_to_one_is_rejected(self, reference_sweep: SweepResult) -> None:
        with pytest.raises(ValueError, match="threshold"):
            reference_sweep.best(1.5)

    def test_the_default_governor_is_reported_as_no_lock(self, reference_sweep: SweepResult) -> None:
        default = reference_sweep.default
        assert default.generation_sm_clock_mhz is None
        assert default.training_sm_clock_mhz is None
        assert default.energy_saving_fraction == 0.0
        assert default.throughput_ratio == 1.0


class TestParetoFront:
    def test_the_front_trades_throughput_for_energy_monotonically(self, reference_sweep: SweepResult) -> None:
        front = reference_sweep.pareto_front()
        throughput = [p.throughput_tokens_per_s for p in front]
        energy = [p.energy_per_valid_token_j for p in front]
        assert throughput == sorted(throughput, reverse=True)
        assert energy == sorted(energy, reverse=True)
        assert len(set(energy)) == len(energy)

    def test_no_pair_dominates_a_point_of_the_front(self, reference_sweep: SweepResult) -> None:
        wall = reference_sweep.wall_s
        energy = reference_sweep.energy_j
        for point in reference_sweep.pareto_front()[::25]:
            dominated = (wall < point.wall_s) & (energy < point.energy_j)
            assert not np.any(dominated)

    def test_the_best_pair_lies_on_the_front(self, reference_sweep: SweepResult) -> None:
        best = reference_sweep.best(0.95)
        pairs = {(p.generation_sm_clock_mhz, p.training_sm_clock_mhz) for p in reference_sweep.pareto_front()}
        assert (best.generation_sm_clock_mhz, best.training_sm_clock_mhz) in pairs
