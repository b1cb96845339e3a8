"""The simulated GPU as pure state transitions: no files, no locks, no clocks read here.

A :class:`GpuState` is materialised up to ``time_s``: its energy integral, its counter step, the
segment that runs at that moment (``head``) and a short power history are exact up to then.
:meth:`GpuModel.advance` moves it forward to a later time, executing queued segments at the clock
that holds when each starts (sim-model spec: default governor = highest grid clock with
``P(f) · noise_power ≤ power_limit_w``; locked at ``f``: ``min(f, that)``; a clock change takes
``clock_switch_ms`` to take effect). Because the device is advanced lazily from timestamps, a lock
requested mid-phase takes effect exactly ``clock_switch_ms`` later, whoever queued the work, and idle
energy between segments accrues by itself. The state itself, as data, is :mod:`eerl_sim.gpu.state`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np

from eerl_sim import physics
from eerl_sim.counters import last_step_s
from eerl_sim.gpu.state import (
    H_CLOCK,
    H_END,
    H_MEMORY,
    H_POWER,
    H_START,
    HISTORY_COLUMNS,
    Q_COMPUTE,
    Q_MEMORY,
    Q_NOISE_DURATION,
    Q_NOISE_POWER,
    Q_PLIM,
    Q_SCALE,
    FloatArray,
    GpuState,
    Head,
    PendingSwitch,
    Row,
    as_row,
)
from eerl_sim.pricing import segment_price
from eerl_sim.profiles import GpuProfile
from eerld.gpu.base import ClockEventReasons, GpuUtilization

POWER_WINDOW_S = 0.1
"""Power and utilisation reads average over this much simulated time (sim-model spec: 100 ms)."""


@dataclass(frozen=True, slots=True)
class Priced:
    """Segments priced at the clock each would run at under one clock cap (arrays, one entry each)."""

    sm_clock_mhz: FloatArray
    duration_s: FloatArray
    power_w: FloatArray
    compute_activity: FloatArray
    memory_activity: FloatArray
    power_capped: FloatArray


class GpuModel:
    """The physics of one profile applied to :class:`GpuState` (pure: time comes in as arguments)."""

    def __init__(self, profile: GpuProfile) -> None:
        self.profile = profile
        self.grid_mhz: tuple[int, ...] = profile.sm_clock_grid_mhz()
        self.grid_set_mhz: frozenset[int] = frozenset(self.grid_mhz)  # membership on every lock
        self._grid = np.array(self.grid_mhz, dtype=np.float64)
        self.max_clock_mhz = self.grid_mhz[-1]
        self.min_clock_mhz = self.grid_mhz[0]
        self.switch_s = profile.clock_switch_ms / 1000.0
        self.counter_period_s = profile.energy_counter_period_ms / 1000.0

    # ---- pricing -------------------------------------------------------------------------------------

    def power_limited_clocks_mhz(self, rows: FloatArray) -> FloatArray:
        """Per queue row: the highest grid clock whose noisy power stays within ``power_limit_w``.

        The limiter sees the actual power (``P(f) · noise_power``), as the virtual-time evaluator does;
        when even the lowest clock exceeds the limit the lowest clock is used.
        """
        index = physics.power_limited_index(
            self.profile,
            self._grid,
            rows[:, Q_COMPUTE],
            rows[:, Q_MEMORY],
            mem_activity_scale=rows[:, Q_SCALE],
            power_noise=rows[:, Q_NOISE_POWER],
        )
        return self._grid[index]

    def price(self, rows: FloatArray, cap_mhz: int | None) -> Priced:
        """Clock, duration, power and activities of each row when it starts under ``cap_mhz`` (each
        segment priced as the evaluator prices it: :func:`eerl_sim.pricing.segment_price`)."""
        cap = float(self.max_clock_mhz if cap_mhz is None else cap_mhz)
        clock = np.minimum(cap, rows[:, Q_PLIM])
        compute = rows[:, Q_COMPUTE]
        memory = rows[:, Q_MEMORY]
        clean_s, power = segment_price(
            self.profile,
            compute,
            memory,
            clock,
            physics.voltage_ratio(self.profile, clock),
            mem_activity_scale=rows[:, Q_SCALE],
        )
        safe = np.maximum(clean_s, 1e-30)
        return Priced(
            sm_clock_mhz=clock,
            duration_s=clean_s * rows[:, Q_NOISE_DURATION],
            power_w=power * rows[:, Q_NOISE_POWER],
            compute_activity=np.where(clean_s > 0, (compute / clock) / safe, 0.0),
            memory_activity=np.where(clean_s > 0, np.minimum(1.0, memory * rows[:, Q_SCALE] / safe), 0.0),
            power_capped=(rows[:, Q_PLIM] < cap).astype(np.float64),
        )

    # ---- clock settings ------------------------------------------------------------------------------

    def requested_cap_mhz(self, gpu: GpuState) -> int | None:
        """The cap the settings ask for: a lock beats application clocks beats the default governor."""
        if gpu.sm_lock_mhz is not None:
            return gpu.sm_lock_mhz
        return gpu.app_sm_clock_mhz

    def request_cap(self, gpu: GpuState, time_s: float) -> None:
        """Settings changed at ``time_s`` (already advanced there): start the clock switch."""
        wanted = self.requested_cap_mhz(gpu)
        if wanted == gpu.cap_mhz:
            gpu.pending = None
        elif self.switch_s <= 0:
            gpu.pending = None
            gpu.cap_mhz = wanted
        else:
            gpu.pending = PendingSwitch(wanted, time_s + self.switch_s)

    @staticmethod
    def _apply_due_switch(gpu: GpuState, time_s: float) -> None:
        if gpu.pending is not None and gpu.pending.at_s <= time_s:
            gpu.cap_mhz = gpu.pending.cap_mhz
            gpu.pending = None

    # ---- time ----------------------------------------------------------------------------------------

    def advance(self, gpu: GpuState, time_s: float) -> None:
        """Materialise ``gpu`` up to ``time_s``: run queued segments, integrate energy, keep the history."""
        if time_s <= gpu.time_s:
            self._apply_due_switch(gpu, gpu.time_s)
            return
        begin_s = gpu.time_s
        begin_energy_j = gpu.energy_j
        head = gpu.head
        if (head is None and not gpu.queue.shape[0]) or (head is not None and head.end_s > time_s):
            # One interval of constant power (idle, or a read while one segment runs): what the loop
            # below does in one turn, without building its lists (every lock and counter read is here).
            self._apply_due_switch(gpu, time_s)
            row = (
                _idle(begin_s, time_s, self.profile.idle_power_w)
                if head is None
                else _interval(begin_s, time_s, head)
            )
            self._advance_one_interval(gpu, row, begin_energy_j, lo_s=time_s - POWER_WINDOW_S)
            return
        blocks: list[FloatArray | Row] = []
        marks: list[tuple[str, float]] = []
        cur = begin_s
        while cur < time_s:
            self._apply_due_switch(gpu, cur)
            head = gpu.head
            if head is not None:
                stop = min(head.end_s, time_s)
                blocks.append(_interval(cur, stop, head))
                cur = stop
                if head.end_s <= time_s:
                    marks.append((f"e{gpu.head_seq}", head.end_s))
                    gpu.queue = gpu.queue[1:]
                    gpu.head_seq += 1
                    gpu.head = None
                continue
            if gpu.queued_segments == 0:
                blocks.append(_idle(cur, time_s, self.profile.idle_power_w))
                cur = time_s
                break
            cur = self._run_queue(gpu, cur, time_s, blocks, marks)
        self._apply_due_switch(gpu, time_s)
        # Most advances (a read shortly after the last one, an idle GPU) cover one or two intervals of
        # constant power: integrate those with plain floats; numpy only for runs of queued segments.
        energy_at: Callable[[float], float]
        lo_s = time_s - POWER_WINDOW_S
        if len(blocks) == 1 and not marks and isinstance(blocks[0], tuple):
            self._advance_one_interval(gpu, blocks[0], begin_energy_j, lo_s=lo_s)
            return
        old = gpu.full_history() if begin_s > lo_s else gpu.history[:0]  # else all of it ended before lo_s
        if all(isinstance(block, tuple) for block in blocks):
            scalar_rows = [block for block in blocks if isinstance(block, tuple)]
            energy_at = partial(_scalar_energy_until, scalar_rows, begin_energy_j)
            if old.shape[0] and _continues(as_row(old[-1]), scalar_rows[0]):
                # The same power since the last advance (a read while one segment runs, or idle):
                # extend that row rather than add one per read.
                scalar_rows = [(float(old[-1, H_START]), *scalar_rows[0][1:]), *scalar_rows[1:]]
                old = old[:-1]
            new_history = np.array(scalar_rows, dtype=np.float64).reshape(-1, len(HISTORY_COLUMNS))
        else:
            new_history = np.vstack([np.array([b]) if isinstance(b, tuple) else b for b in blocks])
            energy_at = partial(_energy_until, new_history, begin_energy_j)
        gpu.energy_j = energy_at(time_s)
        step_s = self.counter_step_s(time_s)
        if step_s > begin_s:
            gpu.step_energy_j = energy_at(step_s)
        for key, at_s in marks:
            if key in gpu.marks and gpu.marks[key] is None:
                gpu.marks[key] = [at_s, energy_at(at_s)]
        _settle(gpu, np.vstack([old, new_history]) if old.shape[0] else new_history, time_s, lo_s)

    def _advance_one_interval(self, gpu: GpuState, row: Row, begin_energy_j: float, *, lo_s: float) -> None:
        """:meth:`advance` over one interval of constant power (an idle GPU, or a read while a segment
        runs): the same figures as the general path; when the power goes on as before (the common
        case) only the history's tail moves, and no numpy call is made."""
        start_s, time_s, power_w = row[H_START], row[H_END], row[H_POWER]
        # _scalar_energy_until over this one row, written out (the same floating-point operations).
        gpu.energy_j = begin_energy_j + power_w * max(0.0, time_s - start_s)
        step_s = self.counter_step_s(time_s)
        if step_s > start_s:
            gpu.step_energy_j = begin_energy_j + power_w * max(0.0, min(time_s, step_s) - start_s)
        closed, tail = (gpu.history, gpu.history_tail) if start_s > lo_s else (gpu.history[:0], None)
        if tail is not None and _continues(tail, row):
            _, end_s, power, clock, compute, memory, capped = row
            tail = (tail[H_START], end_s, power, clock, compute, memory, capped)
        else:
            if tail is not None:
                closed = np.vstack([closed, np.array((tail,), dtype=np.float64)])
            tail = row
        gpu.history, gpu.history_tail, gpu.time_s = _in_window(closed, lo_s), tail, time_s

    def _run_queue(
        self,
        gpu: GpuState,
        cur: float,
        time_s: float,
        blocks: list[FloatArray | Row],
        marks: list[tuple[str, float]],
    ) -> float:
        """Start queued segments from ``cur`` under the current cap until ``time_s`` or the next switch."""
        change_s = gpu.pending.at_s if gpu.pending is not None else math.inf
        limit_s = min(time_s, change_s)
        # Price a growing prefix of the queue: a read shortly after the last one touches few segments.
        size = 32
        while True:
            priced = self.price(gpu.queue[:size], gpu.cap_mhz)
            ends = cur + np.cumsum(priced.duration_s)
            if ends[-1] >= limit_s or size >= gpu.queued_segments:
                break
            size *= 4
        starts = np.concatenate(([cur], ends[:-1]))
        started = max(1, int(np.searchsorted(starts, limit_s, side="left")))
        done = int(np.searchsorted(ends[:started], time_s, side="right"))
        first_seq = gpu.head_seq
        for key in gpu.marks:
            seq = int(key[1:])
            j = seq - first_seq
            if key[0] == "s" and 0 <= j < started:
                marks.append((key, float(starts[j])))
            elif key[0] == "e" and 0 <= j < done:
                marks.append((key, float(ends[j])))
        if done:
            blocks.append(
                np.column_stack(
                    (
                        starts[:done],
                        ends[:done],
                        priced.power_w[:done],
                        priced.sm_clock_mhz[:done],
                        priced.compute_activity[:done],
                        priced.memory_activity[:done],
                        priced.power_capped[:done],
                    )
                )
            )
        gpu.queue = gpu.queue[done:]
        gpu.head_seq += done
        if done < started:
            gpu.head = Head(
                start_s=float(starts[done]),
                duration_s=float(priced.duration_s[done]),
                power_w=float(priced.power_w[done]),
                sm_clock_mhz=float(priced.sm_clock_mhz[done]),
                compute_activity=float(priced.compute_activity[done]),
                memory_activity=float(priced.memory_activity[done]),
                power_capped=bool(priced.power_capped[done]),
            )
            blocks.append(_interval(float(starts[done]), time_s, gpu.head))
            return time_s
        return float(ends[done - 1])

    def remaining_s(self, gpu: GpuState) -> float:
        """Simulated seconds until the queue drains, if the clock settings stay as they are now."""
        total = 0.0
        rows = gpu.queue
        if gpu.head is not None:
            total += max(0.0, gpu.head.end_s - gpu.time_s)
            rows = rows[1:]
        if rows.shape[0]:
            cap = gpu.pending.cap_mhz if gpu.pending is not None else gpu.cap_mhz
            total += float(np.sum(self.price(rows, cap).duration_s))
        return total

    # ---- measurement (on a GPU advanced to the time of the read) -----------------------------------

    def counter_step_s(self, time_s: float) -> float:
        """The last step of the energy counter at or before ``time_s``.

        Advancing a GPU from ``t0`` to ``t1`` moves its counter only when ``counter_step_s(t1) > t0``: a
        read in the same step as the stored state needs no advance (:meth:`SimDevice.read_counter_mj`).
        """
        return last_step_s(time_s, self.counter_period_s)

    @staticmethod
    def counter_mj(gpu: GpuState) -> int:
        """The energy counter: the integral at the last counter step, in whole mJ, never below zero."""
        return max(0, math.floor(gpu.counter_base_mj + 1000.0 * gpu.step_energy_j))

    def average_power_w(self, gpu: GpuState) -> float:
        """True power averaged over the last ``POWER_WINDOW_S`` (or the shorter time since creation)."""
        window = _window(gpu)
        if window.covered_s <= 0:
            return self.instant_power_w(gpu)
        return window.energy_j / window.covered_s

    def instant_power_w(self, gpu: GpuState) -> float:
        """Power at ``time_s``: the running segment's, else idle."""
        return gpu.head.power_w if gpu.head is not None else self.profile.idle_power_w

    def utilization(self, gpu: GpuState) -> GpuUtilization:
        """Share of the window with a segment running, and its mean memory activity, in percent."""
        window = _window(gpu)
        if window.covered_s <= 0:
            busy = 1.0 if gpu.head is not None else 0.0
            memory = gpu.head.memory_activity if gpu.head is not None else 0.0
        else:
            busy = window.busy_s / window.covered_s
            memory = window.memory_s / window.covered_s
        return GpuUtilization(gpu_percent=round(100 * busy), memory_percent=round(100 * min(1.0, memory)))

    def current_clock_mhz(self, gpu: GpuState) -> int:
        """The SM clock that holds: the running segment's; when idle the cap, or the lowest clock."""
        if gpu.head is not None:
            return round(gpu.head.sm_clock_mhz)
        if gpu.cap_mhz is not None:
            return gpu.cap_mhz
        return self.min_clock_mhz

    def lock_readback_mhz(self, gpu: GpuState, cap_mhz: int) -> int:
        """The clock ``cap_mhz`` holds once its switch completes (less while a capped segment runs)."""
        if gpu.head is not None:
            return round(min(float(cap_mhz), float(gpu.queue[0, Q_PLIM])))
        return cap_mhz

    def event_reasons(self, gpu: GpuState) -> ClockEventReasons:
        """GPU_IDLE when nothing runs; SW_POWER_CAP when the power limit holds the clock down;
        APPLICATIONS_CLOCKS_SETTING when a lock or application clock below the maximum does."""
        if gpu.head is None:
            return ClockEventReasons.GPU_IDLE
        if gpu.head.power_capped:
            return ClockEventReasons.SW_POWER_CAP
        if gpu.cap_mhz is not None and gpu.cap_mhz < self.max_clock_mhz:
            return ClockEventReasons.APPLICATIONS_CLOCKS_SETTING
        return ClockEventReasons.NONE


def _interval(start_s: float, end_s: float, head: Head) -> Row:
    return (
        start_s,
        end_s,
        head.power_w,
        head.sm_clock_mhz,
        head.compute_activity,
        head.memory_activity,
        float(head.power_capped),
    )


def _idle(start_s: float, end_s: float, idle_power_w: float) -> Row:
    return (start_s, end_s, idle_power_w, 0.0, 0.0, 0.0, 0.0)


@dataclass(frozen=True, slots=True)
class _Window:
    """Integrals over the last ``POWER_WINDOW_S`` of the history: time covered, energy, time busy, and
    memory activity × time."""

    covered_s: float
    energy_j: float
    busy_s: float
    memory_s: float


SMALL_HISTORY_ROWS = 32
"""Up to this many history rows, window sums use plain floats (numpy's per-call cost is higher)."""


def _window(gpu: GpuState) -> _Window:
    lo = gpu.time_s - POWER_WINDOW_S
    hist = gpu.history
    if hist.shape[0] < SMALL_HISTORY_ROWS:
        covered = energy = busy = memory = 0.0
        rows = hist.tolist()
        for row in rows if gpu.history_tail is None else [*rows, gpu.history_tail]:
            weight = max(0.0, min(row[H_END], gpu.time_s) - max(row[H_START], lo))
            covered += weight
            energy += row[H_POWER] * weight
            busy += weight if row[H_CLOCK] > 0 else 0.0
            memory += weight * row[H_MEMORY]
        return _Window(covered, energy, busy, memory)
    hist = gpu.full_history()
    weights = np.clip(np.minimum(hist[:, H_END], gpu.time_s) - np.maximum(hist[:, H_START], lo), 0, None)
    return _Window(
        covered_s=float(np.sum(weights)),
        energy_j=float(np.sum(hist[:, H_POWER] * weights)),
        busy_s=float(np.sum(weights[hist[:, H_CLOCK] > 0])),
        memory_s=float(np.sum(weights * hist[:, H_MEMORY])),
    )


def _settle(gpu: GpuState, history: FloatArray, time_s: float, lo_s: float) -> None:
    """End an advance: keep the history rows that reach into the power window, move the clock on."""
    history = _in_window(history, lo_s)
    gpu.history = history[:-1]
    gpu.history_tail = as_row(history[-1])
    gpu.time_s = time_s


def _in_window(rows: FloatArray, lo_s: float) -> FloatArray:
    """The history rows (in time order) that end after ``lo_s``, the start of the power window."""
    if rows.shape[0] and rows[0, H_END] <= lo_s:
        return rows[rows[:, H_END] > lo_s]
    return rows


def _continues(last: Row, row: Row) -> bool:
    """Whether ``row`` goes on from history row ``last`` at the same power, clock and activities."""
    return last[H_END] == row[H_START] and last[H_POWER:] == row[H_POWER:]


def _energy_until(rows: FloatArray, begin_energy_j: float, time_s: float) -> float:
    """Energy at ``time_s`` given the intervals executed since ``begin_energy_j`` was exact."""
    covered = np.clip(np.minimum(rows[:, H_END], time_s) - rows[:, H_START], 0, None)
    return begin_energy_j + float(np.sum(rows[:, H_POWER] * covered))


def _scalar_energy_until(rows: Sequence[Row], begin_energy_j: float, time_s: float) -> float:
    """:func:`_energy_until` for a few rows of plain floats."""
    return begin_energy_j + sum(
        row[H_POWER] * max(0.0, min(row[H_END], time_s) - row[H_START]) for row in rows
    )
