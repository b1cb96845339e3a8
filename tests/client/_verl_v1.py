"""verl v1's trainer as the hooks' tests stand it in (no verl installed): the ``KVBatchMeta`` batch handle,
the replay buffer, the PPOTrainer's sample callbacks. The real classes: tests/frameworks/test_verl.py."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class KVBatchMeta:
    """verl v1's batch handle (transfer_queue): sample keys and per-sample tags, no tensors."""

    keys: list[str]
    tags: list[dict[str, Any]]
    partition_id: str = "train"
    extra_info: dict[str, Any] = field(default_factory=dict)


# Two samples (prompts of 3 and 2 tokens, responses of 2 and 3) and a padding sample the hook leaves out.
V1_TAGS = [
    {"prompt_len": 3, "response_len": 2, "seq_len": 5},
    {"prompt_len": 2, "response_len": 3, "seq_len": 5},
    {"prompt_len": 1, "response_len": 1, "seq_len": 2, "is_padding": True},
]


class ReplayBuffer:
    def sample(
        self, global_steps: int, partition_id: str, batch_size: int
    ) -> tuple[KVBatchMeta, dict[str, float]]:
        return KVBatchMeta(keys=["a", "b", "pad"], tags=V1_TAGS, partition_id=partition_id), {}


class V1VerlTrainer:
    """verl ≥ 0.9's v1 PPOTrainer: callbacks around ``replay_buffer.sample`` in ``marked_timer("gen")``;
    ``llm_server_manager`` as its ``_setup`` makes it (the rollout's engines), when given."""

    def __init__(self, trainer_mode: str = "sync", llm_server_manager: Any = None) -> None:
        self.trainer_mode = trainer_mode
        self.global_steps = 0
        self.replay_buffer = ReplayBuffer()
        self.llm_server_manager = llm_server_manager
        self.events: list[str] = []

    def on_sample_begin(self) -> None:
        self.events.append("sample_begin")

    def on_sample_end(self) -> None:
        self.events.append("sample_end")

    def _update_actor(self, batch: KVBatchMeta, metrics: dict[str, float]) -> KVBatchMeta:
        self.events.append("update")
        return batch

    def _validate(self) -> dict[str, float]:
        self.replay_buffer.sample(global_steps=self.global_steps, partition_id="val", batch_size=2)
        return {}

    def fit(self, steps: int) -> None:
        for step in range(1, steps + 1):
            self.global_steps = step
            self.on_sample_begin()
            batch, _ = self.replay_buffer.sample(global_steps=step, partition_id="train", batch_size=2)
            self.on_sample_end()
            self._update_actor(batch, {})
            self._validate()
