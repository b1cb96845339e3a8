"""The GPU physics of the sim-model spec, as pure functions (scalar or NumPy arrays alike).

No randomness and no time here: callers apply noise and advance clocks. Every function works
element-wise on NumPy arrays so that the benchmark can evaluate a phase at every grid clock at once.
"""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import numpy.typing as npt

from eerld.sim.profiles import GpuProfile

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
    compute_mhz_s: ArrayOrFloat, memory_s: ArrayOrFloat, sm_clock_mhz: ArrayOrFloat
) -> ArrayOrFloat:
    """d(f) = ((C/f)^3 + M^3)^(1/3): a smooth roofline where the larger term dominates."""
    compute_s = compute_mhz_s / sm_clock_mhz
    # Products, not ** 3: NumPy's generic power is an order of magnitude slower on large arrays.
    return np.cbrt(compute_s * compute_s * compute_s + memory_s * memory_s * memory_s)  # type: ignore[no-any-return]


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
    duration = segment_duration_s(compute_mhz_s, memory_s, sm_clock_mhz)
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
