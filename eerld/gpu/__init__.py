"""GPU backends: one small protocol (:mod:`eerld.gpu.base`), implemented on NVML and on the simulator."""

from eerld.gpu.base import (
    ClockEventReasons,
    GpuBackend,
    GpuClocks,
    GpuIdentity,
    GpuUtilization,
)

__all__ = ["ClockEventReasons", "GpuBackend", "GpuClocks", "GpuIdentity", "GpuUtilization"]
