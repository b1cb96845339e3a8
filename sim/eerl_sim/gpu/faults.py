"""Injected faults: which errors and which methods a simulated GPU can be made to fail with, and the error
a stored :class:`~eerl_sim.gpu.state.Fault` raises (:meth:`eerl_sim.gpu.device.SimDevice.inject_fault`)."""

from __future__ import annotations

from eerl_sim.gpu.state import GpuState
from eerld.errors import BackendFailure, GpuError, GpuLost, InvalidArgument, NoPermission, NotSupported

INJECTABLE_ERRORS: dict[str, type[GpuError]] = {
    cls.__name__: cls for cls in (NoPermission, NotSupported, GpuLost, InvalidArgument, BackendFailure)
}

FAULTABLE_METHODS = frozenset(
    {
        "inventory",
        "supported_sm_clocks_mhz",
        "supported_mem_clocks_mhz",
        "clocks",
        "supports_locked_clocks",
        "lock_sm_clock",
        "reset_sm_clock",
        "lock_mem_clock",
        "reset_mem_clock",
        "set_application_clocks",
        "reset_application_clocks",
        "total_energy_mj",
        "power_w",
        "power_limit_w",
        "utilization",
        "clock_event_reasons",
        "run_segments",
    }
)
"""Methods a fault can be injected into: every GpuBackend method that names a GPU, plus the worker's."""


def fault_error(error: str, index: int, method: str) -> GpuError:
    """The error a fault named ``error`` raises on GPU ``index`` in ``method`` (BackendFailure if unknown)."""
    cls = INJECTABLE_ERRORS.get(error, BackendFailure)
    return cls(f"simulated {cls.__name__} on GPU {index} ({method})", gpu_index=index)


def take_fault(gpu: GpuState, index: int, method: str, *, lost_raises: bool = True) -> GpuError | None:
    """The error ``method`` raises on this GPU now (GpuLost if lost), a once-fault consumed; None: none."""
    if gpu.lost and lost_raises:
        return fault_error("GpuLost", index, method)
    fault = gpu.faults.get(method)
    if fault is None:
        return None
    if fault.once:
        del gpu.faults[method]
    return fault_error(fault.error, index, method)
