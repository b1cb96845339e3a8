"""The ``sim`` backend proper: :class:`eerld.gpu.base.GpuBackend` on the simulated shared device.

The daemon builds it with :func:`create_sim_backend` and uses it exactly like the NVML backend;
simulated RL workers reach the same GPUs through :attr:`SimBackend.device` (same process) or
:func:`open_sim_device` (another process sharing the state file) and run phase work with
:meth:`SimDevice.run_segments`. How the shared device, its state file and fault injection work:
docs/sim-backend.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TypeVar

from eerl_sim.gpu.clock import RealTimeClock, SimClock
from eerl_sim.gpu.device import SimDevice
from eerl_sim.gpu.state import GpuState
from eerl_sim.profiles import GpuProfile, builtin_profile
from eerld.errors import BackendFailure, GpuError, InvalidArgument, NotSupported
from eerld.gpu.base import ClockEventReasons, GpuClocks, GpuIdentity, GpuUtilization

T = TypeVar("T")

__all__ = ["SimBackend", "create_sim_backend", "open_sim_device"]


class SimBackend:
    """The GPU backend protocol on simulated GPUs, with NVML's validation and the spec's measurement.

    Measurement (sim-model spec): ``total_energy_mj`` is the energy integral at the last step of
    ``energy_counter_period_ms``; ``power_w`` the true power averaged over the last 100 ms of simulated
    time; ``clocks`` the clock that actually holds (below a lock while the power limit holds it down).
    """

    def __init__(self, device: SimDevice) -> None:
        self.device = device
        self._closed = False

    # ---- helpers -----------------------------------------------------------------------------------

    def _check_open(self, index: int | None = None) -> None:
        """BackendFailure once :meth:`close` was called (every call but ``close`` starts here)."""
        if self._closed:
            raise BackendFailure("sim backend is closed", gpu_index=index)

    def _enter(self, index: int, method: str) -> None:
        self._check_open(index)
        self.device.check_index(index)
        self.device.check_faults(index, method)

    def _read(self, index: int, method: str, measure: Callable[[GpuState], T]) -> T:
        self._check_open(index)
        return self.device.read(index, method, measure)

    def _check_sm_clock(self, index: int, sm_clock_mhz: int) -> None:
        if isinstance(sm_clock_mhz, bool) or sm_clock_mhz not in self.device.model.grid_set_mhz:
            grid = self.device.model.grid_mhz
            raise InvalidArgument(
                f"SM clock {sm_clock_mhz!r} MHz is not supported (grid {grid[0]}–{grid[-1]} MHz, "
                f"step {self.device.profile.sm_clock_step_mhz:g})",
                gpu_index=index,
            )

    def _check_mem_clock(self, index: int, mem_clock_mhz: int) -> None:
        if isinstance(mem_clock_mhz, bool) or mem_clock_mhz != self.device.profile.mem_clock_mhz:
            raise InvalidArgument(
                f"memory clock {mem_clock_mhz!r} MHz is not supported "
                f"(only {self.device.profile.mem_clock_mhz} MHz)",
                gpu_index=index,
            )

    # ---- GpuBackend ----------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """``"sim"``."""
        return "sim"

    def inventory(self) -> Sequence[GpuIdentity]:
        """Every GPU, with UUIDs derived from the seed (a lost GPU is still listed, as NVML counts it)."""
        self._check_open()
        for index in range(self.device.gpus):
            self.device.check_faults(index, "inventory", lost_raises=False)
        return self.device.identities

    def supported_sm_clocks_mhz(self, index: int) -> Sequence[int]:
        """The profile's grid, ascending."""
        self._enter(index, "supported_sm_clocks_mhz")
        return list(self.device.model.grid_mhz)

    def supported_mem_clocks_mhz(self, index: int) -> Sequence[int]:
        """The one memory clock of the profile."""
        self._enter(index, "supported_mem_clocks_mhz")
        return [self.device.profile.mem_clock_mhz]

    def clocks(self, index: int) -> GpuClocks:
        """The SM clock that holds now (the running segment's; when idle the lock, or the lowest clock)."""
        clock_mhz = self._read(index, "clocks", self.device.model.current_clock_mhz)
        return GpuClocks(clock_mhz, self.device.profile.mem_clock_mhz)

    def supports_locked_clocks(self, index: int) -> bool:
        """The profile's ``locked_clocks``."""
        self._enter(index, "supports_locked_clocks")
        return self.device.profile.locked_clocks

    def lock_sm_clock(self, index: int, sm_clock_mhz: int) -> int:
        """Lock the SM clock; returns the clock it holds once the ``clock_switch_ms`` switch completes.

        That is ``min(lock, power-limited clock)`` of the segment running now, or the lock when idle.
        NotSupported where the profile has ``locked_clocks = false``; InvalidArgument off the grid.
        """
        self._check_open(index)
        model = self.device.model

        def body(gpu: GpuState, now: float) -> int:
            if not self.device.profile.locked_clocks:
                raise NotSupported("SM clock locks are not supported on this GPU", gpu_index=index)
            self._check_sm_clock(index, sm_clock_mhz)
            gpu.sm_lock_mhz = sm_clock_mhz
            model.request_cap(gpu, now)
            return model.lock_readback_mhz(gpu, sm_clock_mhz)

        return self.device.update(index, "lock_sm_clock", body)

    def reset_sm_clock(self, index: int) -> None:
        """Remove the lock (the default governor, or the application clocks, hold after the switch)."""
        self._update(index, "reset_sm_clock", lambda gpu: setattr(gpu, "sm_lock_mhz", None))

    def lock_mem_clock(self, index: int, mem_clock_mhz: int) -> None:
        """Record a memory clock lock; only the profile's one memory clock is accepted (no other effect)."""

        def apply(gpu: GpuState) -> None:
            self._check_mem_clock(index, mem_clock_mhz)
            gpu.mem_lock_mhz = mem_clock_mhz

        self._update(index, "lock_mem_clock", apply)

    def reset_mem_clock(self, index: int) -> None:
        """Remove the memory clock lock."""
        self._update(index, "reset_mem_clock", lambda gpu: setattr(gpu, "mem_lock_mhz", None))

    def set_application_clocks(self, index: int, mem_clock_mhz: int, sm_clock_mhz: int) -> None:
        """Cap the SM clock with application clocks (the actuator where locks are unsupported).

        Same effect on the clock as a lock; a lock, when set, takes precedence.
        """

        def apply(gpu: GpuState) -> None:
            self._check_mem_clock(index, mem_clock_mhz)
            self._check_sm_clock(index, sm_clock_mhz)
            gpu.app_mem_clock_mhz = mem_clock_mhz
            gpu.app_sm_clock_mhz = sm_clock_mhz

        self._update(index, "set_application_clocks", apply)

    def reset_application_clocks(self, index: int) -> None:
        """Back to default application clocks (no cap)."""

        def apply(gpu: GpuState) -> None:
            gpu.app_mem_clock_mhz = None
            gpu.app_sm_clock_mhz = None

        self._update(index, "reset_application_clocks", apply)

    def _update(self, index: int, method: str, apply: object) -> None:
        self._check_open(index)
        model = self.device.model
        assert callable(apply)

        def body(gpu: GpuState, now: float) -> None:
            apply(gpu)
            model.request_cap(gpu, now)

        self.device.update(index, method, body)

    def total_energy_mj(self, index: int) -> int:
        """The energy counter (mJ) at its last step; monotone except across ``reset_energy_counter``."""
        self._check_open(index)
        return self.device.read_counter_mj(index, "total_energy_mj")

    def power_w(self, index: int) -> float:
        """True power averaged over the last 100 ms of simulated time."""
        return self._read(index, "power_w", self.device.model.average_power_w)

    def power_limit_w(self, index: int) -> float:
        """The profile's ``power_limit_w``."""
        self._enter(index, "power_limit_w")
        return self.device.profile.power_limit_w

    def utilization(self, index: int) -> GpuUtilization:
        """Busy share and mean memory activity over the last 100 ms."""
        return self._read(index, "utilization", self.device.model.utilization)

    def clock_event_reasons(self, index: int) -> ClockEventReasons:
        """GPU_IDLE, SW_POWER_CAP, APPLICATIONS_CLOCKS_SETTING (a lock or application clock) or NONE."""
        return self._read(index, "clock_event_reasons", self.device.model.event_reasons)

    def own_clock(self) -> Callable[[], float] | None:
        """The simulated GPUs' clock (virtual time, or real time sped up): phases are timed on it."""
        return self.device.clock.now_s

    def close(self) -> None:
        """Idempotent; later calls raise BackendFailure. The device state (and its file) stays."""
        self._closed = True

    # ---- fault injection and ground truth (delegated to the device) ---------------------------------

    def inject_fault(self, gpu_index: int, method_name: str, error: type[GpuError], *, once: bool) -> None:
        """See :meth:`SimDevice.inject_fault`."""
        self.device.inject_fault(gpu_index, method_name, error, once=once)

    def clear_faults(self, gpu_index: int | None = None) -> None:
        """See :meth:`SimDevice.clear_faults`."""
        self.device.clear_faults(gpu_index)

    def lose_gpu(self, gpu_index: int) -> None:
        """See :meth:`SimDevice.lose_gpu`."""
        self.device.lose_gpu(gpu_index)

    def recover_gpu(self, gpu_index: int) -> None:
        """See :meth:`SimDevice.recover_gpu`."""
        self.device.recover_gpu(gpu_index)

    def reset_energy_counter(self, gpu_index: int) -> None:
        """See :meth:`SimDevice.reset_energy_counter`."""
        self.device.reset_energy_counter(gpu_index)

    def true_energy_j(self, gpu_index: int) -> float:
        """See :meth:`SimDevice.true_energy_j`."""
        return self.device.true_energy_j(gpu_index)


def create_sim_backend(
    profile: GpuProfile,
    gpus: int,
    *,
    speedup: float = 1.0,
    state_file: Path | None = None,
    seed: int = 0,
    clock: SimClock | None = None,
    durable_writes: bool = False,
) -> SimBackend:
    """The sim backend for ``gpus`` GPUs of ``profile`` (what ``eerld --backend sim`` builds).

    Time is ``clock`` if given (``speedup`` is then ignored), else real time at ``speedup``. With
    ``state_file`` the device is shared with every process opening that file and re-opened from it when
    it exists (locks and counters survive a killed daemon); see :meth:`SimDevice.create` for the checks.
    ``durable_writes=True`` also fsyncs each state write (≈ 10 ms on a disk); without it writes are still
    atomic and survive any process's death, and a power loss is a reboot, which resets the device
    anyway. Raises ConfigError for a bad count, speed-up, or an unusable state file.
    """
    device = SimDevice.create(
        profile,
        gpus,
        clock=RealTimeClock(speedup) if clock is None else clock,
        state_file=state_file,
        seed=seed,
        durable_writes=durable_writes,
    )
    return SimBackend(device)


def create_daemon_backend(
    profile_name: str,
    gpus: int,
    *,
    speedup: float,
    state_file: Path | None,
    locked_clocks: bool,
) -> SimBackend:
    """What ``eerld --backend sim`` runs on, from its options (``--sim-profile``, ``--sim-gpus``,
    ``--sim-speedup``, ``--sim-state``; ``locked_clocks=False`` for ``--clock-actuator application``).

    eerld loads this module by name (:func:`eerld.app.create_backend`) and calls only this. Raises
    ConfigError for an unknown profile (naming the built-in ones) and as :func:`create_sim_backend` does.
    """
    profile = builtin_profile(profile_name)
    if not locked_clocks:
        profile = profile.with_overrides({"locked_clocks": False}, source="--clock-actuator")
    return create_sim_backend(profile, gpus, speedup=speedup, state_file=state_file)


def open_sim_device(
    state_file: Path, *, clock: SimClock | None = None, durable_writes: bool = False
) -> SimDevice:
    """Join the simulated GPUs of an existing state file (a simulated worker in another process).

    Profile, GPU count, seed and time base come from the file; a real-time file needs no ``clock``.
    """
    return SimDevice.attach(state_file, clock=clock, durable_writes=durable_writes)
