"""The TRL hook's phase boundaries on a stand-in GRPOTrainer (the real one runs in test_trl_e2e.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import eerl
import eerl.integrations.trl
import numpy as np
from eerl import ClientConfig, PhaseKind
from eerl.integrations._counting import kv_reads
from eerl.testing import FakeDaemon

COMPLETIONS = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])
PROMPTS = np.array([[1, 1], [0, 1]])


class StandInGrpoTrainer:
    """TRL's control flow: each micro-step prepares inputs (generating every ``generate_every`` of them);
    a step ends at the optimiser after ``accumulation`` micro-steps."""

    def __init__(self, *, generate_every: int, accumulation: int) -> None:
        self.model = SimpleNamespace(training=True)
        self.state = SimpleNamespace(global_step=0)
        self.callbacks: list[Any] = []
        self.generate_every = generate_every
        self.accumulation = accumulation
        self._micro_steps = 0
        self._buffer: dict[str, Any] | None = None

    def add_callback(self, callback: Any) -> None:
        self.callbacks.append(callback)

    def remove_callback(self, callback: Any) -> None:
        self.callbacks.remove(callback)

    def _generate_and_score_completions(self, inputs: Any) -> dict[str, Any]:
        return {"completion_mask": COMPLETIONS, "prompt_mask": PROMPTS}

    def _prepare_inputs(self, batch: Any) -> dict[str, Any]:
        if self._micro_steps % self.generate_every == 0 or self._buffer is None:
            self._buffer = self._generate_and_score_completions(batch)
        return self._buffer

    def train(self, steps: int) -> None:
        for _ in range(steps):
            for _ in range(self.accumulation):
                self._prepare_inputs(None)
                self._micro_steps += 1
            self.state.global_step += 1
            for callback in self.callbacks:
                callback.on_step_end(None, self.state, None)
        for callback in self.callbacks:
            callback.on_train_end(None, self.state, None)


def _events(fake: FakeDaemon) -> list[tuple[bool, PhaseKind, int]]:
    return [(p.begin, p.kind, p.iteration) for p in fake.phases]


def _train(trainer: StandInGrpoTrainer, config: ClientConfig, steps: int) -> None:
    with eerl.connect(gpus=[0], config=config) as session:
        hook = eerl.integrations.trl.instrument(trainer, session)
        trainer.train(steps)
        hook.remove()
        assert session.flush(5)


class TestTrlHook:
    def test_each_step_is_a_generation_then_a_training_phase(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        _train(StandInGrpoTrainer(generate_every=1, accumulation=1), config, steps=2)
        g, t = PhaseKind.GENERATION, PhaseKind.TRAINING
        assert _events(fake) == [(b, k, i) for i in (0, 1) for k in (g, t) for b in (True, False)]
        generation, training = [p.workload for p in fake.phases if not p.begin][:2]
        assert (generation.tokens, generation.sequences, generation.max_response_tokens) == (5, 2, 3)
        assert generation.max_worker_kv_tokens == (3 * 3 + 2 * 2) // 2  # this process's completions
        assert (training.valid_tokens, training.tokens, training.prompt_tokens) == (5, 8, 3)

    def test_a_generation_inside_a_step_ends_the_training_phase_first(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        _train(StandInGrpoTrainer(generate_every=2, accumulation=4), config, steps=1)
        kinds = [(begin, kind.value[0]) for begin, kind, _ in _events(fake)]
        assert kinds == [(True, "g"), (False, "g"), (True, "t"), (False, "t")] * 2
        training = [p.workload for p in fake.phases if not p.begin and p.kind is PhaseKind.TRAINING]
        assert [w.valid_tokens for w in training] == [10, 10]

    def test_evaluation_is_not_reported(self, fake: FakeDaemon, config: ClientConfig) -> None:
        trainer = StandInGrpoTrainer(generate_every=1, accumulation=1)
        trainer.model.training = False
        _train(trainer, config, steps=2)
        assert fake.phases == []


class TestKvReads:
    def test_each_response_reads_its_length_squared_over_two(self) -> None:
        mask = [[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]]
        assert kv_reads(np.array(mask)) == kv_reads(mask) == (9 + 4) // 2
        assert kv_reads(None) == kv_reads(np.zeros((0, 4))) == 0
