"""The clock curve's memory: a commit's phases never crowd out the search's trials at other clocks."""

from __future__ import annotations

import numpy as np
from eerl.control.curve import ClockCurve, FloatArray, Trial


def _flat_baseline(features: FloatArray) -> tuple[FloatArray, FloatArray]:
    rows = features.shape[0]
    return np.full(rows, 10.0), np.full(rows, 1000.0)


def _trial(clock_mhz: int, iteration: int, duration_s: float = 10.0) -> Trial:
    return Trial(clock_mhz, np.ones(3), duration_s, 900.0, iteration)


class TestMemory:
    def test_committed_phases_keep_the_trials_at_other_clocks(self) -> None:
        curve = ClockCurve(_flat_baseline, bandwidth_mhz=100.0, capacity=240, per_clock=30)
        for i, clock in enumerate((1035, 1080, 1125)):
            curve.add(_trial(clock, i))
        for i in range(3, 1003):
            curve.add(_trial(1080, i))
        assert len(curve.trials_at(1035)) == 1
        assert len(curve.trials_at(1125)) == 1
        at_commit = curve.trials_at(1080)
        assert len(at_commit) == 30
        assert min(t.iteration for t in at_commit) == 1002 - 29  # the newest are kept

    def test_the_whole_curve_stays_bounded(self) -> None:
        curve = ClockCurve(_flat_baseline, bandwidth_mhz=100.0, capacity=50, per_clock=30)
        for i in range(400):
            curve.add(_trial(900 + 15 * (i % 20), i))
        assert len(curve) == 50

    def test_the_slope_beside_a_commit_comes_from_the_search(self) -> None:
        """Trials below and above the commit, long before it, still give the curve its slope there."""
        curve = ClockCurve(_flat_baseline, bandwidth_mhz=100.0, half_life_iterations=120.0)
        curve.add(_trial(990, 0, duration_s=10.6))
        curve.add(_trial(1170, 1, duration_s=10.0))
        for i in range(2, 400):
            curve.add(_trial(1080, i, duration_s=10.3))
        estimate = curve.estimate(np.array([990.0, 1170.0]), now_iteration=400)
        assert estimate.time_ratio[0] > estimate.time_ratio[1]
