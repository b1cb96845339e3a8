"""Energy-counter arithmetic: a backwards counter is a reset, and energy is never negative."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eerld.gpu.counters import CounterDelta, EnergyCounter, counter_delta_mj

readings_mj = st.integers(min_value=0, max_value=2**64 - 1)


class TestCounterDelta:
    def test_a_rising_counter_gives_the_difference(self) -> None:
        assert counter_delta_mj(1_000, 4_500) == CounterDelta(delta_mj=3_500, reset_detected=False)

    def test_an_unchanged_counter_gives_zero(self) -> None:
        assert counter_delta_mj(7_000, 7_000) == CounterDelta(delta_mj=0, reset_detected=False)

    def test_a_backwards_counter_is_a_reset_counting_what_came_after_it(self) -> None:
        assert counter_delta_mj(9_000_000, 1_200) == CounterDelta(delta_mj=1_200, reset_detected=True)

    def test_a_counter_reset_to_zero_gives_zero_energy(self) -> None:
        assert counter_delta_mj(9_000_000, 0) == CounterDelta(delta_mj=0, reset_detected=True)

    @pytest.mark.parametrize(("previous_mj", "current_mj"), [(-1, 5), (5, -1)])
    def test_a_negative_reading_is_a_caller_bug(self, previous_mj: int, current_mj: int) -> None:
        with pytest.raises(ValueError, match="never negative"):
            counter_delta_mj(previous_mj, current_mj)

    @given(readings_mj, readings_mj)
    def test_energy_is_never_negative_and_never_more_than_the_new_reading_after_a_reset(
        self, previous_mj: int, current_mj: int
    ) -> None:
        delta = counter_delta_mj(previous_mj, current_mj)
        assert delta.delta_mj >= 0
        assert delta.reset_detected == (current_mj < previous_mj)
        if delta.reset_detected:
            assert delta.delta_mj == current_mj


class TestEnergyCounter:
    def test_the_first_reading_is_only_the_baseline(self) -> None:
        meter = EnergyCounter(50_000)
        assert meter.total_mj == 0
        assert meter.last_reading_mj == 50_000

    def test_it_adds_up_the_energy_of_successive_readings(self) -> None:
        meter = EnergyCounter(0)
        meter.observe(1_000)
        meter.observe(3_000)
        assert meter.total_mj == 3_000
        assert meter.resets == 0

    def test_it_bridges_a_reset_and_counts_it(self) -> None:
        meter = EnergyCounter(10_000)
        meter.observe(12_000)  # +2_000
        delta = meter.observe(500)  # driver reload, then +500
        meter.observe(1_500)  # +1_000
        assert delta == CounterDelta(delta_mj=500, reset_detected=True)
        assert meter.total_mj == 3_500
        assert meter.resets == 1

    def test_a_negative_first_reading_is_refused(self) -> None:
        with pytest.raises(ValueError, match="never negative"):
            EnergyCounter(-5)

    @given(st.lists(readings_mj, min_size=1, max_size=50))
    def test_the_total_never_decreases_and_equals_the_sum_of_the_deltas(self, readings: list[int]) -> None:
        meter = EnergyCounter(readings[0])
        running_mj = 0
        for reading in readings[1:]:
            before_mj = meter.total_mj
            running_mj += meter.observe(reading).delta_mj
            assert meter.total_mj >= before_mj
        assert meter.total_mj == running_mj

    @given(st.lists(st.integers(min_value=0, max_value=10**9), min_size=1, max_size=50))
    def test_without_resets_the_total_is_the_last_reading_minus_the_first(
        self, increments: list[int]
    ) -> None:
        readings = [sum(increments[: i + 1]) for i in range(len(increments))]
        meter = EnergyCounter(readings[0])
        for reading in readings[1:]:
            meter.observe(reading)
        assert meter.total_mj == readings[-1] - readings[0]
        assert meter.resets == 0
