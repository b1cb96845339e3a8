"""End to end: TRL's GRPOTrainer with the eerl hook, on the CPU, against the real daemon (sim backend).

A tiny randomly initialised Llama and a word-level tokenizer are built offline (tests/client/_grpo.py);
three GRPO steps run. The daemon must meter generation and training phases alternately, and their token
counts must equal what TRL itself counted and logged.
"""

from __future__ import annotations

import tempfile

import eerl
import eerl.integrations.trl
import pytest
from eerl.phases import PhaseKind

from .conftest import SimDaemon


@pytest.mark.e2e
@pytest.mark.slow
# transformers deprecates arguments that TRL still passes (gradient_checkpointing → activation_checkpointing)
@pytest.mark.filterwarnings("ignore::FutureWarning")
def test_grpo_phases_reach_the_daemon_with_trls_token_counts(sim_daemon: SimDaemon) -> None:
    from ._grpo import BATCH, STEPS, build_tokenizer, grpo_trainer  # noqa: PLC0415 - torch and TRL load only here

    with tempfile.TemporaryDirectory() as output_dir:
        trainer = grpo_trainer(build_tokenizer(), output_dir)
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
