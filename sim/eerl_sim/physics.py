"""The GPU physics of the sim-model spec, as pure functions (scalar or NumPy arrays alike).

No randomness and no time here: callers apply noise and advance clocks. Every function works
element-wise on NumPy arrays so that the benchmark can evaluate a phase at every grid clock at once.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

from eerl_sim.profiles import GpuProfile

ArrayOrFloat = TypeVar("ArrayOrFloat", float, npt.NDArray[np.float64])


def voltage_ratio(profile: GpuProfile, sm_clock_mhz: ArrayOrFloat) -> ArrayOrFloat:
    """v(f): ``v_floor`` up to ``v_knee_mhz``, then linear to 1.0 at ``sm_clock_max_mhz``."""
    span = profile.sm_clock_max_mhz - profile.v_knee_mhz
    rising = profile.v_floor + (1.0 - profile.v_floor) * (sm_clock_mhz - profile.v_knee_mhz) / span
    result = np.clip(rising, profile.v_floor, 1.0)
    if isinstance(sm_clock_mhz, float | int):
        return float(result)
    return result


def segment_duration_s(
    compute_mhz_s: ArrayOrFloat,
    memory_s: ArrayOrFloat,
    sm_clock_mhz: ArrayOrFloat,
    roofline_exponent: float = 3.0,
) -> ArrayOrFloat:
    """d(f) = ((C/f)^p + M^p)^(1/p): a smooth roofline where the larger term dominates.

    ``p`` is the profile's ``roofline_exponent``: 3 for the H100 and GB200 profiles; a larger one makes
    the corner sharper, as the measured A100 and A40 sweeps are (nearly proportional to 1/f below the
    corner, flat above it).
    """
    compute_s = compute_mhz_s / sm_clock_mhz
    if roofline_exponent == 3.0:
        # Products, not ** 3: NumPy's generic power is an order of magnitude slower on large arrays.
        return np.cbrt(compute_s * compute_s * compute_s + memory_s * memory_s * memory_s)  # type: ignore[no-any-return]
    p = roofline_exponent
    return np.power(np.power(compute_s, p) + np.power(memory_s, p), 1.0 / p)  # type: ignore[no-any-return]


def segment_power_w(
    profile: GpuProfile,
    compute_mhz_s: ArrayOrFloat,
    memory_s: ArrayOrFloat,
    sm_clock_mhz: ArrayOrFloat,
    mem_activity_scale: float = 1.0,
) -> ArrayOrFloat:
    """P(f) while a segment runs (noise-free).

    ``mem_activity_scale`` scales the memory activity ``m`` (communication segments run at m = 0.3).
    """
    duration = segment_duration_s(compute_mhz_s, memory_s, sm_clock_mhz, profile.roofline_exponent)
    v = voltage_ratio(profile, sm_clock_mhz)
    return segment_power_given_w(
        profile, compute_mhz_s, memory_s, duration, v, mem_activity_scale=mem_activity_scale
    )


def segment_power_given_w(
    profile: GpuProfile,
    compute_mhz_s: ArrayOrFloat,
    memory_s: ArrayOrFloat,
    duration_s: ArrayOrFloat,
    voltage: ArrayOrFloat,
    *,
    mem_activity_scale: ArrayOrFloat | float = 1.0,
) -> ArrayOrFloat:
    """P(f) from an already computed duration ``d(f)`` and voltage ratio ``v(f)`` (noise-free).

    Uses ``a · f = C / d``, so that the whole-grid evaluation in the simulator needs no second pass:
    ``P = idle + leak·v + sm·v²·C/(d·f_max) + mem·scale·M/d``.
    """
    safe = np.maximum(duration_s, 1e-30)
    return (  # type: ignore[no-any-return]
        profile.idle_power_w
        + profile.leak_power_w * voltage
        + profile.sm_power_w * voltage * voltage * compute_mhz_s / (safe * profile.sm_clock_max_mhz)
        + profile.mem_power_w * mem_activity_scale * memory_s / safe
    )


def power_limited_index(
    profile: GpuProfile,
    sm_clocks_mhz: npt.NDArray[np.float64],
    compute_mhz_s: npt.NDArray[np.float64],
    memory_s: npt.NDArray[np.float64],
    *,
    mem_activity_scale: npt.NDArray[np.float64],
    power_noise: npt.NDArray[np.float64],
) -> npt.NDArray[np.int64]:
    """Per segment, the index into the ascending ``sm_clocks_mhz`` of the highest clock whose noisy power
    (``P(f) · power_noise``) is within ``power_limit_w``; 0 when even the lowest clock exceeds it.

    The one power limiter of the project (the evaluator and the simulated GPU both use it). Power rises
    monotonically with the clock (``a·f = C/d`` and ``m = M/d`` both grow as d shrinks), so a bisection
    over the grid finds it; segments within the limit at the top clock skip the search.
    """
    top = len(sm_clocks_mhz) - 1
    capped = np.full(len(compute_mhz_s), top, dtype=np.int64)

    def within_limit(rows: npt.NDArray[np.int64], index: npt.NDArray[np.int64]) -> npt.NDArray[np.bool_]:
        clocks = sm_clocks_mhz[index]
        compute = compute_mhz_s[rows]
        memory = memory_s[rows]
        duration = segment_duration_s(compute, memory, clocks, profile.roofline_exponent)
        power = segment_power_given_w(
            profile,
            compute,
            memory,
            duration,
            voltage_ratio(profile, clocks),
            mem_activity_scale=mem_activity_scale[rows],
        )
        return power * power_noise[rows] <= profile.power_limit_w

    over = np.nonzero(~within_limit(np.arange(len(capped)), capped))[0]
    if len(over) == 0:
        return capped
    low = np.full(len(over), -1, dtype=np.int64)  # highest index known within the limit (-1: none)
    high = np.full(len(over), top, dtype=np.int64)  # lowest index known over the limit
    while True:
        open_ = high - low > 1
        if not open_.any():
            break
        middle = (low + high) // 2
        within = within_limit(over, np.maximum(middle, 0))
        low = np.where(open_ & within, middle, low)
        high = np.where(open_ & ~within, middle, high)
    capped[over] = np.maximum(low, 0)
    return capped
