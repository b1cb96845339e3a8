"""A tiny GRPO run built offline: a word-level tokenizer trained on a few strings and a random tiny Llama.

Kept apart from the test module so that collecting the test suite does not import torch and TRL.
"""

from __future__ import annotations

import torch
from datasets import Dataset
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import GRPOConfig, GRPOTrainer

PROMPTS = ["the cat sat on the mat", "a dog ran in the park", "one two three four five", "red green blue sky"]
STEPS = 3
BATCH = 4


def build_tokenizer() -> PreTrainedTokenizerFast:
    words = Tokenizer(models.WordLevel(unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()  # type: ignore[assignment]
    words.train_from_iterator(
        PROMPTS, trainers.WordLevelTrainer(special_tokens=["<pad>", "<unk>", "<s>", "</s>"])
    )
    return PreTrainedTokenizerFast(
        tokenizer_object=words, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def tiny_llama(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    """A one-layer random Llama over ``tokenizer``'s vocabulary (seeded: the same weights every time)."""
    torch.manual_seed(0)
    return LlamaForCausalLM(
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


def grpo_trainer(tokenizer: PreTrainedTokenizerFast, output_dir: str) -> GRPOTrainer:
    model = tiny_llama(tokenizer)

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
