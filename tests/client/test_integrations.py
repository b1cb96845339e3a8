"""The verl and OpenRLHF hooks on stand-in trainers shaped like the real ones (no framework installed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import eerl
import eerl.integrations.openrlhf
import eerl.integrations.verl
import numpy as np
from eerl import ClientConfig, PhaseKind, Workload
from eerl.testing import FakeDaemon

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


class Streamer:
    def make_sample_batch(self) -> tuple[list[Experience], float, int, bool]:
        sample = Experience(action_mask=ATTENTION[:, -3:], attention_mask=ATTENTION)
        return [sample, sample], 1.0, 2, False


class OpenRlhfTrainer:
    """OpenRLHF's PPOTrainer loop: samples from the streamer, then ``ppo_train(global_step)``."""

    def __init__(self) -> None:
        self.train_streamer = Streamer()
        self.trained: list[int] = []

    def ppo_train(self, global_steps: int) -> dict[str, float]:
        self.trained.append(global_steps)
        return {"kl": 0.0}

    def fit(self, steps: int) -> None:
        for global_step in range(steps):
            self.train_streamer.make_sample_batch()
            self.ppo_train(global_step)


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
