"""The NVML backend: :class:`~eerld.gpu.base.GpuBackend` on nvidia-ml-py. The only module that imports pynvml.

Every NVML call goes through :meth:`NvmlBackend._nvml_call`, which translates ``pynvml.NVMLError`` into
the typed errors of :mod:`eerld.errors` with ``raise … from e``, using the one table
:data:`ERROR_CLASS_BY_NVML_NAME`. The message names the NVML call, the GPU and NVML's own text, and the
error carries ``gpu_index``.

Process model: ``nvmlInit`` runs in the constructor and ``nvmlShutdown`` in :meth:`NvmlBackend.close`.
This module never forks or spawns a process: NVML state and device handles do not survive ``fork()``,
so a child of the daemon must build its own backend. A backend used from a forked child refuses every
call with ``BackendFailure`` instead of handing NVML a handle that belongs to the parent.

Readback: ``lock_sm_clock`` reads the SM clock back after the lock and returns it. The hardware may
hold less than the lock asks (the power limit; on Blackwell the firmware arbitrates clocks between
requesters), so callers compare the value, and the backend logs a warning with the clock-event
reasons whenever it is lower.

Lock support (``supports_locked_clocks``) is decided without changing any clock: GPUs older than Volta
cannot lock (read-only ``nvmlDeviceGetArchitecture``), and a GPU whose lock call once answered "not
supported" is remembered as such. An operator can also turn locks off for the whole node
(``use_locked_clocks=False``), e.g. for GB200-NVL drivers with the known ``nvidia-smi -lgc`` problem,
so the clock arbiter uses application clocks there.

Thread safety: NVML itself is thread-safe; the small caches here (device handles, supported-clock
tables, lock support) are guarded by one lock, so the arbiter may apply clocks to many GPUs at once.
"""

from __future__ import annotations

import bisect
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from types import TracebackType
from typing import Any, Final

import structlog

from eerld.errors import (
    BackendFailure,
    GpuError,
    GpuLost,
    InvalidArgument,
    NoPermission,
    NotSupported,
)
from eerld.gpu.base import ClockEventReasons, GpuClocks, GpuIdentity, GpuUtilization

__all__ = ["ERROR_CLASS_BY_NVML_NAME", "REASON_BY_NVML_BIT", "NvmlBackend"]

_log = structlog.get_logger(__name__)

#: The one translation table from NVML return codes (by their ``pynvml`` constant name) to eerld's
#: typed errors. A code missing here, or one a newer driver invents, becomes ``BackendFailure``.
#: The reason for each choice is in docs/nvml.md; in short: privilege problems are ``NoPermission``,
#: "this GPU / driver / mode cannot do that" is ``NotSupported``, "this GPU is unusable until it is
#: reset" is ``GpuLost``, a rejected value is ``InvalidArgument``, and anything about the library, the
#: driver as a whole or a transient condition is ``BackendFailure``.
ERROR_CLASS_BY_NVML_NAME: Final[Mapping[str, type[GpuError]]] = {
    "NVML_ERROR_UNINITIALIZED": BackendFailure,  # nvmlInit not called / already shut down
    "NVML_ERROR_INVALID_ARGUMENT": InvalidArgument,  # bad index, bad clock pair
    "NVML_ERROR_NOT_SUPPORTED": NotSupported,  # the GPU cannot do this (architecture, SKU)
    "NVML_ERROR_NO_PERMISSION": NoPermission,  # clock locks need root or CAP_SYS_ADMIN
    "NVML_ERROR_ALREADY_INITIALIZED": BackendFailure,  # deprecated, never returned by current NVML
    "NVML_ERROR_NOT_FOUND": BackendFailure,  # a lookup inside NVML failed
    "NVML_ERROR_INSUFFICIENT_SIZE": BackendFailure,  # buffer sizing, handled inside pynvml
    "NVML_ERROR_INSUFFICIENT_POWER": BackendFailure,  # external power cables not attached
    "NVML_ERROR_DRIVER_NOT_LOADED": BackendFailure,  # no NVIDIA kernel driver
    "NVML_ERROR_TIMEOUT": BackendFailure,  # transient
    "NVML_ERROR_IRQ_ISSUE": BackendFailure,  # kernel-side interrupt problem
    "NVML_ERROR_LIBRARY_NOT_FOUND": BackendFailure,  # libnvidia-ml.so.1 not loadable
    "NVML_ERROR_FUNCTION_NOT_FOUND": NotSupported,  # the installed driver predates the call
    "NVML_ERROR_CORRUPTED_INFOROM": BackendFailure,  # board firmware store damaged
    "NVML_ERROR_GPU_IS_LOST": GpuLost,  # fell off the bus
    "NVML_ERROR_RESET_REQUIRED": GpuLost,  # unusable until the GPU is reset
    "NVML_ERROR_OPERATING_SYSTEM": NoPermission,  # device node blocked by the OS / cgroups
    "NVML_ERROR_LIB_RM_VERSION_MISMATCH": BackendFailure,  # driver upgraded under us: restart the daemon
    "NVML_ERROR_IN_USE": BackendFailure,  # transient: the GPU is busy with another operation
    "NVML_ERROR_MEMORY": BackendFailure,  # host memory exhausted
    "NVML_ERROR_NO_DATA": BackendFailure,  # no sample yet
    "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED": NotSupported,  # vGPU mode restriction
    "NVML_ERROR_INSUFFICIENT_RESOURCES": BackendFailure,  # driver ran out of resources
    "NVML_ERROR_FREQ_NOT_SUPPORTED": InvalidArgument,  # the requested frequency is rejected
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH": NotSupported,  # the driver lacks this struct version
    "NVML_ERROR_DEPRECATED": NotSupported,  # the driver dropped this call
    "NVML_ERROR_NOT_READY": BackendFailure,  # transient: the system is not ready
    "NVML_ERROR_GPU_NOT_FOUND": GpuLost,  # the GPU is not (or no longer) visible
    "NVML_ERROR_INVALID_STATE": NotSupported,  # not allowed in the GPU's current mode (e.g. MIG)
    "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED": NotSupported,
    "NVML_ERROR_UNKNOWN": BackendFailure,
}

#: NVML's clocks-event-reason bits (``nvmlClocksEventReason*``; formerly ``nvmlClocksThrottleReason*``,
#: same values). These are part of NVML's C ABI, so they are spelt out here rather than looked up in
#: whichever pynvml is installed; a test checks them against pynvml's constants. Bits not listed (newer
#: reasons) are ignored.
REASON_BY_NVML_BIT: Final[Mapping[int, ClockEventReasons]] = {
    0x001: ClockEventReasons.GPU_IDLE,
    0x002: ClockEventReasons.APPLICATIONS_CLOCKS_SETTING,
    0x004: ClockEventReasons.SW_POWER_CAP,
    0x008: ClockEventReasons.HW_SLOWDOWN,
    0x010: ClockEventReasons.SYNC_BOOST,
    0x020: ClockEventReasons.SW_THERMAL_SLOWDOWN,
    0x040: ClockEventReasons.HW_THERMAL_SLOWDOWN,
    0x080: ClockEventReasons.HW_POWER_BRAKE_SLOWDOWN,
    0x100: ClockEventReasons.DISPLAY_CLOCK_SETTING,
}

_ARCH_VOLTA: Final = 5  # NVML_DEVICE_ARCH_VOLTA: the first architecture with nvmlDeviceSetGpuLockedClocks
_ARCH_UNKNOWN: Final = 0xFFFFFFFF  # NVML_DEVICE_ARCH_UNKNOWN


def _text(value: str | bytes) -> str:
    """NVML strings: ``str`` from current nvidia-ml-py, ``bytes`` from older releases and ctypes fields."""
    return value.decode("utf-8", errors="replace") if isinstance(value, bytes) else str(value)


def _nearest_message(what: str, value_mhz: int, supported_mhz: Sequence[int]) -> str:
    """'1234 MHz is not a supported SM clock; nearest supported: 1230 and 1245 MHz'."""
    if not supported_mhz:
        return f"{value_mhz} MHz is not a supported {what}: the GPU reports no supported values"
    pos = bisect.bisect_left(supported_mhz, value_mhz)
    neighbours = sorted({supported_mhz[i] for i in (pos - 1, pos) if 0 <= i < len(supported_mhz)})
    nearest = " and ".join(str(n) for n in neighbours)
    return (
        f"{value_mhz} MHz is not a supported {what}; nearest supported: {nearest} MHz "
        f"(range {supported_mhz[0]}–{supported_mhz[-1]} MHz)"
    )


class NvmlBackend:
    """The GPUs of this node through NVML.

    ``nvml_module`` is the ``pynvml`` module, or a fake with the same names for tests; by default
    ``pynvml`` is imported here, lazily, so that importing eerld never needs the NVIDIA library.
    """

    def __init__(self, nvml_module: Any | None = None, *, use_locked_clocks: bool = True) -> None:
        if nvml_module is None:
            try:
                import pynvml  # noqa: PLC0415 - imported lazily: only the NVML backend needs it
            except ImportError as e:
                raise BackendFailure("nvidia-ml-py (module pynvml) is not installed") from e
            nvml_module = pynvml
        self._nvml: Any = nvml_module
        self._use_locked_clocks = use_locked_clocks
        self._error_class_by_code: dict[int, type[GpuError]] = {}
        self._error_name_by_code: dict[int, str] = {}
        for name in dir(nvml_module):
            code = getattr(nvml_module, name, None) if name.startswith("NVML_ERROR_") else None
            if isinstance(code, int):
                self._error_name_by_code[code] = name
                self._error_class_by_code[code] = ERROR_CLASS_BY_NVML_NAME.get(name, BackendFailure)
        self._guard = threading.Lock()
        self._handles: dict[int, Any] = {}
        self._sm_clocks_by_mem: dict[tuple[int, int], tuple[int, ...]] = {}
        self._mem_clocks: dict[int, tuple[int, ...]] = {}
        self._lock_support: dict[int, bool] = {}
        self._pid = os.getpid()
        self._closed = False
        with self._nvml_call("nvmlInit", None):
            self._nvml.nvmlInit()

    # -- protocol -------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """Always ``"nvml"``."""
        return "nvml"

    def inventory(self) -> Sequence[GpuIdentity]:
        """Index, UUID, name and PCI bus id of every GPU NVML sees, by index."""
        self._check_usable()
        with self._nvml_call("nvmlDeviceGetCount", None):
            count = int(self._nvml.nvmlDeviceGetCount())
        gpus = []
        for index in range(count):
            handle = self._handle(index)
            with self._nvml_call("nvmlDeviceGetUUID", index):
                uuid = _text(self._nvml.nvmlDeviceGetUUID(handle))
            with self._nvml_call("nvmlDeviceGetName", index):
                gpu_name = _text(self._nvml.nvmlDeviceGetName(handle))
            with self._nvml_call("nvmlDeviceGetPciInfo", index):
                pci_bus_id = _text(self._nvml.nvmlDeviceGetPciInfo(handle).busId)
            gpus.append(GpuIdentity(index=index, uuid=uuid, name=gpu_name, pci_bus_id=pci_bus_id))
        return tuple(gpus)

    def supported_mem_clocks_mhz(self, index: int) -> Sequence[int]:
        """Supported memory clocks, ascending, deduplicated (cached: fixed while the driver is loaded)."""
        handle = self._handle(index)
        with self._guard:
            cached = self._mem_clocks.get(index)
        if cached is not None:
            return cached
        with self._nvml_call("nvmlDeviceGetSupportedMemoryClocks", index):
            raw = self._nvml.nvmlDeviceGetSupportedMemoryClocks(handle)
        clocks = tuple(sorted({int(c) for c in raw}))
        with self._guard:
            self._mem_clocks[index] = clocks
        return clocks

    def supported_sm_clocks_mhz(self, index: int) -> Sequence[int]:
        """Supported graphics (SM) clocks at the highest supported memory clock, ascending, deduplicated."""
        mem_clocks = self.supported_mem_clocks_mhz(index)
        if not mem_clocks:
            return ()
        return self._sm_clocks_at(index, mem_clocks[-1])

    def clocks(self, index: int) -> GpuClocks:
        """The SM and memory clocks that hold now."""
        handle = self._handle(index)
        with self._nvml_call("nvmlDeviceGetClockInfo(SM)", index):
            sm_clock_mhz = int(self._nvml.nvmlDeviceGetClockInfo(handle, self._nvml.NVML_CLOCK_SM))
        with self._nvml_call("nvmlDeviceGetClockInfo(MEM)", index):
            mem_clock_mhz = int(self._nvml.nvmlDeviceGetClockInfo(handle, self._nvml.NVML_CLOCK_MEM))
        return GpuClocks(sm_clock_mhz=sm_clock_mhz, mem_clock_mhz=mem_clock_mhz)

    def supports_locked_clocks(self, index: int) -> bool:
        """Whether SM clock locks work here; decided without changing any clock.

        False when locks are turned off for the node, when the GPU is older than Volta, or when a lock
        on this GPU has already answered "not supported". Otherwise True: the first real lock confirms.
        """
        if not self._use_locked_clocks:
            return False
        handle = self._handle(index)
        with self._guard:
            known = self._lock_support.get(index)
        if known is not None:
            return known
        try:
            with self._nvml_call("nvmlDeviceGetArchitecture", index):
                architecture = int(self._nvml.nvmlDeviceGetArchitecture(handle))
        except NotSupported:
            architecture = _ARCH_UNKNOWN
        supported = architecture == _ARCH_UNKNOWN or architecture >= _ARCH_VOLTA
        with self._guard:
            self._lock_support.setdefault(index, supported)
            return self._lock_support[index]

    def lock_sm_clock(self, index: int, sm_clock_mhz: int) -> int:
        """Lock the SM clock to exactly ``sm_clock_mhz``; return the SM clock read back afterwards.

        The clock must be one of :meth:`supported_sm_clocks_mhz` (else ``InvalidArgument`` naming the
        nearest supported values). A value read back below the request is logged with the reasons.
        """
        if not self._use_locked_clocks:
            raise NotSupported(
                f"SM clock locks are turned off for this node (use_locked_clocks=False); GPU {index} "
                "takes application clocks instead",
                gpu_index=index,
            )
        supported = self.supported_sm_clocks_mhz(index)
        if sm_clock_mhz not in supported:
            raise InvalidArgument(
                f"GPU {index}: " + _nearest_message("SM clock", sm_clock_mhz, supported), gpu_index=index
            )
        handle = self._handle(index)
        try:
            with self._nvml_call("nvmlDeviceSetGpuLockedClocks", index):
                self._nvml.nvmlDeviceSetGpuLockedClocks(handle, sm_clock_mhz, sm_clock_mhz)
        except NotSupported:
            with self._guard:
                self._lock_support[index] = False
            raise
        with self._guard:
            self._lock_support[index] = True
        with self._nvml_call("nvmlDeviceGetClockInfo(SM)", index):
            held_mhz = int(self._nvml.nvmlDeviceGetClockInfo(handle, self._nvml.NVML_CLOCK_SM))
        if held_mhz < sm_clock_mhz:
            self._report_short_lock(index, sm_clock_mhz, held_mhz)
        return held_mhz

    def reset_sm_clock(self, index: int) -> None:
        """Remove the SM clock lock; the default governor holds again."""
        handle = self._handle(index)
        with self._nvml_call("nvmlDeviceResetGpuLockedClocks", index):
            self._nvml.nvmlDeviceResetGpuLockedClocks(handle)

    def lock_mem_clock(self, index: int, mem_clock_mhz: int) -> None:
        """Lock the memory clock to one of :meth:`supported_mem_clocks_mhz` (Ampere and newer)."""
        supported = self.supported_mem_clocks_mhz(index)
        if mem_clock_mhz not in supported:
            raise InvalidArgument(
                f"GPU {index}: " + _nearest_message("memory clock", mem_clock_mhz, supported),
                gpu_index=index,
            )
        handle = self._handle(index)
        with self._nvml_call("nvmlDeviceSetMemoryLockedClocks", index):
            self._nvml.nvmlDeviceSetMemoryLockedClocks(handle, mem_clock_mhz, mem_clock_mhz)

    def reset_mem_clock(self, index: int) -> None:
        """Remove the memory clock lock."""
        handle = self._handle(index)
        with self._nvml_call("nvmlDeviceResetMemoryLockedClocks", index):
            self._nvml.nvmlDeviceResetMemoryLockedClocks(handle)

    def set_application_clocks(self, index: int, mem_clock_mhz: int, sm_clock_mhz: int) -> None:
        """Set application clocks (the fallback actuator); the pair must be a supported combination."""
        mem_supported = self.supported_mem_clocks_mhz(index)
        if mem_clock_mhz not in mem_supported:
            raise InvalidArgument(
                f"GPU {index}: " + _nearest_message("memory clock", mem_clock_mhz, mem_supported),
                gpu_index=index,
            )
        sm_supported = self._sm_clocks_at(index, mem_clock_mhz)
        if sm_clock_mhz not in sm_supported:
            what = f"SM clock at memory clock {mem_clock_mhz} MHz"
            raise InvalidArgument(
                f"GPU {index}: " + _nearest_message(what, sm_clock_mhz, sm_supported), gpu_index=index
            )
        handle = self._handle(index)
        with self._nvml_call("nvmlDeviceSetApplicationsClocks", index):
            self._nvml.nvmlDeviceSetApplicationsClocks(handle, mem_clock_mhz, sm_clock_mhz)

    def reset_application_clocks(self, index: int) -> None:
        """Return application clocks to the board defaults."""
        handle = self._handle(index)
        with self._nvml_call("nvmlDeviceResetApplicationsClocks", index):
            self._nvml.nvmlDeviceResetApplicationsClocks(handle)

    def total_energy_mj(self, index: int) -> int:
        """The raw energy counter (mJ since the driver loaded; goes backwards on a reload).

        Use :func:`eerld.gpu.counters.counter_delta_mj` to turn two readings into energy.
        """
        handle = self._handle(index)
        with self._nvml_call("nvmlDeviceGetTotalEnergyConsumption", index):
            return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(handle))

    def power_w(self, index: int) -> float:
        """Board power draw in watts (NVML reports milliwatts, averaged over about a second)."""
        handle = self._handle(index)
        with self._nvml_call("nvmlDeviceGetPowerUsage", index):
            return int(self._nvml.nvmlDeviceGetPowerUsage(handle)) / 1000.0

    def power_limit_w(self, index: int) -> float:
        """The enforced board power limit in watts (the lowest of all limits that apply)."""
        handle = self._handle(index)
        with self._nvml_call("nvmlDeviceGetEnforcedPowerLimit", index):
            return int(self._nvml.nvmlDeviceGetEnforcedPowerLimit(handle)) / 1000.0

    def utilization(self, index: int) -> GpuUtilization:
        """GPU and memory utilisation over NVML's last sample period."""
        handle = self._handle(index)
        with self._nvml_call("nvmlDeviceGetUtilizationRates", index):
            rates = self._nvml.nvmlDeviceGetUtilizationRates(handle)
        return GpuUtilization(gpu_percent=int(rates.gpu), memory_percent=int(rates.memory))

    def clock_event_reasons(self, index: int) -> ClockEventReasons:
        """Why the clock is below its maximum now (older nvidia-ml-py: the "throttle reasons" call)."""
        handle = self._handle(index)
        call = "nvmlDeviceGetCurrentClocksEventReasons"
        query = getattr(self._nvml, call, None)
        if query is None:
            call = "nvmlDeviceGetCurrentClocksThrottleReasons"
            query = getattr(self._nvml, call)
        with self._nvml_call(call, index):
            mask = int(query(handle))
        reasons = ClockEventReasons.NONE
        for bit, reason in REASON_BY_NVML_BIT.items():
            if mask & bit:
                reasons |= reason
        return reasons

    def own_clock(self) -> Callable[[], float] | None:
        """None: real GPUs live in the host's time (the daemon times phases on its monotonic clock)."""
        return None

    def close(self) -> None:
        """Shut NVML down (``nvmlShutdown``); idempotent.

        Clock locks stay as they are: resetting them is the clock arbiter's job, before it closes.
        """
        with self._guard:
            if self._closed:
                return
            self._closed = True
            self._handles.clear()
        if os.getpid() != self._pid:
            return  # a forked child never initialised NVML itself; shutting down would be the parent's
        with self._nvml_call("nvmlShutdown", None):
            self._nvml.nvmlShutdown()

    def __enter__(self) -> NvmlBackend:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- internals ------------------------------------------------------------------------------

    @contextmanager
    def _nvml_call(self, call: str, index: int | None) -> Iterator[None]:
        """Translate any NVMLError raised inside into the typed error of the table, chained."""
        try:
            yield
        except self._nvml.NVMLError as e:
            raise self._translate(e, call, index) from e

    def _translate(self, error: Exception, call: str, index: int | None) -> GpuError:
        """The typed error for one NVMLError: the class from the table, a message naming call, GPU, text."""
        code = getattr(error, "value", None)
        if not isinstance(code, int):
            code = -1
        code_name = self._error_name_by_code.get(code, "an unknown NVML code")
        error_class = self._error_class_by_code.get(code, BackendFailure)
        try:
            nvml_text = str(error)
        except Exception:  # pynvml's __str__ can call into the library: never let it mask the error
            nvml_text = "no text"
        where = f"on GPU {index}" if index is not None else "on this node"
        message = f"{call} failed {where}: {nvml_text} ({code_name} = {code})"
        return error_class(message, gpu_index=index)

    def _check_usable(self) -> None:
        if self._closed:
            raise BackendFailure("the NVML backend is closed")
        if os.getpid() != self._pid:
            raise BackendFailure(
                f"NVML was initialised in process {self._pid}; a forked child must create its own backend"
            )

    def _handle(self, index: int) -> Any:
        """The NVML device handle for a GPU index (cached: handles are stable while NVML is initialised)."""
        self._check_usable()
        with self._guard:
            handle = self._handles.get(index)
        if handle is not None:
            return handle
        with self._nvml_call("nvmlDeviceGetHandleByIndex", index):
            handle = self._nvml.nvmlDeviceGetHandleByIndex(index)
        with self._guard:
            self._handles[index] = handle
        return handle

    def _sm_clocks_at(self, index: int, mem_clock_mhz: int) -> tuple[int, ...]:
        """Supported graphics clocks at one memory clock, ascending, deduplicated, cached."""
        handle = self._handle(index)
        with self._guard:
            cached = self._sm_clocks_by_mem.get((index, mem_clock_mhz))
        if cached is not None:
            return cached
        with self._nvml_call("nvmlDeviceGetSupportedGraphicsClocks", index):
            raw = self._nvml.nvmlDeviceGetSupportedGraphicsClocks(handle, mem_clock_mhz)
        clocks = tuple(sorted({int(c) for c in raw}))
        with self._guard:
            self._sm_clocks_by_mem[(index, mem_clock_mhz)] = clocks
        return clocks

    def _report_short_lock(self, index: int, requested_mhz: int, held_mhz: int) -> None:
        """Log that the hardware holds less than the lock asks, with NVML's reasons when it gives them."""
        try:
            reasons = self.clock_event_reasons(index).names()
        except GpuError:
            reasons = ["unknown"]
        _log.warning(
            "sm_clock_below_lock",
            gpu_index=index,
            requested_sm_clock_mhz=requested_mhz,
            held_sm_clock_mhz=held_mhz,
            clock_event_reasons=reasons,
        )
