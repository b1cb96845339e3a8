"""Creating a simulated device's state and re-opening a stored one (:meth:`eerl_sim.gpu.device.SimDevice.
create`, :meth:`~eerl_sim.gpu.device.SimDevice.attach`): the GPUs' identities, a fresh state, the clock bound
to the stored time base, a reboot noticed, and a stored device checked against the options.
"""

from __future__ import annotations

import hashlib
import math
import time
import uuid
from dataclasses import fields
from pathlib import Path

import numpy as np

from eerl_sim.gpu.clock import RealTimeClock, SimClock, VirtualClock
from eerl_sim.gpu.state import GpuState
from eerl_sim.gpu.store import ClockBinding, DeviceState
from eerl_sim.profiles import GpuProfile
from eerld.errors import ConfigError


def gpu_uuid(seed: int, index: int) -> str:
    """A stable fake UUID in NVML's format (``GPU-xxxxxxxx-xxxx-…``), derived from seed and index."""
    digest = hashlib.sha256(f"eerl-sim/{seed}/{index}".encode()).digest()[:16]
    return f"GPU-{uuid.UUID(bytes=digest, version=4)}"


def gpu_pci_bus_id(index: int) -> str:
    """A PCI bus id laid out like an 8-GPU HGX board (one PCI domain per 8 GPUs)."""
    return f"{index // 8:08X}:{0x18 + 0x12 * (index % 8):02X}:00.0"


def boot_id() -> str | None:
    """This boot of the machine (the kernel's boot id), None where it cannot be read."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None


def fresh_state(profile: GpuProfile, gpus: int, seed: int, clock: SimClock) -> DeviceState:
    """A new device's state: every GPU idle at the clock's now, its energy counter at a seeded offset."""
    now = clock.now_s()
    binding = ClockBinding(kind=clock.kind)
    if isinstance(clock, RealTimeClock):
        binding = ClockBinding("real", clock.speedup, clock.epoch_monotonic_s, boot_id())
    states = []
    for index in range(gpus):
        # A real counter counts since the driver loaded: start somewhere arbitrary but reproducible.
        base_mj = float(np.random.default_rng([seed, index, 0]).integers(10**8, 10**10))
        states.append(GpuState(time_s=now, counter_base_mj=base_mj))
    return DeviceState(profile, seed, binding, states)


def bind_fresh(clock: SimClock) -> SimClock:
    """The clock a new shared device runs on; ConfigError for a clock that cannot be stored."""
    if isinstance(clock, RealTimeClock | VirtualClock):
        return clock
    raise ConfigError(f"a shared sim device needs a RealTimeClock or VirtualClock, not {clock!r}")


def bind_existing(clock: SimClock, binding: ClockBinding, where: str) -> SimClock:
    """``clock`` on the stored device's time base; ConfigError when its kind or speed-up differs."""
    if clock.kind != binding.kind:
        raise ConfigError(f"sim state file {where} uses a {binding.kind} clock, not {clock.kind}")
    if isinstance(clock, RealTimeClock):
        if binding.speedup is None or binding.epoch_monotonic_s is None:
            raise ConfigError(f"sim state file {where} has no real-time epoch")
        if not math.isclose(clock.speedup, binding.speedup):
            raise ConfigError(
                f"sim state file {where} runs at speedup {binding.speedup:g}, not {clock.speedup:g} "
                "(pass the same speedup, or remove the file to start a fresh device)"
            )
        return clock.with_epoch(binding.epoch_monotonic_s)
    return clock


def rebooted(binding: ClockBinding) -> bool:
    """Whether a real-time state file was written before this machine last booted."""
    if binding.kind != "real" or binding.epoch_monotonic_s is None:
        return False
    boot = boot_id()
    if binding.boot_id is not None and boot is not None and boot != binding.boot_id:
        return True
    return time.monotonic() < binding.epoch_monotonic_s


def check_matches(state: DeviceState, *, profile: GpuProfile, gpus: int, seed: int, where: str) -> None:
    """ConfigError saying what differs when a stored device is not the one these options describe."""
    problems = []
    if state.profile != profile:
        differ = [
            f.name for f in fields(GpuProfile) if getattr(state.profile, f.name) != getattr(profile, f.name)
        ]
        problems.append(f"profile differs in {', '.join(differ)}")
    if len(state.gpus) != gpus:
        problems.append(f"it has {len(state.gpus)} GPUs, not {gpus}")
    if state.seed != seed:
        problems.append(f"its seed is {state.seed}, not {seed}")
    if problems:
        raise ConfigError(
            f"sim state file {where} belongs to another device ({'; '.join(problems)}); "
            "pass matching options or remove the file"
        )
