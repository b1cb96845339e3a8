"""The physics-shaped clock curve: it recovers the shape the physics gives, keeps the knee a kink, pools noisy
trials better than each clock alone, and gives the same numbers on any CPU."""

from __future__ import annotations

import numpy as np
import pytest
from eerl.control import physics
from eerl.control.base import ControllerSettings
from eerl.control.curve import ClockCurve, FloatArray, Trial
from eerl.control.eerl import EerlConfig, EerlController
from eerl_sim.physics import voltage_ratio
from eerl_sim.profiles import builtin_profile

from tests.client.control.synthetic import GRID_MHZ, SyntheticJob, drive_sync, run_throughput

TOP = 1980.0
GRID = np.arange(600.0, TOP + 1.0, 15.0)


def _phase(
    clocks: FloatArray, *, compute: float, memory: float, knee: float = 1100.0, cap: float = TOP
) -> tuple[FloatArray, FloatArray]:
    """Time and energy of one phase against its default, by the simulator's own formulas (one roofline
    segment on an H100-like GPU whose default governor holds ``cap``)."""

    def cost(f: FloatArray) -> tuple[FloatArray, FloatArray]:
        f = np.minimum(f, cap)
        duration = np.cbrt((compute / f) ** 3 + memory**3)
        v = np.where(f <= knee, 0.68, 0.68 + 0.32 * (f - knee) / (TOP - knee))
        activity = (compute / f) / duration
        power = 70.0 + 100.0 * v + activity * 800.0 * (f / TOP) * v * v + (memory / duration) * 110.0
        return duration, power * duration

    d, e = cost(np.asarray(clocks, dtype=np.float64))
    d0, e0 = cost(np.array([TOP]))
    return d / d0, e / e0


def _fit(clocks: FloatArray, times: FloatArray, energies: FloatArray) -> physics.PhysicsFit:
    weights = np.ones(len(clocks))
    shape = physics.fit(clocks, times, weights, energies, weights, top_mhz=TOP)
    assert shape is not None
    return shape


class TestShape:
    def test_a_decode_like_phase_is_recovered_from_six_clocks(self) -> None:
        clocks = np.array([795.0, 945.0, 1050.0, 1125.0, 1275.0, 1500.0])
        times, energies = _phase(clocks, compute=8.0, memory=0.012)
        shape = _fit(clocks, times, energies)
        true_t, true_e = _phase(GRID, compute=8.0, memory=0.012)
        assert np.abs(shape.time_ratio(GRID) - true_t).max() < 0.004
        assert np.abs(shape.energy_ratio(GRID) - true_e).max() < 0.004
        assert abs(shape.knee_mhz - 1100.0) <= physics.STEP_MHZ

    def test_the_energy_minimum_stays_at_the_knee(self) -> None:
        """The local fit rounds the kink off and moves the minimum; the shape keeps it (within a step)."""
        clocks = np.array([960.0, 1050.0, 1110.0, 1170.0, 1275.0, 1410.0])
        times, energies = _phase(clocks, compute=6.0, memory=0.012, knee=1110.0)
        shape = _fit(clocks, times, energies)
        fitted_minimum = GRID[int(np.argmin(shape.energy_ratio(GRID)))]
        true_minimum = GRID[int(np.argmin(_phase(GRID, compute=6.0, memory=0.012, knee=1110.0)[1]))]
        assert abs(fitted_minimum - true_minimum) <= 15.0

    def test_a_power_capped_phase_is_flat_above_the_default_clock(self) -> None:
        clocks = np.array([1200.0, 1350.0, 1500.0, 1620.0, 1740.0, 1860.0])
        times, energies = _phase(clocks, compute=1600.0, memory=0.05, cap=1680.0)
        shape = _fit(clocks, times, energies)
        above = np.array([1710.0, 1800.0, 1950.0])
        assert np.allclose(shape.time_ratio(above), 1.0, atol=0.004)
        assert np.allclose(shape.energy_ratio(above), 1.0, atol=0.004)
        below = np.array([1300.0])
        assert shape.time_ratio(below)[0] == pytest.approx(
            _phase(below, compute=1600.0, memory=0.05, cap=1680.0)[0][0], abs=0.01
        )

    def test_three_clocks_are_too_few(self) -> None:
        clocks = np.array([900.0, 1100.0, 1300.0])
        times, energies = _phase(clocks, compute=8.0, memory=0.012)
        weights = np.ones(3)
        assert physics.fit(clocks, times, weights, energies, weights, top_mhz=TOP) is None


class TestNoise:
    def test_pooled_trials_beat_each_clocks_own_mean(self) -> None:
        """Three 1 %-noisy trials at each of ten clocks (a search's spread): the fit is nearer the truth than
        the clocks' own means."""
        rng = np.random.default_rng(7)  # the bit stream is the same on every platform
        clocks = np.repeat(np.linspace(795.0, 1500.0, 10).round(-1), 3)
        times, energies = _phase(clocks, compute=8.0, memory=0.012)
        errors_fit, errors_mean = [], []
        for _ in range(40):
            noisy_t = times * (1.0 + 0.01 * rng.standard_normal(len(clocks)))
            noisy_e = energies * (1.0 + 0.01 * rng.standard_normal(len(clocks)))
            distinct, back = np.unique(clocks, return_inverse=True)
            mean_t = np.bincount(back, weights=noisy_t) / 3.0
            mean_e = np.bincount(back, weights=noisy_e) / 3.0
            shape = _fit(distinct, mean_t, mean_e)
            true_e = _phase(distinct, compute=8.0, memory=0.012)[1]
            errors_fit.append(float(np.abs(shape.energy_ratio(distinct) - true_e).mean()))
            errors_mean.append(float(np.abs(mean_e - true_e).mean()))
        assert np.median(errors_fit) < 0.75 * np.median(errors_mean)


class TestDeterminism:
    def test_the_cube_root_is_exact_to_the_last_bits(self) -> None:
        values = np.concatenate((np.linspace(1.0, 8.0, 1001), np.geomspace(8.0, 1e6, 1001)))
        roots = physics._cube_root(values)
        assert np.allclose(roots, np.cbrt(values), rtol=4e-16, atol=0.0)

    def test_a_fit_uses_only_cpu_independent_arithmetic(self) -> None:
        """The same trials twice give bit-identical curves (no BLAS or LAPACK on the path: see numeric)."""
        clocks = np.array([795.0, 945.0, 1050.0, 1125.0, 1275.0, 1500.0])
        times, energies = _phase(clocks, compute=8.0, memory=0.012)
        first = _fit(clocks, times, energies).energy_ratio(GRID)
        second = _fit(clocks.copy(), times.copy(), energies.copy()).energy_ratio(GRID)
        assert first.tobytes() == second.tobytes()


class TestCurve:
    @staticmethod
    def _baseline(features: FloatArray) -> tuple[FloatArray, FloatArray]:
        rows = features.shape[0]
        return np.full(rows, 10.0), np.full(rows, 1000.0)

    def test_the_curve_uses_the_shape_once_four_clocks_have_trials(self) -> None:
        curve = ClockCurve(self._baseline, bandwidth_mhz=33.0, top_mhz=TOP)
        clocks = (795, 945, 1050, 1125, 1275, 1500)
        times, energies = _phase(np.array(clocks, dtype=np.float64), compute=8.0, memory=0.012)
        for i, (clock, t, e) in enumerate(zip(clocks, times, energies, strict=True)):
            curve.add(Trial(clock, np.ones(3), 10.0 * t, 1000.0 * e, i))
        estimate = curve.estimate(GRID, now_iteration=len(clocks))
        true_e = _phase(GRID, compute=8.0, memory=0.012)[1]
        assert np.abs(estimate.energy_ratio - true_e).max() < 0.004

    def test_the_time_is_the_slower_of_the_shape_and_the_local_fit(self) -> None:
        """Trials at one clock 3 % slower than the roofline (something the shape cannot bend to): the time
        there is read at least as slow as the local fit reads it, so a plan never counts on the shape's
        faster reading; the energy is the shape's."""
        clocks = (795, 945, 1050, 1125, 1275, 1500)
        times, energies = _phase(np.array(clocks, dtype=np.float64), compute=8.0, memory=0.012)
        shaped = ClockCurve(self._baseline, bandwidth_mhz=33.0, top_mhz=TOP)
        local = ClockCurve(self._baseline, bandwidth_mhz=33.0)
        for i in range(3):
            for clock, t, e in zip(clocks, times, energies, strict=True):
                slow = 1.03 if clock == 1050 else 1.0
                for curve in (shaped, local):
                    curve.add(Trial(clock, np.ones(3), 10.0 * t * slow, 1000.0 * e, i))
        grid = np.array([945.0, 1050.0, 1125.0])
        with_shape = shaped.estimate(grid, now_iteration=3)
        alone = local.estimate(grid, now_iteration=3)
        assert (with_shape.time_ratio >= alone.time_ratio).all()
        assert with_shape.time_ratio[1] == pytest.approx(alone.time_ratio[1])
        assert with_shape.time_ratio[1] > _phase(np.array([1050.0]), compute=8.0, memory=0.012)[0][0] + 0.015

    def test_without_the_top_clock_the_curve_is_the_local_fit(self) -> None:
        curve = ClockCurve(self._baseline, bandwidth_mhz=33.0)
        for i, clock in enumerate((795, 945, 1050, 1125)):
            curve.add(Trial(clock, np.ones(3), 10.0, 900.0, i))
        estimate = curve.estimate(np.array([1000.0]), now_iteration=4)
        assert estimate.energy_ratio[0] == pytest.approx(0.9)


def test_the_profiles_voltage_is_the_shape_the_fit_assumes() -> None:
    """The fit's voltage (flat to a knee, then linear to 1 at the top) is the simulator's."""
    profile = builtin_profile("h100-sxm")
    clocks = np.array([900.0, profile.v_knee_mhz, 1500.0, profile.sm_clock_max_mhz])
    expected = voltage_ratio(profile, clocks)
    got = physics._voltage(clocks, profile.v_knee_mhz, profile.v_floor, profile.sm_clock_max_mhz)
    assert np.allclose(got, expected)


class TestController:
    def test_the_controller_reads_its_curves_through_the_shape_unless_told_not_to(self) -> None:
        settings = ControllerSettings(GRID_MHZ, throughput_threshold=0.90)
        plain = EerlController(settings, EerlConfig(physics_curve=False))
        assert all(track.curve._top_mhz is None for track in plain._all)
        shaped = EerlController(settings)
        assert all(track.curve._top_mhz == max(GRID_MHZ) for track in shaped._all)
        job = SyntheticJob()
        trace = drive_sync(shaped, job, 80)
        assert all(track.curve._shape is not None for track in shaped._all)  # the shape was fitted
        assert run_throughput(job, trace) >= 0.90 - 0.001
