# ruff: noqa: PLC0415 - torch and transformers load only in the end-to-end test
"""The TRL hook against the installed TRL (1.16.0, 1.15.0): GRPO and RLOO end to end on the CPU.

What runs: the contract (the trainers sharing GRPO's generation path, their ``_prepare_inputs`` calling
``_generate_and_score_completions``, the masks it returns, the vLLM mode arguments), and real
``GRPOTrainer.train()`` and ``RLOOTrainer.train()`` runs (a tiny random Llama, tests/client/_grpo.py) whose
reported tokens must equal what TRL itself logged.
"""

from __future__ import annotations

import inspect
import tempfile

import eerl.integrations.trl as hook_module
import pytest
import trl
from eerl.integrations import HookWarning
from eerl.phases import PhaseKind

from tests.client._grpo import BATCH, PROMPTS, STEPS, build_tokenizer, grpo_trainer, tiny_llama
from tests.frameworks.conftest import Recorder, _at_least

SHARED_PATH = ("GRPOTrainer", "RLOOTrainer", "DistillationTrainer")


@pytest.mark.parametrize("name", SHARED_PATH)
def test_the_trainers_sharing_grpos_generation_path_have_what_the_hook_wraps(
    name: str, framework_version: str
) -> None:
    cls = getattr(trl, name)
    assert list(inspect.signature(cls._prepare_inputs).parameters) == ["self", "generation_batch"]
    assert "self._generate_and_score_completions(" in inspect.getsource(cls._prepare_inputs)
    assert 'mode = "train" if self.model.training else "eval"' in inspect.getsource(cls._prepare_inputs)
    generate = inspect.getsource(cls._generate_and_score_completions)
    assert '"completion_mask": completion_mask' in generate
    assert '"prompt_mask": prompt_mask' in generate
    assert callable(cls.add_callback)
    assert callable(cls.remove_callback)


def test_the_vllm_modes_the_docs_describe_are_grpos_arguments() -> None:
    fields = trl.GRPOConfig.__dataclass_fields__
    assert fields["use_vllm"].default is False
    assert fields["vllm_mode"].default == "colocate"


def test_a_trainer_it_cannot_hook_warns_naming_this_version(
    framework_version: str, recorder: Recorder
) -> None:
    with pytest.warns(HookWarning, match=rf"\(TRL {framework_version}\)"):
        hook_module.instrument(object(), recorder)


def _rloo_trainer(output_dir: str) -> trl.RLOOTrainer:
    from datasets import Dataset

    tokenizer = build_tokenizer()
    model = tiny_llama(tokenizer)
    args = trl.RLOOConfig(
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
        beta=0.0,  # no reference model (it would be loaded by name)
    )
    return trl.RLOOTrainer(
        model=model,
        reward_funcs=lambda completions, **_: [float(len(c)) for c in completions],
        args=args,
        train_dataset=Dataset.from_dict({"prompt": PROMPTS * 4}),
        processing_class=tokenizer,
    )


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore::FutureWarning")
@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("trainer_name", ["GRPOTrainer", "RLOOTrainer"])
def test_end_to_end_the_hook_reports_trls_own_token_counts(trainer_name: str, recorder: Recorder) -> None:
    with tempfile.TemporaryDirectory() as output_dir:
        if trainer_name == "GRPOTrainer":
            trainer = grpo_trainer(build_tokenizer(), output_dir)
        else:
            trainer = _rloo_trainer(output_dir)
        hook = hook_module.instrument(trainer, recorder)
        assert hook.attached
        assert hook.vllm_mode == ""
        trainer.train()
        logs = [entry for entry in trainer.state.log_history if "num_tokens" in entry]
    assert recorder.kinds() == [
        (kind, step) for step in range(STEPS) for kind in (PhaseKind.GENERATION, PhaseKind.TRAINING)
    ]
    generation = [p.workload for p in recorder.phases if p.kind is PhaseKind.GENERATION]
    training = [p.workload for p in recorder.phases if p.kind is PhaseKind.TRAINING]
    assert [w.tokens for w in generation] == [round(log["completions/mean_length"] * BATCH) for log in logs]
    assert [w.valid_tokens for w in training] == [w.tokens for w in generation]
    # The process's KV reads, Σ length² / 2 over its completions: at least (Σ length)² / (2 · count).
    assert all(w.max_worker_kv_tokens >= w.tokens**2 // (2 * w.sequences) - 1 > 0 for w in generation)
    cumulative = [sum(w.tokens for w in training[: i + 1]) for i in range(STEPS)]
    assert cumulative == [int(log["num_tokens"]) for log in logs]


def test_before_1_16_grpos_loss_needs_triton_so_the_end_to_end_run_is_16_only(framework_version: str) -> None:
    """TRL 1.15's GRPO loss always takes its Triton kernel (trl.kernels); CPU torch has no Triton, so the
    end-to-end tests are deselected there (tests/frameworks/conftest.py) and this checks why."""
    import importlib.util

    from trl.trainer import utils

    assert importlib.util.find_spec("triton") is None, "the framework environments use CPU torch"
    # Without Triton, 1.15 has no chunked log-prob kernel, which its GRPO loss needs; 1.16 imports it anyway.
    assert (utils._ChunkedLogProbFunction is None) is not _at_least(framework_version, (1, 16))
