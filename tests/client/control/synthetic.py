"""A tiny synthetic RL job for the controller's tests: one roofline segment per phase on a simulated H100.

Generation is memory-bound (barely slows until a knee), training compute-bound and power-capped, as in the
sim-model spec, but each phase is a single segment whose size follows the iteration's tokens, so tests run
thousands of phases in well under a second.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from eerl.control.base import Controller, PhaseObservation
from eerl.control.eerl import PROBE_REASON
from eerl.phases import ControllerState, PhaseKind, Workload
from eerl_sim import physics
from eerl_sim.profiles import H100_SXM

GRID_MHZ: tuple[int, ...] = H100_SXM.sm_clock_grid_mhz()
KINDS = (PhaseKind.GENERATION, PhaseKind.TRAINING)

# Per 1e6 tokens: compute work (MHz·s) and memory time (s) of each phase kind.
_SHAPE = {
    PhaseKind.GENERATION: (40_000.0, 45.0),
    PhaseKind.TRAINING: (30_000.0, 1.0),
}


def _power_capped_mhz(compute: float, memory: float) -> int:
    for clock in reversed(GRID_MHZ):
        if physics.segment_power_w(H100_SXM, compute, memory, float(clock)) <= H100_SXM.power_limit_w:
            return clock
    return GRID_MHZ[0]


@dataclass
class SyntheticJob:
    """Prices phases of a stationary, stepped or growing workload; noise is multiplicative and seeded."""

    tokens: int = 1_000_000
    noise: float = 0.0
    seed: int = 0
    gpus: int = 8
    step_at_iteration: int | None = None
    step_tokens_factor: float = 2.0
    step_memory_factor: float = 0.5
    step_longest_factor: float = 1.0
    """At the step the longest response grows by this factor (a raised response cap)."""
    alternate_every: int | None = None
    """With a step: the workload steps back and forth every this many iterations (regimes that return)."""
    growth_per_iteration: float = 0.0
    """The tokens (and the cost) grow by this fraction every iteration: responses lengthening."""
    outliers: dict[tuple[PhaseKind, int], float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    def stepped(self, iteration: int) -> bool:
        """Whether ``iteration`` runs the stepped workload."""
        if self.step_at_iteration is None or iteration < self.step_at_iteration:
            return False
        if self.alternate_every is None:
            return True
        return (iteration - self.step_at_iteration) // self.alternate_every % 2 == 0

    def workload(self, iteration: int) -> Workload:
        tokens, longest = int(self.tokens * (1.0 + self.growth_per_iteration) ** iteration), 8192
        if self.stepped(iteration):
            tokens = int(tokens * self.step_tokens_factor)
            longest = int(longest * self.step_longest_factor)
        return Workload(tokens=tokens, valid_tokens=tokens // 2, sequences=2048, max_response_tokens=longest)

    def segment(self, kind: PhaseKind, iteration: int) -> tuple[float, float]:
        compute, memory = _SHAPE[kind]
        if self.stepped(iteration):
            memory *= self.step_memory_factor
        scale = self.workload(iteration).tokens / 1e6
        return compute * scale, memory * scale

    def true_cost(self, kind: PhaseKind, iteration: int, sm_clock_mhz: int | None) -> tuple[float, float]:
        """Noise-free (duration_s, energy_j) of a phase at a lock (None: default governor)."""
        compute, memory = self.segment(kind, iteration)
        capped = _power_capped_mhz(compute, memory)
        clock = float(capped if sm_clock_mhz is None else min(sm_clock_mhz, capped))
        duration = physics.segment_duration_s(compute, memory, clock)
        power = physics.segment_power_w(H100_SXM, compute, memory, clock)
        return duration, power * duration * self.gpus

    def observe(
        self, kind: PhaseKind, iteration: int, sm_clock_mhz: int | None, now_s: float
    ) -> PhaseObservation:
        duration, energy = self.true_cost(kind, iteration, sm_clock_mhz)
        if self.noise:
            duration *= float(np.exp(self._rng.normal(0.0, self.noise)))
            energy *= float(np.exp(self._rng.normal(0.0, self.noise / 2)))
        factor = self.outliers.get((kind, iteration), 1.0)
        return PhaseObservation(
            kind=kind,
            iteration=iteration,
            workload=self.workload(iteration),
            duration_s=duration * factor,
            energy_j=energy * factor,
            sm_clock_mhz=sm_clock_mhz,
            gpus=self.gpus,
            end_time_s=now_s + duration,
        )


@dataclass
class Trace:
    """What a driven controller chose, per kind and iteration."""

    clocks: dict[PhaseKind, list[int | None]] = field(default_factory=lambda: {k: [] for k in KINDS})
    states: dict[PhaseKind, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})
    reasons: dict[PhaseKind, list[str]] = field(default_factory=lambda: {k: [] for k in KINDS})
    start: int = 0

    def committed_clocks(self, kind: PhaseKind, since: int = 0) -> set[int]:
        """The clocks held as commits from trace index ``since`` on (control phases and probes aside)."""
        rows = zip(
            self.clocks[kind][since:], self.states[kind][since:], self.reasons[kind][since:], strict=True
        )
        return {
            c
            for c, state, reason in rows
            if c is not None and state == ControllerState.COMMITTED.value and reason != PROBE_REASON
        }


def drive_sync(
    controller: Controller,
    job: SyntheticJob,
    iterations: int,
    kinds: tuple[PhaseKind, ...] = KINDS,
    start: int = 0,
) -> Trace:
    """Run a sync job from iteration ``start``: each iteration runs each kind in turn; the decisions."""
    trace = Trace(start=start)
    now_s = 0.0
    for i in range(start, start + iterations):
        for kind in kinds:
            decision = controller.decide(kind, i, None, now_s)
            trace.clocks[kind].append(decision.sm_clock_mhz)
            trace.states[kind].append(decision.state.value)
            trace.reasons[kind].append(decision.reason)
            observation = job.observe(kind, i, decision.sm_clock_mhz, now_s)
            now_s = observation.end_time_s
            controller.observe(observation, now_s)
    return trace


def iteration_ratios(
    job: SyntheticJob, clocks: dict[PhaseKind, int | None], iteration: int = 0
) -> tuple[float, float]:
    """True (throughput ratio, energy ratio) of a sync iteration at these clocks against the default."""
    time = energy = time0 = energy0 = 0.0
    for kind, clock in clocks.items():
        d, e = job.true_cost(kind, iteration, clock)
        d0, e0 = job.true_cost(kind, iteration, None)
        time, energy, time0, energy0 = time + d, energy + e, time0 + d0, energy0 + e0
    return time0 / time, energy / energy0


def oracle_energy_ratio(job: SyntheticJob, threshold: float, iteration: int = 0) -> float:
    """The lowest iteration energy ratio any fixed pair of grid clocks reaches at the threshold."""
    best = 1.0
    candidates: list[int | None] = [None, *GRID_MHZ[::3]]
    for g in candidates:
        for t in candidates:
            throughput, energy = iteration_ratios(
                job, {PhaseKind.GENERATION: g, PhaseKind.TRAINING: t}, iteration
            )
            if throughput >= threshold:
                best = min(best, energy)
    return best


def run_throughput(job: SyntheticJob, *traces: Trace, upto: int | None = None) -> float:
    """True throughput ratio of the traced run (its traces in order) against the default governor, over
    every phase from the first traced iteration (through iteration ``upto``, if given)."""
    time = time0 = 0.0
    for trace in traces:
        for kind, clocks in trace.clocks.items():
            for index, clock in enumerate(clocks):
                iteration = trace.start + index
                if upto is not None and iteration > upto:
                    break
                time += job.true_cost(kind, iteration, clock)[0]
                time0 += job.true_cost(kind, iteration, None)[0]
    return time0 / time
