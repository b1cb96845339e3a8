"""The offline oracle: a whole run at every fixed (generation, training) clock pair.

Each iteration is sampled once and each phase priced at every grid clock (common random numbers: the
same responses and noise for every pair). Sync mode is separable — a pair's run costs the sum of its
generation column and its training column — so the pair tables are outer sums of per-phase totals.
Async mode is not (an iteration lasts as long as the slower pool), so pairs are combined per iteration.

The default governor equals a lock at the top grid clock (a lock never lifts the power limit), so the
top row/column of the tables is the default, and a best pair that uses the top clock reports ``None``
for that phase: no lock is needed. The work between the phases runs at the default governor for every pair
(the lock ends with its phase), so it adds the same time and energy to each. Clock-switch windows are
ignored here (15 ms per phase of tens of
seconds: below 0.05%); :func:`eerl_sim.evaluate.run_fixed` includes them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from eerl.phases import ExecutionMode, PhaseKind

from eerl_sim.evaluate import (
    IterationSample,
    ProgressCallback,
    RunFigures,
    combine_phases,
    evaluate_between,
    evaluate_phase,
    sample_iteration,
)
from eerl_sim.pricing import clock_grid
from eerl_sim.scenario import Scenario
from eerl_sim.workload import FloatArray, IntArray

KINDS = (PhaseKind.GENERATION, PhaseKind.TRAINING)
"""The phase kinds of an iteration, in the order a sync iteration runs them."""


@dataclass(frozen=True, slots=True)
class SweepPoint(RunFigures):
    """One fixed clock pair over the whole run, compared with the default governor."""

    generation_sm_clock_mhz: int | None
    training_sm_clock_mhz: int | None
    energy_j: float
    wall_s: float
    valid_tokens: int
    energy_saving_fraction: float
    """1 − energy per valid token / the default's (positive: saves energy)."""
    throughput_ratio: float
    """Throughput over the default's."""


@dataclass(frozen=True, slots=True, eq=False)
class SweepResult:
    """Run totals for every clock pair; ``energy_j[g, t]`` is generation at ``sm_clocks_mhz[g]`` and
    training at ``sm_clocks_mhz[t]``. Per-iteration, per-clock phase tables are kept for the bench."""

    scenario: str
    iterations: int
    sm_clocks_mhz: tuple[int, ...]
    valid_tokens: int
    energy_j: FloatArray
    wall_s: FloatArray
    generation_duration_s: FloatArray
    """[iteration, clock index]"""
    generation_energy_j: FloatArray
    training_duration_s: FloatArray
    training_energy_j: FloatArray
    iteration_valid_tokens: IntArray

    @property
    def energy_per_valid_token_j(self) -> FloatArray:
        """[g, t] energy per valid token of each pair."""
        return self.energy_j / max(self.valid_tokens, 1)

    @property
    def throughput_tokens_per_s(self) -> FloatArray:
        """[g, t] valid tokens per second of each pair."""
        return self.valid_tokens / np.maximum(self.wall_s, 1e-30)

    def _index(self, sm_clock_mhz: int | None) -> int:
        if sm_clock_mhz is None:
            return len(self.sm_clocks_mhz) - 1
        return self.sm_clocks_mhz.index(sm_clock_mhz)

    def _clock(self, index: int) -> int | None:
        return None if index == len(self.sm_clocks_mhz) - 1 else self.sm_clocks_mhz[index]

    def point(self, generation_sm_clock_mhz: int | None, training_sm_clock_mhz: int | None) -> SweepPoint:
        """The pair's totals (None: default governor); ValueError for a clock off the grid."""
        return self._point(self._index(generation_sm_clock_mhz), self._index(training_sm_clock_mhz))

    def _point(self, g: int, t: int) -> SweepPoint:
        top = len(self.sm_clocks_mhz) - 1
        base_energy, base_wall = float(self.energy_j[top, top]), float(self.wall_s[top, top])
        energy, wall = float(self.energy_j[g, t]), float(self.wall_s[g, t])
        return SweepPoint(
            generation_sm_clock_mhz=self._clock(g),
            training_sm_clock_mhz=self._clock(t),
            energy_j=energy,
            wall_s=wall,
            valid_tokens=self.valid_tokens,
            energy_saving_fraction=1.0 - energy / base_energy if base_energy > 0 else 0.0,
            throughput_ratio=base_wall / wall if wall > 0 else 0.0,
        )

    @property
    def default(self) -> SweepPoint:
        """The default governor on both phases."""
        return self.point(None, None)

    def best(self, threshold: float = 0.95) -> SweepPoint:
        """The pair with the lowest energy per valid token whose throughput is ≥ threshold × default's."""
        if not 0 < threshold <= 1:
            raise ValueError(f"threshold must be in (0, 1], got {threshold}")
        top = len(self.sm_clocks_mhz) - 1
        ratio = self.wall_s[top, top] / np.maximum(self.wall_s, 1e-30)
        # Tiny tolerance so that the default itself always qualifies despite rounding.
        allowed = ratio >= threshold - 1e-12
        masked = np.where(allowed, self.energy_j, np.inf)
        g, t = np.unravel_index(int(np.argmin(masked)), masked.shape)
        return self._point(int(g), int(t))

    def pareto_front(self) -> tuple[SweepPoint, ...]:
        """Pairs no other pair beats on both throughput and energy per token, fastest first."""
        wall = self.wall_s.ravel()
        energy = self.energy_j.ravel()
        order = np.lexsort((energy, wall))  # fastest first, then cheapest
        front: list[SweepPoint] = []
        lowest = np.inf
        width = self.wall_s.shape[1]
        for flat in order:
            if energy[flat] < lowest:
                lowest = float(energy[flat])
                front.append(self._point(int(flat) // width, int(flat) % width))
        return tuple(front)


def pair_totals(
    scenario: Scenario,
    generation_duration_s: FloatArray,
    generation_energy_j: FloatArray,
    training_duration_s: FloatArray,
    training_energy_j: FloatArray,
    *,
    between_duration_s: FloatArray | None = None,
    between_energy_j: FloatArray | None = None,
) -> tuple[FloatArray, FloatArray]:
    """Whole-run (energy, wall) of every (generation clock, training clock) pair: ``[g, t]`` arrays.

    The inputs are ``[iteration, clock index]`` phase tables and ``[iteration]`` totals of the work between
    the phases. Sync phases add, so the run's totals are sums of column sums; async iterations last as
    long as their slower pool, so they combine per iteration.
    """
    if scenario.workload.mode is ExecutionMode.SYNC:
        between_wall = 0.0 if between_duration_s is None else float(between_duration_s.sum())
        between_energy = 0.0 if between_energy_j is None else float(between_energy_j.sum())
        wall = generation_duration_s.sum(axis=0)[:, None] + training_duration_s.sum(axis=0)[None, :]
        energy = generation_energy_j.sum(axis=0)[:, None] + training_energy_j.sum(axis=0)[None, :]
        return energy + between_energy, wall + between_wall
    size = generation_duration_s.shape[1]
    wall = np.zeros((size, training_duration_s.shape[1]))
    energy = np.zeros_like(wall)
    for i in range(generation_duration_s.shape[0]):
        iteration_wall, iteration_energy = combine_phases(
            scenario.workload,
            scenario.gpu.idle_power_w,
            generation_duration_s=generation_duration_s[i][:, None],
            generation_energy_j=generation_energy_j[i][:, None],
            training_duration_s=training_duration_s[i][None, :],
            training_energy_j=training_energy_j[i][None, :],
        )
        wall += iteration_wall
        energy += iteration_energy
    return energy, wall


@dataclass(frozen=True, slots=True, eq=False)
class PriceTable:
    """Every sampled iteration priced at every grid clock, per phase kind (columns: grid clocks).

    The default governor equals a lock at the top grid clock, so the last column is the default.
    """

    sm_clocks_mhz: tuple[int, ...]
    duration_s: dict[PhaseKind, FloatArray]
    energy_j: dict[PhaseKind, FloatArray]
    valid_tokens: IntArray
    between_duration_s: FloatArray
    """Per iteration: the work between the phases at the default governor (0 without any)."""
    between_energy_j: FloatArray

    def combined(
        self,
        scenario: Scenario,
        columns: tuple[int | slice, int | slice],
        between: tuple[FloatArray, FloatArray] | None = None,
    ) -> tuple[FloatArray, FloatArray]:
        """Per iteration, wall time and energy with generation at column ``columns[0]`` and training at
        ``columns[1]`` (a slice pairs columns element-wise: ``slice(None)`` twice is every clock for both
        phases); the work between at the default governor, unless ``between`` (duration, energy) says
        otherwise."""
        between_s, between_j = (
            (self.between_duration_s, self.between_energy_j) if between is None else between
        )
        generation, training = columns
        return combine_phases(
            scenario.workload,
            scenario.gpu.idle_power_w,
            generation_duration_s=self.duration_s[PhaseKind.GENERATION][:, generation],
            generation_energy_j=self.energy_j[PhaseKind.GENERATION][:, generation],
            training_duration_s=self.duration_s[PhaseKind.TRAINING][:, training],
            training_energy_j=self.energy_j[PhaseKind.TRAINING][:, training],
            between_duration_s=between_s,
            between_energy_j=between_j,
        )


def price_iterations(
    scenario: Scenario,
    iterations: int,
    sample: Callable[[int], IterationSample],
    progress: Callable[[int], None] | None = None,
) -> PriceTable:
    """Price iterations ``0 … iterations - 1`` (``sample(i)`` gives each) at every grid clock; ``progress``
    is called with the number of iterations just done."""
    clocks = tuple(int(c) for c in clock_grid(scenario.gpu).sm_clocks_mhz)
    requested: list[int | None] = list(clocks)
    duration = {k: np.zeros((iterations, len(clocks))) for k in KINDS}
    energy = {k: np.zeros((iterations, len(clocks))) for k in KINDS}
    valid = np.zeros(iterations, dtype=np.int64)
    between_duration, between_energy = np.zeros(iterations), np.zeros(iterations)
    for i in range(iterations):
        drawn = sample(i)
        for kind in KINDS:
            outcome = evaluate_phase(scenario, drawn, kind, requested)
            duration[kind][i] = outcome.duration_s
            energy[kind][i] = outcome.energy_j
        between = evaluate_between(scenario, drawn)
        between_duration[i], between_energy[i] = between.duration_s, between.energy_j
        valid[i] = drawn.valid_tokens
        if progress is not None:
            progress(1)
    return PriceTable(clocks, duration, energy, valid, between_duration, between_energy)


def table_pair_totals(scenario: Scenario, table: PriceTable) -> tuple[FloatArray, FloatArray]:
    """:func:`pair_totals` of a price table."""
    return pair_totals(
        scenario,
        table.duration_s[PhaseKind.GENERATION],
        table.energy_j[PhaseKind.GENERATION],
        table.duration_s[PhaseKind.TRAINING],
        table.energy_j[PhaseKind.TRAINING],
        between_duration_s=table.between_duration_s,
        between_energy_j=table.between_energy_j,
    )


def sweep(
    scenario: Scenario, iterations: int | None = None, progress: ProgressCallback | None = None
) -> SweepResult:
    """Price every (generation clock, training clock) pair over the first ``iterations`` iterations."""
    count = scenario.workload.iterations if iterations is None else iterations
    done = 0

    def step(iterations_done: int) -> None:
        nonlocal done
        done += iterations_done
        if progress is not None:
            progress(done, count)

    table = price_iterations(scenario, count, lambda i: sample_iteration(scenario, i), step)
    energy, wall = table_pair_totals(scenario, table)
    gen, train = PhaseKind.GENERATION, PhaseKind.TRAINING
    return SweepResult(
        scenario=scenario.name,
        iterations=count,
        sm_clocks_mhz=table.sm_clocks_mhz,
        valid_tokens=int(table.valid_tokens.sum()),
        energy_j=energy,
        wall_s=wall,
        generation_duration_s=table.duration_s[gen],
        generation_energy_j=table.energy_j[gen],
        training_duration_s=table.duration_s[train],
        training_energy_j=table.energy_j[train],
        iteration_valid_tokens=table.valid_tokens,
    )


__all__ = [
    "PriceTable",
    "SweepPoint",
    "SweepResult",
    "pair_totals",
    "price_iterations",
    "sweep",
    "table_pair_totals",
]
