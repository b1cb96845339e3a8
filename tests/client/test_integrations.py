"""The verl and OpenRLHF hooks on stand-in trainers shaped like the real ones (no framework installed).

The real frameworks' classes, signatures and batch types: tests/frameworks (make test-frameworks).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import eerl
import eerl.integrations.openrlhf
import eerl.integrations.trl
import eerl.integrations.verl
import numpy as np
import pytest
from eerl import ClientConfig, PhaseKind, Workload
from eerl.testing import FakeDaemon

from ._verl_v1 import V1VerlTrainer

# Two sequences: prompts of 3 columns (left-padded), responses of 3 columns (right-padded).
ATTENTION = np.array([[0, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 1]])
RESPONSE_TOKENS, ALL_TOKENS, LONGEST = 5, 10, 3


class DataProto:
    """verl's DataProto, as far as the hook looks: a ``batch`` mapping of tensors."""

    def __init__(self, **tensors: Any) -> None:
        self.batch = dict(tensors)


class WorkerGroup:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def generate_sequences(self, prompts: DataProto) -> DataProto:
        self.calls.append("generate")
        return DataProto(responses=np.zeros((2, 3)), attention_mask=ATTENTION)

    def update_actor(self, batch: DataProto) -> str:
        self.calls.append("update")
        return "metrics"


class OldVerlTrainer:
    """verl < 0.6: rollout and update through the worker group; validation generates too."""

    def __init__(self) -> None:
        self.global_steps = 0
        self.actor_rollout_wg = WorkerGroup()
        self.async_rollout_manager = None

    def _validate(self) -> None:
        self.actor_rollout_wg.generate_sequences(DataProto())

    def fit(self, steps: int) -> None:
        for step in range(1, steps + 1):
            self.global_steps = step
            output = self.actor_rollout_wg.generate_sequences(DataProto())
            batch = DataProto(attention_mask=ATTENTION, response_mask=output.batch["attention_mask"][:, -3:])
            self.actor_rollout_wg.update_actor(batch)
            self._validate()


class NewVerlTrainer(OldVerlTrainer):
    """verl ≥ 0.6: an agent-loop rollout manager, and ``_update_actor`` around the worker call."""

    def __init__(self) -> None:
        super().__init__()
        self.async_rollout_manager = WorkerGroup()

    def _update_actor(self, batch: DataProto) -> str:
        return self.actor_rollout_wg.update_actor(batch)

    def fit(self, steps: int) -> None:
        for step in range(1, steps + 1):
            self.global_steps = step
            self.async_rollout_manager.generate_sequences(DataProto())
            self._update_actor(DataProto(attention_mask=ATTENTION, responses=np.zeros((2, 3))))


@dataclass
class Experience:
    """OpenRLHF's Experience/Samples, as far as the hook looks."""

    action_mask: Any
    attention_mask: Any
    info: dict[str, Any] = field(default_factory=dict)


class SamplesGenerator:
    def generate_samples(self, **generate_kwargs: Any) -> tuple[list[Experience], float, int, bool]:
        sample = Experience(action_mask=ATTENTION[:, -3:], attention_mask=ATTENTION)
        return [sample, sample], 1.0, 2, False


class OpenRlhfTrainer:
    """OpenRLHF's PPOTrainer loop: samples from the generator, ``train_step`` → ``ppo_train(global_step)``."""

    def __init__(self) -> None:
        self.samples_generator = SamplesGenerator()
        self.trained: list[int] = []

    def train_step(self, rollout_samples: list[Experience], global_step: int) -> tuple[dict[str, float], int]:
        return self.ppo_train(global_step), global_step + 1

    def ppo_train(self, global_steps: int) -> dict[str, float]:
        self.trained.append(global_steps)
        return {"kl": 0.0}

    def fit(self, steps: int) -> None:
        global_step = 0
        for _ in range(steps):
            samples, _, _, _ = self.samples_generator.generate_samples()
            _, global_step = self.train_step(samples, global_step)


def _run(trainer: Any, config: ClientConfig, module: Any, steps: int = 2) -> Any:
    with eerl.connect(gpus=[0], config=config) as session:
        hook = module.instrument(trainer, session)
        trainer.fit(steps)
        hook.remove()
        assert session.flush(5)
    return hook


def _ends(fake: FakeDaemon) -> list[tuple[PhaseKind, int, Workload]]:
    return [(p.kind, p.iteration, p.workload) for p in fake.phases if not p.begin]


GENERATION = Workload(tokens=RESPONSE_TOKENS, sequences=2, max_response_tokens=LONGEST, prompt_tokens=5)
TRAINING = Workload(ALL_TOKENS, RESPONSE_TOKENS, 2, LONGEST, ALL_TOKENS - RESPONSE_TOKENS)


class TestVerl:
    def test_the_old_trainers_rollout_and_update_are_phases_with_their_tokens(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        _run(OldVerlTrainer(), config, eerl.integrations.verl)
        assert _ends(fake) == [
            (PhaseKind.GENERATION, 1, GENERATION),
            (PhaseKind.TRAINING, 1, TRAINING),
            (PhaseKind.GENERATION, 2, GENERATION),
            (PhaseKind.TRAINING, 2, TRAINING),
        ]

    def test_the_new_trainers_update_is_one_phase_not_two(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        trainer = NewVerlTrainer()
        _run(trainer, config, eerl.integrations.verl, steps=1)
        assert _ends(fake) == [(PhaseKind.GENERATION, 1, GENERATION), (PhaseKind.TRAINING, 1, TRAINING)]
        assert trainer.actor_rollout_wg.calls == ["update"]

    def test_remove_restores_the_trainer(self, config: ClientConfig) -> None:
        trainer = NewVerlTrainer()
        _run(trainer, config, eerl.integrations.verl)
        assert "_update_actor" not in vars(trainer)
        assert "generate_sequences" not in vars(trainer.async_rollout_manager)


V1_GENERATION = Workload(tokens=5, sequences=2, max_response_tokens=3, prompt_tokens=5)
V1_TRAINING = Workload(tokens=10, valid_tokens=5, sequences=2, max_response_tokens=3, prompt_tokens=5)


class TestVerlV1:
    def test_the_sample_callbacks_and_the_update_are_phases_with_the_tags_tokens(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        trainer = V1VerlTrainer()
        hook = _run(trainer, config, eerl.integrations.verl)
        assert hook.variant == eerl.integrations.verl.V1
        assert _ends(fake) == [
            (PhaseKind.GENERATION, 1, V1_GENERATION),
            (PhaseKind.TRAINING, 1, V1_TRAINING),
            (PhaseKind.GENERATION, 2, V1_GENERATION),
            (PhaseKind.TRAINING, 2, V1_TRAINING),
        ]
        assert trainer.events[:3] == ["sample_begin", "sample_end", "update"]
        assert not {"on_sample_begin", "on_sample_end", "_update_actor"} & set(vars(trainer))

    def test_separate_async_reports_training_only(self, fake: FakeDaemon, config: ClientConfig) -> None:
        hook = _run(V1VerlTrainer("separate_async"), config, eerl.integrations.verl, steps=1)
        assert hook.variant == eerl.integrations.verl.V1_SEPARATE
        assert _ends(fake) == [(PhaseKind.TRAINING, 1, V1_TRAINING)]

    def test_a_failing_sample_ends_the_phase_and_raises_the_frameworks_error(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        trainer = V1VerlTrainer()

        def broken(**kwargs: Any) -> None:
            raise RuntimeError("rollout died")

        trainer.replay_buffer.sample = broken  # type: ignore[method-assign,assignment]
        with eerl.connect(gpus=[0], config=config) as session:
            eerl.integrations.verl.instrument(trainer, session)
            with pytest.raises(RuntimeError, match="rollout died"):
                trainer.fit(1)
            assert session.flush(5)
        assert [(p.begin, p.kind) for p in fake.phases] == [
            (True, PhaseKind.GENERATION),
            (False, PhaseKind.GENERATION),
        ]


class TestOpenRlhf:
    def test_sampling_and_ppo_train_are_phases_with_the_samples_tokens(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        trainer = OpenRlhfTrainer()
        _run(trainer, config, eerl.integrations.openrlhf)
        generation = Workload(RESPONSE_TOKENS * 2, 0, 4, LONGEST, (ALL_TOKENS - RESPONSE_TOKENS) * 2)
        training = Workload(
            ALL_TOKENS * 2, RESPONSE_TOKENS * 2, 4, LONGEST, (ALL_TOKENS - RESPONSE_TOKENS) * 2
        )
        assert _ends(fake) == [
            (PhaseKind.GENERATION, 0, generation),
            (PhaseKind.TRAINING, 0, training),
            (PhaseKind.GENERATION, 1, generation),
            (PhaseKind.TRAINING, 1, training),
        ]
        assert trainer.trained == [0, 1]

    def test_samples_without_masks_count_their_response_lengths(self) -> None:
        sample = Experience(action_mask=None, attention_mask=None, info={"response_length": np.array([4, 6])})
        workload = eerl.integrations.openrlhf.samples_workload([sample])
        assert (workload.valid_tokens, workload.sequences) == (10, 2)

    def test_the_async_trainers_actors_report_their_own_phase_kind(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        generator = SimpleNamespace(samples_generator=SamplesGenerator())
        trainer = OpenRlhfTrainer()
        trainer.samples_generator = None  # type: ignore[assignment]
        with eerl.connect(gpus=[0], config=config) as session:
            g = eerl.integrations.openrlhf.instrument(generator, session)
            t = eerl.integrations.openrlhf.instrument(trainer, session)
            samples, *_ = generator.samples_generator.generate_samples()
            trainer.train_step(samples, 0)
            assert session.flush(5)
        assert (g.variant, t.variant) == (
            eerl.integrations.openrlhf.GENERATOR,
            eerl.integrations.openrlhf.TRAINER,
        )
        assert [(kind, w.valid_tokens) for kind, _, w in _ends(fake)] == [
            (PhaseKind.GENERATION, 0),
            (PhaseKind.TRAINING, RESPONSE_TOKENS * 2),
        ]

    def test_run_name_reads_nested_and_flat_args_and_never_raises(self) -> None:
        nested = SimpleNamespace(
            args=SimpleNamespace(logger=SimpleNamespace(wandb=SimpleNamespace(run_name="r1")))
        )
        flat = SimpleNamespace(args=SimpleNamespace(wandb_run_name="r0"))
        assert eerl.integrations.openrlhf.run_name(nested) == "r1"
        assert eerl.integrations.openrlhf.run_name(flat) == "r0"
        assert eerl.integrations.openrlhf.run_name(SimpleNamespace(args=SimpleNamespace())) is None
        assert eerl.integrations.openrlhf.run_name(object()) is None


class Unrelated:
    """Nothing any hook knows how to wrap."""

    model = SimpleNamespace(training=True)

    def fit(self) -> None:
        return None


class TestNothingToWrap:
    @pytest.mark.parametrize(
        ("module", "framework"),
        [
            (eerl.integrations.verl, "verl"),
            (eerl.integrations.openrlhf, "OpenRLHF"),
            (eerl.integrations.trl, "TRL"),
        ],
    )
    def test_instrument_on_an_object_it_cannot_hook_warns_naming_the_version(
        self, module: Any, framework: str, config: ClientConfig, caplog: pytest.LogCaptureFixture
    ) -> None:
        trainer = Unrelated()
        with eerl.connect(gpus=[0], config=config) as session, caplog.at_level(logging.WARNING, "eerl"):
            with pytest.warns(eerl.integrations.HookWarning, match=rf"\({framework} [^)]+\)"):
                hook = module.instrument(trainer, session)
            trainer.fit()
            hook.remove()
        assert f"{framework} hook" in caplog.text
        assert "Unrelated" in caplog.text
        assert vars(trainer) == {}

    def test_a_legacy_verl_trainer_before_init_workers_warns(self, config: ClientConfig) -> None:
        trainer = OldVerlTrainer()
        trainer.actor_rollout_wg = None  # type: ignore[assignment]
        with (
            eerl.connect(gpus=[0], config=config) as session,
            pytest.warns(eerl.integrations.HookWarning, match="init_workers"),
        ):
            eerl.integrations.verl.instrument(trainer, session)

    def test_openrlhf_async_trainer_itself_points_to_instrument_async(self, config: ClientConfig) -> None:
        trainer = SimpleNamespace(generator_actor=object(), trainer_actor=object())
        with (
            eerl.connect(gpus=[0], config=config) as session,
            pytest.warns(eerl.integrations.HookWarning, match="instrument_async"),
        ):
            eerl.integrations.openrlhf.instrument(trainer, session)
        with pytest.warns(eerl.integrations.HookWarning, match="__ray_call__"):
            assert not eerl.integrations.openrlhf.instrument_async(trainer)


class TestFailOpen:
    """A hook never raises inside the training loop: eerl's failures are logged, the framework's call runs."""

    class BrokenSource:
        def phase(self, kind: Any, iteration: Any = None, **kwargs: Any) -> Any:
            raise RuntimeError("eerl is broken")

    def test_a_phase_source_that_raises_never_reaches_the_trainer(
        self, caplog: pytest.LogCaptureFixture
    ) -> None:
        for trainer, module in (
            (NewVerlTrainer(), eerl.integrations.verl),
            (V1VerlTrainer(), eerl.integrations.verl),
            (OpenRlhfTrainer(), eerl.integrations.openrlhf),
        ):
            hook = module.instrument(trainer, self.BrokenSource())
            trainer.fit(2)
            hook.remove()
        assert "training goes on" in caplog.text

    def test_a_batch_it_cannot_count_reports_nothing_and_the_step_runs(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        trainer = OpenRlhfTrainer()
        trainer.samples_generator.generate_samples = lambda **kw: (
            [Experience(action_mask="x", attention_mask=None)],
            0,
            0,
            False,
        )  # type: ignore[method-assign]
        _run(trainer, config, eerl.integrations.openrlhf, steps=1)
        assert trainer.trained == [0]
        assert [kind for kind, _, _ in _ends(fake)] == [PhaseKind.GENERATION, PhaseKind.TRAINING]
