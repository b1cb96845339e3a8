# ruff: noqa: PLC0415 - the v1 trainer exists only from verl 0.9: its modules are imported in its tests
"""The verl hook against the installed verl (0.9.1: v1 and legacy trainers; 0.8.0: legacy only).

What runs: the contract (classes, methods, signatures, the call sites in ``fit``/``_step_once`` the hook
relies on), token counts on verl's own batch types (``DataProto``, ``TensorDict``, transfer_queue's
``KVBatchMeta``), and, on the v1 trainer, the real ``PPOTrainerSync.step`` → ``_step_once`` →
``on_sample_end`` → ``_update_actor`` driven with its remote parts (replay buffer/rollout, worker group,
checkpoint engine, log-prob and advantage computations) replaced by local stand-ins.

``max_worker_kv_tokens``: verl's own ``LLMServerManager`` counts the rollout replicas (from its default
config and a worker group's size) that decide whether the agent loop has one engine, its
``GlobalRequestLoadBalancer`` shows that the server of a request depends on what is in flight, and its
``dispatch_lazy_compute_data_proto`` / ``collect_lazy_compute_data_proto`` show which rows of a batch each
data-parallel rollout rank decodes.
"""

from __future__ import annotations

import asyncio
import inspect
import os
import re
from types import SimpleNamespace
from typing import Any

import eerl.integrations.verl as hook_module
import pytest
import torch
from eerl.integrations._counting import decode_reads, mask_decode_reads
from eerl.phases import PhaseKind, Workload
from packaging.version import Version
from tensordict import TensorDict
from verl import DataProto
from verl.single_controller.base.worker_group import WorkerGroup
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.workers.rollout.llm_server import LLMServerManager

from tests.frameworks.conftest import Recorder

ATTENTION = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
RESPONSES = torch.zeros((2, 3), dtype=torch.long)
# Prompts: 3 columns left-padded (2 + 3 tokens); responses: 3 columns right-padded (2 + 3 tokens).
LEGACY = Workload(tokens=10, valid_tokens=5, sequences=2, max_response_tokens=3, prompt_tokens=5)


def _params(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


def is_v1(version: str) -> bool:
    return Version(version) >= Version("0.9")


class TestLegacyTrainerContract:
    def test_the_methods_the_hook_wraps_exist_with_the_signatures_it_assumes(
        self, framework_version: str
    ) -> None:
        assert _params(RayPPOTrainer._update_actor) == ["self", "batch"]
        assert callable(RayPPOTrainer._validate)
        assert callable(RayPPOTrainer.init_workers)
        fit = inspect.getsource(RayPPOTrainer.fit)
        assert 'marked_timer("gen"' in fit
        assert "self.async_rollout_manager.generate_sequences(" in fit
        assert "self._update_actor(batch)" in fit
        assert "self.global_steps" in fit
        assert "self.async_rollout_manager = " in inspect.getsource(RayPPOTrainer.init_workers)

    def test_dataproto_from_the_rollout_counts_its_response_and_prompt_tokens(self) -> None:
        output = DataProto.from_dict(tensors={"responses": RESPONSES, "attention_mask": ATTENTION})
        assert hook_module.batch_workload(output) == LEGACY
        masked = DataProto.from_dict(
            tensors={"responses": RESPONSES, "attention_mask": ATTENTION, "response_mask": ATTENTION[:, -3:]}
        )
        assert hook_module.batch_workload(masked) == LEGACY
        assert hook_module.batch_workload(masked.batch) == LEGACY
        assert isinstance(masked.batch, TensorDict)

    def test_the_hook_on_a_legacy_trainer_reports_its_rollout_and_update(self, recorder: Recorder) -> None:
        trainer = object.__new__(RayPPOTrainer)
        calls: list[str] = []

        class Manager:
            def generate_sequences(self, prompts: DataProto) -> DataProto:
                calls.append("generate")
                return DataProto.from_dict(tensors={"responses": RESPONSES, "attention_mask": ATTENTION})

        trainer.async_rollout_manager = Manager()
        trainer.actor_rollout_wg = None
        trainer.global_steps = 3
        trainer._update_actor = lambda batch: calls.append("update") or batch  # type: ignore[method-assign]
        hook = hook_module.instrument(trainer, recorder)
        assert hook.variant == hook_module.LEGACY
        out = trainer.async_rollout_manager.generate_sequences(DataProto())
        trainer._update_actor(out)
        assert calls == ["generate", "update"]
        assert [(p.kind, p.iteration, p.workload) for p in recorder.phases] == [
            (PhaseKind.GENERATION, 3, Workload(5, 0, 2, 3, 5)),
            (PhaseKind.TRAINING, 3, LEGACY),
        ]


class TestV1Trainer:
    @pytest.fixture(autouse=True)
    def _v1_only(self, framework_version: str) -> None:
        if not is_v1(framework_version):
            pytest.fail("the v1 tests are selected only for verl >= 0.9 (see test_v1_is_absent_before_0_9)")

    def test_the_callbacks_and_methods_the_hook_wraps_exist(self) -> None:
        from verl.trainer.ppo.v1 import PPOTrainer, get_trainer_cls
        from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer

        for name in ("on_sample_begin", "on_sample_end", "on_init_end"):
            assert _params(getattr(PPOTrainer, name)) == ["self"]
        assert _params(PPOTrainer._update_actor) == ["self", "batch", "metrics"]
        assert _params(ReplayBuffer.sample) == ["self", "global_steps", "partition_id", "batch_size"]
        step = inspect.getsource(PPOTrainer._step_once)
        order = [
            step.index(s)
            for s in (
                'marked_timer("gen"',
                "self.on_sample_begin()",
                "self.replay_buffer.sample(",
                "self.on_sample_end()",
                "self._update_actor(batch",
            )
        ]
        assert order == sorted(order)
        assert "self.replay_buffer = " in inspect.getsource(PPOTrainer.__init__)
        assert "self.trainer_mode = " in inspect.getsource(PPOTrainer.__init__)
        for mode in ("sync", "colocate_async", "separate_async"):
            assert issubclass(get_trainer_cls(mode), PPOTrainer)
        assert 'partition_id="val"' in inspect.getsource(PPOTrainer._validate)

    def test_the_rollouts_tags_carry_the_lengths_the_hook_counts(self) -> None:
        from verl.trainer.ppo.v1 import agent_loop_tq

        source = inspect.getsource(agent_loop_tq)
        assert '"prompt_len": prompt_len' in source
        assert '"response_len": response_len' in source

    def test_kvbatchmeta_counts_its_tags_without_the_padding(self) -> None:
        from transfer_queue.metadata import KVBatchMeta

        batch = KVBatchMeta(
            keys=["a", "b", "pad"],
            tags=[
                {"prompt_len": 3, "response_len": 2, "seq_len": 5},
                {"prompt_len": 2, "response_len": 3, "seq_len": 5},
                {"prompt_len": 1, "response_len": 1, "seq_len": 2, "is_padding": True},
            ],
            partition_id="train",
        )
        assert hook_module.batch_workload(batch) == LEGACY

    @pytest.mark.parametrize(
        ("replicas", "kv"), [(None, 0), (1, decode_reads([2, 3])), (2, 0)], ids=["none", "one", "two"]
    )
    def test_the_real_sync_trainers_step_reports_a_generation_and_a_training_phase(
        self, recorder: Recorder, replicas: int | None, kv: int
    ) -> None:
        """With one rollout replica its generation phase also reports the tags' decode reads."""
        from omegaconf import OmegaConf
        from transfer_queue.metadata import KVBatchMeta
        from verl.trainer.ppo.v1 import PPOTrainerSync

        tags = [
            {"prompt_len": 3, "response_len": 2, "seq_len": 5},
            {"prompt_len": 2, "response_len": 3, "seq_len": 5},
        ]
        events: list[str] = []

        class LocalReplayBuffer:  # stands in for the TransferQueue-backed buffer and the rollout behind it
            def sample(
                self, global_steps: int, partition_id: str, batch_size: int
            ) -> tuple[KVBatchMeta, dict[str, float]]:
                events.append(f"sample {partition_id}")
                return KVBatchMeta(
                    keys=[f"k{global_steps}a", f"k{global_steps}b"], tags=tags, partition_id=partition_id
                ), {}

        class LocalWorkers:  # stands in for the actor worker group (Ray)
            def update_actor(self, batch: KVBatchMeta) -> dict[str, Any]:
                events.append("update_actor")
                return {"metrics": {"mfu": 0.5, "pg_loss": 0.1}}

        class LocalCheckpointEngine:
            def sleep_replicas(self) -> None:
                events.append("sleep_replicas")

            def update_weights(self, step: int) -> None:
                events.append("update_weights")

        trainer = object.__new__(PPOTrainerSync)
        trainer.config = OmegaConf.create(
            {
                "data": {"train_batch_size": 2},
                "trainer": {"critic_warmup": 0},
                "actor_rollout_ref": {
                    "rollout": {"temperature": 1.0, "n": 1},
                    "actor": {
                        "ppo_mini_batch_size": 2,
                        "calculate_entropy": False,
                        "entropy_coeff": 0.0,
                        "ppo_epochs": 1,
                        "data_loader_seed": 0,
                        "shuffle": False,
                    },
                },
            }
        )
        trainer.parameter_sync_step = 1
        trainer.trainer_mode = "sync"
        trainer.global_steps = 1
        trainer.curr_step_profile = False
        trainer.use_reference_policy = trainer.use_critic = False
        trainer.replay_buffer = LocalReplayBuffer()
        trainer.actor_rollout_wg = LocalWorkers()
        trainer.checkpoint_manager = LocalCheckpointEngine()
        trainer.reward_loop_manager = type("R", (), {"reward_loop_worker_handles": ["remote"]})()
        if replicas is not None:  # the hybrid replicas _setup makes: the trainer's GPUs at tensor parallel 2
            trainer.llm_server_manager = server_manager(world_size=2 * replicas, tensor_parallel=2)
        # The log-prob and advantage computations read tensors from TransferQueue: identity stand-ins.
        trainer.prepare_step = dict  # type: ignore[method-assign]
        for name in ("_balance_batch", "_compute_old_log_prob", "_compute_advantage"):
            setattr(trainer, name, lambda batch, metrics=None, **kw: batch)

        hook = hook_module.instrument(trainer, recorder)
        assert hook.variant == hook_module.V1
        for step in (1, 2):
            trainer.global_steps = step
            trainer.step({}, {})
        assert events[:3] == ["sample train", "sleep_replicas", "update_actor"]
        v1 = Workload(tokens=10, valid_tokens=5, sequences=2, max_response_tokens=3, prompt_tokens=5)
        gen = Workload(tokens=5, sequences=2, max_response_tokens=3, prompt_tokens=5, max_worker_kv_tokens=kv)
        assert [(p.kind, p.iteration, p.workload) for p in recorder.phases] == [
            (PhaseKind.GENERATION, 1, gen),
            (PhaseKind.TRAINING, 1, v1),
            (PhaseKind.GENERATION, 2, gen),
            (PhaseKind.TRAINING, 2, v1),
        ]
        hook.remove()
        assert "on_sample_begin" not in vars(trainer)


def rollout_config(tensor_parallel: int, data_parallel: int = 1, disaggregation: bool = False) -> Any:
    """verl's own default trainer config (``_generated_ppo_trainer.yaml``), with these rollout sizes."""
    import verl
    from omegaconf import OmegaConf

    path = os.path.join(os.path.dirname(verl.__file__), "trainer", "config", "_generated_ppo_trainer.yaml")
    config = OmegaConf.load(path)
    rollout = config.actor_rollout_ref.rollout
    rollout.name = "vllm"
    rollout.tensor_model_parallel_size = tensor_parallel
    rollout.data_parallel_size = data_parallel
    rollout.disaggregation.enabled = disaggregation
    return config


class LocalReplica:
    """Stands in for a vLLM ``RolloutReplica`` (its server is a Ray actor on the GPUs): nothing launched."""

    def __init__(self, replica_rank: int, config: Any, model_config: Any, gpus_per_node: int) -> None:
        self.replica_rank = replica_rank
        self._server_handle = object()
        self._server_address = f"replica-{replica_rank}"

    async def init_hybrid(self, worker_group: Any) -> None:
        return None


def server_manager(
    world_size: int, tensor_parallel: int, data_parallel: int = 1, disaggregation: bool = False
) -> LLMServerManager:
    """verl's own ``LLMServerManager`` over a worker group of ``world_size`` GPUs: its
    ``_initialize_llm_servers`` decides how many replicas there are, as in ``init_workers``."""
    manager = object.__new__(LLMServerManager)
    manager.rollout_replica_class = LocalReplica  # the hook verl leaves for recipes
    manager.__init__(  # type: ignore[misc]
        config=rollout_config(tensor_parallel, data_parallel, disaggregation),
        worker_group=SimpleNamespace(world_size=world_size),
    )
    asyncio.run(manager._initialize_llm_servers())
    return manager


# Four responses of 4, 1, 2 and 2 tokens.
RESPONSE_MASK = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0], [1, 1, 0, 0], [1, 1, 0, 0]])


def rollout_output() -> DataProto:
    attention = torch.cat([torch.ones((4, 2), dtype=torch.long), RESPONSE_MASK], dim=1)
    return DataProto.from_dict(
        tensors={"responses": torch.zeros((4, 4), dtype=torch.long), "attention_mask": attention}
    )


class TestMaxWorkerKvTokens:
    @pytest.mark.parametrize(
        ("world_size", "tensor_parallel", "data_parallel", "disaggregation", "engines"),
        [
            (2, 2, 1, False, 1),
            (1, 1, 1, False, 1),
            (4, 2, 1, False, None),
            (2, 1, 2, False, None),
            (4, 1, 1, True, None),
        ],
        ids=["one replica", "one gpu", "two replicas", "dp engines in one replica", "prefill/decode"],
    )
    def test_the_agent_loop_has_one_engine_only_when_verl_makes_one_replica_of_one_engine(
        self,
        world_size: int,
        tensor_parallel: int,
        data_parallel: int,
        disaggregation: bool,
        engines: int | None,
    ) -> None:
        manager = server_manager(world_size, tensor_parallel, data_parallel, disaggregation)
        assert hook_module._server_engines(SimpleNamespace(llm_server_manager=manager)) == engines

    def test_init_workers_keeps_the_server_manager_on_the_trainer(self, framework_version: str) -> None:
        assert "self.llm_server_manager = LLMServerManager.create(" in inspect.getsource(
            RayPPOTrainer.init_workers
        )
        assert "self.rollout_config = config.actor_rollout_ref.rollout" in inspect.getsource(
            LLMServerManager.__init__
        )
        if is_v1(framework_version):
            from verl.trainer.ppo.v1.trainer_base import PPOTrainer

            assert (
                "self.llm_server_manager: LLMServerManager = LLMServerManager.create("
                in inspect.getsource(PPOTrainer)
            )

    def test_a_requests_server_depends_on_what_is_in_flight_and_no_sample_names_it(
        self, framework_version: str
    ) -> None:
        """Why several engines report 0: the balancer picks the least-loaded server as each request arrives
        (verl 0.9: router.py; 0.8: llm_server.py, a Ray actor), and the agent loop's outputs drop the
        server id (``LLMServerClient.generate`` only releases it)."""
        if is_v1(framework_version):
            from verl.workers.rollout.router import GlobalRequestLoadBalancer
        else:
            from verl.workers.rollout.llm_server import GlobalRequestLoadBalancer
        from verl.experimental.agent_loop import agent_loop
        from verl.workers.rollout.llm_server import LLMServerClient

        balancer_cls = getattr(GlobalRequestLoadBalancer, "__ray_actor_class__", GlobalRequestLoadBalancer)
        balancer = balancer_cls(servers={"s0": "h0", "s1": "h1"})
        first, _ = balancer.acquire_server(request_id="a")
        second, _ = balancer.acquire_server(request_id="b")  # "a" in flight: the other server
        assert {first, second} == {"s0", "s1"}
        balancer.release_server(server_id=second)
        assert balancer.acquire_server(request_id="c")[0] == second  # "b" done: its server is the free one
        assert "server_id" not in inspect.getsource(agent_loop.AgentLoopWorker)
        assert "_release_server(" in inspect.getsource(LLMServerClient.generate)
        if is_v1(framework_version):
            from verl.trainer.ppo.v1 import agent_loop_tq

            assert "server_id" not in inspect.getsource(agent_loop_tq)

    def test_each_data_parallel_rank_decodes_the_contiguous_chunk_verls_dispatch_hands_it(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``make_nd_compute_dataproto_dispatch_fn(mesh_name="rollout")``, as verl 0.6/0.7 register the worker
        group's ``generate_sequences``, on four ranks at tensor parallel 2: two engines."""
        import verl.utils.ray_utils
        from verl.single_controller.base.decorator import (
            collect_lazy_compute_data_proto,
            dispatch_lazy_compute_data_proto,
        )

        monkeypatch.setattr(verl.utils.ray_utils, "parallel_put", lambda data, max_workers=None: list(data))
        workers = object.__new__(WorkerGroup)
        workers._workers = [object()] * 4
        workers._dispatch_info = {"rollout": [0, 0, 1, 1]}
        workers._collect_info = {"rollout": [True, False, True, False]}
        output = rollout_output()
        (per_rank,), _ = dispatch_lazy_compute_data_proto("rollout", workers, output)
        decoded = [per_rank[0], per_rank[2]]  # one engine per data-parallel rank
        assert torch.equal(
            collect_lazy_compute_data_proto("rollout", workers, per_rank).batch["responses"],
            output.batch["responses"],
        )
        expected = max(mask_decode_reads(chunk.batch["attention_mask"][:, -4:]) for chunk in decoded)
        assert expected == decode_reads([4, 1])
        assert hook_module._dp_engines(workers) == 2
        assert hook_module.generation_workload(output, 2).max_worker_kv_tokens == expected
        assert hook_module._dp_engines(object.__new__(WorkerGroup)) is None

    def test_an_uneven_batch_splits_as_dataproto_chunk_splits_it(self) -> None:
        """Five rows on two engines: 3 and 2, as ``DataProto.chunk`` splits a batch whose padding is enabled
        (otherwise verl's dispatch asserts that the batch divides evenly)."""
        mask = torch.cat([RESPONSE_MASK, torch.tensor([[1, 1, 1, 0]])])
        output = DataProto.from_dict(tensors={"responses": torch.zeros((5, 4)), "response_mask": mask})
        output.meta_info["_verl_auto_padding"] = True  # lets DataProto.chunk split unevenly
        chunks = output.chunk(2)
        assert [len(chunk) for chunk in chunks] == [3, 2]
        expected = max(mask_decode_reads(chunk.batch["response_mask"]) for chunk in chunks)
        assert expected == decode_reads([4, 1, 2])
        assert hook_module.generation_workload(output, 2).max_worker_kv_tokens == expected


def test_v1_is_absent_before_0_9(framework_version: str) -> None:
    """verl 0.8 has only the legacy trainer; the hook takes that path there."""
    import importlib.util

    assert (importlib.util.find_spec("verl.trainer.ppo.v1") is not None) == is_v1(framework_version)


def test_a_trainer_it_cannot_hook_warns_naming_this_verl_version(
    framework_version: str, recorder: Recorder
) -> None:
    from eerl.integrations import HookWarning

    with pytest.warns(HookWarning, match=rf"\(verl {re.escape(framework_version)}[,)].*init_workers"):
        hook_module.instrument(object.__new__(RayPPOTrainer), recorder)
