"""Virtual-time runs of a scenario: default governor, offline oracle and an online controller.

Every run sees the same sampled iterations (common random numbers: the simulator's draws depend only on the
scenario's seed and the iteration), so differences between runs come from the clocks alone. The sampled
iterations are priced once at every grid clock (a "price table"); the oracle is found on that table, and the
online controller's phases are priced as they happen (including the clock-switch window).

The online controller is shown what the daemon would show it, no more (sim-model "The benchmark measures as
the daemon does"): a phase's energy is the difference of two energy-counter reads, in steps of the profile's
``energy_counter_period_ms``, summed over the GPUs of the phase's pool (:mod:`eerl_sim.meter`); its duration
is the wall clock's; and ``decide()`` gets as hints only what a client knows before the phase starts — the
batch's shape (responses and prompt tokens), never the realised tokens of the phase about to run. The run's
figures (energy, wall time) are the true ones.

Between the phases the bench does what the daemon does: a phase's lock ends with the phase, so the work
between generation and training (``[workload.between]``) runs at the default governor — after the reset's
clock-switch window — and the next phase begins from the default. That work's time reaches the controller
as the next phase's ``gap_before_s``, as the daemon reports it; its energy counts in the run's totals.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt
from eerl.control.base import Controller, ControllerSettings, PhaseObservation
from eerl.phases import ControllerState, ExecutionMode, PhaseKind, Workload

from eerl_sim.evaluate import (
    IterationSample,
    PhaseOutcome,
    RunFigures,
    combine_phases,
    evaluate_between,
    evaluate_phase,
    sample_iteration,
)
from eerl_sim.meter import EnergyCounters
from eerl_sim.pricing import clock_grid
from eerl_sim.scenario import Scenario
from eerl_sim.sweep import KINDS, PriceTable, price_iterations, table_pair_totals
from eerl_sim.workload import iteration_rng

FloatArray = npt.NDArray[np.float64]
Progress = Callable[[int], None]
"""Called with the number of iterations just completed (for progress bars)."""
ControllerFactory = Callable[[ControllerSettings], Controller]

COUNTER_OFFSET_STREAM = 8
"""Stream of the energy counters' step offsets (one per GPU, drawn once per run from the seed)."""


def prior_hints(workload: Workload) -> Workload:
    """What a client knows about a phase before it starts: the batch's shape, not its realised tokens."""
    return Workload(sequences=workload.sequences, prompt_tokens=workload.prompt_tokens)


def pool_counters(scenario: Scenario) -> dict[PhaseKind, EnergyCounters]:
    """The energy counters of each phase kind's pool (sync: one bank, shared; async: one per pool)."""
    spec = scenario.workload
    period_s = scenario.gpu.energy_counter_period_ms / 1000.0
    rng = iteration_rng(spec.seed, 0, COUNTER_OFFSET_STREAM)
    idle = scenario.gpu.idle_power_w
    if spec.mode is ExecutionMode.SYNC:
        shared = EnergyCounters(rng.uniform(0.0, period_s, spec.gpus), period_s, idle)
        return dict.fromkeys(KINDS, shared)
    return {
        kind: EnergyCounters(rng.uniform(0.0, period_s, spec.pool_gpus(kind)), period_s, idle)
        for kind in KINDS
    }


@dataclass(frozen=True, slots=True)
class RunTotals(RunFigures):
    """A whole run: energy (all GPUs, idle included), wall time and valid tokens; figures via RunFigures."""

    energy_j: float
    wall_s: float
    valid_tokens: int


@dataclass(slots=True)
class Timeline:
    """Per-iteration record of an online run (for the timeline plot and the JSON)."""

    sm_clock_mhz: dict[PhaseKind, list[int | None]] = field(default_factory=lambda: {k: [] for k in KINDS})
    state: dict[PhaseKind, list[ControllerState]] = field(default_factory=lambda: {k: [] for k in KINDS})
    wall_s: list[float] = field(default_factory=list)
    energy_j: list[float] = field(default_factory=list)
    valid_tokens: list[int] = field(default_factory=list)
    metered_energy_j: dict[PhaseKind, list[float]] = field(default_factory=lambda: {k: [] for k in KINDS})
    """The phase energy the controller was shown (counter differences summed over the pool's GPUs)."""


@dataclass(frozen=True, slots=True)
class OnlineRun:
    """An online controller's run: totals, timeline, and the controllers (for their snapshots)."""

    totals: RunTotals
    timeline: Timeline
    controllers: dict[PhaseKind, Controller]
    exploration_phases: int


def best_pair(
    energy_j: FloatArray, wall_s: FloatArray, default_wall_s: float, threshold: float
) -> tuple[int, int]:
    """The oracle's choice on a sweep's ``[generation, training]`` tables: the grid columns of the least
    energy among the pairs whose throughput (the default's wall time over theirs) meets the threshold."""
    ok = default_wall_s / wall_s >= threshold
    index = int(np.argmin(np.where(ok, energy_j, np.inf)))
    g, t = divmod(index, energy_j.shape[1])
    return int(g), int(t)


class ScenarioRun:
    """A scenario's sampled iterations, shared by every run on it."""

    def __init__(self, scenario: Scenario, iterations: int | None = None) -> None:
        self.scenario = scenario
        self.iterations = scenario.workload.iterations if iterations is None else iterations
        self._samples: dict[int, IterationSample] = {}
        self._table: PriceTable | None = None

    def sample(self, iteration: int) -> IterationSample:
        """The iteration's sample (memoised)."""
        sample = self._samples.get(iteration)
        if sample is None:
            sample = sample_iteration(self.scenario, iteration)
            self._samples[iteration] = sample
        return sample

    def price_table(self, progress: Progress | None = None) -> PriceTable:
        """Price every iteration at every grid clock (once)."""
        if self._table is None:
            self._table = price_iterations(self.scenario, self.iterations, self.sample, progress)
        return self._table

    def totals(self, pair: tuple[int, int]) -> RunTotals:
        """Run totals at fixed grid-column indices (generation, training), from the price table."""
        table = self.price_table()
        wall, energy = table.combined(self.scenario, pair)
        return RunTotals(float(energy.sum()), float(wall.sum()), int(table.valid_tokens.sum()))

    def default_totals(self) -> RunTotals:
        """The default governor (top grid column for both phases)."""
        top = len(self.price_table().sm_clocks_mhz) - 1
        return self.totals((top, top))

    def sweep(self) -> tuple[FloatArray, FloatArray]:
        """Total energy and wall time for every (generation, training) clock pair: [gen, train] arrays."""
        return table_pair_totals(self.scenario, self.price_table())

    def oracle(self, threshold: float) -> tuple[tuple[int, int], RunTotals]:
        """The best fixed clock pair meeting the threshold on the whole run (grid indices, totals)."""
        energy, wall = self.sweep()
        pair = best_pair(energy, wall, self.default_totals().wall_s, threshold)
        return pair, self.totals(pair)

    def run_online(
        self, factory: ControllerFactory, threshold: float, progress: Progress | None = None
    ) -> OnlineRun:
        """Drive fresh controllers through the run in virtual time."""
        scenario = self.scenario
        top = int(clock_grid(scenario.gpu).sm_clocks_mhz[-1])
        clocks = tuple(int(c) for c in clock_grid(scenario.gpu).sm_clocks_mhz)
        mode = scenario.workload.mode
        if mode is ExecutionMode.SYNC:
            shared = factory(ControllerSettings(clocks, KINDS, mode, threshold))
            controllers = dict.fromkeys(KINDS, shared)
        else:
            controllers = {k: factory(ControllerSettings(clocks, (k,), mode, threshold)) for k in KINDS}
        timeline = Timeline()
        now_s = 0.0
        energy_total = wall_total = 0.0
        valid_total = 0
        exploring = 0
        last_lock: dict[PhaseKind, int] = {}
        previous_sync: int | None = None
        counters = pool_counters(scenario)
        for i in range(self.iterations):
            sample = self.sample(i)
            outcomes = {}
            metered: dict[PhaseKind, float] = {}
            gap_before_s = between_energy_j = 0.0
            for kind in KINDS:
                if kind is PhaseKind.TRAINING and mode is ExecutionMode.SYNC and sample.between is not None:
                    # Generation's lock ended with it: the work between runs at the default governor.
                    between = evaluate_between(scenario, sample, previous_sync)
                    counters[kind].advance(between.duration_s, between.gpu_busy_s, between.gpu_busy_energy_j)
                    now_s += between.duration_s
                    gap_before_s, between_energy_j = between.duration_s, between.energy_j
                    previous_sync = top
                hints = prior_hints(sample.phase(kind).workload)
                decision = controllers[kind].decide(kind, i, hints, now_s)
                clock = decision.sm_clock_mhz
                lock = top if clock is None else clock
                if mode is ExecutionMode.SYNC:
                    previous = previous_sync
                    previous_sync = lock
                else:
                    previous = last_lock.get(kind)
                    previous = previous if previous != lock else None
                    last_lock[kind] = lock
                outcome = evaluate_phase(scenario, sample, kind, [clock], previous)
                outcomes[kind] = outcome
                metered[kind] = self._meter(counters[kind], outcome)
                timeline.metered_energy_j[kind].append(metered[kind])
                timeline.sm_clock_mhz[kind].append(clock)
                timeline.state[kind].append(decision.state)
                if decision.state in (ControllerState.EXPLORING, ControllerState.RETUNING):
                    exploring += 1
                if mode is ExecutionMode.SYNC:
                    now_s += float(outcome.duration_s[0])
                    self._observe(
                        controllers,
                        outcome,
                        metered[kind],
                        iteration=i,
                        clock=clock,
                        now_s=now_s,
                        mode=mode,
                        gap_before_s=gap_before_s if kind is PhaseKind.TRAINING else 0.0,
                    )
            wall, energy = combine_phases(
                scenario.workload,
                scenario.gpu.idle_power_w,
                generation_duration_s=outcomes[PhaseKind.GENERATION].duration_s,
                generation_energy_j=outcomes[PhaseKind.GENERATION].energy_j,
                training_duration_s=outcomes[PhaseKind.TRAINING].duration_s,
                training_energy_j=outcomes[PhaseKind.TRAINING].energy_j,
                between_duration_s=gap_before_s,
                between_energy_j=between_energy_j,
            )
            if mode is ExecutionMode.ASYNC:
                now_s += float(wall[0])
                for kind in KINDS:
                    # The pool that finished first waits at idle power until the iteration ends.
                    counters[kind].advance(now_s - counters[kind].now_s)
                for kind in KINDS:
                    self._observe(
                        controllers,
                        outcomes[kind],
                        metered[kind],
                        iteration=i,
                        clock=timeline.sm_clock_mhz[kind][-1],
                        now_s=now_s,
                        mode=mode,
                    )
            wall_total += float(wall[0])
            energy_total += float(energy[0])
            valid_total += sample.valid_tokens
            timeline.wall_s.append(float(wall[0]))
            timeline.energy_j.append(float(energy[0]))
            timeline.valid_tokens.append(sample.valid_tokens)
            if progress is not None:
                progress(1)
        return OnlineRun(RunTotals(energy_total, wall_total, valid_total), timeline, controllers, exploring)

    @staticmethod
    def _meter(counters: EnergyCounters, outcome: PhaseOutcome) -> float:
        """Run the phase through its pool's counters: the energy two counter reads give, summed over GPUs."""
        readings = counters.meter(
            float(outcome.duration_s[0]), outcome.gpu_busy_s[:, 0], outcome.gpu_busy_energy_j[:, 0]
        )
        return float(readings.sum())

    @staticmethod
    def _observe(
        controllers: dict[PhaseKind, Controller],
        outcome: PhaseOutcome,
        metered_energy_j: float,
        *,
        iteration: int,
        clock: int | None,
        now_s: float,
        mode: ExecutionMode,
        gap_before_s: float = 0.0,
    ) -> None:
        kind = outcome.kind
        observation = PhaseObservation(
            kind=kind,
            iteration=iteration,
            workload=outcome.workload,
            duration_s=float(outcome.duration_s[0]),
            energy_j=metered_energy_j,
            sm_clock_mhz=clock,
            gpus=outcome.gpus,
            end_time_s=now_s,
            gap_before_s=gap_before_s,
        )
        if mode is ExecutionMode.SYNC:
            controllers[kind].observe(observation, now_s)
            return
        for controller in {id(c): c for c in controllers.values()}.values():
            controller.observe(observation, now_s)
