"""Pricing sampled GPU work at SM clocks: the evaluator's one pricing home.

The clock grid of a profile (:class:`ClockGrid`; a lock's index on it), the sampled work that can be priced
(:class:`PhaseSample`, :class:`BetweenSample`, with each segment's power-limited clock), and its per-GPU
busy time, energy and clock × time at any set of requested clocks at once (:func:`price_work`), the clock
switch blended in. Every segment's duration and power come from :func:`segment_price` — the simulated
GPUs (:meth:`eerl_sim.gpu.model.GpuModel.price`) price their queued segments through it as well — except
where :func:`phase_totals` sums a segment's energy in closed form over many clocks at once (see there).
:mod:`eerl_sim.evaluate` samples iterations and prices them with this.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
from eerl.phases import PhaseKind, Workload

from eerl_sim import physics
from eerl_sim.profiles import GpuProfile
from eerl_sim.workload import FloatArray, IntArray, Segments
from eerld.errors import InvalidArgument


def segment_price(
    profile: GpuProfile,
    compute_mhz_s: FloatArray,
    memory_s: FloatArray,
    sm_clock_mhz: FloatArray,
    voltage: FloatArray,
    *,
    mem_activity_scale: FloatArray,
) -> tuple[FloatArray, FloatArray]:
    """Noise-free duration (s) and power (W) of segments at SM clocks of voltage ratios ``voltage``
    (arrays that broadcast together; the sim-model spec's segment formulas, :mod:`eerl_sim.physics`)."""
    clean_s = physics.segment_duration_s(compute_mhz_s, memory_s, sm_clock_mhz, profile.roofline_exponent)
    power_w = physics.segment_power_given_w(
        profile, compute_mhz_s, memory_s, clean_s, voltage, mem_activity_scale=mem_activity_scale
    )
    return clean_s, power_w


@dataclass(frozen=True, slots=True, eq=False)
class ClockGrid:
    """A profile's supported SM clocks and the voltage ratio at each."""

    sm_clocks_mhz: IntArray
    voltage: FloatArray

    @property
    def top(self) -> int:
        """Index of the highest clock (what the default governor asks for)."""
        return len(self.sm_clocks_mhz) - 1


@lru_cache(maxsize=16)
def clock_grid(profile: GpuProfile) -> ClockGrid:
    """The grid of ``profile`` (memoised: profiles are immutable)."""
    clocks = np.array(profile.sm_clock_grid_mhz(), dtype=np.int64)
    volts = physics.voltage_ratio(profile, clocks.astype(np.float64))
    clocks.setflags(write=False)
    volts.setflags(write=False)
    return ClockGrid(clocks, volts)


@lru_cache(maxsize=16)
def _grid_positions(profile: GpuProfile) -> Mapping[int, int]:
    """Each grid clock's index (memoised like the grid), so that a lock's index is one look-up."""
    return {int(clock): index for index, clock in enumerate(clock_grid(profile).sm_clocks_mhz)}


def clock_index(profile: GpuProfile, sm_clock_mhz: int | None) -> int:
    """Grid index of a lock; ``None`` (default governor) is the top clock. InvalidArgument off the grid."""
    return _position(profile, _grid_positions(profile), sm_clock_mhz)


def clock_indices(profile: GpuProfile, sm_clocks_mhz: Sequence[int | None]) -> IntArray:
    """:func:`clock_index` of every clock (the grid looked up once: pricing asks for every grid clock)."""
    positions = _grid_positions(profile)
    return np.array([_position(profile, positions, clock) for clock in sm_clocks_mhz], dtype=np.int64)


def _position(profile: GpuProfile, positions: Mapping[int, int], sm_clock_mhz: int | None) -> int:
    if sm_clock_mhz is None:
        return len(positions) - 1
    index = positions.get(sm_clock_mhz)
    if index is None:
        raise InvalidArgument(f"{sm_clock_mhz} MHz is not a supported SM clock of {profile.name}")
    return index


@dataclass(frozen=True, slots=True, eq=False)
class PhaseSample:
    """One phase of a sampled iteration: its segments, its workload and, per segment, the grid index of
    the clock the default governor would hold (the power-limited clock)."""

    kind: PhaseKind
    segments: Segments
    workload: Workload
    capped_index: IntArray


@dataclass(frozen=True, slots=True, eq=False)
class BetweenSample:
    """The work between generation and training of a sampled iteration (sim-model "Work between the
    phases"): its segments and, per segment, the grid index of the power-limited clock."""

    segments: Segments
    capped_index: IntArray


Priced = PhaseSample | BetweenSample
"""GPU work the evaluator can price at any clock."""


def power_capped_index(profile: GpuProfile, segments: Segments) -> IntArray:
    """Per segment, the grid index of the highest clock whose (noisy) power is within the limit.

    If even the lowest clock exceeds the limit the segment runs at the lowest clock (see
    :func:`physics.power_limited_index`).
    """
    return physics.power_limited_index(
        profile,
        clock_grid(profile).sm_clocks_mhz.astype(np.float64),
        segments.compute_mhz_s,
        segments.memory_s,
        mem_activity_scale=segments.mem_activity_scale,
        power_noise=segments.power_noise,
    )


Totals = tuple[FloatArray, FloatArray, FloatArray]
"""Per GPU and requested clock: busy seconds, energy (J) and clock × busy seconds (MHz·s)."""


def price_work(
    profile: GpuProfile, work: Priced, requested: IntArray, previous_sm_clock_mhz: int | None
) -> Totals:
    """Per-GPU totals of some work at the requested clocks, its first segment blended with the previous
    clock's price for the switch window (:func:`apply_clock_switch`; None: no switch)."""
    totals = phase_totals(profile, work, requested)
    if previous_sm_clock_mhz is not None:
        apply_clock_switch(profile, work, clock_index(profile, previous_sm_clock_mhz), requested, totals)
    return totals


def with_idle_waits(
    profile: GpuProfile, busy: FloatArray, gpu_energy: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Per requested clock: the work's duration (its slowest GPU's) and the energy of all its GPUs, each
    waiting at idle power once its own share is done."""
    duration = busy.max(axis=0)
    idle = profile.idle_power_w * (duration[None, :] - busy).sum(axis=0)
    return duration, gpu_energy.sum(axis=0) + idle


def phase_totals(profile: GpuProfile, phase: Priced, requested: IntArray) -> Totals:
    """Per-GPU totals of a phase, split by whether the power limit can bind.

    Segments whose power-limited clock is at or above every requested clock run at exactly the requested
    clocks. For them energy is linear in the noise-free duration ``d0``: ``E = pn·dn·((idle + leak·v)·d0
    + sm·v²·C/f_max + mem·scale·M)``, so the per-GPU sums are matrix products over segments and only
    ``d0`` has to be formed per (segment, clock). The few segments the limit holds back (compute-heavy
    ones) are priced element by element at ``min(requested, capped)``. The closed form is the same
    formula as :func:`segment_price`, summed in another order: routing it through there would change the
    last bits of every figure of eerl-bench, so it stays written out here, next to it.
    """
    grid = clock_grid(profile)
    segments = phase.segments
    gpu_of = np.repeat(np.arange(segments.gpus), np.diff(segments.gpu_bounds))
    held = phase.capped_index < requested.max()
    free_rows = np.nonzero(~held)[0]
    held_rows = np.nonzero(held)[0]
    shape = (segments.gpus, len(requested))
    busy, energy, clock_time = np.zeros(shape), np.zeros(shape), np.zeros(shape)
    if len(free_rows):
        clocks = grid.sm_clocks_mhz[requested].astype(np.float64)
        volts = grid.voltage[requested]
        compute = segments.compute_mhz_s[free_rows]
        memory = segments.memory_s[free_rows]
        clean = physics.segment_duration_s(
            compute[:, None], memory[:, None], clocks[None, :], profile.roofline_exponent
        )
        owner = gpu_of[free_rows]
        duration_noise = segments.duration_noise[free_rows]
        energy_noise = duration_noise * segments.power_noise[free_rows]
        busy += sum_by_gpu(clean * duration_noise[:, None], owner, segments.gpus)
        static_w = profile.idle_power_w + profile.leak_power_w * volts
        energy += sum_by_gpu(clean * energy_noise[:, None], owner, segments.gpus) * static_w[None, :]
        compute_per_gpu = np.bincount(owner, weights=energy_noise * compute, minlength=segments.gpus)
        energy += compute_per_gpu[:, None] * ((profile.sm_power_w / profile.sm_clock_max_mhz) * volts * volts)
        memory_work = energy_noise * segments.mem_activity_scale[free_rows] * memory
        energy += (
            profile.mem_power_w * np.bincount(owner, weights=memory_work, minlength=segments.gpus)[:, None]
        )
        clock_time += busy * clocks[None, :]
    if len(held_rows):
        effective = np.minimum(requested[None, :], phase.capped_index[held_rows, None])
        duration, segment_energy, segment_clock_time = price_at(profile, grid, segments, held_rows, effective)
        owner = gpu_of[held_rows]
        busy += sum_by_gpu(duration, owner, segments.gpus)
        energy += sum_by_gpu(segment_energy, owner, segments.gpus)
        clock_time += sum_by_gpu(segment_clock_time, owner, segments.gpus)
    return busy, energy, clock_time


def sum_by_gpu(values: FloatArray, gpu_of_row: IntArray, gpus: int) -> FloatArray:
    """Sum the rows of ``values`` per GPU (rows sorted by GPU; a GPU without rows sums to 0)."""
    result = np.zeros((gpus, values.shape[1]))
    if len(gpu_of_row) == 0:
        return result
    starts = np.flatnonzero(np.r_[True, gpu_of_row[1:] != gpu_of_row[:-1]])
    result[gpu_of_row[starts]] = np.add.reduceat(values, starts, axis=0)
    return result


def price_at(
    profile: GpuProfile, grid: ClockGrid, segments: Segments, rows: IntArray, effective: IntArray
) -> Totals:
    """Per (row, column): noisy duration, noisy energy and clock × duration at grid indices ``effective``."""
    compute = segments.compute_mhz_s[rows, None]
    memory = segments.memory_s[rows, None]
    clocks = grid.sm_clocks_mhz[effective].astype(np.float64)
    clean, power = segment_price(
        profile,
        compute,
        memory,
        clocks,
        grid.voltage[effective],
        mem_activity_scale=segments.mem_activity_scale[rows, None],
    )
    duration = clean * segments.duration_noise[rows, None]
    energy = power * segments.power_noise[rows, None] * duration
    return duration, energy, clocks * duration


def apply_clock_switch(
    profile: GpuProfile, phase: Priced, previous_index: int, requested: IntArray, totals: Totals
) -> None:
    """Blend each GPU's first segment with its price at the previous clock (in place; see module doc)."""
    switching = requested != previous_index
    bounds = phase.segments.gpu_bounds
    has_work = np.diff(bounds) > 0
    firsts = bounds[:-1][has_work]
    if not switching.any() or len(firsts) == 0:
        return
    grid = clock_grid(profile)
    capped = phase.capped_index[firsts, None]
    new = price_at(profile, grid, phase.segments, firsts, np.minimum(requested[None, :], capped))
    old = price_at(profile, grid, phase.segments, firsts, np.minimum(previous_index, capped))
    window_s = profile.clock_switch_ms / 1000.0
    share = np.minimum(1.0, window_s / np.maximum(old[0], 1e-30))
    gpu_rows = np.nonzero(has_work)[0]
    for total, new_value, old_value in zip(totals, new, old, strict=True):
        delta = share * (old_value - new_value)
        total[np.ix_(gpu_rows, np.nonzero(switching)[0])] += delta[:, switching]
