"""The RL workload of the sim-model spec: what is random in an iteration, and the GPU segments it makes.

Common random numbers: every draw of iteration ``i`` comes from a NumPy Generator seeded with
``SeedSequence([seed, i, stream])`` — never from clocks or from what ran before — so a default-governor
run, a fixed-clock sweep and an online controller see the very same responses and the very same noise.
Streams: 0 = response lengths and validity (the rollout), 1 = generation noise, 2 = training noise,
6 and 7 = generation and training phase-level noise (one factor per phase and GPU; 3–5 are the nodes model's),
9 and 10 = the work between the phases (segment noise, phase-level noise; 8 is the bench's counter offsets).

Segments are stored per phase as flat arrays, GPU by GPU (``gpu_bounds[g]:gpu_bounds[g + 1]`` are GPU
``g``'s segments, in execution order), so the evaluator can price every segment at every clock at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from eerl.phases import Workload

from eerl_sim.scenario import BetweenSpec, GenerationSpec, TrainingSpec

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
BoolArray = npt.NDArray[np.bool_]

DECODE_BUCKET_TOKENS = 32
"""Decode steps simulated as one segment (the spec allows up to 32; tests hold it to 0.5% of 1)."""

WEIGHT_SYNC_MEM_ACTIVITY = 0.3
"""Memory activity of the weight-sync (communication) segment, per the spec."""

ROLLOUT_STREAM, GENERATION_NOISE_STREAM, TRAINING_NOISE_STREAM = 0, 1, 2
GENERATION_PHASE_NOISE_STREAM, TRAINING_PHASE_NOISE_STREAM = 6, 7
BETWEEN_NOISE_STREAM, BETWEEN_PHASE_NOISE_STREAM = 9, 10

FORWARD_PASS_COST_SHARE = 1.0 / 3.0
"""A forward pass costs a third of a training step per token (a backward pass costs about two forwards)."""


def iteration_rng(seed: int, iteration: int, stream: int) -> np.random.Generator:
    """The generator of one iteration's stream: depends on (seed, iteration, stream) only."""
    return np.random.default_rng(np.random.SeedSequence([seed, iteration, stream]))


@dataclass(frozen=True, slots=True, eq=False)
class Rollout:
    """The responses of one iteration: their lengths and which are valid for training.

    Response ``r`` answers prompt ``r // samples_per_prompt``; validity is decided per prompt (a group
    whose rewards all agree is dropped as a whole), as in GRPO-style training.
    """

    iteration: int
    prompt_tokens: int
    response_tokens: IntArray
    valid: BoolArray
    valid_fraction: float
    """The drawn fraction of valid prompts (before rounding to whole prompts)."""


@dataclass(frozen=True, slots=True, eq=False)
class Segments:
    """One phase's GPU work: per segment compute C (MHz·s), memory time M (s), memory-activity scale and
    the multiplicative noise on its duration and power; segments of GPU g are ``gpu_bounds[g]:[g+1]``."""

    compute_mhz_s: FloatArray
    memory_s: FloatArray
    mem_activity_scale: FloatArray
    duration_noise: FloatArray
    power_noise: FloatArray
    gpu_bounds: IntArray

    @property
    def gpus(self) -> int:
        """GPUs of the phase's pool (some may have no segment)."""
        return len(self.gpu_bounds) - 1

    @property
    def count(self) -> int:
        """Segments over all GPUs."""
        return len(self.compute_mhz_s)


def with_phase_noise(
    segments: Segments, rng: np.random.Generator, noise_phase_duration: float, noise_phase_power: float
) -> Segments:
    """The segments with one log-normal duration factor and one power factor per GPU, shared by all of that
    GPU's segments (sim-model "Phase-level noise"). Draw order: every GPU's duration, then every power."""
    gpus = segments.gpus
    duration = np.exp(noise_phase_duration * rng.standard_normal(gpus))
    power = np.exp(noise_phase_power * rng.standard_normal(gpus))
    per_segment = np.diff(segments.gpu_bounds)
    return Segments(
        segments.compute_mhz_s,
        segments.memory_s,
        segments.mem_activity_scale,
        segments.duration_noise * np.repeat(duration, per_segment),
        segments.power_noise * np.repeat(power, per_segment),
        segments.gpu_bounds,
    )


def draw_rollout(generation: GenerationSpec, training: TrainingSpec, seed: int, iteration: int) -> Rollout:
    """Response lengths (log-normal, capped) and validity (normal fraction, clipped to [0, 1])."""
    rng = iteration_rng(seed, iteration, ROLLOUT_STREAM)
    raw = rng.lognormal(
        mean=np.log(generation.response_median_tokens),
        sigma=generation.response_sigma,
        size=generation.responses,
    )
    lengths = np.clip(np.rint(raw), 1, generation.response_max_tokens).astype(np.int64)
    fraction = float(np.clip(rng.normal(training.valid_fraction_mean, training.valid_fraction_sd), 0.0, 1.0))
    valid_prompts = np.zeros(generation.prompts, dtype=np.bool_)
    valid_prompts[rng.permutation(generation.prompts)[: round(fraction * generation.prompts)]] = True
    valid = np.repeat(valid_prompts, generation.samples_per_prompt)
    return Rollout(iteration, generation.prompt_tokens, lengths, valid, fraction)


def split_bounds(items: int, gpus: int) -> IntArray:
    """Contiguous, as-even-as-possible blocks: item block of GPU g is ``bounds[g]:bounds[g + 1]``."""
    return (np.arange(gpus + 1, dtype=np.int64) * items) // gpus


def _noise(rng: np.random.Generator, sigma: float, count: int) -> FloatArray:
    if sigma <= 0:
        return np.ones(count)
    return np.exp(sigma * rng.standard_normal(count))


def _segments(
    per_gpu: list[tuple[FloatArray, FloatArray, FloatArray]],
    rng: np.random.Generator,
    noise_duration: float,
    noise_power: float,
) -> Segments:
    counts = np.array([len(c) for c, _, _ in per_gpu], dtype=np.int64)
    bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    total = int(bounds[-1])
    empty = np.zeros(0)
    compute = np.concatenate([c for c, _, _ in per_gpu]) if total else empty
    memory = np.concatenate([m for _, m, _ in per_gpu]) if total else empty
    scale = np.concatenate([s for _, _, s in per_gpu]) if total else empty
    # Duration noise first, then power noise: fixed order keeps the draws reproducible.
    duration_noise = _noise(rng, noise_duration, total)
    power_noise = _noise(rng, noise_power, total)
    return Segments(compute, memory, scale, duration_noise, power_noise, bounds)


def generation_segments(
    generation: GenerationSpec,
    rollout: Rollout,
    gpus: int,
    rng: np.random.Generator,
    *,
    noise_duration: float,
    noise_power: float,
    bucket_tokens: int = DECODE_BUCKET_TOKENS,
) -> Segments:
    """One prefill segment per GPU, then its decode steps in buckets of ``bucket_tokens`` steps.

    At step t a GPU's batch b(t) holds its responses longer than t, each with context prompt + t, so a
    bucket's work is the sum over its steps of ``C = c·b(t)`` and ``M = w + kv·b(t)·(prompt + t)``.
    Summing C and M of consecutive steps before the roofline is exact when their C/M ratio is equal and
    stays close while b(t) changes slowly (see tests/sim/test_workload.py for the 0.5% bound).
    """
    if bucket_tokens < 1:
        raise ValueError("bucket_tokens must be at least 1")
    lengths = rollout.response_tokens
    bounds = split_bounds(len(lengths), gpus)
    longest = int(lengths.max()) if len(lengths) else 0
    buckets = -(-longest // bucket_tokens)
    steps_padded = buckets * bucket_tokens
    # b[g, t] = responses of GPU g longer than t.
    gpu_of = np.repeat(np.arange(gpus), np.diff(bounds))
    width = steps_padded + 1
    finished = np.bincount(gpu_of * width + lengths, minlength=gpus * width).reshape(gpus, width)
    per_gpu_count = np.diff(bounds)
    batch = per_gpu_count[:, None] - np.cumsum(finished, axis=1)[:, :steps_padded]
    context = float(rollout.prompt_tokens) + np.arange(steps_padded, dtype=np.float64)
    shape = (gpus, buckets, bucket_tokens)
    batch_sum = batch.reshape(shape).sum(axis=2).astype(np.float64)
    context_sum = (batch * context).reshape(shape).sum(axis=2)
    steps = (batch > 0).reshape(shape).sum(axis=2).astype(np.float64)
    per_gpu: list[tuple[FloatArray, FloatArray, FloatArray]] = []
    for g in range(gpus):
        live = steps[g] > 0
        prefill_c = generation.prefill_compute_mhz_s_per_token * rollout.prompt_tokens * per_gpu_count[g]
        compute = np.concatenate([[prefill_c], generation.decode_compute_mhz_s_per_seq * batch_sum[g, live]])
        memory = np.concatenate(
            [
                [0.0],
                generation.decode_weight_s * steps[g, live]
                + generation.decode_kv_s_per_token * context_sum[g, live],
            ]
        )
        if per_gpu_count[g] == 0:
            compute, memory = np.zeros(0), np.zeros(0)
        per_gpu.append((compute, memory, np.ones(len(compute))))
    return _segments(per_gpu, rng, noise_duration, noise_power)


def training_segments(
    training: TrainingSpec,
    rollout: Rollout | None,
    gpus: int,
    rng: np.random.Generator,
    *,
    noise_duration: float,
    noise_power: float,
) -> Segments:
    """Per GPU: ``micro_batches`` compute segments over an even share of the valid (prompt + response)
    tokens (sequence balancing, as verl does), then the optimizer step and the weight sync.

    With no rollout (async warm-up) or no valid response there is no training step: no segment at all.
    """
    tokens = 0.0 if rollout is None else float(training_tokens(rollout))
    if tokens <= 0:
        empty = np.zeros(0)
        return _segments([(empty, empty, empty)] * gpus, rng, noise_duration, noise_power)
    micro_tokens = tokens / (gpus * training.micro_batches)
    compute = np.concatenate(
        [np.full(training.micro_batches, training.train_compute_mhz_s_per_token * micro_tokens), [0.0, 0.0]]
    )
    memory = np.concatenate(
        [
            np.full(training.micro_batches, training.train_memory_s_per_token * micro_tokens),
            [training.optimizer_s, training.weight_sync_s],
        ]
    )
    scale = np.concatenate([np.ones(training.micro_batches + 1), [WEIGHT_SYNC_MEM_ACTIVITY]])
    return _segments([(compute, memory, scale)] * gpus, rng, noise_duration, noise_power)


def between_segments(
    training: TrainingSpec,
    between: BetweenSpec,
    rollout: Rollout,
    gpus: int,
    rng: np.random.Generator,
    *,
    noise_duration: float,
    noise_power: float,
) -> Segments:
    """Per GPU: ``forward_passes`` passes of ``micro_batches`` segments over an even share of the training
    tokens, each at a third of a training segment's compute and memory, then ``fixed_s`` of memory-bound
    work (sim-model "Work between the phases"). No work: no segment at all."""
    tokens = float(training_tokens(rollout))
    micro_tokens = tokens / (gpus * training.micro_batches)
    passes = between.forward_passes * training.micro_batches if tokens > 0 else 0
    share = FORWARD_PASS_COST_SHARE * micro_tokens
    compute = np.full(passes, share * training.train_compute_mhz_s_per_token)
    memory = np.full(passes, share * training.train_memory_s_per_token)
    if between.fixed_s > 0:
        compute = np.append(compute, 0.0)
        memory = np.append(memory, between.fixed_s)
    per_gpu = (compute, memory, np.ones(len(compute)))
    return _segments([per_gpu] * gpus, rng, noise_duration, noise_power)


def training_tokens(rollout: Rollout) -> int:
    """Prompt + response tokens of the valid responses."""
    valid = rollout.valid
    return int(rollout.response_tokens[valid].sum()) + rollout.prompt_tokens * int(valid.sum())


def valid_tokens(rollout: Rollout | None) -> int:
    """Response tokens of the valid responses: the figure of merit's denominator."""
    return 0 if rollout is None else int(rollout.response_tokens[rollout.valid].sum())


def step_reads(generation: GenerationSpec) -> float:
    """One decode step's weight read in KV-cache tokens of the simulated model: ``decode_weight_s`` over
    ``decode_kv_s_per_token`` (what a hook derives from the model's parameters and attention shape); 0 when
    reading the KV cache costs nothing (the reads are then Σ length² / 2 alone)."""
    if generation.decode_kv_s_per_token <= 0:
        return 0.0
    return generation.decode_weight_s / generation.decode_kv_s_per_token


def generation_workload(rollout: Rollout, gpus: int, *, reads_per_step: float) -> Workload:
    """Generation's workload. ``valid_tokens`` is 0: validity is known only after the rewards, and the
    iteration's valid tokens are credited once, to the training phase that trains on them.
    ``max_worker_kv_tokens`` is the busiest of the ``gpus`` workers' decode reads (their responses split
    as :func:`generation_segments` splits them), as a hook that knows each worker's responses and its
    model reports it (``eerl.integrations.decode_reads``): ``reads_per_step`` KV-cache tokens for
    each decode step (the worker's longest response; :func:`step_reads` of the generation spec) plus
    Σ length² / 2."""
    lengths = rollout.response_tokens
    bounds = split_bounds(len(lengths), max(gpus, 1))
    squares = lengths.astype(np.float64) ** 2 / 2.0
    per_worker = np.add.reduceat(squares, bounds[:-1]) if len(lengths) else np.zeros(1)
    if len(lengths):
        per_worker = per_worker + reads_per_step * np.maximum.reduceat(lengths, bounds[:-1])
    per_worker[np.diff(bounds) == 0] = 0.0  # reduceat gives an empty block its neighbour's value
    return Workload(
        tokens=int(lengths.sum()),
        valid_tokens=0,
        sequences=len(lengths),
        max_response_tokens=int(lengths.max()) if len(lengths) else 0,
        prompt_tokens=rollout.prompt_tokens * len(lengths),
        max_worker_kv_tokens=int(per_worker.max()),
    )


def training_workload(rollout: Rollout | None) -> Workload:
    """Training's workload: the valid responses (all zero when there is nothing to train on)."""
    if rollout is None:
        return Workload(tokens=0)
    valid_lengths = rollout.response_tokens[rollout.valid]
    return Workload(
        tokens=training_tokens(rollout),
        valid_tokens=int(valid_lengths.sum()),
        sequences=len(valid_lengths),
        max_response_tokens=int(valid_lengths.max()) if len(valid_lengths) else 0,
        prompt_tokens=rollout.prompt_tokens * len(valid_lengths),
    )
