"""The NeMo-RL hook against NeMo-RL's source, NVIDIA-NeMo/RL at commit 7ea279abfbeb (not installable: the
package index holds only a placeholder named ``nemo-rl``).

What runs: the contract, read in excerpts of that commit (tests/frameworks/sources, cut by vendor.py): the
signatures of ``GenerationInterface`` and ``PolicyInterface.train``, and the order in which ``grpo_train``
calls what the hook wraps (``clear_logger_metrics`` once, inside ``timer.time("generation")``, before its
``finish_generation``; ``policy.train`` inside ``timer.time("policy_training")``; validation between
``prepare_for_generation`` and ``finish_generation`` without ``clear_logger_metrics``). Then a loop that makes
those calls in that order on stand-ins with the interfaces' signatures, through the hook: recorded, and
metered by the real daemon on the sim backend. Not run: NeMo-RL itself (its Ray worker groups, vLLM,
Megatron/DTensor policies), so neither its real timing nor its batch classes (``BatchedDataDict`` is a dict;
the stand-ins return dicts of tensors with the fields ``GenerationOutputSpec`` and ``train_data`` name).
"""

from __future__ import annotations

import ast
import asyncio
import re
from collections.abc import AsyncIterator
from types import SimpleNamespace
from typing import Any

import eerl
import eerl.integrations.nemo_rl as hook_module
import pytest
import torch
from eerl.integrations import HookWarning
from eerl.phases import PhaseKind, Workload

from tests.frameworks.conftest import (
    GENERATION_MHZ,
    TRAINING_MHZ,
    Recorder,
    SimWork,
    assert_commits,
    source_excerpt,
)

COMMIT = hook_module.NEMO_RL_COMMIT
GRPO = "nemo_rl/algorithms/grpo.py"

# One generate call: two samples of 3 and 5 generated tokens after prompts of 4 tokens each.
GENERATED = Workload(tokens=8, sequences=2, max_response_tokens=5, prompt_tokens=8)
TURNS = 2  # a multi-turn rollout generates once per turn
COMMIT_STEPS = 40
"""Steps after which the daemon's controller has committed a clock per kind (in about 15 on this work)."""
GENERATION = Workload(tokens=16, sequences=4, max_response_tokens=5, prompt_tokens=16)
# train_data: three samples (7, 9, 6 tokens), loss on 3, 5, 3 of them; the third's sample_mask is 0.
TRAINING = Workload(tokens=22, valid_tokens=8, sequences=3, max_response_tokens=5, prompt_tokens=11)


def excerpt(path: str, name: str) -> str:
    return source_excerpt("nemo_rl", COMMIT, path, name)


def _signature(path: str, qualname: str) -> list[str]:
    """The parameter names of ``qualname`` (``Class.method``) in the excerpt of ``Class``."""
    cls, _, method = qualname.partition(".")
    tree = ast.parse(excerpt(path, cls))
    node = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == method)
    return [a.arg for a in (*node.args.args, *node.args.kwonlyargs)]


def _line(text: str, needle: str, start: int = 0) -> int:
    """The index of the first line at or after ``start`` that contains ``needle``."""
    lines = text.splitlines()
    return next(i for i in range(start, len(lines)) if needle in lines[i])


class StandInGeneration:
    """Shaped from ``GenerationInterface`` (and ``VllmGeneration``'s ``generate_async``,
    ``clear_logger_metrics``): returns ``GenerationOutputSpec`` fields, records the calls."""

    def __init__(self, calls: list[str], work: SimWork | None = None) -> None:
        self.calls = calls
        self.work = work

    def generate(self, data: dict[str, Any], greedy: bool) -> dict[str, torch.Tensor]:
        self.calls.append("generate")
        if self.work is not None:
            self.work.run(PhaseKind.GENERATION, share=1 / TURNS)
        return {
            "output_ids": torch.zeros((2, 9), dtype=torch.long),
            "generation_lengths": torch.tensor([3, 5]),
            "unpadded_sequence_lengths": torch.tensor([7, 9]),
        }

    async def generate_async(self, data: dict[str, Any], greedy: bool) -> AsyncIterator[tuple[int, Any]]:
        self.calls.append("generate_async")
        try:
            for index, (generated, whole) in enumerate(((3, 7), (5, 9))):
                yield (
                    index,
                    {
                        "generation_lengths": torch.tensor([generated]),
                        "unpadded_sequence_lengths": torch.tensor([whole]),
                    },
                )
        finally:
            self.calls.append("generate_async closed")

    def prepare_for_generation(self, *args: Any, **kwargs: Any) -> bool:
        self.calls.append("prepare_for_generation")
        return True

    def finish_generation(self, *args: Any, **kwargs: Any) -> bool:
        self.calls.append("finish_generation")
        return True

    def clear_logger_metrics(self) -> None:
        self.calls.append("clear_logger_metrics")


class StandInPolicy:
    """Shaped from ``PolicyInterface`` (``train``, ``prepare_for_training``, ``get_logprobs``)."""

    def __init__(self, calls: list[str], work: SimWork | None = None) -> None:
        self.calls = calls
        self.work = work

    def get_logprobs(self, data: dict[str, Any], timer: Any = None) -> dict[str, torch.Tensor]:
        self.calls.append("get_logprobs")
        return {"logprobs": torch.zeros((3, 9))}

    def prepare_for_training(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append("prepare_for_training")

    def train(
        self,
        data: dict[str, Any],
        loss_fn: Any,
        eval_mode: bool = False,
        *,
        gbs: int | None = None,
        mbs: int | None = None,
        timer: Any = None,
    ) -> dict[str, Any]:
        self.calls.append("train" if not eval_mode else "train(eval_mode)")
        if self.work is not None:
            self.work.run(PhaseKind.TRAINING)
        return {"loss": torch.tensor(0.1)}


def train_data() -> dict[str, torch.Tensor]:
    token_mask = torch.zeros((3, 9), dtype=torch.long)
    token_mask[0, 4:7] = token_mask[1, 4:9] = token_mask[2, 3:6] = 1
    return {
        "input_ids": torch.zeros((3, 9), dtype=torch.long),
        "input_lengths": torch.tensor([7, 9, 6]),
        "token_mask": token_mask,
        "sample_mask": torch.tensor([1.0, 1.0, 0.0]),
    }


def grpo_train_like(
    policy: StandInPolicy,
    generation: StandInGeneration,
    steps: int,
    *,
    use_async: bool = False,
    validate: bool = True,
) -> None:
    """The calls ``grpo_train`` makes on ``policy`` and ``policy_generation`` each step (checked against the
    excerpt by TestContract), with a validation after every step."""
    for _ in range(steps):
        generation.prepare_for_generation()  # prepare_for_generation/total (or refit)
        generation.clear_logger_metrics()  # first line in timer.time("generation")
        for _turn in range(TURNS):  # run_multi_turn_rollout / run_async_multi_turn_rollout
            if use_async:

                async def drain() -> None:
                    async for _item in generation.generate_async({}, greedy=False):
                        pass

                asyncio.run(drain())
            else:
                generation.generate({}, greedy=False)
        generation.finish_generation()  # last call in timer.time("generation")
        policy.get_logprobs(train_data())  # policy_and_reference_logprobs
        policy.prepare_for_training()  # training_prep
        policy.train(train_data(), loss_fn=None, timer=None)  # policy_training
        if validate:
            generation.prepare_for_generation()  # validation: refit / prepare
            generation.generate({}, greedy=False)  # validate() → run_multi_turn_rollout
            generation.finish_generation()


class TestContract:
    def test_the_stand_ins_have_the_interfaces_signatures(self, framework_version: str) -> None:
        interfaces = "nemo_rl/models/generation/interfaces.py"
        assert _signature(interfaces, "GenerationInterface.generate") == ["self", "data", "greedy"]
        assert _signature(interfaces, "GenerationInterface.finish_generation") == ["self"]
        assert _signature("nemo_rl/models/policy/interfaces.py", "PolicyInterface.train") == [
            "self",
            "data",
            "loss_fn",
            "eval_mode",
            "gbs",
            "mbs",
            "timer",
        ]
        spec = excerpt(interfaces, "GenerationOutputSpec")
        assert "generation_lengths: torch.Tensor" in spec
        assert "unpadded_sequence_lengths" in spec

    def test_grpo_train_calls_what_the_hook_wraps_in_the_order_the_loop_assumes(self) -> None:
        text = excerpt(GRPO, "grpo_train")
        assert text.count("policy_generation.clear_logger_metrics()") == 1
        loop = _line(text, "for batch in wrapped_dataloader:")
        prepare = _line(text, "policy_generation.prepare_for_generation()", loop)
        block = _line(text, 'with timer.time("generation"):', prepare)
        clear = _line(text, "policy_generation.clear_logger_metrics()", block)
        finish = _line(text, "policy_generation.finish_generation()", clear)
        training_prep = _line(text, "policy.prepare_for_training()", finish)
        training = _line(text, 'with timer.time("policy_training"):', training_prep)
        train = _line(text, "train_results = policy.train(", training)
        validation = _line(text, "val_metrics, validation_timings = validate(", train)
        after_validation = _line(text, "policy_generation.finish_generation()", validation)
        assert loop < prepare < block < clear < finish < training_prep < training < train
        assert train < validation < after_validation
        assert clear == block + 3  # `if policy_generation is not None:` after the comment line
        between = "\n".join(text.splitlines()[block:finish])
        assert "run_multi_turn_rollout(" in between
        assert "run_async_multi_turn_rollout(" in between
        assert "run_nemo_gym_rollout_sync(" in between

    def test_validation_and_the_rollouts_never_clear_the_logger_metrics(self) -> None:
        assert "clear_logger_metrics" not in excerpt(GRPO, "validate")
        rollouts = "nemo_rl/experience/rollouts.py"
        assert "policy_generation.generate(" in excerpt(rollouts, "generate_responses")
        assert "policy_generation.generate_async(" in excerpt(rollouts, "generate_responses_async")
        assert 'generation_outputs["generation_lengths"]' in excerpt(rollouts, "generate_responses")

    def test_train_data_carries_the_fields_the_hook_counts(self) -> None:
        text = excerpt(GRPO, "grpo_train")
        for field in ('"input_lengths": input_lengths', '"token_mask": flat_messages["token_loss_mask"]'):
            assert field in text
        assert '"sample_mask": repeated_batch["loss_multiplier"]' in text

    def test_the_async_trainer_trains_in_the_driver_and_clears_metrics_outside_generation(self) -> None:
        text = excerpt(GRPO, "async_grpo_train")
        assert "train_results = policy.train(" in text
        assert re.search(r"policy_generation\.clear_logger_metrics\(\)", text)  # why generation=None there

    def test_run_grpo_picks_grpo_train_unless_the_data_plane_is_enabled(self) -> None:
        """grpo_train_sync (data_plane.enabled) is not covered; the default is the trainer the hook knows."""
        source = excerpt("examples/run_grpo.py", "_select_trainer")
        namespace: dict[str, Any] = {"grpo_train": "grpo_train", "MasterConfig": dict}
        exec(compile(source, "run_grpo.py@" + COMMIT[:12], "exec"), namespace)  # NeMo-RL's own function text
        assert namespace["_select_trainer"](SimpleNamespace(data_plane=None)) == "grpo_train"
        assert namespace["_select_trainer"](SimpleNamespace(data_plane={"enabled": False})) == "grpo_train"
        assert "from nemo_rl.algorithms.grpo_sync import grpo_train_sync" in source

    def test_an_object_it_cannot_hook_warns_naming_the_commit(self, recorder: Recorder) -> None:
        with pytest.warns(HookWarning, match=COMMIT[:12]):
            hook = hook_module.instrument(object(), recorder, generation=object())
        assert hook.variant == ""


class TestDriven:
    def test_each_steps_rollout_and_update_are_phases_and_validation_is_not(self, recorder: Recorder) -> None:
        calls: list[str] = []
        policy, generation = StandInPolicy(calls), StandInGeneration(calls)
        hook = hook_module.instrument(policy, recorder, generation=generation, start_step=4)
        assert hook.variant == hook_module.SYNC
        grpo_train_like(policy, generation, steps=2)
        assert [(p.kind, p.iteration, p.workload) for p in recorder.phases] == [
            (PhaseKind.GENERATION, 5, GENERATION),
            (PhaseKind.TRAINING, 5, TRAINING),
            (PhaseKind.GENERATION, 6, GENERATION),
            (PhaseKind.TRAINING, 6, TRAINING),
        ]
        assert calls.count("generate") == 2 * (TURNS + 1)

    def test_async_rollouts_are_counted_sample_by_sample(self, recorder: Recorder) -> None:
        calls: list[str] = []
        policy, generation = StandInPolicy(calls), StandInGeneration(calls)
        hook_module.instrument(policy, recorder, generation=generation)
        grpo_train_like(policy, generation, steps=1, use_async=True)
        assert recorder.phases[0].workload == GENERATION
        assert calls.count("generate_async") == TURNS

    def test_a_consumer_that_stops_early_closes_nemo_rls_generator_too(self, recorder: Recorder) -> None:
        calls: list[str] = []
        policy, generation = StandInPolicy(calls), StandInGeneration(calls)
        hook_module.instrument(policy, recorder, generation=generation)
        generation.clear_logger_metrics()

        async def first_only() -> None:
            stream = generation.generate_async({}, greedy=False)
            async for _item in stream:
                break
            await stream.aclose()

        asyncio.run(first_only())
        generation.finish_generation()
        assert calls[-2:] == ["generate_async closed", "finish_generation"]
        assert recorder.phases[0].workload == Workload(
            tokens=3, sequences=1, max_response_tokens=3, prompt_tokens=4
        )

    def test_an_evaluation_pass_of_train_is_not_a_phase(self, recorder: Recorder) -> None:
        calls: list[str] = []
        policy = StandInPolicy(calls)
        hook_module.instrument(policy, recorder)
        policy.train(train_data(), None, True)
        policy.train(train_data(), None, eval_mode=True)
        assert recorder.phases == []

    def test_without_a_generation_it_reports_training_only(self, recorder: Recorder) -> None:
        calls: list[str] = []
        policy, generation = StandInPolicy(calls), StandInGeneration(calls)
        hook = hook_module.instrument(policy, recorder)
        assert hook.variant == hook_module.TRAINING_ONLY
        grpo_train_like(policy, generation, steps=2)
        assert [(p.kind, p.iteration) for p in recorder.phases] == [
            (PhaseKind.TRAINING, 1),
            (PhaseKind.TRAINING, 2),
        ]

    def test_remove_restores_both_objects(self, recorder: Recorder) -> None:
        calls: list[str] = []
        policy, generation = StandInPolicy(calls), StandInGeneration(calls)
        hook_module.instrument(policy, recorder, generation=generation).remove()
        assert not vars(policy).keys() - {"calls", "work"}
        assert not vars(generation).keys() - {"calls", "work"}
        grpo_train_like(policy, generation, steps=1)
        assert recorder.phases == []

    def test_a_failing_session_never_stops_the_loop(self) -> None:
        class Broken:
            def phase(self, *args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("no daemon")

        calls: list[str] = []
        policy, generation = StandInPolicy(calls), StandInGeneration(calls)
        hook_module.instrument(policy, Broken(), generation=generation)
        grpo_train_like(policy, generation, steps=1)
        assert calls.count("train") == 1


class TestMetered:
    def test_the_daemon_meters_each_phase_with_its_tokens_and_clock(self, metering_daemon: Any) -> None:
        calls: list[str] = []
        policy, generation = StandInPolicy(calls), StandInGeneration(calls)
        with eerl.connect(gpus=[0], job_id="nemo-rl-grpo", config=metering_daemon.config) as session:
            hook_module.instrument(policy, session, generation=generation)
            grpo_train_like(policy, generation, steps=3)
            assert session.flush(10)
        records = metering_daemon.records
        assert [(r.kind, r.iteration) for r in records] == [
            (kind, step) for step in (1, 2, 3) for kind in (PhaseKind.GENERATION, PhaseKind.TRAINING)
        ]
        assert [(r.tokens, r.valid_tokens, r.sm_clock_mhz) for r in records] == [
            (GENERATION.tokens, 0, GENERATION_MHZ),
            (TRAINING.tokens, TRAINING.valid_tokens, TRAINING_MHZ),
        ] * 3

    def test_the_daemons_own_controller_commits_a_clock_for_each_phase_kind(
        self, committing_daemon: tuple[Any, SimWork]
    ) -> None:
        """The stand-ins' work runs on the simulated GPU the session holds: eerl explores and commits."""
        daemon, work = committing_daemon
        calls: list[str] = []
        policy, generation = StandInPolicy(calls, work), StandInGeneration(calls, work)
        with eerl.connect(gpus=[0], job_id="nemo-rl-grpo", config=daemon.config) as session:
            hook_module.instrument(policy, session, generation=generation)
            grpo_train_like(policy, generation, steps=COMMIT_STEPS, validate=False)
            assert session.flush(10)
        assert_commits(daemon.records)
        assert {r.valid_tokens for r in daemon.records if r.kind is PhaseKind.TRAINING} == {
            TRAINING.valid_tokens
        }
