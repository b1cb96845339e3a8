"""The verl hook's ``max_worker_kv_tokens`` on stand-in trainers shaped like verl's (no verl installed).

How verl splits a rollout batch across its engines decides what the hook can report: the agent loop's
servers are picked per request by a load balancer and named by no sample (so only one engine is
known-busiest: the only one), while the worker group's rollout hands data-parallel rank ``r`` the ``r``-th
contiguous chunk. The real classes and source: tests/frameworks/test_verl.py.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import eerl
import eerl.integrations.verl as verl_hook
import numpy as np
import pytest
from eerl import ClientConfig, PhaseKind, Workload
from eerl.integrations._counting import (
    DEFAULT_STEP_READS,
    as_ints,
    busiest_decode_reads,
    contiguous_chunks,
    decode_reads,
    row_lengths,
)
from eerl.testing import FakeDaemon

from ._verl_v1 import V1VerlTrainer

# Four responses of 4, 1, 2 and 2 tokens (right-padded to 4 columns) after 2-token prompts.
RESPONSE_MASK = np.array([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]])
ATTENTION = np.concatenate([np.ones((4, 2), dtype=int), RESPONSE_MASK], axis=1)
WHOLE_BATCH_KV = decode_reads([4, 1, 2, 2])


def server_manager(replicas: int = 1, data_parallel_size: int = 1, disaggregation: bool = False) -> Any:
    """verl 0.8/0.9's ``LLMServerManager`` as the hook reads it: its replicas and its rollout config."""
    config = SimpleNamespace(
        data_parallel_size=data_parallel_size, disaggregation=SimpleNamespace(enabled=disaggregation)
    )
    return SimpleNamespace(rollout_config=config, get_replicas=lambda: [object()] * replicas)


class DataProto:
    def __init__(self, **tensors: Any) -> None:
        self.batch = dict(tensors)


def rollout_output() -> DataProto:
    return DataProto(responses=np.zeros((4, 4)), attention_mask=ATTENTION, response_mask=RESPONSE_MASK)


class Rollout:
    """``async_rollout_manager`` (agent loop) or ``actor_rollout_wg`` (worker group, ``_dispatch_info``)."""

    def __init__(self, dispatch_info: dict[str, Any] | None = None) -> None:
        if dispatch_info is not None:
            self._dispatch_info = dispatch_info

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        return rollout_output()

    def update_actor(self, batch: DataProto) -> str:
        return "metrics"


class AgentLoopTrainer:
    """The legacy RayPPOTrainer of verl 0.8/0.9: the agent-loop manager and its ``llm_server_manager``."""

    def __init__(self, manager: Any) -> None:
        self.global_steps = 0
        self.async_rollout_manager = Rollout()
        self.actor_rollout_wg = Rollout()
        self.llm_server_manager = manager

    def _update_actor(self, batch: DataProto) -> str:
        return "metrics"

    def fit(self, steps: int) -> None:
        for step in range(1, steps + 1):
            self.global_steps = step
            self._update_actor(self.async_rollout_manager.generate_sequences(DataProto()))


class WorkerGroupTrainer:
    """verl 0.6/0.7 in sync rollout mode: ``actor_rollout_wg.generate_sequences`` (no agent loop)."""

    def __init__(self, dispatch_info: dict[str, Any] | None) -> None:
        self.global_steps = 0
        self.actor_rollout_wg = Rollout(dispatch_info)
        self.async_rollout_manager = None

    def fit(self, steps: int) -> None:
        for step in range(1, steps + 1):
            self.global_steps = step
            self.actor_rollout_wg.update_actor(self.actor_rollout_wg.generate_sequences(DataProto()))


def _generation_kv(trainer: Any, fake: FakeDaemon, config: ClientConfig) -> list[int]:
    with eerl.connect(gpus=[0], config=config) as session:
        hook = verl_hook.instrument(trainer, session)
        trainer.fit(2)
        hook.remove()
        assert session.flush(5)
    ends = [p.workload for p in fake.phases if not p.begin and p.kind is PhaseKind.GENERATION]
    assert len(ends) == 2
    return [w.max_worker_kv_tokens for w in ends]


class TestAgentLoopRollout:
    def test_one_engine_decoded_the_whole_batch(self, fake: FakeDaemon, config: ClientConfig) -> None:
        assert _generation_kv(AgentLoopTrainer(server_manager()), fake, config) == [WHOLE_BATCH_KV] * 2

    @pytest.mark.parametrize(
        "manager",
        [
            server_manager(replicas=2),
            server_manager(data_parallel_size=2),
            server_manager(disaggregation=True),
            None,
        ],
        ids=["two replicas", "data-parallel engines in the replica", "prefill/decode disaggregation", "none"],
    )
    def test_several_engines_or_none_known_report_zero_not_a_guess(
        self, manager: Any, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        """The load balancer picks each request's server as it arrives; no sample names it."""
        assert _generation_kv(AgentLoopTrainer(manager), fake, config) == [0, 0]

    def test_the_v1_trainers_one_engine_reads_the_tags_padding_left_out(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        trainer = V1VerlTrainer(llm_server_manager=server_manager())
        assert _generation_kv(trainer, fake, config) == [decode_reads([2, 3])] * 2  # V1_TAGS, padding out

    def test_the_v1_trainers_two_replicas_report_zero(self, fake: FakeDaemon, config: ClientConfig) -> None:
        trainer = V1VerlTrainer(llm_server_manager=server_manager(replicas=2))
        assert _generation_kv(trainer, fake, config) == [0, 0]

    def test_a_config_that_breaks_the_lookup_reports_zero_and_the_rest(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        def broken() -> list[Any]:
            raise RuntimeError("replicas gone")

        manager = server_manager()
        manager.get_replicas = broken
        assert _generation_kv(AgentLoopTrainer(manager), fake, config) == [0, 0]
        generation = next(p.workload for p in fake.phases if not p.begin)
        assert (generation.tokens, generation.sequences) == (9, 4)


class TestWorkerGroupRollout:
    def test_each_data_parallel_rank_decoded_its_contiguous_chunk(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        """Four ranks at tensor parallel 2: two engines, the first decoding rows 0-1 (4 and 1 tokens)."""
        trainer = WorkerGroupTrainer({"rollout": [0, 0, 1, 1]})
        assert _generation_kv(trainer, fake, config) == [decode_reads([4, 1])] * 2

    def test_without_verls_dispatch_mapping_it_reports_zero(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        """verl < 0.6 (``Dispatch.DP_COMPUTE_PROTO``) keeps no mapping."""
        assert _generation_kv(WorkerGroupTrainer(None), fake, config) == [0, 0]

    @pytest.mark.parametrize("mapping", [[], "0011", [0, -1], [0, True]])
    def test_a_mapping_unlike_verls_reports_zero(
        self, mapping: Any, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        assert _generation_kv(WorkerGroupTrainer({"rollout": mapping}), fake, config) == [0, 0]


class TestGenerationWorkload:
    def test_the_engines_split_the_batch_as_dataproto_chunk_does(self) -> None:
        output = rollout_output()
        assert verl_hook.generation_workload(output, 1).max_worker_kv_tokens == WHOLE_BATCH_KV
        assert verl_hook.generation_workload(output, 3).max_worker_kv_tokens == decode_reads([4, 1])  # [2,2]
        assert verl_hook.generation_workload(output, 4).max_worker_kv_tokens == decode_reads([4])
        assert verl_hook.generation_workload(output, None) == Workload(
            tokens=9, sequences=4, max_response_tokens=4, prompt_tokens=8
        )


class TestCounting:
    def test_row_lengths_are_in_row_order(self) -> None:
        assert row_lengths(RESPONSE_MASK) == [4, 1, 2, 2]
        assert row_lengths(RESPONSE_MASK.tolist()) == [4, 1, 2, 2]
        assert row_lengths(None) == []
        assert row_lengths(np.zeros((0, 3))) == []

    def test_decode_reads_are_a_weight_read_per_step_and_each_responses_length_squared_over_two(self) -> None:
        assert decode_reads([4, 1], reads_per_step=100.0) == 100 * 4 + (16 + 1) // 2
        assert decode_reads([4, 1]) == int(DEFAULT_STEP_READS * 4) + 8
        assert decode_reads([]) == 0

    def test_a_hook_of_your_own_finds_the_decode_reads_in_eerl_integrations(self) -> None:
        import eerl.integrations as public  # noqa: PLC0415 - what a user's own hook imports

        assert public.decode_reads([4, 1], 100.0) == 408
        assert public.busiest_decode_reads([[6], [4, 4, 4]], 1.0) == 28
        assert public.DEFAULT_STEP_READS == DEFAULT_STEP_READS
        exported = {"decode_reads", "busiest_decode_reads", "model_step_reads", "step_reads"}
        assert exported <= set(public.__all__)

    def test_the_busiest_worker_is_the_one_with_the_most_decode_reads(self) -> None:
        # [6] decodes 6 steps, [4, 4, 4] reads more KV cache (24 vs 18): which one the phase waits for
        # depends on what a step's weight read costs.
        groups = [[6], [4, 4, 4], []]
        assert busiest_decode_reads(groups, reads_per_step=100.0) == 600 + 18
        assert busiest_decode_reads(groups, reads_per_step=1.0) == 4 + 24
        assert busiest_decode_reads([]) == 0

    def test_contiguous_chunks_split_like_torch_chunk(self) -> None:
        assert contiguous_chunks([1, 2, 3, 4, 5], 2) == [[1, 2, 3], [4, 5]]
        assert contiguous_chunks([1, 2], 4) == [[1], [2]]
        assert contiguous_chunks([], 3) == []
        with pytest.raises(ValueError, match="positive"):
            contiguous_chunks([1], 0)

    def test_as_ints_takes_float_lengths(self) -> None:
        assert as_ints(np.array([2.0, 3.0])) == [2, 3]
        assert as_ints(None) == []
