"""A decode-like and a training-like kernel mix measured read-only at the default governor, written as a
stage profile (the format of the measured sweeps shipped in ``eerl_sim/measured``), so that a GPU at hand
can be set beside the simulator's profile of it.

Read-only: it reads the energy counter, the SM clock and the power, and never locks, resets or changes a
clock or a limit; the clock in the file is the one the default governor held (the median of samples
taken while the mix ran). :mod:`perf.real_gpu` runs it; the mixes need PyTorch, the rest does not.
"""

from __future__ import annotations

import csv
import statistics
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from eerld.gpu.base import GpuClocks

STAGE_PROFILE_COLUMNS = ("stage", "instruction", "frequency", "time", "energy")
"""The header of ``eerl_sim.measured``'s stage profiles, spelled out here: perf.real_gpu runs from a plain
checkout on a GPU node, where eerl-sim need not be importable (tests/perf reads the output back with it)."""


class ReadOnlyGpu(Protocol):
    """The reads a measurement makes (eerld's NVML backend has them; tests pass a fake)."""

    def total_energy_mj(self, index: int) -> int: ...
    def clocks(self, index: int) -> GpuClocks: ...
    def power_w(self, index: int) -> float: ...


class Sampler:
    """Samples the SM clock and power of GPU 0 at ~20 Hz (read-only) while work runs."""

    def __init__(self, backend: ReadOnlyGpu, period_s: float = 0.05) -> None:
        self._backend = backend
        self._period_s = period_s
        self._stop = threading.Event()
        self.clocks: list[int] = []
        self.power: list[float] = []
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self._period_s):
            self.clocks.append(self._backend.clocks(0).sm_clock_mhz)
            self.power.append(self._backend.power_w(0))

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass(frozen=True, slots=True)
class MixRecord:
    """One kernel mix at the default governor: the clock it held, its duration, energy and mean power."""

    instruction: str
    sm_clock_mhz: int
    time_s: float
    energy_j: float

    @property
    def power_w(self) -> float:
        """Mean power over the run (energy / duration)."""
        return self.energy_j / self.time_s


def measure_mix(backend: ReadOnlyGpu, instruction: str, run: Callable[[], object]) -> MixRecord:
    """Run the mix once on GPU 0 between two energy-counter reads, sampling the clock meanwhile."""
    before_mj = backend.total_energy_mj(0)
    started = time.perf_counter()
    with Sampler(backend) as sampler:
        run()
    time_s = time.perf_counter() - started
    energy_j = (backend.total_energy_mj(0) - before_mj) / 1e3
    clocks = sampler.clocks or [backend.clocks(0).sm_clock_mhz]
    return MixRecord(instruction, round(statistics.median(clocks)), time_s, energy_j)


def write_stage_profile(records: Sequence[MixRecord], path: Path) -> None:
    """The records as a stage profile: stage 0, the mix's name as the instruction, the held clock."""
    with path.open("w", newline="", encoding="utf-8") as out:
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(STAGE_PROFILE_COLUMNS)
        for r in records:
            writer.writerow((0, r.instruction, r.sm_clock_mhz, repr(r.time_s), repr(r.energy_j)))


def steps_per_second(step: Callable[[], object], synchronize: Callable[[], None], steps: int = 20) -> float:
    """How many ``step`` calls the GPU runs per second, after three to warm up (``synchronize`` waits for
    the GPU): what sizes a run to a given length."""
    for _ in range(3):
        step()
    synchronize()
    started = time.perf_counter()
    for _ in range(steps):
        step()
    synchronize()
    return steps / (time.perf_counter() - started)


def make_mixes(seconds: float) -> Mapping[str, Callable[[], object]]:
    """Each mix about ``seconds`` long on cuda:0: ``decode`` reads a 8B-class layer's weights per step for a
    small batch (matrix-vector products) and streams a KV cache; ``training`` is large bf16 matrix products
    with the elementwise work between them."""
    import torch  # noqa: PLC0415 - only a GPU node needs torch

    device = torch.device("cuda:0")
    weights = torch.randn(4096, 14336, dtype=torch.bfloat16, device=device)
    batch = torch.randn(32, 4096, dtype=torch.bfloat16, device=device)
    cache = torch.empty(1024**3, dtype=torch.uint8, device=device)  # 1 GiB of KV cache to stream
    cache_copy = torch.empty_like(cache)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)

    def decode_step() -> None:
        for _ in range(8):
            batch @ weights
        cache_copy.copy_(cache)

    def training_step() -> None:
        c = a @ b
        torch.nn.functional.gelu(c).mul_(0.5).add_(a)

    def repeated(step: Callable[[], None]) -> Callable[[], object]:
        count = max(1, int(seconds * steps_per_second(step, torch.cuda.synchronize)))

        def run() -> None:
            for _ in range(count):
                step()
            torch.cuda.synchronize()

        return run

    return {"decode": repeated(decode_step), "training": repeated(training_step)}
