"""A fake ``pynvml`` module: NVML's documented behaviour and error codes, without a GPU.

An instance of :class:`FakePynvml` stands in for the ``pynvml`` module (pass it as ``nvml_module``). It
reuses the real nvidia-ml-py constants and ``NVMLError`` classes - importing ``pynvml`` never loads the
NVIDIA library, only ``nvmlInit`` does, and the fake never calls that - so the backend's error mapping
is tested against the real codes and exception classes.

What it reproduces, from the NVML API reference:

- every call except ``nvmlInit`` fails with ``NVML_ERROR_UNINITIALIZED`` until ``nvmlInit`` (and after
  the matching ``nvmlShutdown``); init is reference-counted;
- ``nvmlInit`` fails with ``LIBRARY_NOT_FOUND`` / ``DRIVER_NOT_LOADED`` when so configured;
- an index outside ``0..count-1`` is ``INVALID_ARGUMENT``; a lost GPU answers ``GPU_IS_LOST``;
- supported clocks come back highest first, as NVML lists them; graphics clocks for a memory clock that
  is not supported are ``NOT_FOUND``;
- clock locks, memory locks and application clocks need privilege (``NO_PERMISSION``) and support
  (``NOT_SUPPORTED``); a lock changes the reported clock, but never above what the power limit lets the
  GPU hold, in which case the SW power cap reason is set;
- application clocks must be a supported (memory, graphics) pair (``INVALID_ARGUMENT``);
- the energy counter counts millijoules and restarts from zero on a driver reload, which also drops all
  locks; power and power limit are in milliwatts;
- any function can be made to fail with any code, for one GPU or all, once or every time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import pynvml as _real

# The real return codes, re-exported for tests.
NVML_ERROR_CODES: dict[str, int] = {
    name: value
    for name, value in vars(_real).items()
    if name.startswith("NVML_ERROR_") and isinstance(value, int)
}

H100_MEM_CLOCKS_MHZ = (2619, 1593)
H100_SM_CLOCKS_MHZ = tuple(range(1980, 344, -15))  # 1980 … 345 MHz in 15 MHz steps, highest first


@dataclass
class FakeGpu:
    """One fake GPU: its static facts, its settings and its counters (tests may change any field)."""

    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    pci_bus_id: str = "00000000:18:00.0"
    architecture: int = _real.NVML_DEVICE_ARCH_HOPPER
    mem_clocks_mhz: tuple[int, ...] = H100_MEM_CLOCKS_MHZ
    sm_clocks_by_mem_mhz: dict[int, tuple[int, ...]] = field(
        default_factory=lambda: {2619: H100_SM_CLOCKS_MHZ, 1593: H100_SM_CLOCKS_MHZ[4:]}
    )
    default_sm_clock_mhz: int = 1980
    default_mem_clock_mhz: int = 2619
    power_capped_sm_clock_mhz: int | None = None  # the highest SM clock the power limit lets hold
    supports_sm_locks: bool = True
    supports_mem_locks: bool = True
    supports_app_clocks: bool = True
    supports_energy: bool = True
    energy_mj: int = 0
    power_mw: int = 350_000
    power_limit_mw: int = 700_000
    gpu_util_percent: int = 0
    mem_util_percent: int = 0
    extra_event_reasons: int = 0
    lost: bool = False
    sm_lock_range_mhz: tuple[int, int] | None = None  # (min, max) of nvmlDeviceSetGpuLockedClocks
    mem_lock_range_mhz: tuple[int, int] | None = None  # (min, max) of nvmlDeviceSetMemoryLockedClocks
    app_clocks_mhz: tuple[int, int] | None = None  # (memory, graphics)

    def sm_clock_mhz(self) -> int:
        """The SM clock that holds: lock, else application clock, else default; never above the cap."""
        if self.sm_lock_range_mhz is not None:
            wanted = self.sm_lock_range_mhz[1]  # under load the clock rises to the top of the range
        elif self.app_clocks_mhz is not None:
            wanted = self.app_clocks_mhz[1]
        else:
            wanted = self.default_sm_clock_mhz
        cap = self.power_capped_sm_clock_mhz
        return wanted if cap is None else min(wanted, cap)

    def mem_clock_mhz(self) -> int:
        """The memory clock that holds: lock, else application clock, else default."""
        if self.mem_lock_range_mhz is not None:
            return self.mem_lock_range_mhz[1]
        if self.app_clocks_mhz is not None:
            return self.app_clocks_mhz[0]
        return self.default_mem_clock_mhz


@dataclass(frozen=True)
class FakeHandle:
    """An opaque device handle, like ``c_nvmlDevice_t``."""

    index: int


@dataclass
class _Injection:
    function: str
    code: int
    index: int | None
    remaining: int | None


def make_gpus(count: int = 2) -> list[FakeGpu]:
    """``count`` H100-like GPUs with distinct UUIDs and PCI bus ids."""
    return [
        FakeGpu(uuid=f"GPU-{i:08x}-1111-2222-3333-444455556666", pci_bus_id=f"00000000:{0x18 + i:02X}:00.0")
        for i in range(count)
    ]


class FakePynvml:
    """Stands in for the ``pynvml`` module; see the module docstring for what it reproduces."""

    NVMLError = _real.NVMLError

    def __init__(
        self,
        gpus: Sequence[FakeGpu] | None = None,
        *,
        privileged: bool = True,
        library_present: bool = True,
        driver_loaded: bool = True,
        legacy_bytes: bool = False,
    ) -> None:
        for name, value in vars(_real).items():
            if name.startswith(("NVML_", "nvmlClocksEventReason", "nvmlClocksThrottleReason")):
                setattr(self, name, value)
        self.gpus: list[FakeGpu] = list(gpus) if gpus is not None else make_gpus()
        self.privileged = privileged
        self.library_present = library_present
        self.driver_loaded = driver_loaded
        self.legacy_bytes = legacy_bytes  # old nvidia-ml-py returned names and UUIDs as bytes
        self.init_count = 0
        self.calls: list[tuple[str, int | None]] = []
        self._injections: list[_Injection] = []

    # -- test controls --------------------------------------------------------------------------

    def inject_error(
        self, function: str, code: int, *, index: int | None = None, times: int | None = None
    ) -> None:
        """Make ``function`` fail with ``code`` (on GPU ``index`` or every GPU; ``times`` calls or always)."""
        self._injections.append(_Injection(function, code, index, times))

    def reload_driver(self) -> None:
        """A driver reload: energy counters restart from zero and every lock and application clock is gone."""
        for gpu in self.gpus:
            gpu.energy_mj = 0
            gpu.sm_lock_range_mhz = None
            gpu.mem_lock_range_mhz = None
            gpu.app_clocks_mhz = None

    def run(self, index: int, duration_s: float) -> None:
        """Let GPU ``index`` draw its power for ``duration_s``: the energy counter advances (mW·s = mJ)."""
        gpu = self.gpus[index]
        gpu.energy_mj += round(gpu.power_mw * duration_s)

    def mutating_calls(self) -> list[str]:
        """Names of the calls made so far that change GPU state."""
        return [name for name, _ in self.calls if name.startswith(("nvmlDeviceSet", "nvmlDeviceReset"))]

    # -- internals ------------------------------------------------------------------------------

    def _raise(self, code: int) -> None:
        raise _real.NVMLError(code)

    def _injected(self, function: str, index: int | None) -> int | None:
        """The code of an injected failure that applies to this call, if any (counting it down)."""
        for injection in self._injections:
            if injection.function == function and injection.index in (None, index):
                if injection.remaining is not None:
                    injection.remaining -= 1
                    if injection.remaining == 0:
                        self._injections.remove(injection)
                return injection.code
        return None

    def _enter(self, function: str, index: int | None = None) -> None:
        """What every NVML entry point does first: log, initialised?, injected failure, lost GPU."""
        self.calls.append((function, index))
        if self.init_count == 0:
            self._raise(_real.NVML_ERROR_UNINITIALIZED)
        code = self._injected(function, index)
        if code is not None:
            self._raise(code)
        if index is not None and self.gpus[index].lost:
            self._raise(_real.NVML_ERROR_GPU_IS_LOST)

    def _gpu(self, function: str, handle: FakeHandle) -> FakeGpu:
        self._enter(function, handle.index)
        return self.gpus[handle.index]

    def _privileged(self) -> None:
        if not self.privileged:
            self._raise(_real.NVML_ERROR_NO_PERMISSION)

    def _string(self, value: str) -> str | bytes:
        return value.encode() if self.legacy_bytes else value

    # -- initialisation -------------------------------------------------------------------------

    def nvmlInit(self) -> None:
        self.calls.append(("nvmlInit", None))
        if not self.library_present:
            self._raise(_real.NVML_ERROR_LIBRARY_NOT_FOUND)
        if not self.driver_loaded:
            self._raise(_real.NVML_ERROR_DRIVER_NOT_LOADED)
        code = self._injected("nvmlInit", None)
        if code is not None:
            self._raise(code)
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.init_count -= 1

    # -- queries --------------------------------------------------------------------------------

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeHandle:
        valid = 0 <= index < len(self.gpus)
        self._enter("nvmlDeviceGetHandleByIndex", index if valid else None)
        if not valid:
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        return FakeHandle(index)

    def nvmlDeviceGetUUID(self, handle: FakeHandle) -> str | bytes:
        return self._string(self._gpu("nvmlDeviceGetUUID", handle).uuid)

    def nvmlDeviceGetName(self, handle: FakeHandle) -> str | bytes:
        return self._string(self._gpu("nvmlDeviceGetName", handle).name)

    def nvmlDeviceGetPciInfo(self, handle: FakeHandle) -> Any:
        gpu = self._gpu("nvmlDeviceGetPciInfo", handle)
        info = _real.nvmlPciInfo_t()  # the real ctypes struct: busId reads back as bytes
        info.busId = gpu.pci_bus_id.encode()
        return info

    def nvmlDeviceGetArchitecture(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetArchitecture", handle).architecture

    def nvmlDeviceGetSupportedMemoryClocks(self, handle: FakeHandle) -> list[int]:
        return list(self._gpu("nvmlDeviceGetSupportedMemoryClocks", handle).mem_clocks_mhz)

    def nvmlDeviceGetSupportedGraphicsClocks(self, handle: FakeHandle, mem_clock_mhz: int) -> list[int]:
        gpu = self._gpu("nvmlDeviceGetSupportedGraphicsClocks", handle)
        if mem_clock_mhz not in gpu.sm_clocks_by_mem_mhz:
            self._raise(_real.NVML_ERROR_NOT_FOUND)
        return list(gpu.sm_clocks_by_mem_mhz[mem_clock_mhz])

    def nvmlDeviceGetClockInfo(self, handle: FakeHandle, clock_type: int) -> int:
        gpu = self._gpu("nvmlDeviceGetClockInfo", handle)
        if clock_type in (_real.NVML_CLOCK_SM, _real.NVML_CLOCK_GRAPHICS):
            return gpu.sm_clock_mhz()
        if clock_type == _real.NVML_CLOCK_MEM:
            return gpu.mem_clock_mhz()
        self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        raise AssertionError("unreachable")

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeHandle) -> int:
        gpu = self._gpu("nvmlDeviceGetTotalEnergyConsumption", handle)
        if not gpu.supports_energy:
            self._raise(_real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.energy_mj

    def nvmlDeviceGetPowerUsage(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeHandle) -> int:
        return self._gpu("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetUtilizationRates(self, handle: FakeHandle) -> Any:
        gpu = self._gpu("nvmlDeviceGetUtilizationRates", handle)
        return _real.c_nvmlUtilization_t(gpu=gpu.gpu_util_percent, memory=gpu.mem_util_percent)

    def _event_reasons(self, gpu: FakeGpu) -> int:
        reasons = gpu.extra_event_reasons
        cap = gpu.power_capped_sm_clock_mhz
        if cap is not None and gpu.sm_lock_range_mhz is not None and cap < gpu.sm_lock_range_mhz[1]:
            reasons |= _real.nvmlClocksEventReasonSwPowerCap
        if gpu.app_clocks_mhz is not None:
            reasons |= _real.nvmlClocksEventReasonApplicationsClocksSetting
        return reasons

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: FakeHandle) -> int:
        return self._event_reasons(self._gpu("nvmlDeviceGetCurrentClocksEventReasons", handle))

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: FakeHandle) -> int:
        return self._event_reasons(self._gpu("nvmlDeviceGetCurrentClocksThrottleReasons", handle))

    # -- commands (root / CAP_SYS_ADMIN) ----------------------------------------------------------

    def nvmlDeviceSetGpuLockedClocks(
        self, handle: FakeHandle, min_sm_clock_mhz: int, max_sm_clock_mhz: int
    ) -> None:
        gpu = self._gpu("nvmlDeviceSetGpuLockedClocks", handle)
        self._privileged()
        if not gpu.supports_sm_locks:
            self._raise(_real.NVML_ERROR_NOT_SUPPORTED)
        if min_sm_clock_mhz > max_sm_clock_mhz:
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        gpu.sm_lock_range_mhz = (min_sm_clock_mhz, max_sm_clock_mhz)

    def nvmlDeviceResetGpuLockedClocks(self, handle: FakeHandle) -> None:
        gpu = self._gpu("nvmlDeviceResetGpuLockedClocks", handle)
        self._privileged()
        if not gpu.supports_sm_locks:
            self._raise(_real.NVML_ERROR_NOT_SUPPORTED)
        gpu.sm_lock_range_mhz = None

    def nvmlDeviceSetMemoryLockedClocks(
        self, handle: FakeHandle, min_mem_clock_mhz: int, max_mem_clock_mhz: int
    ) -> None:
        gpu = self._gpu("nvmlDeviceSetMemoryLockedClocks", handle)
        self._privileged()
        if not gpu.supports_mem_locks:
            self._raise(_real.NVML_ERROR_NOT_SUPPORTED)
        if min_mem_clock_mhz > max_mem_clock_mhz:
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        gpu.mem_lock_range_mhz = (min_mem_clock_mhz, max_mem_clock_mhz)

    def nvmlDeviceResetMemoryLockedClocks(self, handle: FakeHandle) -> None:
        gpu = self._gpu("nvmlDeviceResetMemoryLockedClocks", handle)
        self._privileged()
        if not gpu.supports_mem_locks:
            self._raise(_real.NVML_ERROR_NOT_SUPPORTED)
        gpu.mem_lock_range_mhz = None

    def nvmlDeviceSetApplicationsClocks(
        self, handle: FakeHandle, max_mem_clock_mhz: int, max_sm_clock_mhz: int
    ) -> None:
        gpu = self._gpu("nvmlDeviceSetApplicationsClocks", handle)
        self._privileged()
        if not gpu.supports_app_clocks:
            self._raise(_real.NVML_ERROR_NOT_SUPPORTED)
        if max_sm_clock_mhz not in gpu.sm_clocks_by_mem_mhz.get(max_mem_clock_mhz, ()):
            self._raise(_real.NVML_ERROR_INVALID_ARGUMENT)
        gpu.app_clocks_mhz = (max_mem_clock_mhz, max_sm_clock_mhz)

    def nvmlDeviceResetApplicationsClocks(self, handle: FakeHandle) -> None:
        gpu = self._gpu("nvmlDeviceResetApplicationsClocks", handle)
        self._privileged()
        if not gpu.supports_app_clocks:
            self._raise(_real.NVML_ERROR_NOT_SUPPORTED)
        gpu.app_clocks_mhz = None


class LegacyFakePynvml(FakePynvml):
    """An older nvidia-ml-py: byte strings, and only the "throttle reasons" name for clock-event reasons."""

    def __init__(self, gpus: Sequence[FakeGpu] | None = None, **kwargs: Any) -> None:
        super().__init__(gpus, legacy_bytes=True, **kwargs)

    @property
    def nvmlDeviceGetCurrentClocksEventReasons(self) -> Any:  # type: ignore[override]
        raise AttributeError("nvmlDeviceGetCurrentClocksEventReasons is not in this nvidia-ml-py")
