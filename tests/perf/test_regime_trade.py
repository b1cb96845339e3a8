"""perf.regime_trade: the three allocations it compares, on a job small enough to price by hand."""

from __future__ import annotations

import numpy as np
import pytest

from perf.regime_trade import trade

FAR = 100.0
"""A clock pair so slow that no allocation takes it."""


def _regime(slow_time: float, slow_energy: float) -> tuple[np.ndarray, np.ndarray]:
    """Two clocks per kind: both slow (``[0, 0]``) or both at the default (``[1, 1]``, time and energy 10)."""
    time = np.array([[slow_time, FAR], [FAR, 10.0]])
    energy = np.array([[slow_energy, FAR], [FAR, 10.0]])
    return time, energy


def test_one_price_of_time_trades_where_neither_a_fixed_pair_nor_each_regime_can() -> None:
    """Two regimes, each 10 % slower when slowed; one saves 30 % of its energy so, the other 5 %. At a
    threshold of 1/1.05 the run may take 21 of time: slowing both (22) is too slow for a fixed pair, and
    neither regime alone may take 11 (its budget is 10.5), but the run can slow the one that saves most."""
    (time_a, energy_a), (time_b, energy_b) = _regime(11.0, 7.0), _regime(11.0, 9.5)
    fixed, per_regime, one_price = trade(np.array([time_a, time_b]), np.array([energy_a, energy_b]), 1 / 1.05)
    assert fixed == pytest.approx(0.0)
    assert per_regime == pytest.approx(0.0)
    assert one_price == pytest.approx(0.15)


def test_with_room_for_both_all_three_slow_both() -> None:
    """At a threshold of 1/1.1 every regime may take 11: all three allocations save 16.5 of 20."""
    (time_a, energy_a), (time_b, energy_b) = _regime(11.0, 7.0), _regime(11.0, 9.5)
    savings = trade(np.array([time_a, time_b]), np.array([energy_a, energy_b]), 1 / 1.1 - 1e-9)
    assert savings == pytest.approx((0.175, 0.175, 0.175))
