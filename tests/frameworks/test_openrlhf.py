"""The OpenRLHF hook against the installed OpenRLHF (0.11.2, 0.10.4): sync and async trainers.

What runs: the contract (classes, methods, signatures, the call sites in ``fit``/``train_step``), token
counts on OpenRLHF's own ``Experience``, and the real trainers' loops driven on the CPU: the sync
``PPOTrainer.fit`` and the async ``TrainingActor.fit`` / ``GenerateSamplesActor.fit``, each the actor's
real class with its remote parts (vLLM engines behind ``samples_generator``, the actor model group, the
experience maker, the Ray queues and lock) replaced by local stand-ins and ``ray.get`` by the identity.

``max_worker_kv_tokens``: the real ``SamplesGenerator.generate_samples`` → ``_generate_vllm`` →
``_dispatch_prompts_to_vllm`` → ``_process_response_into_experience``, on a local Ray cluster whose vLLM
engines are Ray actors that answer with canned responses (the dict OpenRLHF's executors return) and
remember what they decoded: the busiest engine's decode reads are known from the engines themselves.
"""

from __future__ import annotations

import inspect
from collections.abc import Iterator
from types import SimpleNamespace
from typing import Any

import eerl.integrations.openrlhf as hook_module
import pytest
import ray
import torch
from eerl.integrations import HookWarning
from eerl.integrations._counting import busiest_decode_reads, decode_reads
from eerl.phases import PhaseKind, Workload
from openrlhf.trainer.ppo_trainer import BasePPOTrainer, PPOTrainer
from openrlhf.trainer.ppo_trainer_async import GenerateSamplesActor, PPOTrainerAsync, TrainingActor
from openrlhf.trainer.ppo_utils.experience import Experience
from openrlhf.trainer.ppo_utils.kl_controller import FixedKLController
from openrlhf.trainer.ppo_utils.samples_generator import SamplesGenerator
from openrlhf.utils.agent import SingleTurnAgentExecutor

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


class TestPerEngineContract:
    def test_each_prompt_goes_to_one_engine_and_comes_back_through_process_response(self) -> None:
        assert _params(SamplesGenerator._dispatch_prompts_to_vllm) == [
            "self",
            "prompts",
            "labels",
            "images",
            "generate_kwargs",
        ]
        assert _params(SamplesGenerator._process_response_into_experience) == [
            "self",
            "response",
            "generate_kwargs",
        ]
        dispatch = inspect.getsource(SamplesGenerator._dispatch_prompts_to_vllm)
        assert "llm_engine = self.vllm_engines[engine_indices[idx]]" in dispatch
        assert "ref = llm_engine.generate_responses.remote(" in dispatch
        assert "prompt=prompt," in dispatch
        assert "label=label," in dispatch
        assert "num_samples=n_samples," in dispatch
        assert "refs.append(ref)" in dispatch
        generate = inspect.getsource(SamplesGenerator._generate_vllm)
        assert "self._dispatch_prompts_to_vllm(" in generate
        assert (
            "self._process_response_into_experience(response, **generate_kwargs) for response in ray.get(ref)"
            in generate
        )
        respond = inspect.getsource(SingleTurnAgentExecutor.execute)
        assert '"prompt": prompt,' in respond
        assert '"label": label,' in respond


def local_engine_class() -> Any:
    """A Ray actor class standing in for ``RolloutRayActor``: canned responses for each prompt, in the dict
    OpenRLHF's ``SingleTurnAgentExecutor`` returns, and the list of response lengths it decoded. (Made in
    a function so that Ray ships it by value: the workers need not import this module.)"""

    class LocalEngine:
        def __init__(self, lengths: dict[str, list[int]], scores: dict[str, float]) -> None:
            self.lengths, self.scores, self.decoded = lengths, scores, []

        def get_num_unfinished_requests(self) -> int:
            return 0

        def generate_responses(
            self,
            prompt: str,
            label: str,
            sampling_params: Any,
            max_length: int,
            hf_tokenizer: Any,
            num_samples: int = 1,
            images: Any = None,
        ) -> list[dict[str, Any]]:
            responses = []
            for length in self.lengths[prompt][:num_samples]:
                self.decoded.append(length)
                responses.append(
                    {
                        "prompt": prompt,
                        "label": label,
                        "images": images,
                        "mm_train_inputs": None,
                        "observation_tokens": [7, 7, 7] + [8] * length,
                        "action_ranges": [(3, 3 + length)],
                        "rollout_log_probs": None,
                        "truncated": False,
                        "reward": None,
                        "scores": self.scores.get(prompt, 0.5),
                        "extra_logs": {},
                    }
                )
            return responses

        def decoded_lengths(self) -> list[int]:
            return self.decoded

    return ray.remote(num_cpus=0)(LocalEngine)


# Each prompt's two samples' response lengths, as the engine that gets the prompt decodes them.
LENGTHS = {
    "p0": [5, 1],
    "p1": [2, 2],
    "p2": [3, 3],
    "p3": [1, 1],
    "p4": [4, 4],
    "p5": [6, 2],
    "p6": [1, 2],
    "p7": [2, 1],
}


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """A local Ray of two CPUs for the engine actors (they take none): a new one (``address="local"``), never
    another cluster running on the machine (``make test`` runs the main suite's beside it)."""
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()


def _generator(
    *, batch_size: int, generate_batch_size: int | None = None, filtered: dict[str, float] | None = None
) -> tuple[SamplesGenerator, list[Any]]:
    ns = SimpleNamespace
    engines = [local_engine_class().remote(LENGTHS, filtered or {}) for _ in range(2)]
    args = ns(
        rollout=ns(
            batch_size=batch_size, n_samples_per_prompt=2, vllm_generate_batch_size=generate_batch_size
        ),
        vllm=ns(enable_sleep=False),
        algo=ns(
            dynamic_filtering_enable=filtered is not None,
            dynamic_filtering_range=(0.1, 0.9),
            advantage=ns(is_correction_level="off", is_correction_enable=False),
        ),
    )
    prompts = sorted(LENGTHS)
    loader = [
        (None, prompts[i : i + 2], [f"label {p}" for p in prompts[i : i + 2]], [None, None])
        for i in (0, 2, 4, 6)
    ]
    generator = SamplesGenerator(
        strategy=ns(args=args),
        prompts_dataloader=loader,
        eval_dataloader=None,
        tokenizer=None,
        vllm_engines=engines,
    )
    return generator, engines


def _busiest(engines: list[Any]) -> tuple[int, list[list[int]]]:
    decoded = ray.get([engine.decoded_lengths.remote() for engine in engines])
    return busiest_decode_reads(decoded), decoded


GENERATE = {"max_new_tokens": 16, "max_len": 64, "n_samples_per_prompt": 2}


@pytest.mark.usefixtures("ray_cluster")
class TestPerEngineOnRay:
    def test_the_busiest_engine_is_the_one_that_decoded_the_most(self, recorder: Recorder) -> None:
        generator, engines = _generator(batch_size=4)
        hook = hook_module.instrument(SimpleNamespace(samples_generator=generator), recorder)
        samples, _, consumed, _ = generator.generate_samples(**GENERATE)
        hook.remove()
        busiest, decoded = _busiest(engines)
        assert (consumed, len(samples)) == (4, 8)
        assert all(decoded), "both engines decoded some prompts"
        (generation,) = [p.workload for p in recorder.phases]
        assert generation.max_worker_kv_tokens == busiest
        assert busiest < decode_reads([n for lengths in decoded for n in lengths])  # not the whole batch
        assert generation.tokens == sum(sum(lengths) for lengths in decoded)

    def test_responses_dynamic_filtering_drops_were_decoded_and_count(self, recorder: Recorder) -> None:
        generator, engines = _generator(batch_size=2, filtered={"p1": 0.0})
        hook = hook_module.instrument(SimpleNamespace(samples_generator=generator), recorder)
        samples, _, consumed, _ = generator.generate_samples(**GENERATE)
        hook.remove()
        busiest, decoded = _busiest(engines)
        assert consumed == 3  # p1's samples dropped: p2 drawn in its place
        assert {sample.prompts[0] for sample in samples} == {"p0", "p2"}
        (generation,) = [p.workload for p in recorder.phases]
        assert generation.max_worker_kv_tokens == busiest
        assert generation.tokens < sum(sum(lengths) for lengths in decoded)

    def test_a_batch_served_from_the_sample_buffer_decoded_nothing(self, recorder: Recorder) -> None:
        generator, engines = _generator(batch_size=2, generate_batch_size=4)
        hook = hook_module.instrument(SimpleNamespace(samples_generator=generator), recorder)
        first = generator.generate_samples(**GENERATE)
        second = generator.generate_samples(**GENERATE)
        hook.remove()
        busiest, _ = _busiest(engines)
        assert (first[2], second[2]) == (4, 0)  # prompts consumed: the second batch came from the buffer
        assert [p.workload.max_worker_kv_tokens for p in recorder.phases] == [busiest, 0]
