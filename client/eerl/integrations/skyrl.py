"""SkyRL: put a PPO/GRPO trainer's rollout and policy update into an eerl session.

Checked against the releases ``skyrl`` 0.4.0 and 0.3.0 (``skyrl/train/trainer.py``; tests/frameworks drive
the real ``RayPPOTrainer.train`` loop). The trainer is a plain object in the driver, so the hook wraps two
of its methods on that one object:

* **generation** = ``await trainer.generate(generator_input)`` — the ``Timer("generate")`` block, where
  the inference engines sample the batch (with ``colocate_all`` they are awake on the trainer's GPUs).
  Tokens from the ``GeneratorOutput``: ``response_ids`` (generated), ``prompt_token_ids``. Evaluation
  calls ``generator.generate`` directly, not ``trainer.generate``, so it is not reported. With dynamic
  sampling a step may generate several times: one phase each, all with the step's iteration.
* **training** = ``trainer.train_critic_and_policy(training_input)`` — the ``Timer("train_critic_and_
  policy")`` block (critic and policy ``forward_backward`` + ``optim_step``). Tokens from the
  ``TrainingInputBatch``: ``attention_mask`` (prompt + response), ``loss_mask`` (valid: the response
  tokens trained on), ``response_mask`` (sequences, longest response).

Between the phases, not in one: postprocessing, ``convert_to_training_input``, the forward pass for
log-probs/values/rewards, advantages, checkpoints, and the weight sync to the engines.

``max_worker_kv_tokens``: SkyRL's inference client spreads requests over its engines as they arrive and the
output does not say which engine decoded which sample, so the hook reports the batch's decode reads (Σ
response length² / 2 plus its decode steps' weight reads, ``_counting.decode_reads``) only when there is one
engine (``generator.inference_engine``: ``run_engines_locally``, ``num_engines`` 1, ``data_parallel_size`` 1,
no prefill/decode disaggregation), else 0 (unknown).

``FullyAsyncRayPPOTrainer`` generates in background tasks through ``generator.generate`` while it trains:
the hook reports its training phases only (open the session with ``mode="async", role="training"``; the
inference engines' GPUs need a session of their own, ``role="generation"``). The public callbacks
(``add_callback``) mark steps, not the rollout, so the hook does not use them. The iteration is
``trainer.global_step``. On several nodes, pass ``eerl.ray.RayJob(job_id=...)`` instead of the session.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from eerl.integrations._common import GuardedPhases, framework_version, logger, warn_setup
from eerl.integrations._counting import decode_reads, longest_row, rows, total
from eerl.integrations._source import PhaseSource
from eerl.integrations._wrapping import Patches
from eerl.phases import PhaseKind, Workload

__all__ = ["SkyrlHook", "generation_workload", "instrument", "training_workload"]

SYNC = "RayPPOTrainer"
FULLY_ASYNC = "FullyAsyncRayPPOTrainer (training only)"

_EXPECTED = "RayPPOTrainer's async generate(input_batch) and train_critic_and_policy(data)"


class SkyrlHook:
    """The hook on one trainer; :meth:`remove` restores it. ``variant`` says which trainer it found."""

    def __init__(self, trainer: Any, session: PhaseSource) -> None:
        self._trainer = trainer
        self._phases = GuardedPhases(session, "SkyRL")
        self._patches = Patches()
        self.variant = ""
        fully_async = callable(getattr(trainer, "_run_generate_for_a_group_loop", None))
        self.generation_hooked = False
        if fully_async:
            logger.info(
                "eerl: SkyRL %s fully async trainer: generation runs in background tasks on the engines' "
                "GPUs; only training phases are reported (open the session with mode='async', "
                "role='training')",
                framework_version("skyrl"),
            )
        elif _is_async(getattr(trainer, "generate", None)):
            self.generation_hooked = self._patches.wrap(trainer, "generate", self._generation)
        self.training_hooked = self._patches.wrap(trainer, "train_critic_and_policy", self._training)
        kind = type(trainer).__name__
        if not (self.generation_hooked or self.training_hooked):
            self._patches.undo()
            warn_setup(
                f"SkyRL hook: found nothing to wrap on {kind} (skyrl {framework_version('skyrl')}); "
                f"expected {_EXPECTED}. Nothing will be reported."
            )
            return
        self.variant = FULLY_ASYNC if fully_async else SYNC
        if not fully_async and not (self.generation_hooked and self.training_hooked):
            missing = "generation" if not self.generation_hooked else "training"
            warn_setup(
                f"SkyRL hook: on {kind} (skyrl {framework_version('skyrl')}) no {missing} step was found to "
                f"wrap; expected {_EXPECTED}. Those phases will not be reported."
            )

    def remove(self) -> None:
        """Undoes the wrapping."""
        self._patches.undo()

    def _iteration(self) -> int | None:
        try:
            return int(self._trainer.global_step)
        except Exception:
            return None

    def _generation(self, original: Callable[..., Any]) -> Callable[..., Any]:
        async def generate(*args: Any, **kwargs: Any) -> Any:
            phase = self._phases.begin(PhaseKind.GENERATION, self._iteration())
            try:
                output = await original(*args, **kwargs)
                self._phases.report(phase, lambda: generation_workload(output, _one_engine(self._trainer)))
                return output
            finally:
                self._phases.end(phase)

        return generate

    def _training(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def train_critic_and_policy(data: Any, *args: Any, **kwargs: Any) -> Any:
            phase = self._phases.begin(PhaseKind.TRAINING, self._iteration())
            try:
                self._phases.report(phase, lambda: training_workload(data))
                return original(data, *args, **kwargs)
            finally:
                self._phases.end(phase)

        return train_critic_and_policy


def instrument(trainer: Any, session: PhaseSource) -> SkyrlHook:
    """Reports ``trainer``'s (a SkyRL ``RayPPOTrainer`` or subclass, after ``build_models``) phases to
    ``session``; returns the hook. Warns (:class:`~eerl.integrations.HookWarning`) when it finds nothing to
    wrap; never raises."""
    return SkyrlHook(trainer, session)


def generation_workload(output: Any, one_engine: bool) -> Workload:
    """The workload of a ``GeneratorOutput``: response tokens generated (``response_ids``), prompt tokens
    (``prompt_token_ids``), sequences, the longest response, and — when ``one_engine`` decoded them all —
    its decode reads as ``max_worker_kv_tokens`` (else 0: not known)."""
    lengths = [len(ids) for ids in _lists(output, "response_ids")]
    return Workload(
        tokens=sum(lengths),
        sequences=len(lengths),
        max_response_tokens=max(lengths, default=0),
        prompt_tokens=sum(len(ids) for ids in _lists(output, "prompt_token_ids")),
        max_worker_kv_tokens=decode_reads(lengths) if one_engine else 0,
    )


def training_workload(batch: Any) -> Workload:
    """The workload of a ``TrainingInputBatch``: ``attention_mask`` (all tokens), ``loss_mask`` (valid:
    response tokens trained on), ``response_mask`` (sequences, longest response)."""
    attention = _get(batch, "attention_mask")
    responses = _get(batch, "response_mask")
    loss = _get(batch, "loss_mask")
    all_tokens = total(attention)
    response_tokens = total(responses)
    return Workload(
        tokens=all_tokens,
        valid_tokens=total(loss) if loss is not None else response_tokens,
        sequences=rows(responses if responses is not None else attention),
        max_response_tokens=longest_row(responses),
        prompt_tokens=max(0, all_tokens - response_tokens),
    )


def _one_engine(trainer: Any) -> bool:
    """Whether one inference engine decodes every sample (then the batch's decode reads are its own)."""
    engine = getattr(getattr(getattr(trainer, "cfg", None), "generator", None), "inference_engine", None)
    if engine is None:
        return False
    return (
        bool(getattr(engine, "run_engines_locally", False))
        and getattr(engine, "num_engines", 0) == 1
        and getattr(engine, "data_parallel_size", 1) == 1
        and not getattr(engine, "enable_pd", False)
    )


def _lists(output: Any, key: str) -> Sequence[Sequence[Any]]:
    value = output.get(key) if hasattr(output, "get") else None
    return value if isinstance(value, Sequence) else []


def _get(batch: Any, key: str) -> Any:
    try:
        return batch.get(key)
    except Exception:
        return None


def _is_async(method: Any) -> bool:
    """Whether ``method`` is an ``async def``, under decorators that keep ``__wrapped__`` (SkyRL's
    ``generate`` is ``@torch.no_grad()``: a plain function returning the coroutine)."""
    try:
        return callable(method) and inspect.iscoroutinefunction(inspect.unwrap(method))
    except Exception:
        return False
