"""The GPU model: voltage curve, roofline, power and the power-limited default clock."""

from __future__ import annotations

import numpy as np
import pytest
from eerl.phases import PhaseKind
from eerl_sim import physics
from eerl_sim.evaluate import evaluate_phase, sample_iteration
from eerl_sim.pricing import clock_grid, power_capped_index
from eerl_sim.profiles import BUILTIN_PROFILES, GB200, H100_SXM, GpuProfile
from eerl_sim.scenario import Scenario
from eerl_sim.workload import Segments
from hypothesis import given
from hypothesis import strategies as st

PROFILES = sorted(BUILTIN_PROFILES.values(), key=lambda p: p.name)


class TestVoltageCurve:
    @pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
    def test_voltage_stays_at_the_floor_up_to_the_knee(self, profile: GpuProfile) -> None:
        clocks = np.array([profile.sm_clock_min_mhz, profile.v_knee_mhz - 1, profile.v_knee_mhz])
        assert np.allclose(physics.voltage_ratio(profile, clocks), profile.v_floor)

    @pytest.mark.parametrize("profile", PROFILES, ids=lambda p: p.name)
    def test_voltage_reaches_one_at_the_top_clock_along_a_straight_line(self, profile: GpuProfile) -> None:
        middle = (profile.v_knee_mhz + profile.sm_clock_max_mhz) / 2
        assert physics.voltage_ratio(profile, float(profile.sm_clock_max_mhz)) == pytest.approx(1.0)
        assert physics.voltage_ratio(profile, middle) == pytest.approx((1.0 + profile.v_floor) / 2)


class TestRoofline:
    def test_a_purely_compute_bound_segment_takes_c_over_f(self) -> None:
        assert physics.segment_duration_s(1500.0, 0.0, 1500.0) == pytest.approx(1.0)
        assert physics.segment_duration_s(1500.0, 0.0, 750.0) == pytest.approx(2.0)

    def test_a_memory_bound_segment_barely_depends_on_the_clock(self) -> None:
        fast = physics.segment_duration_s(1.0, 0.01, 1980.0)
        slow = physics.segment_duration_s(1.0, 0.01, 1000.0)
        assert slow / fast < 1.01

    @given(
        compute=st.one_of(st.just(0.0), st.floats(1e-3, 1e4)),
        memory=st.one_of(st.just(0.0), st.floats(1e-6, 10.0)),
        clock=st.floats(100.0, 2100.0),
    )
    def test_duration_lies_between_the_larger_term_and_their_sum(
        self, compute: float, memory: float, clock: float
    ) -> None:
        duration = physics.segment_duration_s(compute, memory, clock)
        larger = max(compute / clock, memory)
        assert larger * (1 - 1e-12) <= duration <= (compute / clock + memory) * (1 + 1e-12)

    @given(
        compute=st.floats(1e-3, 1e4),
        memory=st.floats(1e-6, 10.0),
        clock=st.floats(100.0, 2100.0),
        exponent=st.floats(1.0, 16.0),
    )
    def test_any_roofline_exponent_lies_between_the_larger_term_and_their_sum(
        self, compute: float, memory: float, clock: float, exponent: float
    ) -> None:
        duration = physics.segment_duration_s(compute, memory, clock, exponent)
        larger = max(compute / clock, memory)
        assert larger * (1 - 1e-9) <= duration <= (compute / clock + memory) * (1 + 1e-9)

    def test_a_sharper_roofline_is_closer_to_the_larger_term(self) -> None:
        """At the corner (C/f = M) the smooth cube adds 26 %; an exponent of 8 adds 9 %."""
        assert physics.segment_duration_s(1000.0, 1.0, 1000.0) == pytest.approx(2 ** (1 / 3))
        assert physics.segment_duration_s(1000.0, 1.0, 1000.0, 8.0) == pytest.approx(2 ** (1 / 8))

    def test_the_default_exponent_is_the_spec_s_cube_bit_for_bit(self) -> None:
        """The H100 and GB200 profiles keep today's physics exactly (other work benchmarks on them)."""
        compute = np.array([0.3, 12.0, 0.0])
        memory = np.array([0.001, 0.0, 0.5])
        expected = np.cbrt((compute / 1200.0) ** 3 + memory**3)
        for profile in (H100_SXM, GB200):
            assert profile.roofline_exponent == 3.0
            got = physics.segment_duration_s(compute, memory, 1200.0, profile.roofline_exponent)
            assert np.array_equal(got, physics.segment_duration_s(compute, memory, 1200.0))
            assert np.allclose(got, expected, rtol=1e-15)


class TestPower:
    @given(compute=st.floats(1e-3, 1e4), memory=st.floats(0.0, 10.0))
    def test_power_never_falls_as_the_clock_rises(self, compute: float, memory: float) -> None:
        clocks = clock_grid(H100_SXM).sm_clocks_mhz.astype(np.float64)
        power = physics.segment_power_w(H100_SXM, compute, memory, clocks)
        assert np.all(np.diff(power) >= -1e-9)

    def test_a_compute_bound_kernel_at_the_top_clock_draws_idle_leak_and_full_sm_power(self) -> None:
        expected = H100_SXM.idle_power_w + H100_SXM.leak_power_w + H100_SXM.sm_power_w
        assert physics.segment_power_w(H100_SXM, 1e6, 0.0, 1980.0) == pytest.approx(expected)

    def test_communication_runs_at_reduced_memory_activity(self) -> None:
        full = physics.segment_power_w(H100_SXM, 0.0, 1.0, 1980.0)
        sync = physics.segment_power_w(H100_SXM, 0.0, 1.0, 1980.0, mem_activity_scale=0.3)
        assert full - sync == pytest.approx(0.7 * H100_SXM.mem_power_w)


def _one_segment(compute_mhz_s: float, memory_s: float) -> Segments:
    return Segments(
        np.array([compute_mhz_s]), np.array([memory_s]), np.ones(1), np.ones(1), np.ones(1), np.array([0, 1])
    )


class TestPowerLimit:
    @pytest.mark.parametrize("profile", [H100_SXM, GB200], ids=lambda p: p.name)
    def test_the_default_clock_is_the_highest_within_the_power_limit(self, profile: GpuProfile) -> None:
        grid = clock_grid(profile)
        index = int(power_capped_index(profile, _one_segment(1e5, 0.0))[0])
        at = float(grid.sm_clocks_mhz[index])
        above = float(grid.sm_clocks_mhz[index + 1])
        assert physics.segment_power_w(profile, 1e5, 0.0, at) <= profile.power_limit_w
        assert physics.segment_power_w(profile, 1e5, 0.0, above) > profile.power_limit_w

    def test_a_light_segment_runs_at_the_top_clock(self) -> None:
        assert int(power_capped_index(H100_SXM, _one_segment(1.0, 1.0))[0]) == clock_grid(H100_SXM).top

    def test_a_lock_above_the_power_limited_clock_changes_nothing(self, sync_h100: Scenario) -> None:
        sample = sample_iteration(sync_h100, 0)
        outcome = evaluate_phase(sync_h100, sample, PhaseKind.TRAINING, [None, 1980, 1935])
        assert outcome.duration_s[1] == outcome.duration_s[0]
        assert outcome.duration_s[2] == pytest.approx(outcome.duration_s[0], rel=1e-3)
        assert outcome.energy_j[2] == pytest.approx(outcome.energy_j[0], rel=1e-3)

    def test_training_power_never_exceeds_the_limit_at_any_lock(self, sync_h100: Scenario) -> None:
        sample = sample_iteration(sync_h100, 0)
        clocks: list[int | None] = [int(c) for c in clock_grid(sync_h100.gpu).sm_clocks_mhz]
        outcome = evaluate_phase(sync_h100, sample, PhaseKind.TRAINING, clocks)
        average_power_w = outcome.energy_j / outcome.duration_s / outcome.gpus
        assert np.all(average_power_w <= sync_h100.gpu.power_limit_w)
