"""The SkyRL hook against the installed ``skyrl`` release (0.4.0, 0.3.0): ``RayPPOTrainer`` and the fully
async trainer.

What runs: the contract (the methods the hook wraps, their signatures and their call sites in ``train``),
token counts on SkyRL's own ``TrainingInputBatch``, and the real ``RayPPOTrainer.train`` loop driven on the
CPU with the release's own config (``SkyRLTrainConfig``), ``prepare_generator_input``, ``generate`` (with
``validate_generator_output``), ``postprocess_generator_output``, ``convert_to_training_input``,
``compute_advantages_and_returns`` and ``train_critic_and_policy`` → ``_execute_training_step``. Local
stand-ins replace what needs GPUs or a Ray cluster: the generator (the vLLM engines: canned responses),
the worker dispatch (``WorkerDispatch``: forward, forward_backward, optim_step, weight sync), the
inference client's ``sleep`` and the tracker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
from types import SimpleNamespace
from typing import Any

import eerl
import eerl.integrations.skyrl as hook_module
import pytest
import torch
from eerl.integrations import HookWarning
from eerl.integrations._counting import decode_reads
from eerl.phases import PhaseKind, Workload
from skyrl.backends.skyrl_train.training_batch import TrainingInputBatch
from skyrl.train.config import SkyRLTrainConfig
from skyrl.train.fully_async_trainer import FullyAsyncRayPPOTrainer
from skyrl.train.trainer import RayPPOTrainer
from skyrl.train.utils.callbacks import CallbackHandler, TrainingControl

from tests.client.conftest import fast
from tests.frameworks.conftest import GENERATION_MHZ, TRAINING_MHZ, Recorder, SimWork, assert_commits

PROMPTS = [[11, 12, 13], [21, 22]]  # one per prompt; each prompt sampled twice
RESPONSES = [[1, 2], [3, 4, 5, 6], [7], [8, 9, 10]]  # (2 + 4) for prompt 0, (1 + 3) for prompt 1
GENERATION = Workload(tokens=10, sequences=4, max_response_tokens=4, prompt_tokens=10)
TRAINING = Workload(tokens=20, valid_tokens=10, sequences=4, max_response_tokens=4, prompt_tokens=10)


def _params(function: Any) -> list[str]:
    return list(inspect.signature(function).parameters)


class TestContract:
    def test_the_methods_the_hook_wraps_exist_with_the_signatures_it_assumes(
        self, framework_version: str
    ) -> None:
        assert inspect.iscoroutinefunction(inspect.unwrap(RayPPOTrainer.generate))
        assert _params(RayPPOTrainer.generate) == ["self", "input_batch"]
        assert _params(RayPPOTrainer.train_critic_and_policy) == ["self", "data"]
        train = inspect.getsource(RayPPOTrainer.train)
        assert 'with Timer("generate", self.all_timings):' in train
        assert "generator_output: GeneratorOutput = await self.generate(generator_input)" in train
        assert 'with Timer("train_critic_and_policy", self.all_timings):' in train
        assert "status = self.train_critic_and_policy(training_input)" in train
        assert "self.global_step += 1" in train

    def test_evaluation_calls_the_generator_not_the_trainers_generate(self) -> None:
        from skyrl.train import evaluate  # noqa: PLC0415 - read for its source only

        source = inspect.getsource(evaluate)
        assert "await generator.generate(generator_input)" in source
        assert "self.generate(" not in source
        assert "trainer.generate(" not in source

    def test_the_fully_async_trainer_generates_in_background_and_trains_through_the_same_method(self) -> None:
        assert callable(FullyAsyncRayPPOTrainer._run_generate_for_a_group_loop)
        assert "self.generator.generate(" in inspect.getsource(
            FullyAsyncRayPPOTrainer._run_generate_for_a_group_loop
        )
        assert "self.train_critic_and_policy, training_input" in inspect.getsource(
            FullyAsyncRayPPOTrainer._run_training
        )

    def test_the_one_engine_rule_reads_the_releases_config_fields(self) -> None:
        engine = SkyRLTrainConfig().generator.inference_engine
        assert (
            engine.run_engines_locally,
            engine.num_engines,
            engine.data_parallel_size,
            engine.enable_pd,
        ) == (
            True,
            1,
            1,
            False,
        )
        assert hook_module._one_engine(SimpleNamespace(cfg=SkyRLTrainConfig()))
        engine.num_engines = 2
        config = SkyRLTrainConfig()
        config.generator.inference_engine.num_engines = 2
        assert not hook_module._one_engine(SimpleNamespace(cfg=config))

    def test_a_training_input_batch_counts_its_masks(self) -> None:
        batch = TrainingInputBatch(
            {
                "attention_mask": torch.tensor([[0, 1, 1, 1, 1], [1, 1, 1, 1, 0]]),
                "response_mask": torch.tensor([[1, 1], [1, 0]]),
                "loss_mask": torch.tensor([[1, 0], [1, 0]]),
            }
        )
        assert hook_module.training_workload(batch) == Workload(
            tokens=8, valid_tokens=2, sequences=2, max_response_tokens=2, prompt_tokens=5
        )

    def test_an_object_it_cannot_hook_warns_naming_this_version(
        self, framework_version: str, recorder: Recorder
    ) -> None:
        with pytest.warns(HookWarning, match=rf"\(skyrl {framework_version}\)"):
            hook = hook_module.instrument(object(), recorder)
        assert hook.variant == ""


class LocalGenerator:
    """Stands in for SkyRL's generator (the vLLM engines): canned responses in ``GeneratorOutput`` form."""

    def __init__(self, work: SimWork | None = None) -> None:
        self.calls = 0
        self.work = work

    async def generate(self, input_batch: dict[str, Any]) -> dict[str, Any]:
        self.calls += 1
        if self.work is not None:
            self.work.run(PhaseKind.GENERATION)
        n = len(input_batch["prompts"])
        assert n == len(RESPONSES)
        return {
            "prompt_token_ids": [PROMPTS[i // 2] for i in range(n)],
            "response_ids": [list(r) for r in RESPONSES],
            "rewards": [1.0, 0.0, 0.5, 0.25],
            "loss_masks": [[1] * len(r) for r in RESPONSES],
            "stop_reasons": ["stop"] * n,
            "rollout_metrics": {"generate/mean": 1.0},
            "rollout_logprobs": None,
        }


class LocalDispatch:
    """Stands in for ``WorkerDispatch`` (the Ray worker groups): one data-parallel rank, nothing remote."""

    def __init__(self, work: SimWork | None = None) -> None:
        self.calls: list[str] = []
        self.work = work

    def get_lcm_dp_size(self) -> int:
        return 1

    async def save_weights_for_sampler(self) -> None:
        self.calls.append("save_weights_for_sampler")

    def get_timing_metrics(self) -> dict[str, float]:
        return {}

    def finalize_pending_saves(self, model: str) -> None:
        self.calls.append(f"finalize_pending_saves:{model}")

    def empty_cache(self, model: str | None = None) -> None:
        return None

    def forward(self, model: str, data: Any) -> Any:
        self.calls.append(f"forward:{model}")
        width = int(data.metadata["response_length"])
        return SimpleNamespace(
            loss_fn_outputs=[{"logprobs": [0.0] * width} for _ in range(len(data["sequences"]))]
        )

    def stage_data(self, model: str, data: Any, boundaries: Any) -> list[Any]:
        return [data[start:end] for start, end in boundaries]

    def forward_from_staged(self, model: str, chunk: Any) -> Any:
        return self.forward(model, chunk)

    def forward_backward_from_staged(self, model: str, chunk: Any) -> Any:
        self.calls.append(f"forward_backward:{model}")
        if self.work is not None:
            self.work.run(PhaseKind.TRAINING)
        return SimpleNamespace(metrics={"policy_loss": 0.1})

    def optim_step(self, model: str) -> float:
        self.calls.append(f"optim_step:{model}")
        return 0.5


class LocalSleep:
    def __init__(self) -> None:
        self.sleeps = 0

    async def sleep(self) -> None:
        self.sleeps += 1


def _config() -> SkyRLTrainConfig:
    config = SkyRLTrainConfig()
    trainer = config.trainer
    trainer.resume_mode = "none"
    trainer.epochs = 1
    trainer.eval_interval = -1
    trainer.ckpt_interval = -1
    trainer.hf_save_interval = -1
    trainer.train_batch_size = 2
    trainer.policy_mini_batch_size = 2
    trainer.print_example_interval = 0
    trainer.dump_data_batch = False
    trainer.update_epochs_per_batch = 1
    config.generator.n_samples_per_prompt = 2
    return config


def driven_trainer(cls: type = RayPPOTrainer, steps: int = 2, work: SimWork | None = None) -> Any:
    """The release's trainer class, its state set as ``__init__`` and ``build_models`` would, with the
    remote parts (generator, worker dispatch, inference client, tracker) local."""
    trainer = object.__new__(cls)
    trainer.cfg = _config()
    trainer.colocate_all = trainer.cfg.trainer.placement.colocate_all
    trainer.tracker = SimpleNamespace(log=lambda *args, **kwargs: None, finish=lambda: None)
    trainer.tokenizer = SimpleNamespace(pad_token_id=0, decode=lambda ids: "text")
    prompts = [
        {
            "prompt": [{"role": "user", "content": f"q{p}"}],
            "env_class": None,
            "env_extras": {},
            "uid": f"u{p}",
        }
        for p in range(2)
    ]
    trainer.train_dataloader = [prompts[:1] + prompts[1:] for _ in range(steps)]
    trainer.total_training_steps = steps
    trainer.eval_dataloader = None
    trainer.generator = LocalGenerator(work)
    trainer.inference_engine_client = LocalSleep()
    trainer.dispatch = LocalDispatch(work)
    from skyrl.train.utils.trainer_utils import ResumeMode  # noqa: PLC0415 - the release's own enum

    trainer.resume_mode = ResumeMode.NONE
    trainer.all_metrics, trainer.all_timings = {}, {}
    trainer.global_step = 0
    trainer._vllm_metrics_scraper = trainer._ray_gpu_monitor = None
    trainer.trajectory_logger = None
    trainer.policy_model = trainer.critic_model = trainer.ref_model = None
    trainer.dynamic_sampling_state = None
    trainer.reward_kl_controller = None
    trainer._callback_handler = CallbackHandler([])
    trainer._training_control = TrainingControl()
    trainer._current_epoch = 0
    trainer._num_training_gpus = 1
    trainer.init_weight_sync_state = lambda: None
    return trainer


class TestDriven:
    def test_the_trainers_train_loop_reports_generation_then_training_each_step(
        self, recorder: Recorder
    ) -> None:
        trainer = driven_trainer(steps=2)
        hook = hook_module.instrument(trainer, recorder)
        assert hook.variant == hook_module.SYNC
        asyncio.run(trainer.train())
        one_engine_kv = decode_reads([len(r) for r in RESPONSES])
        generation = dataclasses.replace(GENERATION, max_worker_kv_tokens=one_engine_kv)
        assert [(p.kind, p.iteration, p.workload) for p in recorder.phases] == [
            (PhaseKind.GENERATION, 1, generation),
            (PhaseKind.TRAINING, 1, TRAINING),
            (PhaseKind.GENERATION, 2, generation),
            (PhaseKind.TRAINING, 2, TRAINING),
        ]
        assert trainer.generator.calls == 2
        assert trainer.dispatch.calls.count("optim_step:policy") == 2
        assert trainer.inference_engine_client.sleeps == 3  # colocate_all: after each rollout, and at the end

    def test_with_several_engines_the_busiest_engines_kv_reads_are_unknown(self, recorder: Recorder) -> None:
        trainer = driven_trainer(steps=1)
        trainer.cfg.generator.inference_engine.num_engines = 2
        hook_module.instrument(trainer, recorder)
        asyncio.run(trainer.train())
        assert recorder.phases[0].workload == GENERATION

    def test_remove_restores_the_trainer(self, recorder: Recorder) -> None:
        trainer = driven_trainer(steps=1)
        hook_module.instrument(trainer, recorder).remove()
        assert "generate" not in vars(trainer)
        assert "train_critic_and_policy" not in vars(trainer)
        asyncio.run(trainer.train())
        assert recorder.phases == []

    def test_a_failing_session_never_stops_the_loop(self) -> None:
        class Broken:
            def phase(self, *args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("no daemon")

        trainer = driven_trainer(steps=1)
        hook_module.instrument(trainer, Broken())
        asyncio.run(trainer.train())
        assert trainer.dispatch.calls.count("optim_step:policy") == 1

    def test_the_fully_async_trainer_reports_training_only(self, recorder: Recorder) -> None:
        trainer = driven_trainer(FullyAsyncRayPPOTrainer, steps=1)
        hook = hook_module.instrument(trainer, recorder)
        assert hook.variant == hook_module.FULLY_ASYNC
        assert "generate" not in vars(trainer)
        batch = TrainingInputBatch(
            {
                "attention_mask": torch.ones((1, 3)),
                "response_mask": torch.ones((1, 2)),
                "loss_mask": torch.ones((1, 2)),
            }
        )
        trainer.dispatch = LocalDispatch()
        trainer.train_critic_and_policy(_with_boundaries(batch))
        assert [(p.kind, p.workload) for p in recorder.phases] == [
            (
                PhaseKind.TRAINING,
                Workload(tokens=3, valid_tokens=2, sequences=1, max_response_tokens=2, prompt_tokens=1),
            )
        ]


def _with_boundaries(batch: TrainingInputBatch) -> TrainingInputBatch:
    batch["advantages"] = torch.zeros((1, 2))
    batch.metadata = {"policy_mini_batch_boundaries": [(0, 1)], "policy_prompt_boundaries": [(0, 1)]}
    return batch


class TestMetered:
    def test_the_daemon_meters_each_phase_with_its_tokens_and_clock(self, metering_daemon: Any) -> None:
        trainer = driven_trainer(steps=3)
        with eerl.connect(gpus=[0], job_id="skyrl-grpo", config=fast(metering_daemon.config)) as session:
            hook_module.instrument(trainer, session)
            asyncio.run(trainer.train())
            assert session.flush(10)
        records = metering_daemon.records
        assert [(r.kind, r.iteration) for r in records] == [
            (kind, step) for step in (1, 2, 3) for kind in (PhaseKind.GENERATION, PhaseKind.TRAINING)
        ]
        assert [(r.tokens, r.valid_tokens, r.sm_clock_mhz) for r in records] == [
            (GENERATION.tokens, 0, GENERATION_MHZ),
            (TRAINING.tokens, TRAINING.valid_tokens, TRAINING_MHZ),
        ] * 3

    def test_the_daemons_own_controller_commits_a_clock(self, committing_daemon: tuple[Any, SimWork]) -> None:
        """The stand-ins' work runs on the simulated GPU the session holds: eerl explores and commits."""
        daemon, work = committing_daemon
        trainer = driven_trainer(steps=40, work=work)
        with eerl.connect(gpus=[0], job_id="skyrl-grpo", config=daemon.config) as session:
            hook_module.instrument(trainer, session)
            asyncio.run(trainer.train())
            assert session.flush(10)
        assert_commits(daemon.records)
