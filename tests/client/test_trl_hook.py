"""The TRL hook's phase boundaries on a stand-in GRPOTrainer (the real one runs in test_trl_e2e.py)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import eerl
import eerl.integrations.trl
import numpy as np
import pytest
from eerl import ClientConfig, PhaseKind
from eerl.integrations._counting import (
    DEFAULT_STEP_READS,
    decode_reads,
    mask_decode_reads,
    model_step_reads,
    step_reads,
)
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
        assert generation.max_worker_kv_tokens == decode_reads([3, 2])  # this process's completions
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


class TestDecodeReads:
    def test_a_mask_reads_a_weight_read_per_step_and_each_responses_length_squared_over_two(self) -> None:
        mask = [[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]]
        expected = 3 * 1000 + (9 + 4) // 2
        assert mask_decode_reads(np.array(mask), 1000.0) == mask_decode_reads(mask, 1000.0) == expected
        assert mask_decode_reads(None) == mask_decode_reads(np.zeros((0, 4))) == 0

    def test_a_models_step_reads_are_its_parameters_over_the_kv_values_a_token_adds(self) -> None:
        """Llama-3.1-8B's shape: 8.03 G parameters, 32 layers, 8 of 32 heads keep K and V, 128 per head."""
        config = SimpleNamespace(
            num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=8, hidden_size=4096
        )
        model = SimpleNamespace(config=config, num_parameters=lambda: 8_030_000_000)
        assert model_step_reads(model) == pytest.approx(8.03e9 / (2 * 32 * 8 * 128))
        assert model_step_reads(model) == pytest.approx(DEFAULT_STEP_READS, rel=0.01)
        multi_head = SimpleNamespace(num_hidden_layers=2, num_attention_heads=4, hidden_size=64, head_dim=8)
        assert model_step_reads(SimpleNamespace(config=multi_head, num_parameters=lambda: 640)) == 5.0

    def test_a_model_it_cannot_read_gets_the_default(self) -> None:
        assert model_step_reads(None) == DEFAULT_STEP_READS
        assert model_step_reads(SimpleNamespace(training=True)) == DEFAULT_STEP_READS
        broken = SimpleNamespace(
            config=SimpleNamespace(num_hidden_layers=0, num_attention_heads=4, hidden_size=8)
        )
        assert (
            model_step_reads(SimpleNamespace(config=broken, num_parameters=lambda: 10)) == DEFAULT_STEP_READS
        )
        assert step_reads(0, 32, 8, 128) is None
