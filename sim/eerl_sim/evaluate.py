"""Virtual-time evaluation: the duration and energy of a phase at any set of SM clocks at once.

This is the API the controller benchmark drives. An iteration is sampled once (all its randomness and
all its segments, independent of clocks) and then priced at as many clocks as wanted: every segment at
every requested clock in one NumPy expression, the same noise draw for every clock.

Clock rules (sim-model spec): the default governor (``None``) runs each segment at the highest grid clock
whose power stays within ``power_limit_w``; a lock ``f`` runs it at ``min(f, that clock)``. The power
limiter sees the actual (noisy) power. So the default governor is exactly a lock at the top grid clock,
which is how it is evaluated.

Clock switch (approximation): when ``previous_sm_clock_mhz`` differs from the requested clock, each GPU
runs the first ``clock_switch_ms`` of its first segment at the previous clock (both capped by power): a
fraction ``φ = min(1, window / d_old)`` of that segment's work is priced at the old clock and the rest at
the new one. ``previous_sm_clock_mhz=None`` means no switch; to model a switch away from the default
governor pass the profile's top clock, which is what the default governor runs at.

Energy of a phase covers every GPU of its pool for the whole phase: a GPU that finishes before the
slowest one waits at ``idle_power_w``.

The clock grid and the pricing itself are :mod:`eerl_sim.pricing`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TypeVar

import numpy as np
from eerl.phases import ExecutionMode, PhaseKind, Workload

from eerl_sim.pricing import (
    BetweenSample,
    PhaseSample,
    clock_grid,
    clock_indices,
    power_capped_index,
    price_work,
    with_idle_waits,
)
from eerl_sim.profiles import GpuProfile
from eerl_sim.scenario import Scenario, WorkloadSpec
from eerl_sim.workload import (
    BETWEEN_NOISE_STREAM,
    BETWEEN_PHASE_NOISE_STREAM,
    DECODE_BUCKET_TOKENS,
    GENERATION_NOISE_STREAM,
    GENERATION_PHASE_NOISE_STREAM,
    TRAINING_NOISE_STREAM,
    TRAINING_PHASE_NOISE_STREAM,
    FloatArray,
    IntArray,
    Rollout,
    Segments,
    between_segments,
    draw_rollout,
    generation_segments,
    generation_workload,
    iteration_rng,
    step_reads,
    training_segments,
    training_workload,
    with_phase_noise,
)
from eerld.errors import InvalidArgument

ProgressCallback = Callable[[int, int], None]
"""Called as ``progress(done, total)`` after each iteration of a long evaluation."""


@dataclass(frozen=True, slots=True, eq=False)
class IterationSample:
    """Everything random about one iteration, fixed before any clock is chosen.

    ``rollout`` is generated in this iteration; ``trained_rollout`` is what this iteration's training
    step trains on (the same rollout in sync mode; the one ``staleness`` iterations back in async mode,
    ``None`` during the first ``staleness`` iterations, whose training pool has nothing to do).
    """

    iteration: int
    generation: PhaseSample
    training: PhaseSample
    rollout: Rollout
    trained_rollout: Rollout | None
    between: BetweenSample | None = None
    """The work between the phases (None: the scenario has none)."""

    @property
    def valid_tokens(self) -> int:
        """Valid training tokens credited to this iteration (those its training step trains on)."""
        return self.training.workload.valid_tokens

    def phase(self, kind: PhaseKind) -> PhaseSample:
        """The sample of one phase kind."""
        return self.generation if kind is PhaseKind.GENERATION else self.training


@dataclass(frozen=True, slots=True, eq=False)
class PhaseOutcome:
    """A phase priced at K clocks: arrays indexed like ``sm_clocks_mhz``.

    ``energy_j`` covers all GPUs of the pool, idle waits for the slowest GPU included; ``mean_clock_mhz``
    is the time-weighted clock over the segments that ran (0 when none did).
    """

    kind: PhaseKind
    sm_clocks_mhz: tuple[int | None, ...]
    duration_s: FloatArray
    energy_j: FloatArray
    mean_clock_mhz: FloatArray
    gpus: int
    workload: Workload
    gpu_busy_s: FloatArray
    """``[gpu, clock]``: each GPU's busy time (it then waits at idle power until the phase ends)."""
    gpu_busy_energy_j: FloatArray
    """``[gpu, clock]``: each GPU's energy while busy (idle wait excluded)."""


def sample_iteration(
    scenario: Scenario, iteration: int, *, decode_bucket_tokens: int = DECODE_BUCKET_TOKENS
) -> IterationSample:
    """All draws and segments of ``iteration``; depends on (scenario, iteration) only, so callers may cache
    it (it is immutable and its arrays are read-only)."""
    spec = scenario.workload
    profile = scenario.gpu
    current = spec.at_iteration(iteration)
    rollout = draw_rollout(current.generation, current.training, spec.seed, iteration)
    trained: Rollout | None = rollout
    if spec.staleness:
        source = iteration - spec.staleness
        if source < 0:
            trained = None
        else:
            past = spec.at_iteration(source)
            trained = draw_rollout(past.generation, past.training, spec.seed, source)
    noise = {"noise_duration": profile.noise_duration, "noise_power": profile.noise_power}
    gen_segments = generation_segments(
        current.generation,
        rollout,
        spec.pool_gpus(PhaseKind.GENERATION),
        iteration_rng(spec.seed, iteration, GENERATION_NOISE_STREAM),
        bucket_tokens=decode_bucket_tokens,
        **noise,
    )
    train_segments = training_segments(
        current.training,
        trained,
        spec.pool_gpus(PhaseKind.TRAINING),
        iteration_rng(spec.seed, iteration, TRAINING_NOISE_STREAM),
        **noise,
    )
    if spec.nodes is None:
        # Phase-level noise per GPU (sim-model spec); a multi-node scenario draws it per node and GPU in
        # eerl_sim.nodes instead, so it is not drawn twice.
        gen_segments = with_phase_noise(
            gen_segments,
            iteration_rng(spec.seed, iteration, GENERATION_PHASE_NOISE_STREAM),
            profile.noise_phase_duration,
            profile.noise_phase_power,
        )
        train_segments = with_phase_noise(
            train_segments,
            iteration_rng(spec.seed, iteration, TRAINING_PHASE_NOISE_STREAM),
            profile.noise_phase_duration,
            profile.noise_phase_power,
        )
    between: BetweenSample | None = None
    if not spec.between.empty:
        work = with_phase_noise(
            between_segments(
                current.training,
                spec.between,
                rollout,
                spec.gpus,
                iteration_rng(spec.seed, iteration, BETWEEN_NOISE_STREAM),
                **noise,
            ),
            iteration_rng(spec.seed, iteration, BETWEEN_PHASE_NOISE_STREAM),
            profile.noise_phase_duration,
            profile.noise_phase_power,
        )
        _freeze(work)
        between = BetweenSample(work, _capped(profile, work))
    return IterationSample(
        iteration=iteration,
        generation=_phase_sample(
            profile,
            PhaseKind.GENERATION,
            gen_segments,
            generation_workload(
                rollout,
                spec.pool_gpus(PhaseKind.GENERATION),
                reads_per_step=step_reads(current.generation),
            ),
        ),
        training=_phase_sample(profile, PhaseKind.TRAINING, train_segments, training_workload(trained)),
        rollout=rollout,
        trained_rollout=trained,
        between=between,
    )


def _phase_sample(
    profile: GpuProfile, kind: PhaseKind, segments: Segments, workload: Workload
) -> PhaseSample:
    _freeze(segments)
    return PhaseSample(kind, segments, workload, _capped(profile, segments))


def _freeze(segments: Segments) -> None:
    for array in (
        segments.compute_mhz_s,
        segments.memory_s,
        segments.mem_activity_scale,
        segments.duration_noise,
        segments.power_noise,
        segments.gpu_bounds,
    ):
        array.setflags(write=False)


def _capped(profile: GpuProfile, segments: Segments) -> IntArray:
    capped = power_capped_index(profile, segments)
    capped.setflags(write=False)
    return capped


def evaluate_phase(
    scenario: Scenario,
    sample: IterationSample,
    kind: PhaseKind,
    sm_clocks_mhz: Sequence[int | None],
    previous_sm_clock_mhz: int | None = None,
) -> PhaseOutcome:
    """Duration, energy and mean clock of one phase at each requested clock (None: default governor)."""
    profile = scenario.gpu
    phase = sample.phase(kind)
    segments = phase.segments
    requested = clock_indices(profile, sm_clocks_mhz)
    clocks = tuple(sm_clocks_mhz)
    gpus = segments.gpus
    if segments.count == 0 or len(requested) == 0:
        zeros = np.zeros(len(requested))
        per_gpu = np.zeros((gpus, len(requested)))
        return PhaseOutcome(
            kind, clocks, zeros, zeros.copy(), zeros.copy(), gpus, phase.workload, per_gpu, per_gpu.copy()
        )

    busy, gpu_energy, clock_time = price_work(profile, phase, requested, previous_sm_clock_mhz)
    phase_duration, energy = with_idle_waits(profile, busy, gpu_energy)
    total_busy = busy.sum(axis=0)
    mean_clock = np.divide(
        clock_time.sum(axis=0), total_busy, out=np.zeros_like(total_busy), where=total_busy > 0
    )
    return PhaseOutcome(
        kind=kind,
        sm_clocks_mhz=clocks,
        duration_s=phase_duration,
        energy_j=energy,
        mean_clock_mhz=mean_clock,
        gpus=gpus,
        workload=phase.workload,
        gpu_busy_s=busy,
        gpu_busy_energy_j=gpu_energy,
    )


@dataclass(frozen=True, slots=True, eq=False)
class BetweenOutcome:
    """The work between the phases, run at the default governor (the lock ends with its phase): its
    duration (the slowest GPU's) and the energy of every GPU over it, idle waits included."""

    duration_s: float
    energy_j: float
    gpu_busy_s: FloatArray
    """Per GPU: busy time (it then waits at idle power until the slowest GPU is done)."""
    gpu_busy_energy_j: FloatArray


def evaluate_between(
    scenario: Scenario,
    sample: IterationSample,
    previous_sm_clock_mhz: int | None = None,
    *,
    held_sm_clock_mhz: int | None = None,
) -> BetweenOutcome:
    """The iteration's work between the phases at the default governor; ``previous_sm_clock_mhz`` is the
    lock of the phase before it, which holds for the reset's ``clock_switch_ms`` (None: no switch).

    ``held_sm_clock_mhz`` prices the counterfactual a daemon that kept the phase's lock would give (the
    work at that lock), for the comparison in ``perf/whole_iterations.py``; the bench never uses it.
    """
    profile = scenario.gpu
    gpus = scenario.workload.gpus
    work = sample.between
    if work is None or work.segments.count == 0:
        return BetweenOutcome(0.0, 0.0, np.zeros(gpus), np.zeros(gpus))
    requested = clock_indices(profile, [held_sm_clock_mhz])
    busy, gpu_energy, _ = price_work(profile, work, requested, previous_sm_clock_mhz)
    duration, energy = with_idle_waits(profile, busy, gpu_energy)
    return BetweenOutcome(float(duration[0]), float(energy[0]), busy[:, 0], gpu_energy[:, 0])


def between_at_clocks(
    scenario: Scenario, sample: IterationSample, sm_clocks_mhz: Sequence[int | None]
) -> tuple[FloatArray, FloatArray]:
    """The work between the phases with each clock held through it (a lock that outlives the phases, such as
    an admin's ``nvidia-smi -lgc``): duration and energy per clock, no switch (zeros without any work)."""
    work = sample.between
    if work is None or work.segments.count == 0:
        return np.zeros(len(sm_clocks_mhz)), np.zeros(len(sm_clocks_mhz))
    busy, gpu_energy, _ = price_work(scenario.gpu, work, clock_indices(scenario.gpu, sm_clocks_mhz), None)
    return with_idle_waits(scenario.gpu, busy, gpu_energy)


_Work = TypeVar("_Work", PhaseSample, BetweenSample)


def under_power_limit(scenario: Scenario, sample: IterationSample, power_limit_w: float) -> IterationSample:
    """The same draws with the GPUs' power limit at ``power_limit_w`` (``nvidia-smi -pl``): every segment's
    power-limited clock found again; price it with a scenario whose profile has that limit."""
    profile = scenario.gpu.with_overrides({"power_limit_w": power_limit_w})

    def recapped(work: _Work) -> _Work:
        return replace(work, capped_index=_capped(profile, work.segments))

    between = sample.between
    return replace(
        sample,
        generation=recapped(sample.generation),
        training=recapped(sample.training),
        between=None if between is None else recapped(between),
    )


def combine_phases(
    workload: WorkloadSpec,
    idle_power_w: float,
    *,
    generation_duration_s: FloatArray,
    generation_energy_j: FloatArray,
    training_duration_s: FloatArray,
    training_energy_j: FloatArray,
    between_duration_s: FloatArray | float = 0.0,
    between_energy_j: FloatArray | float = 0.0,
) -> tuple[FloatArray, FloatArray]:
    """Wall time and energy of an iteration from its two phases (NumPy broadcasting applies).

    Sync: the phases and the work between them follow each other on the same GPUs, so all add. Async: they
    run at once on their pools; the iteration lasts as long as the slower pool, and the faster pool's GPUs
    wait at idle power for the rest (that idle energy is included). GPUs in neither pool are not part of
    the job.
    """
    if workload.mode is ExecutionMode.SYNC:
        return (
            generation_duration_s + between_duration_s + training_duration_s,
            generation_energy_j + between_energy_j + training_energy_j,
        )
    wall = np.maximum(generation_duration_s, training_duration_s)
    idle = idle_power_w * (
        workload.pool_gpus(PhaseKind.GENERATION) * (wall - generation_duration_s)
        + workload.pool_gpus(PhaseKind.TRAINING) * (wall - training_duration_s)
    )
    return wall, generation_energy_j + training_energy_j + idle


@dataclass(frozen=True, slots=True, eq=False)
class IterationTotals:
    """One iteration at K clock pairs: wall time, energy (idle waits included) and valid tokens."""

    wall_s: FloatArray
    energy_j: FloatArray
    valid_tokens: int


def iteration_totals(
    scenario: Scenario,
    generation: PhaseOutcome,
    training: PhaseOutcome,
    between: BetweenOutcome | None = None,
) -> IterationTotals:
    """Combine two outcomes of the same iteration (and the work between them), pairing their clock columns
    element-wise."""
    wall, energy = combine_phases(
        scenario.workload,
        scenario.gpu.idle_power_w,
        generation_duration_s=generation.duration_s,
        generation_energy_j=generation.energy_j,
        training_duration_s=training.duration_s,
        training_energy_j=training.energy_j,
        between_duration_s=0.0 if between is None else between.duration_s,
        between_energy_j=0.0 if between is None else between.energy_j,
    )
    return IterationTotals(wall, energy, training.workload.valid_tokens)


class RunFigures:
    """The figure of merit and throughput of any run total that has energy, wall time and valid tokens."""

    __slots__ = ()
    energy_j: float
    wall_s: float
    valid_tokens: int

    @property
    def energy_per_valid_token_j(self) -> float:
        """The figure of merit: GPU energy (all GPUs, all phases, idle included) per valid token."""
        return self.energy_j / self.valid_tokens if self.valid_tokens else float("inf")

    @property
    def throughput_tokens_per_s(self) -> float:
        """Valid training tokens per second of wall time."""
        return self.valid_tokens / self.wall_s if self.wall_s > 0 else 0.0


@dataclass(frozen=True, slots=True, eq=False)
class RunResult(RunFigures):
    """A whole run at fixed clocks: totals and per-iteration arrays."""

    scenario: str
    generation_sm_clock_mhz: int | None
    training_sm_clock_mhz: int | None
    iterations: int
    energy_j: float
    wall_s: float
    valid_tokens: int
    iteration_wall_s: FloatArray
    iteration_energy_j: FloatArray
    iteration_valid_tokens: IntArray
    generation_duration_s: FloatArray
    generation_energy_j: FloatArray
    generation_mean_clock_mhz: FloatArray
    training_duration_s: FloatArray
    training_energy_j: FloatArray
    training_mean_clock_mhz: FloatArray


def run_fixed(
    scenario: Scenario,
    clocks: Mapping[PhaseKind, int | None],
    iterations: int | None = None,
    progress: ProgressCallback | None = None,
    *,
    samples: Sequence[IterationSample] | None = None,
) -> RunResult:
    """Run the scenario with one fixed clock per phase kind (missing or None: default governor).

    Sync: each phase starts right after the other phase on the same GPUs, so it pays the clock switch
    from the other phase's clock; the work between generation and training runs at the default governor
    (the daemon releases a phase's lock when it ends), so it pays the reset's switch from generation's
    clock and training then switches from the default. Async: each pool keeps its clock, so there is no
    switch. ``samples``
    (``sample_iteration(scenario, i)`` for the first iterations) lets several runs share the sampling,
    which costs more than pricing a phase at one clock.
    """
    count = scenario.workload.iterations if iterations is None else iterations
    if samples is not None and len(samples) < count:
        raise InvalidArgument(f"run_fixed: {len(samples)} samples for {count} iterations")
    gen_clock = clocks.get(PhaseKind.GENERATION)
    train_clock = clocks.get(PhaseKind.TRAINING)
    sync = scenario.workload.mode is ExecutionMode.SYNC
    top = int(clock_grid(scenario.gpu).sm_clocks_mhz[-1])

    def as_lock(sm_clock_mhz: int | None) -> int:
        # The default governor runs at what a lock at the top clock gives (see the module doc).
        return top if sm_clock_mhz is None else sm_clock_mhz

    columns: dict[str, list[float]] = {
        k: [] for k in ("gd", "ge", "gc", "td", "te", "tc", "wall", "energy", "valid")
    }
    for i in range(count):
        sample = sample_iteration(scenario, i) if samples is None else samples[i]
        gen_previous = as_lock(train_clock) if sync and i > 0 else None
        gen = evaluate_phase(scenario, sample, PhaseKind.GENERATION, [gen_clock], gen_previous)
        between = evaluate_between(scenario, sample, as_lock(gen_clock))
        train_previous = (top if between.duration_s > 0 else as_lock(gen_clock)) if sync else None
        train = evaluate_phase(scenario, sample, PhaseKind.TRAINING, [train_clock], train_previous)
        totals = iteration_totals(scenario, gen, train, between)
        for key, value in (
            ("gd", gen.duration_s[0]),
            ("ge", gen.energy_j[0]),
            ("gc", gen.mean_clock_mhz[0]),
            ("td", train.duration_s[0]),
            ("te", train.energy_j[0]),
            ("tc", train.mean_clock_mhz[0]),
            ("wall", totals.wall_s[0]),
            ("energy", totals.energy_j[0]),
            ("valid", totals.valid_tokens),
        ):
            columns[key].append(float(value))
        if progress is not None:
            progress(i + 1, count)
    arrays = {k: np.array(v) for k, v in columns.items()}
    return RunResult(
        scenario=scenario.name,
        generation_sm_clock_mhz=gen_clock,
        training_sm_clock_mhz=train_clock,
        iterations=count,
        energy_j=float(arrays["energy"].sum()),
        wall_s=float(arrays["wall"].sum()),
        valid_tokens=int(arrays["valid"].sum()),
        iteration_wall_s=arrays["wall"],
        iteration_energy_j=arrays["energy"],
        iteration_valid_tokens=arrays["valid"].astype(np.int64),
        generation_duration_s=arrays["gd"],
        generation_energy_j=arrays["ge"],
        generation_mean_clock_mhz=arrays["gc"],
        training_duration_s=arrays["td"],
        training_energy_j=arrays["te"],
        training_mean_clock_mhz=arrays["tc"],
    )
