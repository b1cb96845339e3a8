"""perf.default_cost: which default-governor phases it counts and what it charges them, priced by hand."""

from __future__ import annotations

import numpy as np
import pytest
from eerl.phases import ControllerState

from perf.default_cost import default_phase_cost

B, C, R = ControllerState.BASELINE, ControllerState.COMMITTED, ControllerState.RETUNING


def test_only_default_phases_are_charged_each_what_the_oracle_saves_on_it() -> None:
    """Five phases, three on the default (clock None): a baseline phase and a control phase that each give up
    2 J of the oracle's 10 J of savings, and a re-tune's fresh baseline that gives up 1 J. The locked
    phases cost nothing here, whatever their energy."""
    clocks = [None, 1200, None, 1100, None]
    states = [B, C, C, R, R]
    default = np.array([12.0, 12.0, 12.0, 12.0, 11.0])
    oracle = np.array([10.0, 10.0, 10.0, 10.0, 10.0])
    count, cost = default_phase_cost(clocks, states, default, oracle, 10.0)
    assert count == {B: 1, C: 1, R: 1}
    assert cost == pytest.approx({B: 0.2, C: 0.2, R: 0.1})


def test_a_run_without_default_phases_costs_nothing() -> None:
    count, cost = default_phase_cost([1200, 1200], [C, C], np.array([5.0, 5.0]), np.array([4.0, 4.0]), 2.0)
    assert not count
    assert cost == {}
