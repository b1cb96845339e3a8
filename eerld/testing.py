"""Test helpers that users of eerld can import too: an in-memory GPU backend and an in-process daemon.

:class:`FakeGpuBackend` implements :class:`eerld.gpu.base.GpuBackend` in memory: its energy counters
advance with an injectable clock at a power that depends on the locked clock, so energy attribution can
be checked against exact ground truth; every call can be made to fail per GPU to exercise degraded paths.
:func:`running_daemon` starts a real gRPC server of both services on Unix sockets in a directory
(:func:`eerld.api.server.create_server`, which builds the daemon with :func:`eerld.app.build`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eerld.api.server import Server, create_server
from eerld.config import Config, parse_fixed_clocks
from eerld.errors import GpuError, InvalidArgument
from eerld.gpu.base import ClockEventReasons, GpuBackend, GpuClocks, GpuIdentity, GpuUtilization

if TYPE_CHECKING:
    from eerld.daemon import Daemon

FAKE_SM_CLOCKS_MHZ = tuple(range(600, 1981, 15))
FAKE_MEM_CLOCKS_MHZ = (1593, 2619)
FAKE_MAX_SM_MHZ = FAKE_SM_CLOCKS_MHZ[-1]


@dataclass(slots=True)
class FakeGpu:
    """The in-memory state of one fake GPU."""

    identity: GpuIdentity
    locked_sm_mhz: int | None = None
    locked_mem_mhz: int | None = None
    app_sm_mhz: int | None = None
    energy_mj: float = 0.0
    last_s: float = 0.0
    busy: bool = True
    lock_calls: int = 0
    reset_calls: int = 0
    lock_history: list[int] = field(default_factory=list)
    """Every SM clock a lock (or application clocks) was asked for, in order, supported or not."""
    failures: dict[str, GpuError] = field(default_factory=dict)


class FakeGpuBackend:
    """A deterministic in-memory GpuBackend; ``clock`` drives the energy counters.

    Power while busy is ``idle_w + dynamic_w * (clock / max clock)``; the counter accrues exactly that,
    so ``energy_between`` gives the ground truth for any interval.
    """

    def __init__(
        self,
        gpus: int = 4,
        *,
        clock: Callable[[], float] = time.monotonic,
        idle_w: float = 80.0,
        dynamic_w: float = 520.0,
        locks_work: bool = True,
    ) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._idle_w = idle_w
        self._dynamic_w = dynamic_w
        self._locks_work = locks_work
        now = clock()
        self.gpus = [
            FakeGpu(
                GpuIdentity(
                    i, f"GPU-fake-{i:04d}-0000-0000-000000000000", "Fake GPU", f"00000000:{i:02x}:00.0"
                ),
                last_s=now,
            )
            for i in range(gpus)
        ]
        self.closed = False
        self._hangs: dict[int, threading.Event] = {}

    # -- test controls ------------------------------------------------------------------------------

    def fail(self, index: int, method: str, error: GpuError) -> None:
        """Make ``method`` raise ``error`` on GPU ``index`` until :meth:`heal`."""
        with self._lock:
            self.gpus[index].failures[method] = error

    def hang(self, index: int, release: threading.Event) -> None:
        """Make lock and reset calls on GPU ``index`` block until ``release`` is set (a stuck driver)."""
        with self._lock:
            self._hangs[index] = release

    def heal(self, index: int) -> None:
        """Stop injecting failures on GPU ``index``."""
        with self._lock:
            self.gpus[index].failures.clear()

    def locked(self) -> dict[int, int]:
        """SM clock locks in force, by index (what an outside observer would see)."""
        with self._lock:
            return {g.identity.index: g.locked_sm_mhz for g in self.gpus if g.locked_sm_mhz is not None}

    def lock_history(self, index: int) -> list[int]:
        """Every SM clock GPU ``index`` was asked to lock to (or set as application clock), in order."""
        with self._lock:
            return list(self.gpus[index].lock_history)

    def lock_calls(self) -> int:
        """Total lock and application-clock calls (to check that dry-run never locks)."""
        with self._lock:
            return sum(g.lock_calls for g in self.gpus)

    def power_at(self, index: int) -> float:
        """Power now, watts, from the clock that holds."""
        gpu = self.gpus[index]
        if not gpu.busy:
            return self._idle_w
        return self._idle_w + self._dynamic_w * self._sm(gpu) / FAKE_MAX_SM_MHZ

    def force_lock(self, index: int, sm_clock_mhz: int) -> None:
        """Set a lock directly, as if another process (or a dead daemon) had left it."""
        with self._lock:
            self._accrue(self.gpus[index])
            self.gpus[index].locked_sm_mhz = sm_clock_mhz

    # -- internals ----------------------------------------------------------------------------------

    def _sm(self, gpu: FakeGpu) -> int:
        if gpu.locked_sm_mhz is not None:
            return gpu.locked_sm_mhz
        if gpu.app_sm_mhz is not None:
            return gpu.app_sm_mhz
        return FAKE_MAX_SM_MHZ

    def _accrue(self, gpu: FakeGpu) -> None:
        now = self._clock()
        gpu.energy_mj += self.power_at(gpu.identity.index) * max(0.0, now - gpu.last_s) * 1000.0
        gpu.last_s = now

    def _gpu(self, index: int, method: str) -> FakeGpu:
        if not 0 <= index < len(self.gpus):
            raise InvalidArgument(f"no GPU {index}", gpu_index=index)
        gpu = self.gpus[index]
        error = gpu.failures.get(method) or gpu.failures.get("*")
        if error is not None:
            raise error
        self._accrue(gpu)
        return gpu

    # -- GpuBackend ---------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        """Backend name."""
        return "fake"

    def inventory(self) -> Sequence[GpuIdentity]:
        """Every fake GPU."""
        return [g.identity for g in self.gpus]

    def supported_sm_clocks_mhz(self, index: int) -> Sequence[int]:
        """600-1980 MHz in 15 MHz steps."""
        with self._lock:
            self._gpu(index, "supported_sm_clocks_mhz")
            return FAKE_SM_CLOCKS_MHZ

    def supported_mem_clocks_mhz(self, index: int) -> Sequence[int]:
        """Two memory clocks."""
        with self._lock:
            self._gpu(index, "supported_mem_clocks_mhz")
            return FAKE_MEM_CLOCKS_MHZ

    def clocks(self, index: int) -> GpuClocks:
        """The clock that holds."""
        with self._lock:
            gpu = self._gpu(index, "clocks")
            return GpuClocks(self._sm(gpu), gpu.locked_mem_mhz or FAKE_MEM_CLOCKS_MHZ[-1])

    def supports_locked_clocks(self, index: int) -> bool:
        """As configured."""
        return self._locks_work

    def _maybe_hang(self, index: int) -> None:
        release = self._hangs.get(index)
        if release is not None:
            release.wait()

    def lock_sm_clock(self, index: int, sm_clock_mhz: int) -> int:
        """Lock and read back."""
        self._maybe_hang(index)
        with self._lock:
            gpu = self._gpu(index, "lock_sm_clock")
            gpu.lock_history.append(sm_clock_mhz)
            if sm_clock_mhz not in FAKE_SM_CLOCKS_MHZ:
                raise InvalidArgument(f"{sm_clock_mhz} MHz not supported", gpu_index=index)
            gpu.locked_sm_mhz = sm_clock_mhz
            gpu.lock_calls += 1
            return sm_clock_mhz

    def reset_sm_clock(self, index: int) -> None:
        """Back to the default governor."""
        self._maybe_hang(index)
        with self._lock:
            gpu = self._gpu(index, "reset_sm_clock")
            gpu.locked_sm_mhz = None
            gpu.reset_calls += 1

    def lock_mem_clock(self, index: int, mem_clock_mhz: int) -> None:
        """Lock the memory clock."""
        with self._lock:
            gpu = self._gpu(index, "lock_mem_clock")
            gpu.locked_mem_mhz = mem_clock_mhz
            gpu.lock_calls += 1

    def reset_mem_clock(self, index: int) -> None:
        """Unlock the memory clock."""
        with self._lock:
            self._gpu(index, "reset_mem_clock").locked_mem_mhz = None

    def set_application_clocks(self, index: int, mem_clock_mhz: int, sm_clock_mhz: int) -> None:
        """The fallback actuator."""
        with self._lock:
            gpu = self._gpu(index, "set_application_clocks")
            gpu.lock_history.append(sm_clock_mhz)
            gpu.app_sm_mhz = sm_clock_mhz
            gpu.lock_calls += 1

    def reset_application_clocks(self, index: int) -> None:
        """Undo application clocks."""
        with self._lock:
            gpu = self._gpu(index, "reset_application_clocks")
            gpu.app_sm_mhz = None
            gpu.reset_calls += 1

    def total_energy_mj(self, index: int) -> int:
        """The energy counter, exact to the millijoule."""
        with self._lock:
            return int(self._gpu(index, "total_energy_mj").energy_mj)

    def power_w(self, index: int) -> float:
        """Power now."""
        with self._lock:
            self._gpu(index, "power_w")
            return self.power_at(index)

    def power_limit_w(self, index: int) -> float:
        """A constant limit."""
        with self._lock:
            self._gpu(index, "power_limit_w")
            return 700.0

    def utilization(self, index: int) -> GpuUtilization:
        """Busy or idle."""
        with self._lock:
            gpu = self._gpu(index, "utilization")
            return GpuUtilization(100 if gpu.busy else 0, 50 if gpu.busy else 0)

    def clock_event_reasons(self, index: int) -> ClockEventReasons:
        """Application-clock setting while locked, none otherwise."""
        with self._lock:
            gpu = self._gpu(index, "clock_event_reasons")
            if gpu.locked_sm_mhz is not None:
                return ClockEventReasons.APPLICATIONS_CLOCKS_SETTING
            return ClockEventReasons.NONE

    def own_clock(self) -> Callable[[], float] | None:
        """None: the fake's counters follow the daemon's clock (``clock``), as real GPUs follow the host's."""
        return None

    def close(self) -> None:
        """Idempotent."""
        self.closed = True


class ManualClock:
    """A monotonic clock that moves only when told (thread-safe)."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self._now = start_s
        self._lock = threading.Lock()

    def __call__(self) -> float:
        with self._lock:
            return self._now

    def advance(self, seconds: float) -> None:
        """Move time forward."""
        with self._lock:
            self._now += seconds


@dataclass(frozen=True, slots=True)
class DaemonHandle:
    """A running in-process daemon: its domain object, backend and socket paths."""

    daemon: Daemon
    backend: GpuBackend
    socket_path: Path
    admin_socket_path: Path
    server: Server


@contextmanager
def running_daemon(
    directory: Path,
    *,
    backend: GpuBackend | None = None,
    controller: str = "fixed",
    fixed_clocks: str = "generation=1200,training=1500",
    dry_run: bool = False,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    reaper: bool = True,
    **overrides: Any,
) -> Iterator[DaemonHandle]:
    """Serve both services on Unix sockets under ``directory`` (a fake backend by default); stop on exit.

    ``directory`` must be short: a Unix socket path holds at most 107 bytes. The shared socket may claim
    every GPU (``tenancy="single"``) and grants go to ``directory/grants``. ``overrides`` replace fields
    of :class:`~eerld.config.Config` (e.g. ``socket_group="eerl"``, ``tenancy="multi"``).
    """
    gpus = backend if backend is not None else FakeGpuBackend(clock=clock)
    config = replace(
        Config(),
        socket_path=directory / "eerld.sock",
        admin_socket_path=directory / "admin.sock",
        state_dir=directory / "state",
        tenancy="single",
        grant_dir=directory / "grants",
        controller=controller,
        fixed_clocks_mhz=parse_fixed_clocks(fixed_clocks) if fixed_clocks else {},
        dry_run=dry_run,
        metrics_address=None,
    )
    config = replace(config, **overrides)
    server = create_server(config, backend=gpus, clock=clock, wall_clock=wall_clock, reaper=reaper)
    server.start()
    try:
        yield DaemonHandle(server.daemon, gpus, config.socket_path, config.admin_socket_path, server)
    finally:
        server.stop(grace_s=0.5)


__all__ = ["DaemonHandle", "FakeGpuBackend", "ManualClock", "running_daemon"]
