"""GPU profiles of the simulated GPU: the ``[gpu]`` table of a scenario file, with built-in defaults."""

from __future__ import annotations

from dataclasses import dataclass, fields, replace
from typing import Any

from eerld.errors import ConfigError


@dataclass(frozen=True, slots=True)
class GpuProfile:
    """Parameters of the GPU model; names and meanings are those of the sim-model spec."""

    name: str
    sm_clock_min_mhz: float
    sm_clock_max_mhz: float
    sm_clock_step_mhz: float
    mem_clock_mhz: int
    power_limit_w: float
    idle_power_w: float
    leak_power_w: float
    sm_power_w: float
    mem_power_w: float
    v_knee_mhz: float
    v_floor: float
    clock_switch_ms: float
    energy_counter_period_ms: float
    noise_duration: float
    noise_power: float
    noise_phase_duration: float = 0.01
    """σ of the log-normal factor each phase on each GPU draws for its duration (sim-model: phase-level)."""
    noise_phase_power: float = 0.01
    """σ of the log-normal factor each phase on each GPU draws for its power."""
    locked_clocks: bool = True
    product_name: str = "Simulated GPU"
    roofline_exponent: float = 3.0
    """Sharpness ``p`` of the roofline ``d = ((C/f)^p + M^p)^(1/p)``: 3 (the spec's smooth corner) unless
    a measured sweep says otherwise (the A100 and A40 profiles, fitted to one: docs/simulator.md)."""

    def sm_clock_grid_mhz(self) -> tuple[int, ...]:
        """The supported SM clocks, ascending, rounded to whole MHz as NVML reports them."""
        count = round((self.sm_clock_max_mhz - self.sm_clock_min_mhz) / self.sm_clock_step_mhz) + 1
        return tuple(
            sorted({round(self.sm_clock_min_mhz + i * self.sm_clock_step_mhz) for i in range(count)})
        )

    def with_overrides(self, overrides: dict[str, Any], *, source: str = "profile") -> GpuProfile:
        """A copy with some fields replaced; unknown names and wrong types raise ConfigError."""
        known = {f.name: f for f in fields(self)}
        clean: dict[str, Any] = {}
        for key, value in overrides.items():
            if key not in known:
                raise ConfigError(f"{source}: unknown key 'gpu.{key}'")
            current = getattr(self, key)
            if isinstance(current, bool):
                if not isinstance(value, bool):
                    raise ConfigError(f"{source}: 'gpu.{key}' must be true or false, not {value!r}")
            elif isinstance(current, int | float) and not isinstance(current, bool):
                if isinstance(value, bool) or not isinstance(value, int | float):
                    raise ConfigError(f"{source}: 'gpu.{key}' must be a number, not {value!r}")
                if value < 0:
                    raise ConfigError(f"{source}: 'gpu.{key}' must not be negative, got {value}")
                clean[key] = float(value) if isinstance(current, float) else int(value)
                continue
            elif isinstance(current, str) and not isinstance(value, str):
                raise ConfigError(f"{source}: 'gpu.{key}' must be a string, not {value!r}")
            clean[key] = value
        profile = replace(self, **clean)
        profile.validate(source)
        return profile

    def validate(self, source: str = "profile") -> None:
        """Raise ConfigError naming the first inconsistent parameter."""
        if not 0 < self.sm_clock_min_mhz < self.sm_clock_max_mhz:
            raise ConfigError(f"{source}: 'gpu.sm_clock_min_mhz' must be positive and below sm_clock_max_mhz")
        if self.sm_clock_step_mhz <= 0:
            raise ConfigError(f"{source}: 'gpu.sm_clock_step_mhz' must be positive")
        if self.roofline_exponent < 1:
            raise ConfigError(f"{source}: 'gpu.roofline_exponent' must be at least 1")
        if not 0 < self.v_floor <= 1:
            raise ConfigError(f"{source}: 'gpu.v_floor' must be in (0, 1]")
        if self.power_limit_w <= self.idle_power_w:
            raise ConfigError(f"{source}: 'gpu.power_limit_w' must exceed idle_power_w")
        if self.energy_counter_period_ms <= 0:
            raise ConfigError(f"{source}: 'gpu.energy_counter_period_ms' must be positive")


H100_SXM = GpuProfile(
    name="h100-sxm",
    product_name="NVIDIA H100 80GB HBM3 (simulated)",
    sm_clock_min_mhz=345,
    sm_clock_max_mhz=1980,
    sm_clock_step_mhz=15,
    mem_clock_mhz=2619,
    power_limit_w=700,
    idle_power_w=70,
    leak_power_w=100,
    sm_power_w=800,
    mem_power_w=110,
    v_knee_mhz=1100,
    v_floor=0.68,
    clock_switch_ms=15,
    energy_counter_period_ms=100,
    noise_duration=0.02,
    noise_power=0.015,
)

GB200 = GpuProfile(
    name="gb200",
    product_name="NVIDIA GB200 (simulated)",
    sm_clock_min_mhz=120,
    sm_clock_max_mhz=2062,
    sm_clock_step_mhz=7.5,
    mem_clock_mhz=3996,
    power_limit_w=1200,
    idle_power_w=170,
    leak_power_w=160,
    sm_power_w=1350,
    mem_power_w=200,
    v_knee_mhz=1150,
    v_floor=0.66,
    clock_switch_ms=10,
    energy_counter_period_ms=100,
    noise_duration=0.02,
    noise_power=0.015,
)

# Fitted to measured sweeps (sim/eerl_sim/measured: the Perseus artifact's GPT-3 175B and BLOOM stages) by
# ``python -m perf.fit_measured NAME``; ``eerl-bench calibration`` and tests/sim/test_measured.py check them.
A100_SXM = GpuProfile(
    name="a100-sxm",
    product_name="NVIDIA A100-SXM4-80GB (simulated)",
    sm_clock_min_mhz=210,
    sm_clock_max_mhz=1410,
    sm_clock_step_mhz=15,
    mem_clock_mhz=1593,
    power_limit_w=470.3,
    idle_power_w=39.2,
    leak_power_w=0.0,
    sm_power_w=287.2,
    mem_power_w=192.4,
    v_knee_mhz=1103,
    v_floor=0.649,
    roofline_exponent=9.52,
    clock_switch_ms=15,
    energy_counter_period_ms=100,
    noise_duration=0.02,
    noise_power=0.015,
)

A40 = GpuProfile(
    name="a40",
    product_name="NVIDIA A40 (simulated)",
    sm_clock_min_mhz=210,
    sm_clock_max_mhz=1740,
    sm_clock_step_mhz=15,
    mem_clock_mhz=7251,
    power_limit_w=300,
    idle_power_w=27.43,
    leak_power_w=190.1,
    sm_power_w=166.6,
    mem_power_w=56.4,
    v_knee_mhz=983.5,
    v_floor=0.5419,
    roofline_exponent=1.794,
    clock_switch_ms=15,
    energy_counter_period_ms=100,
    noise_duration=0.02,
    noise_power=0.015,
)

BUILTIN_PROFILES: dict[str, GpuProfile] = {p.name: p for p in (H100_SXM, GB200, A100_SXM, A40)}


def builtin_profile(name: str) -> GpuProfile:
    """The built-in profile of that name; ConfigError listing the known names otherwise."""
    try:
        return BUILTIN_PROFILES[name]
    except KeyError:
        known = ", ".join(sorted(BUILTIN_PROFILES))
        raise ConfigError(f"unknown GPU profile {name!r}; built-in profiles: {known}") from None
