"""One simulated GPU's state, as data: what :class:`~eerl_sim.gpu.model.GpuModel` moves forward in time
and :mod:`~eerl_sim.gpu.store` keeps (the queue of segments, the running one, the power history, the clock
settings, the injected faults). No physics here; no files, locks or clocks either.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

# Columns of a queue row: the segment as given, plus its power-limited clock (computed when queued).
Q_COMPUTE, Q_MEMORY, Q_SCALE, Q_NOISE_DURATION, Q_NOISE_POWER, Q_PLIM = range(6)
QUEUE_COLUMNS = (
    "compute_mhz_s",
    "memory_s",
    "mem_activity_scale",
    "noise_duration",
    "noise_power",
    "plim_mhz",
)

# Columns of a history row: one interval of constant power (a segment, part of one, or idle).
H_START, H_END, H_POWER, H_CLOCK, H_COMPUTE, H_MEMORY, H_CAPPED = range(7)
HISTORY_COLUMNS = (
    "start_s",
    "end_s",
    "power_w",
    "sm_clock_mhz",
    "compute_activity",
    "memory_activity",
    "power_capped",
)


def empty_rows(columns: int) -> FloatArray:
    """A (0, columns) float array."""
    return np.zeros((0, columns), dtype=np.float64)


@dataclass(slots=True)
class Head:
    """The segment running at ``GpuState.time_s``; its clock, duration and power were fixed at its start."""

    start_s: float
    duration_s: float
    power_w: float
    sm_clock_mhz: float
    compute_activity: float
    memory_activity: float
    power_capped: bool

    @property
    def end_s(self) -> float:
        """When the segment ends."""
        return self.start_s + self.duration_s


@dataclass(slots=True)
class PendingSwitch:
    """A requested clock cap (``None``: default governor) that takes effect at ``at_s``."""

    cap_mhz: int | None
    at_s: float


@dataclass(slots=True)
class Fault:
    """An injected error: the :mod:`eerld.errors` class name, and whether it fires once or every time."""

    error: str
    once: bool


@dataclass(slots=True)
class GpuState:
    """Everything one simulated GPU remembers, materialised up to ``time_s`` (simulated seconds)."""

    time_s: float
    energy_j: float = 0.0
    step_energy_j: float = 0.0
    counter_base_mj: float = 0.0
    sm_lock_mhz: int | None = None
    app_sm_clock_mhz: int | None = None
    app_mem_clock_mhz: int | None = None
    mem_lock_mhz: int | None = None
    cap_mhz: int | None = None
    pending: PendingSwitch | None = None
    queue: FloatArray = field(default_factory=lambda: empty_rows(len(QUEUE_COLUMNS)))
    head_seq: int = 0
    head: Head | None = None
    history: FloatArray = field(default_factory=lambda: empty_rows(len(HISTORY_COLUMNS)))
    """The power history but its last row (see :meth:`full_history`), oldest first."""
    history_tail: Row | None = None
    """The history's last row, as plain floats: most advances only move its end (an idle GPU, a read
    while a segment runs), and doing that without numpy saves ~20 µs per advance on cold CPU caches —
    three advances per BeginPhase + EndPhase on the sim backend. ``None`` only when there is no history."""
    marks: dict[str, list[float] | None] = field(default_factory=dict)
    lost: bool = False
    faults: dict[str, Fault] = field(default_factory=dict)

    def copy_for_advance(self) -> GpuState:
        """A copy that :meth:`GpuModel.advance` may move on without changing this one.

        Cheaper than :meth:`clone`: advancing only rebinds fields (arrays are sliced or rebuilt, never
        written in place) except ``marks``, which gets its own dict.
        """
        return GpuState(
            time_s=self.time_s,
            energy_j=self.energy_j,
            step_energy_j=self.step_energy_j,
            counter_base_mj=self.counter_base_mj,
            sm_lock_mhz=self.sm_lock_mhz,
            app_sm_clock_mhz=self.app_sm_clock_mhz,
            app_mem_clock_mhz=self.app_mem_clock_mhz,
            mem_lock_mhz=self.mem_lock_mhz,
            cap_mhz=self.cap_mhz,
            pending=self.pending,
            queue=self.queue,
            head_seq=self.head_seq,
            head=self.head,
            history=self.history,
            history_tail=self.history_tail,
            marks=dict(self.marks),
            lost=self.lost,
            faults=self.faults,
        )

    def copy_for_change(self) -> GpuState:
        """A copy that a transaction may change without changing this (stored, shared) one.

        Shares what is never changed in place — the arrays (rebuilt, see :meth:`copy_for_advance`), the
        running :class:`Head` and the :class:`PendingSwitch` (both replaced, never edited) — and gives
        the two dicts that are edited in place (``marks``, ``faults``) their own copies.
        """
        copy = self.copy_for_advance()
        copy.faults = dict(self.faults)
        return copy

    def clone(self) -> GpuState:
        """A deep copy (reads advance a private copy and never write it back).

        Starts from :meth:`copy_for_advance`, so a new field needs listing only there, then gives every
        mutable field its own copy.
        """
        copy = self.copy_for_advance()
        if self.pending is not None:
            copy.pending = PendingSwitch(self.pending.cap_mhz, self.pending.at_s)
        copy.queue = self.queue.copy()
        if self.head is not None:
            copy.head = Head(**{s: getattr(self.head, s) for s in Head.__slots__})
        copy.history = self.history.copy()
        copy.marks = {k: None if v is None else list(v) for k, v in self.marks.items()}
        copy.faults = {k: Fault(f.error, f.once) for k, f in self.faults.items()}
        return copy

    def full_history(self) -> FloatArray:
        """Every history row (``HISTORY_COLUMNS``), oldest first, the tail included (a new array)."""
        if self.history_tail is None:
            return self.history
        return np.vstack([self.history, np.array((self.history_tail,), dtype=np.float64)])

    @property
    def queued_segments(self) -> int:
        """Segments not finished yet (the running one included)."""
        return int(self.queue.shape[0])

    @property
    def next_seq(self) -> int:
        """Sequence number the next queued segment gets."""
        return self.head_seq + self.queued_segments


Row = tuple[float, float, float, float, float, float, float]
"""One history row as plain floats (``HISTORY_COLUMNS``)."""


def as_row(values: FloatArray) -> Row:
    """One history row of an array, as plain floats."""
    start, end, power, clock, compute, memory, capped = values.tolist()
    return (start, end, power, clock, compute, memory, capped)
