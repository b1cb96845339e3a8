"""What a user would run instead of per-phase online control, priced on the same sampled iterations.

- **One fixed clock** for the whole job — what an admin does with ``nvidia-smi -lgc``: the lock holds through
  every phase and the work between them, with no clock switches.
- **One fixed power limit** — ``nvidia-smi -pl``, what Zeus's power-limit optimizer picks per job: the
  default governor under a lower limit, for every phase and the work between, in steps of
  :data:`POWER_LIMIT_STEP_W` from :data:`MIN_POWER_LIMIT_FRACTION` of the GPU's limit up to it.

Each is the best of its kind on the whole run at the threshold, found with hindsight, as the oracle pair is:
the table then shows what choosing a clock per phase (the oracle) and choosing it online (EE-RL) add over
the settings a user could make by hand. The default governor is a candidate of both (the top clock, the
full limit), so each peer saves at least nothing.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from eerl_sim.bench.runner import RunTotals, ScenarioRun
from eerl_sim.evaluate import (
    between_at_clocks,
    evaluate_between,
    evaluate_phase,
    iteration_totals,
    under_power_limit,
)
from eerl_sim.sweep import KINDS
from eerl_sim.workload import FloatArray

POWER_LIMIT_STEP_W = 25.0
"""The power-limit grid's step (NVML accepts any watt; Zeus's optimizer sweeps limits in steps like it)."""
MIN_POWER_LIMIT_FRACTION = 0.3
"""The lowest limit tried, as a fraction of the GPU's (an H100's minimum settable limit is about 200 W)."""


@dataclass(frozen=True, slots=True)
class Peer:
    """The best setting of one kind and its run totals."""

    name: str
    setting: str
    """The setting in words (``1305 MHz``, ``450 W``; ``default`` when nothing beat the default)."""
    totals: RunTotals


def best_fixed_clock(run: ScenarioRun, threshold: float) -> Peer:
    """The one clock for every phase and the work between with the least energy at the threshold."""
    table = run.price_table()
    clocks = table.sm_clocks_mhz
    between = [between_at_clocks(run.scenario, run.sample(i), list(clocks)) for i in range(run.iterations)]
    between_s = np.array([d for d, _ in between]) if between else np.zeros((0, len(clocks)))
    between_j = np.array([e for _, e in between]) if between else np.zeros((0, len(clocks)))
    wall, energy = table.combined(run.scenario, (slice(None), slice(None)), (between_s, between_j))
    index = _best(wall.sum(axis=0), energy.sum(axis=0), threshold)
    top = len(clocks) - 1
    setting = "default" if index == top else f"{clocks[index]} MHz"
    valid = int(table.valid_tokens.sum())
    return Peer(
        "one fixed clock",
        setting,
        RunTotals(float(energy[:, index].sum()), float(wall[:, index].sum()), valid),
    )


def best_power_limit(run: ScenarioRun, threshold: float) -> Peer:
    """The one power limit (the default governor under it) with the least energy at the threshold.

    Limits are tried from the full one down, in :data:`POWER_LIMIT_STEP_W` steps, until one misses the
    threshold: a lower limit never lets a segment run faster, so every limit below that one misses it too.
    """
    full = run.scenario.gpu.power_limit_w
    default = power_limited_totals(run, full)
    best, best_limit = default, full
    for limit in np.arange(
        full - POWER_LIMIT_STEP_W, MIN_POWER_LIMIT_FRACTION * full - 1e-9, -POWER_LIMIT_STEP_W
    ):
        totals = power_limited_totals(run, float(limit))
        if default.wall_s / totals.wall_s < threshold - 1e-12:
            break
        if totals.energy_j < best.energy_j:
            best, best_limit = totals, float(limit)
    return Peer("one power limit", "default" if best_limit == full else f"{best_limit:.0f} W", best)


def power_limited_totals(run: ScenarioRun, power_limit_w: float) -> RunTotals:
    """The whole run on the default governor under ``power_limit_w``."""
    gpu = run.scenario.gpu.with_overrides({"power_limit_w": power_limit_w})
    scenario = dataclasses.replace(run.scenario, gpu=gpu)
    wall_s = energy_j = 0.0
    for i in range(run.iterations):
        sample = under_power_limit(run.scenario, run.sample(i), power_limit_w)
        generation, training = (evaluate_phase(scenario, sample, kind, [None]) for kind in KINDS)
        totals = iteration_totals(scenario, generation, training, evaluate_between(scenario, sample))
        wall_s += float(totals.wall_s[0])
        energy_j += float(totals.energy_j[0])
    return RunTotals(energy_j, wall_s, int(run.price_table().valid_tokens.sum()))


def _best(wall_s: FloatArray, energy_j: FloatArray, threshold: float) -> int:
    """The column of least energy whose throughput (the default column's, the last, wall time over its own)
    meets the threshold; the default column always does."""
    ok = wall_s[-1] / wall_s >= threshold - 1e-12
    return int(np.argmin(np.where(ok, energy_j, np.inf)))


__all__ = [
    "MIN_POWER_LIMIT_FRACTION",
    "POWER_LIMIT_STEP_W",
    "Peer",
    "best_fixed_clock",
    "best_power_limit",
    "power_limited_totals",
]
