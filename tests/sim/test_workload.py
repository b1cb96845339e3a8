"""Workload sampling: deterministic per (seed, iteration), common to every clock, and bucketed faithfully."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from eerl.integrations._counting import decode_reads
from eerl.phases import PhaseKind
from eerl_sim.evaluate import evaluate_phase, sample_iteration
from eerl_sim.scenario import Scenario
from eerl_sim.workload import draw_rollout, step_reads

from .conftest import quiet


def _with_seed(scenario: Scenario, seed: int) -> Scenario:
    return dataclasses.replace(scenario, workload=dataclasses.replace(scenario.workload, seed=seed))


class TestDeterminism:
    def test_the_same_seed_and_iteration_give_the_same_sample(self, sync_h100: Scenario) -> None:
        first, second = sample_iteration(sync_h100, 7), sample_iteration(sync_h100, 7)
        assert np.array_equal(first.rollout.response_tokens, second.rollout.response_tokens)
        assert np.array_equal(
            first.generation.segments.duration_noise, second.generation.segments.duration_noise
        )
        assert first.training.workload == second.training.workload

    def test_an_iteration_does_not_depend_on_which_iterations_were_sampled_before(
        self, sync_h100: Scenario
    ) -> None:
        alone = sample_iteration(sync_h100, 5)
        for i in range(5):
            sample_iteration(sync_h100, i)
        after = sample_iteration(sync_h100, 5)
        assert np.array_equal(alone.generation.segments.power_noise, after.generation.segments.power_noise)

    def test_different_iterations_and_seeds_draw_different_responses(self, sync_h100: Scenario) -> None:
        base = sample_iteration(sync_h100, 0).rollout.response_tokens
        assert not np.array_equal(base, sample_iteration(sync_h100, 1).rollout.response_tokens)
        assert not np.array_equal(base, sample_iteration(_with_seed(sync_h100, 2), 0).rollout.response_tokens)

    def test_a_phase_priced_alone_equals_the_same_clock_priced_among_others(
        self, sync_h100: Scenario
    ) -> None:
        sample = sample_iteration(sync_h100, 3)
        alone = evaluate_phase(sync_h100, sample, PhaseKind.GENERATION, [1200])
        among = evaluate_phase(sync_h100, sample, PhaseKind.GENERATION, [None, 900, 1200, 1500])
        assert alone.duration_s[0] == pytest.approx(among.duration_s[2], rel=1e-12)
        assert alone.energy_j[0] == pytest.approx(among.energy_j[2], rel=1e-12)


class TestRollout:
    def test_lengths_are_capped_at_the_maximum(self, sync_h100: Scenario) -> None:
        spec = sync_h100.workload.generation
        lengths = draw_rollout(spec, sync_h100.workload.training, 1, 0).response_tokens
        assert lengths.max() <= spec.response_max_tokens
        assert lengths.min() >= 1

    def test_the_median_length_follows_the_spec(self, sync_h100: Scenario) -> None:
        spec = sync_h100.workload.generation
        lengths = draw_rollout(spec, sync_h100.workload.training, 1, 0).response_tokens
        assert 0.9 * spec.response_median_tokens <= np.median(lengths) <= 1.1 * spec.response_median_tokens

    def test_validity_is_decided_per_prompt_group(self, sync_h100: Scenario) -> None:
        spec = sync_h100.workload.generation
        valid = draw_rollout(spec, sync_h100.workload.training, 1, 0).valid
        groups = valid.reshape(spec.prompts, spec.samples_per_prompt)
        assert np.all(groups.all(axis=1) | ~groups.any(axis=1))
        assert 0.4 <= valid.mean() <= 0.95


class TestWorkloads:
    def test_generation_reports_the_generated_tokens_and_no_valid_tokens(self, sync_h100: Scenario) -> None:
        sample = sample_iteration(sync_h100, 0)
        workload = sample.generation.workload
        assert workload.tokens == int(sample.rollout.response_tokens.sum())
        assert workload.sequences == 2048
        assert workload.max_response_tokens == int(sample.rollout.response_tokens.max())
        assert workload.prompt_tokens == 2048 * 512
        assert workload.valid_tokens == 0

    def test_generation_reports_the_busiest_workers_decode_reads(self, sync_h100: Scenario) -> None:
        """The largest, over the 8 GPUs' contiguous blocks of responses, of their decode reads as a hook
        reports them (the client's ``decode_reads``), each step's weight read at the model's own ratio."""
        sample = sample_iteration(sync_h100, 0)
        lengths = sample.rollout.response_tokens.astype(np.int64)
        generation = sync_h100.workload.generation
        reads_per_step = generation.decode_weight_s / generation.decode_kv_s_per_token
        assert step_reads(generation) == pytest.approx(reads_per_step)
        per_gpu = [decode_reads(block.tolist(), reads_per_step) for block in np.array_split(lengths, 8)]
        assert abs(sample.generation.workload.max_worker_kv_tokens - max(per_gpu)) <= 2
        assert max(per_gpu) > 1.02 * min(per_gpu)  # the workers differ: the figure says which is busiest
        squares_alone = max(int((block**2).sum()) // 2 for block in np.array_split(lengths, 8))
        assert sample.generation.workload.max_worker_kv_tokens > squares_alone + reads_per_step * 1000

    def test_training_reports_the_valid_responses(self, sync_h100: Scenario) -> None:
        sample = sample_iteration(sync_h100, 0)
        valid = sample.rollout.valid
        lengths = sample.rollout.response_tokens
        workload = sample.training.workload
        assert workload.valid_tokens == int(lengths[valid].sum()) == sample.valid_tokens
        assert workload.tokens == int(lengths[valid].sum()) + 512 * int(valid.sum())
        assert workload.sequences == int(valid.sum())

    def test_async_training_trains_on_the_rollout_of_staleness_iterations_back(
        self, async_h100: Scenario
    ) -> None:
        earlier = sample_iteration(async_h100, 4)
        later = sample_iteration(async_h100, 5)
        assert later.trained_rollout is not None
        assert np.array_equal(later.trained_rollout.response_tokens, earlier.rollout.response_tokens)
        assert later.training.workload.valid_tokens == int(
            earlier.rollout.response_tokens[earlier.rollout.valid].sum()
        )

    def test_the_first_async_iteration_has_nothing_to_train(self, async_h100: Scenario) -> None:
        first = sample_iteration(async_h100, 0)
        assert first.trained_rollout is None
        assert first.valid_tokens == 0
        outcome = evaluate_phase(async_h100, first, PhaseKind.TRAINING, [None])
        assert outcome.duration_s[0] == 0.0
        assert outcome.energy_j[0] == 0.0

    def test_async_generation_splits_the_rollout_over_its_pool_only(self, async_h100: Scenario) -> None:
        assert sample_iteration(async_h100, 0).generation.segments.gpus == 4

    def test_training_ends_with_an_optimizer_step_and_a_weight_sync(self, sync_h100: Scenario) -> None:
        segments = sample_iteration(sync_h100, 0).training.segments
        last_two = slice(segments.gpu_bounds[1] - 2, segments.gpu_bounds[1])
        assert np.all(segments.compute_mhz_s[last_two] == 0)
        assert list(segments.memory_s[last_two]) == [1.5, 2.0]
        assert list(segments.mem_activity_scale[last_two]) == [1.0, 0.3]


class TestBucketing:
    @pytest.mark.parametrize("iteration", [0, 1])
    def test_32_token_buckets_stay_within_half_a_percent_of_step_by_step(
        self, reference: Scenario, iteration: int
    ) -> None:
        scenario = quiet(reference)
        clocks: list[int | None] = [None, 1500, 1200, 900, 600]
        step = sample_iteration(scenario, iteration, decode_bucket_tokens=1)
        bucketed = sample_iteration(scenario, iteration, decode_bucket_tokens=32)
        exact = evaluate_phase(scenario, step, PhaseKind.GENERATION, clocks)
        approx = evaluate_phase(scenario, bucketed, PhaseKind.GENERATION, clocks)
        assert np.all(np.abs(approx.duration_s / exact.duration_s - 1) <= 0.005)
        assert np.all(np.abs(approx.energy_j / exact.energy_j - 1) <= 0.005)

    def test_buckets_keep_the_decode_work_exactly(self, sync_h100: Scenario) -> None:
        step = sample_iteration(sync_h100, 0, decode_bucket_tokens=1).generation.segments
        bucketed = sample_iteration(sync_h100, 0, decode_bucket_tokens=32).generation.segments
        assert bucketed.compute_mhz_s.sum() == pytest.approx(step.compute_mhz_s.sum())
        assert bucketed.memory_s.sum() == pytest.approx(step.memory_s.sum())
        assert bucketed.count < step.count / 20
