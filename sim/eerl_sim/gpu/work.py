"""GPU work as simulated workers see it (:meth:`eerl_sim.gpu.device.SimDevice.submit_segments`,
:meth:`~eerl_sim.gpu.device.SimDevice.run_segments`): a segment column as given, a ticket for segments
queued on a GPU, what running them took, and the marks a GPU keeps of work started and finished."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from eerl_sim.gpu.state import FloatArray, GpuState
from eerld.errors import InvalidArgument

ArrayLike = Sequence[float] | FloatArray | float
"""A segment column as a worker gives it: one value per segment, or one for all."""

MARK_RETENTION_S = 3600.0
"""Finished-work marks nobody collected (a killed worker's) are dropped after this much simulated time."""


@dataclass(frozen=True, slots=True)
class WorkTicket:
    """Work queued on a GPU: its segments are ``first_seq`` … ``last_seq`` of that GPU."""

    gpu_index: int
    first_seq: int
    last_seq: int
    segments: int


@dataclass(frozen=True, slots=True)
class WorkResult:
    """What running a list of segments took: simulated start and end, and the GPU's true energy between.

    ``final`` is False for a forecast (``run_segments(..., sleep=False)``): later clock changes can still
    change what actually happens.
    """

    gpu_index: int
    segments: int
    start_s: float
    end_s: float
    energy_j: float
    final: bool = True

    @property
    def duration_s(self) -> float:
        """Simulated seconds from the first segment's start to the last one's end."""
        return self.end_s - self.start_s

    @property
    def average_power_w(self) -> float:
        """Mean true power over the work (0 for empty work)."""
        return self.energy_j / self.duration_s if self.duration_s > 0 else 0.0


def segment_column(values: ArrayLike | None, count: int, default: float, name: str) -> FloatArray:
    """One column of ``count`` segments: ``default`` for None, a scalar repeated; InvalidArgument otherwise
    when the length is wrong."""
    if values is None:
        return np.full(count, default, dtype=np.float64)
    array = np.asarray(values, dtype=np.float64)
    if array.ndim == 0:
        return np.full(count, float(array), dtype=np.float64)
    if array.shape != (count,):
        raise InvalidArgument(f"{name}: expected {count} values, got shape {array.shape}")
    return array


def take_result(gpu: GpuState, ticket: WorkTicket) -> WorkResult | None:
    """The ticket's result once its last segment ended (its marks removed); None while it runs."""
    start = gpu.marks.get(f"s{ticket.first_seq}")
    end = gpu.marks.get(f"e{ticket.last_seq}")
    if start is None or end is None:
        return None
    del gpu.marks[f"s{ticket.first_seq}"], gpu.marks[f"e{ticket.last_seq}"]
    return WorkResult(ticket.gpu_index, ticket.segments, start[0], end[0], end[1] - start[1])


def prune_marks(gpu: GpuState, now: float) -> None:
    """Drop the marks of finished work nobody collected for ``MARK_RETENTION_S``."""
    stale = [k for k, v in gpu.marks.items() if v is not None and v[0] < now - MARK_RETENTION_S]
    for key in stale:
        del gpu.marks[key]
