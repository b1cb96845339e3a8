# ruff: noqa: PLC0415 - the v1 trainer exists only from verl 0.9: its modules are imported in its tests
"""The verl hook against the installed verl (0.9.1: v1 and legacy trainers; 0.8.0: legacy only).

What runs: the contract (classes, methods, signatures, the call sites in ``fit``/``_step_once`` the hook
relies on), token counts on verl's own batch types (``DataProto``, ``TensorDict``, transfer_queue's
``KVBatchMeta``), and, on the v1 trainer, the real ``PPOTrainerSync.step`` → ``_step_once`` →
``on_sample_end`` → ``_update_actor`` driven with its remote parts (replay buffer/rollout, worker group,
checkpoint engine, log-prob and advantage computations) replaced by local stand-ins.
"""

from __future__ import annotations

import inspect
import re
from typing import Any

import eerl.integrations.verl as hook_module
import pytest
import torch
from eerl.phases import PhaseKind, Workload
from packaging.version import Version
from tensordict import TensorDict
from verl import DataProto
from verl.trainer.ppo.ray_trainer import RayPPOTrainer

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

    def test_the_real_sync_trainers_step_reports_a_generation_and_a_training_phase(
        self, recorder: Recorder
    ) -> None:
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
        gen = Workload(tokens=5, sequences=2, max_response_tokens=3, prompt_tokens=5)
        assert [(p.kind, p.iteration, p.workload) for p in recorder.phases] == [
            (PhaseKind.GENERATION, 1, gen),
            (PhaseKind.TRAINING, 1, v1),
            (PhaseKind.GENERATION, 2, gen),
            (PhaseKind.TRAINING, 2, v1),
        ]
        hook.remove()
        assert "on_sample_begin" not in vars(trainer)


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
