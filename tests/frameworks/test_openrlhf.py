"""The OpenRLHF hook against the installed OpenRLHF (0.11.2, 0.10.4): sync and async trainers.

What runs: the contract (classes, methods, signatures, the call sites in ``fit``/``train_step``), token
counts on OpenRLHF's own ``Experience``, and the real trainers' loops driven on the CPU: the sync
``PPOTrainer.fit`` and the async ``TrainingActor.fit`` / ``GenerateSamplesActor.fit``, each the actor's
real class with its remote parts (vLLM engines behind ``samples_generator``, the actor model group, the
experience maker, the Ray queues and lock) replaced by local stand-ins and ``ray.get`` by the identity.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace
from typing import Any

import eerl.integrations.openrlhf as hook_module
import pytest
import ray
import torch
from eerl.integrations import HookWarning
from eerl.phases import PhaseKind, Workload
from openrlhf.trainer.ppo_trainer import BasePPOTrainer, PPOTrainer
from openrlhf.trainer.ppo_trainer_async import GenerateSamplesActor, PPOTrainerAsync, TrainingActor
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator

from tests.frameworks.conftest import Recorder

ATTENTION = torch.tensor([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
GENERATION = Workload(tokens=5, sequences=2, max_response_tokens=3, prompt_tokens=5)
TRAINING = Workload(tokens=10, valid_tokens=5, sequences=2, max_response_tokens=3, prompt_tokens=5)


def experience() -> Experience:
    return Experience(
        sequences=torch.ones((2, 6), dtype=torch.long),
        attention_mask=ATTENTION,
        action_mask=ATTENTION[:, -3:].bool(),
        response_length=torch.tensor([2.0, 3.0]),
        total_length=torch.tensor([5.0, 5.0]),
        truncated=torch.tensor([False, False]),
        info={"reward": torch.tensor([1.0, 0.0])},
    )


def _params(function: Any) -> list[str]:
    """The parameters, less the ``_ray_trace_ctx`` Ray's tracing adds to an actor class's methods."""
    return [name for name in inspect.signature(function).parameters if not name.startswith("_ray")]


class TestContract:
    def test_the_methods_the_hook_wraps_exist_with_the_signatures_it_assumes(
        self, framework_version: str
    ) -> None:
        assert _params(SamplesGenerator.generate_samples) == ["self", "generate_kwargs"]
        assert _params(BasePPOTrainer.ppo_train) == ["self", "global_steps"]
        assert _params(BasePPOTrainer.train_step) == ["self", "rollout_samples", "global_step"]
        assert "self.ppo_train(global_step)" in inspect.getsource(BasePPOTrainer.train_step)
        sync = PPOTrainer.__ray_actor_class__
        assert "self.samples_generator = SamplesGenerator(" in inspect.getsource(sync.__init__)
        fit = inspect.getsource(sync.fit)
        assert "self.samples_generator.generate_samples(**self.generate_kwargs)" in fit
        assert "self.train_step(rollout_samples, global_step)" in fit
        generator = GenerateSamplesActor.__ray_actor_class__
        assert "self.samples_generator = SamplesGenerator(" in inspect.getsource(generator.__init__)
        assert "self.samples_generator.generate_samples(" in inspect.getsource(generator.fit)
        assert issubclass(TrainingActor.__ray_actor_class__, BasePPOTrainer)
        assert "self.train_step(rollout_samples, global_step)" in inspect.getsource(
            TrainingActor.__ray_actor_class__.fit
        )
        init = inspect.getsource(PPOTrainerAsync.__ray_actor_class__.__init__)
        assert "self.generator_actor = GenerateSamplesActor.remote(" in init
        assert "self.trainer_actor = TrainingActor.remote(" in init
        assert callable(getattr(ray.actor.ActorHandle, "__ray_call__", None)) or hasattr(
            ray.actor, "ActorHandle"
        )

    def test_the_run_name_is_nested_in_args_and_the_docs_reader_never_raises(self) -> None:
        from openrlhf.cli import train_ppo_ray  # noqa: PLC0415 - the CLI module is imported only here

        assert "--logger.wandb.run_name" in inspect.getsource(train_ppo_ray)
        assert hook_module.run_name(SimpleNamespace(args=SimpleNamespace(logger=SimpleNamespace()))) is None

    def test_experience_counts_its_masks_or_its_lengths(self) -> None:
        assert hook_module.samples_workload([experience()]) == TRAINING
        bare = experience()
        bare.action_mask = bare.attention_mask = None
        assert hook_module.samples_workload([bare]) == TRAINING

    def test_a_trainer_it_cannot_hook_warns_naming_this_version(
        self, framework_version: str, recorder: Recorder
    ) -> None:
        with pytest.warns(HookWarning, match=rf"\(OpenRLHF {framework_version}\)"):
            hook_module.instrument(object.__new__(PPOTrainerAsync.__ray_actor_class__), recorder)


class LocalGroup:
    """Stands in for a RayActorGroup: runs nothing remote, returns what ray.get (the identity) hands back."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def async_run_method_batch(self, method_name: str, **kwargs: Any) -> list[Any]:
        self.calls.append(method_name)
        return []

    def async_run_method(self, method_name: str, **kwargs: Any) -> list[dict[str, float]]:
        self.calls.append(method_name)
        return [{"policy_loss": 0.1}]


class LocalSamples:
    """Stands in for SamplesGenerator's vLLM engines: ``batches`` batches of one Experience, then done."""

    def __init__(self, batches: int) -> None:
        self.left = batches

    def generate_samples(self, **generate_kwargs: Any) -> tuple[list[Experience], float, int, bool]:
        if self.left <= 0:  # the dataloader is exhausted: an empty batch that says so
            return [], 1.0, 0, True
        self.left -= 1
        return [experience()], 1.0, 1, False


def _args() -> SimpleNamespace:
    ns = SimpleNamespace
    return ns(
        ckpt=ns(path="/nonexistent", load_enable=False, save_steps=float("inf")),
        train=ns(num_episodes=1, dynamic_batch_enable=False),
        logger=ns(logging_steps=1, wandb=ns(run_name="run")),
        eval=ns(steps=float("inf")),
        critic=ns(freezing_steps=-1),
        ds=ns(enable_sleep=False),
        algo=ns(dynamic_filtering_enable=False),
        rollout=ns(batch_size=1, n_samples_per_prompt=2),
    )


def _trainer(cls: type, batches: int) -> Any:
    trainer = object.__new__(cls)
    trainer.args = _args()
    trainer.actor_model_group = LocalGroup()
    trainer.critic_model_group = None
    trainer.vllm_engines = None
    trainer.kl_ctl = FixedKLController(0.0)
    trainer.experience_maker = SimpleNamespace(make_experience_batch=lambda samples: samples)
    trainer.tokenizer = SimpleNamespace(decode=lambda ids, skip_special_tokens=True: ["text"])
    trainer.wandb_logger = trainer.tensorboard_logger = None
    trainer.best_eval_metric_key, trainer.best_eval_metric_value = "", float("-inf")
    trainer._latest_eval_metric_value = None
    trainer.samples_generator = LocalSamples(batches)
    trainer.prompts_dataloader = LocalLoader()
    trainer.eval_dataloader = None
    trainer.generate_kwargs = {}
    return trainer


class LocalLoader(list):  # type: ignore[type-arg]
    def state_dict(self) -> dict[str, int]:
        return {}


@pytest.fixture
def local_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ray, "get", lambda refs, **kwargs: refs)


@pytest.mark.usefixtures("local_ray")
class TestDriven:
    def test_the_sync_trainers_fit_reports_generation_then_training(self, recorder: Recorder) -> None:
        trainer = _trainer(PPOTrainer.__ray_actor_class__, batches=2)
        hook = hook_module.instrument(trainer, recorder)
        assert hook.variant == hook_module.SYNC
        trainer.fit()
        assert [(p.kind, p.iteration, p.workload) for p in recorder.phases] == [
            (PhaseKind.GENERATION, None, GENERATION),
            (PhaseKind.TRAINING, 0, TRAINING),
            (PhaseKind.GENERATION, 1, GENERATION),
            (PhaseKind.TRAINING, 1, TRAINING),
            (PhaseKind.GENERATION, 2, Workload()),  # the call that finds the dataloader exhausted
        ]
        assert trainer.actor_model_group.calls == ["append", "fit"] * 2

    def test_the_async_training_actors_fit_reports_training_with_the_queued_samples_tokens(
        self, recorder: Recorder
    ) -> None:
        trainer = _trainer(TrainingActor.__ray_actor_class__, batches=0)
        del trainer.samples_generator  # the training actor has none: its samples come through the queue
        payloads: list[Any] = [([experience()], {}, 1.0, 0.5), ([experience()], {}, 1.0, 0.5), "done"]
        trainer.rollout_queue = SimpleNamespace(get=lambda block=True: payloads.pop(0))
        trainer.rollout_slots = SimpleNamespace(put=lambda step, block=True: None)
        trainer.vllm_lock, trainer._partial_rollout = None, False
        hook = hook_module.instrument(trainer, recorder)
        assert hook.variant == hook_module.TRAINER  # its samples_generator is a stand-in only here
        trainer.fit(global_step=0)
        assert [(p.kind, p.iteration, p.workload) for p in recorder.phases] == [
            (PhaseKind.TRAINING, 0, TRAINING),
            (PhaseKind.TRAINING, 1, TRAINING),
        ]

    def test_the_async_generator_actors_fit_reports_generation(self, recorder: Recorder) -> None:
        actor = object.__new__(GenerateSamplesActor.__ray_actor_class__)
        actor.args = _args()
        actor.samples_generator = LocalSamples(batches=2)
        actor.prompts_dataloader, actor.eval_dataloader = LocalLoader(), None
        actor.generate_kwargs, actor._partial_rollout = {}, False
        actor._last_eval_step, actor._eval_just_done = -1, False
        queued: list[Any] = []
        actor.rollout_queue = SimpleNamespace(put=lambda item, block=True: queued.append(item))
        actor.rollout_slots = SimpleNamespace(get=lambda block=True: 0, put=lambda step, block=True: None)
        remote = SimpleNamespace(remote=lambda: None)
        actor.vllm_lock = SimpleNamespace(acquire=remote, release=remote)
        hook = hook_module.instrument(actor, recorder)
        assert hook.variant == hook_module.GENERATOR
        actor.fit(episode=0, total_consumed_prompts=0)
        assert [(p.kind, p.workload) for p in recorder.phases] == [
            (PhaseKind.GENERATION, GENERATION),
            (PhaseKind.GENERATION, GENERATION),
            (PhaseKind.GENERATION, Workload()),
        ]
        assert queued[-1] == "done"
