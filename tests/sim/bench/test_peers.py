"""The peers in the bench: one fixed clock for the whole job, one fixed power limit (eerl_sim.bench.peers)."""

from __future__ import annotations

import pytest
from eerl.phases import PhaseKind
from eerl_sim.bench.peers import POWER_LIMIT_STEP_W, best_fixed_clock, best_power_limit, power_limited_totals
from eerl_sim.bench.runner import ScenarioRun
from eerl_sim.evaluate import between_at_clocks, evaluate_between, evaluate_phase, run_fixed
from eerl_sim.scenario import load_scenario

ITERATIONS = 40
THRESHOLD = 0.95


@pytest.fixture(scope="module")
def sync_run() -> ScenarioRun:
    return ScenarioRun(load_scenario("sync-h100"), ITERATIONS)


@pytest.fixture(scope="module")
def verl_run() -> ScenarioRun:
    return ScenarioRun(load_scenario("verl-h100"), ITERATIONS)


def mhz(setting: str) -> int:
    return int(setting.removesuffix(" MHz"))


class TestOneFixedClock:
    def test_it_is_the_run_with_that_lock_on_both_phases(self, sync_run: ScenarioRun) -> None:
        """The same totals as a fixed run at that clock for both phases (no switches: it never changes)."""
        peer = best_fixed_clock(sync_run, THRESHOLD)
        clock = mhz(peer.setting)
        fixed = run_fixed(sync_run.scenario, dict.fromkeys(PhaseKind, clock), ITERATIONS)
        assert peer.totals.wall_s == pytest.approx(fixed.wall_s, rel=1e-9)
        assert peer.totals.energy_j == pytest.approx(fixed.energy_j, rel=1e-9)

    def test_it_meets_the_threshold_and_no_clock_per_phase_pair_does_worse_than_it(
        self, sync_run: ScenarioRun
    ) -> None:
        """The oracle's pairs include every single clock: it saves at least as much."""
        peer = best_fixed_clock(sync_run, THRESHOLD)
        default = sync_run.default_totals()
        _, oracle = sync_run.oracle(THRESHOLD)
        assert default.wall_s / peer.totals.wall_s >= THRESHOLD
        assert oracle.energy_j <= peer.totals.energy_j < default.energy_j

    def test_its_lock_holds_through_the_work_between_the_phases(self, verl_run: ScenarioRun) -> None:
        """An admin's -lgc is not released between phases: the work between runs at the lock too."""
        peer = best_fixed_clock(verl_run, THRESHOLD)
        clock = mhz(peer.setting)
        wall = energy = 0.0
        for i in range(ITERATIONS):
            sample = verl_run.sample(i)
            for kind in PhaseKind:
                outcome = evaluate_phase(verl_run.scenario, sample, kind, [clock])
                wall += float(outcome.duration_s[0])
                energy += float(outcome.energy_j[0])
            held_s, held_j = between_at_clocks(verl_run.scenario, sample, [clock])
            assert held_s[0] > evaluate_between(verl_run.scenario, sample).duration_s
            wall += float(held_s[0])
            energy += float(held_j[0])
        assert peer.totals.wall_s == pytest.approx(wall, rel=1e-9)
        assert peer.totals.energy_j == pytest.approx(energy, rel=1e-9)


class TestOnePowerLimit:
    def test_the_full_limit_is_the_default_governor(self, sync_run: ScenarioRun) -> None:
        full = power_limited_totals(sync_run, sync_run.scenario.gpu.power_limit_w)
        default = sync_run.default_totals()
        assert full.wall_s == pytest.approx(default.wall_s, rel=1e-9)
        assert full.energy_j == pytest.approx(default.energy_j, rel=1e-9)

    def test_the_best_limit_meets_the_threshold_and_one_step_lower_does_not_do_better(
        self, sync_run: ScenarioRun
    ) -> None:
        peer = best_power_limit(sync_run, THRESHOLD)
        default = sync_run.default_totals()
        limit = float(peer.setting.removesuffix(" W"))
        assert limit < sync_run.scenario.gpu.power_limit_w
        assert default.wall_s / peer.totals.wall_s >= THRESHOLD
        assert peer.totals.energy_j < default.energy_j
        lower = power_limited_totals(sync_run, limit - POWER_LIMIT_STEP_W)
        assert default.wall_s / lower.wall_s < THRESHOLD or lower.energy_j >= peer.totals.energy_j

    def test_a_lower_limit_never_runs_faster(self, sync_run: ScenarioRun) -> None:
        """Why the scan may stop at the first limit that misses the threshold."""
        full = sync_run.scenario.gpu.power_limit_w
        walls = [power_limited_totals(sync_run, full - k * 100.0).wall_s for k in range(4)]
        assert walls == sorted(walls)
        assert walls[-1] > walls[0]
