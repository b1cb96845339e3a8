"""The GPU backend protocol: everything eerld needs from a GPU, and nothing more.

Only ``eerld/gpu/nvml.py`` imports pynvml; the simulated backend and the test fake implement the same
protocol, so every layer above this one is the same code on real and simulated GPUs.

Every method may raise a subclass of :class:`eerld.errors.GpuError` (``NoPermission``, ``NotSupported``,
``GpuLost``, ``InvalidArgument``, ``BackendFailure``) and nothing else. GPUs are named by their index on
the node; :meth:`GpuBackend.inventory` maps indices to UUIDs.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """Static facts about one GPU."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str


@dataclass(frozen=True, slots=True)
class GpuClocks:
    """Clocks that actually hold now (which can be below a lock, e.g. under the power limit)."""

    sm_clock_mhz: int
    mem_clock_mhz: int


@dataclass(frozen=True, slots=True)
class GpuUtilization:
    """Percent of the last sample period during which a kernel ran / memory was read or written."""

    gpu_percent: int
    memory_percent: int


class ClockEventReasons(enum.Flag):
    """Why the clock is below its maximum (NVML's clocks-event reasons, formerly "throttle reasons")."""

    NONE = 0
    GPU_IDLE = enum.auto()
    APPLICATIONS_CLOCKS_SETTING = enum.auto()
    SW_POWER_CAP = enum.auto()
    HW_SLOWDOWN = enum.auto()
    SYNC_BOOST = enum.auto()
    SW_THERMAL_SLOWDOWN = enum.auto()
    HW_THERMAL_SLOWDOWN = enum.auto()
    HW_POWER_BRAKE_SLOWDOWN = enum.auto()
    DISPLAY_CLOCK_SETTING = enum.auto()

    def names(self) -> list[str]:
        """Lower-case names of the set reasons, e.g. ``["sw_power_cap"]``."""
        return [r.name.lower() for r in ClockEventReasons if r and r in self and r.name]


@runtime_checkable
class GpuBackend(Protocol):
    """What eerld needs from the GPUs of one node.

    Locking is the primary actuator; where SM clock locks do not work (``supports_locked_clocks`` is
    False, e.g. a GB200-NVL driver with the known ``nvidia-smi -lgc`` problem) the application clock is
    the fallback actuator, and callers use :meth:`set_application_clocks` instead.
    """

    @property
    def name(self) -> str:
        """Short backend name: ``"nvml"`` or ``"sim"``."""
        ...

    def inventory(self) -> Sequence[GpuIdentity]:
        """All GPUs of the node, ordered by index."""
        ...

    def supported_sm_clocks_mhz(self, index: int) -> Sequence[int]:
        """Supported SM clocks, ascending (for the highest supported memory clock)."""
        ...

    def supported_mem_clocks_mhz(self, index: int) -> Sequence[int]:
        """Supported memory clocks, ascending."""
        ...

    def clocks(self, index: int) -> GpuClocks:
        """Clocks that hold now."""
        ...

    def supports_locked_clocks(self, index: int) -> bool:
        """Whether SM clock locks work on this GPU (else use application clocks)."""
        ...

    def lock_sm_clock(self, index: int, sm_clock_mhz: int) -> int:
        """Lock the SM clock (min = max = ``sm_clock_mhz``); return the SM clock read back afterwards.

        The value read back can be lower than asked (power limit, arbitration); callers compare it.
        """
        ...

    def reset_sm_clock(self, index: int) -> None:
        """Remove the SM clock lock: the default governor holds again."""
        ...

    def lock_mem_clock(self, index: int, mem_clock_mhz: int) -> None:
        """Lock the memory clock (``NotSupported`` where the GPU does not allow it)."""
        ...

    def reset_mem_clock(self, index: int) -> None:
        """Remove the memory clock lock."""
        ...

    def set_application_clocks(self, index: int, mem_clock_mhz: int, sm_clock_mhz: int) -> None:
        """Set application clocks: the fallback actuator where locks do not work."""
        ...

    def reset_application_clocks(self, index: int) -> None:
        """Return application clocks to their defaults."""
        ...

    def total_energy_mj(self, index: int) -> int:
        """Energy counter since the driver loaded, millijoules. Can go backwards on a driver reload."""
        ...

    def power_w(self, index: int) -> float:
        """Power draw (NVML averages it over about the last second; the sim over 100 ms)."""
        ...

    def power_limit_w(self, index: int) -> float:
        """Enforced board power limit."""
        ...

    def utilization(self, index: int) -> GpuUtilization:
        """Utilisation over the last sample period."""
        ...

    def clock_event_reasons(self, index: int) -> ClockEventReasons:
        """Why the clock is below its maximum now."""
        ...

    def own_clock(self) -> Callable[[], float] | None:
        """The backend's own notion of time, in seconds, where it keeps one; None on real hardware.

        The simulated GPUs run on a clock of their own (virtual time, or real time sped up); the daemon
        times phases on it so that durations agree with the energy counters. Real GPUs return None: they
        live in the host's time, and the daemon times phases on its monotonic clock.
        """
        ...

    def close(self) -> None:
        """Release the backend (``nvmlShutdown``); idempotent."""
        ...
