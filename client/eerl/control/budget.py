"""Spend the iteration's allowed slowdown where it saves the most energy.

The throughput threshold is a property of the whole iteration, not of each phase: in sync mode the
iteration takes the sum of its phases' times (and of the work between them), so a memory-bound generation
phase that barely slows down can take a large clock cut while a compute-bound training phase takes a small
one. Given each kind's estimated time and energy ratio at every candidate clock and its typical default
time and energy, the allocation minimises the iteration's energy subject to its time staying within
``default / threshold``.

In async mode the pools run at once and the iteration takes as long as the slower pool; a pool that waits
for its peer has slack, and may slow down until it is used up (plus the threshold's share).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from eerl.phases import PhaseKind

FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class KindOptions:
    """The choices for one phase kind: candidate clocks (None = default) with estimated ratios."""

    kind: PhaseKind
    sm_clocks_mhz: tuple[int | None, ...]
    time_ratio: FloatArray
    energy_ratio: FloatArray
    default_duration_s: float
    default_energy_j: float


@dataclass(frozen=True, slots=True)
class Allocation:
    """The chosen clock per kind and the iteration-level ratios it is expected to give."""

    sm_clock_mhz: dict[PhaseKind, int | None]
    throughput_ratio: float
    energy_ratio: float


def allocate_sync(options: list[KindOptions], threshold: float, between_s: float = 0.0) -> Allocation:
    """Minimum-energy clocks whose iteration time stays within the default time over the threshold.

    ``between_s`` is the iteration's work between the phases (:mod:`eerl.control.between`): it runs at the
    default governor whatever the phases' clocks, so it adds the same time to both sides.
    """
    assert options, "at least one phase kind"
    default_time = sum(o.default_duration_s for o in options) + between_s
    default_energy = sum(o.default_energy_j for o in options)
    time = np.full(1, between_s)
    energy = np.zeros(1)
    for o in options:
        t = o.default_duration_s * np.nan_to_num(o.time_ratio, nan=np.inf)
        e = o.default_energy_j * np.nan_to_num(o.energy_ratio, nan=np.inf)
        time = (time[:, None] + t[None, :]).ravel()
        energy = (energy[:, None] + e[None, :]).ravel()
    feasible = time <= default_time / threshold
    best = int(np.argmin(np.where(feasible, energy, np.inf))) if feasible.any() else int(np.argmin(time))
    chosen: dict[PhaseKind, int | None] = {}
    index = best
    for o in reversed(options):
        index, pick = divmod(index, len(o.sm_clocks_mhz))
        chosen[o.kind] = o.sm_clocks_mhz[pick]
    return Allocation(
        sm_clock_mhz=chosen,
        throughput_ratio=float(default_time / time[best]),
        energy_ratio=float(energy[best] / default_energy),
    )


def allocate_async(
    own: KindOptions, peer_reference_s: float | None, threshold: float, idle_power_w: float
) -> Allocation:
    """Minimum-energy clock for one pool of an async job.

    The iteration lasts as long as the slower pool. This pool may take up to the larger of its own default
    time and its peer's reference (:meth:`eerl.control.slack.PeerSlack.reference_s`), over the threshold: a
    pool that waits uses its slack, and the pool that gates the iteration spends the threshold. Time this
    pool no longer waits at idle power is credited (``idle_power_w`` over all of its GPUs).
    """
    horizon_s = max(own.default_duration_s, peer_reference_s or 0.0)
    allowed_s = horizon_s / threshold
    t = own.default_duration_s * np.nan_to_num(own.time_ratio, nan=np.inf)
    e = own.default_energy_j * np.nan_to_num(own.energy_ratio, nan=np.inf)
    # Energy over the whole iteration window: the phase, then idle until the window ends.
    window_energy = e + idle_power_w * np.maximum(allowed_s - t, 0.0)
    feasible = t <= allowed_s
    best = int(np.argmin(np.where(feasible, window_energy, np.inf))) if feasible.any() else int(np.argmin(t))
    return Allocation(
        sm_clock_mhz={own.kind: own.sm_clocks_mhz[best]},
        throughput_ratio=float(min(1.0, horizon_s / max(t[best], 1e-12))),
        energy_ratio=float(e[best] / own.default_energy_j),
    )
