"""A backend that forwards every call to another: the base of the wrappers that change one behaviour."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from eerld.gpu.base import ClockEventReasons, GpuBackend, GpuClocks, GpuIdentity, GpuUtilization


class DelegatingBackend:
    """Forwards every :class:`GpuBackend` call to ``inner``; subclasses override what they change."""

    def __init__(self, inner: GpuBackend) -> None:
        self._inner = inner

    @property
    def name(self) -> str:
        return self._inner.name

    def inventory(self) -> Sequence[GpuIdentity]:
        return self._inner.inventory()

    def supported_sm_clocks_mhz(self, index: int) -> Sequence[int]:
        return self._inner.supported_sm_clocks_mhz(index)

    def supported_mem_clocks_mhz(self, index: int) -> Sequence[int]:
        return self._inner.supported_mem_clocks_mhz(index)

    def clocks(self, index: int) -> GpuClocks:
        return self._inner.clocks(index)

    def supports_locked_clocks(self, index: int) -> bool:
        return self._inner.supports_locked_clocks(index)

    def lock_sm_clock(self, index: int, sm_clock_mhz: int) -> int:
        return self._inner.lock_sm_clock(index, sm_clock_mhz)

    def reset_sm_clock(self, index: int) -> None:
        self._inner.reset_sm_clock(index)

    def lock_mem_clock(self, index: int, mem_clock_mhz: int) -> None:
        self._inner.lock_mem_clock(index, mem_clock_mhz)

    def reset_mem_clock(self, index: int) -> None:
        self._inner.reset_mem_clock(index)

    def set_application_clocks(self, index: int, mem_clock_mhz: int, sm_clock_mhz: int) -> None:
        self._inner.set_application_clocks(index, mem_clock_mhz, sm_clock_mhz)

    def reset_application_clocks(self, index: int) -> None:
        self._inner.reset_application_clocks(index)

    def total_energy_mj(self, index: int) -> int:
        return self._inner.total_energy_mj(index)

    def power_w(self, index: int) -> float:
        return self._inner.power_w(index)

    def power_limit_w(self, index: int) -> float:
        return self._inner.power_limit_w(index)

    def utilization(self, index: int) -> GpuUtilization:
        return self._inner.utilization(index)

    def clock_event_reasons(self, index: int) -> ClockEventReasons:
        return self._inner.clock_event_reasons(index)

    def own_clock(self) -> Callable[[], float] | None:
        return self._inner.own_clock()

    def close(self) -> None:
        self._inner.close()
