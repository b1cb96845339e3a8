"""Per-phase energy from the GPUs' energy counters.

A phase's energy is the sum over its GPUs of counter deltas between the phase's begin and end. Counters are
read through the backend; the arithmetic is pure so that a counter reset (driver reload, GPU reset) can
never produce negative energy: the reset is reported and the counter's new value is the best lower bound.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from eerld.errors import GpuError
from eerld.gpu.base import GpuBackend
from eerld.gpu.counters import counter_delta_mj


@dataclass(frozen=True, slots=True)
class CounterReading:
    """Energy counters of some GPUs at one instant; a GPU whose read failed is absent."""

    time_s: float
    energy_mj: Mapping[int, int]


@dataclass(frozen=True, slots=True)
class PhaseEnergy:
    """Energy of a phase over its GPUs; ``complete`` is False when a GPU's counter could not be read."""

    duration_s: float
    energy_mj: float
    per_gpu_energy_mj: Mapping[int, int]
    counter_reset: bool
    complete: bool

    @property
    def mean_power_w(self) -> float:
        """Mean power summed over the GPUs (mJ / s / 1000 = W)."""
        return self.energy_mj / 1000.0 / self.duration_s if self.duration_s > 0 else 0.0


def read_counters(backend: GpuBackend, indices: Sequence[int], time_s: float) -> CounterReading:
    """Read the energy counter of each GPU; a failing GPU is left out rather than failing the phase."""
    values: dict[int, int] = {}
    for index in indices:
        try:
            values[index] = backend.total_energy_mj(index)
        except GpuError:
            continue
    return CounterReading(time_s=time_s, energy_mj=values)


def phase_energy(begin: CounterReading, end: CounterReading, indices: Sequence[int]) -> PhaseEnergy:
    """Energy and duration between two readings of the same GPUs (pure)."""
    per_gpu: dict[int, int] = {}
    reset = False
    complete = True
    for index in indices:
        if index not in begin.energy_mj or index not in end.energy_mj:
            complete = False
            continue
        delta, was_reset = counter_delta_mj(begin.energy_mj[index], end.energy_mj[index])
        per_gpu[index] = delta
        reset = reset or was_reset
    return PhaseEnergy(
        duration_s=max(0.0, end.time_s - begin.time_s),
        energy_mj=float(sum(per_gpu.values())),
        per_gpu_energy_mj=per_gpu,
        counter_reset=reset,
        complete=complete,
    )
