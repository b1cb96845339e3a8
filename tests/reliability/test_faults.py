"""NVML faults: each typed error at each backend call site degrades only its GPU; a counter reset is safe."""

from __future__ import annotations

import pytest

from soak import faults

START_ONLY = ["inventory", "supported_sm_clocks_mhz", "supported_mem_clocks_mhz", "supports_locked_clocks"]


@pytest.mark.parametrize("error", faults.ERRORS)
def test_an_error_at_any_call_site_while_serving_degrades_only_that_gpu(error: str) -> None:
    result = faults.fault_matrix(faults.BACKEND_METHODS, [error], at_start=False)
    assert result["problems"] == {}


def test_an_error_at_a_start_only_call_site_leaves_the_daemon_serving_the_other_gpus() -> None:
    result = faults.fault_matrix(START_ONLY, faults.ERRORS, at_start=True)
    assert result["problems"] == {}


def test_an_energy_counter_reset_mid_phase_books_neither_negative_nor_more_than_the_true_energy() -> None:
    result = faults.energy_counter_reset()
    with_reset, without = result["with_reset"], result["without_reset"]
    assert 0 <= with_reset["measured_j"] <= with_reset["true_j"]
    assert without["measured_j"] == pytest.approx(without["true_j"], rel=0.01)
