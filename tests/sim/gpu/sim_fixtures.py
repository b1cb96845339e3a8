"""Helpers shared by the sim backend tests: profiles, typical segments, and the spec's formulas."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from eerl_sim import physics
from eerl_sim.gpu import SimBackend, VirtualClock, create_sim_backend
from eerl_sim.profiles import GpuProfile, builtin_profile

H100 = builtin_profile("h100-sxm")
QUIET_H100 = replace(H100, noise_duration=0.0, noise_power=0.0)

# A training micro-batch: compute-bound, long enough to watch (≈ 0.6 s at the power-limited clock).
HEAVY_COMPUTE_MHZ_S = 1000.0
HEAVY_MEMORY_S = 0.01
# A decode step: memory-bound, well under the power limit.
LIGHT_COMPUTE_MHZ_S = 2.0
LIGHT_MEMORY_S = 0.01


def virtual_backend(
    profile: GpuProfile = QUIET_H100, gpus: int = 2, *, state_file: Path | None = None, seed: int = 0
) -> tuple[SimBackend, VirtualClock]:
    """A backend on a fresh virtual clock."""
    clock = VirtualClock()
    return create_sim_backend(profile, gpus, clock=clock, state_file=state_file, seed=seed), clock


def power_limited_clock_mhz(profile: GpuProfile, compute_mhz_s: float, memory_s: float) -> int:
    """The spec's default-governor clock: the highest grid clock with P(f) ≤ power_limit_w."""
    return max(
        f
        for f in profile.sm_clock_grid_mhz()
        if physics.segment_power_w(profile, compute_mhz_s, memory_s, float(f)) <= profile.power_limit_w
    )


def segment_energy_j(
    profile: GpuProfile, compute_mhz_s: float, memory_s: float, sm_clock_mhz: float
) -> float:
    """Noise-free energy of one segment at one clock."""
    duration = physics.segment_duration_s(compute_mhz_s, memory_s, sm_clock_mhz)
    return duration * physics.segment_power_w(profile, compute_mhz_s, memory_s, sm_clock_mhz)
