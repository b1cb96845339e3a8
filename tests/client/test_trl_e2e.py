"""End to end: TRL's GRPOTrainer with the eerl hook, on the CPU, against the real daemon (sim backend).

A tiny randomly initialised Llama and a word-level tokenizer are built here (no download); three GRPO
steps run. The daemon must meter generation and training phases alternately, and their token counts
must equal what TRL itself counted and logged.
"""

from __future__ import annotations

import tempfile

import eerl
import eerl.integrations.trl
import pytest
import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

from eerld.control.base import PhaseKind

from .conftest import SimDaemon

PROMPTS = ["the cat sat on the mat", "a dog ran in the park", "one two three four five", "red green blue sky"]
STEPS = 3
BATCH = 4


def _tokenizer() -> PreTrainedTokenizerFast:
    words = Tokenizer(models.WordLevel(unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()  # type: ignore[assignment]
    words.train_from_iterator(
        PROMPTS, trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<s>", "</s>"])
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def _trainer(tokenizer: PreTrainedTokenizerFast, output_dir: str) -> GRPOTrainer:
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=64,
            pad_token_id=tokenizer.pad_token_id,
            bos_token_id=tokenizer.bos_token_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    )

    def reward_length(completions: list[str], **_: object) -> list[float]:
        return [float(len(c)) for c in completions]

    args = GRPOConfig(
        output_dir=output_dir,
        per_device_train_batch_size=BATCH,
        num_generations=2,
        max_completion_length=6,
        max_steps=STEPS,
        logging_steps=1,
        learning_rate=1e-3,
        report_to="none",
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        seed=0,
    )
    return GRPOTrainer(
        model=model,
        reward_funcs=reward_length,
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS * 4}),
        processing_class=tokenizer,
    )


@pytest.mark.e2e
@pytest.mark.slow
# transformers deprecates arguments that TRL still passes (gradient_checkpointing → activation_checkpointing)
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_grpo_phases_reach_the_daemon_with_trls_token_counts(sim_daemon: SimDaemon) -> None:
    with tempfile.TemporaryDirectory() as output_dir:
        trainer = _trainer(_tokenizer(), output_dir)
        with eerl.connect(gpus=[0], job_id="grpo-e2e", config=sim_daemon.config) as session:
            eerl.integrations.trl.instrument(trainer, session)
            trainer.train()
            assert session.flush(10)
        step_logs = [entry for entry in trainer.state.log_history if "num_tokens" in entry]

    records = sim_daemon.records
    assert [(r.kind, r.iteration) for r in records] == [
        (kind, step) for step in range(STEPS) for kind in (PhaseKind.GENERATION, PhaseKind.TRAINING)
    ]
    generation = [r for r in records if r.kind is PhaseKind.GENERATION]
    training = [r for r in records if r.kind is PhaseKind.TRAINING]
    assert len(step_logs) == STEPS
    # TRL logs the mean length of the step's BATCH completions: times BATCH, that is what it generated.
    assert [r.tokens for r in generation] == [
        round(log["completions/mean_length"] * BATCH) for log in step_logs
    ]
    # The samples trained on are those generated: their completion tokens are the valid training tokens.
    assert [r.valid_tokens for r in training] == [r.tokens for r in generation]
    # TRL's running count of prompt + completion tokens equals the training tokens reported, step by step.
    cumulative = [sum(r.tokens for r in training[: i + 1]) for i in range(STEPS)]
    assert cumulative == [int(log["num_tokens"]) for log in step_logs]
