"""NeMo-RL: put ``grpo_train``'s rollout and policy update into an eerl session.

NeMo-RL is not on the package index (the name there is a placeholder), so this hook is written and tested
against the structure of its source, NVIDIA-NeMo/RL at commit 7ea279abfbeb698b092856d0dab61e7cf39bc909
(``nemo_rl/algorithms/grpo.py``; tests/client/test_nemo_rl_hook.py checks the call sites it relies on in
that text). ``grpo_train(policy, policy_generation, ...)`` is a function, not a trainer object, so the hook
wraps its two arguments, the objects it drives:

* **generation** = from ``policy_generation.clear_logger_metrics()`` — the first call inside
  ``timer.time("generation")``, and made nowhere else in ``grpo_train`` — to the
  ``policy_generation.finish_generation()`` that ends that block. The weight refit and
  ``prepare_for_generation`` before it are outside; validation (``prepare_for_generation`` → ``validate``
  → ``finish_generation``, no ``clear_logger_metrics``) opens no phase and is not reported. Tokens: every
  ``generate`` / ``generate_async`` output in the phase (``generation_lengths``; prompt tokens
  ``unpadded_sequence_lengths`` − ``generation_lengths``; multi-turn rollouts add each turn). NeMo-Gym
  rollouts sample over the engines' HTTP servers, not through these methods: their phase reports no
  tokens. ``max_worker_kv_tokens`` is 0 (unknown: the vLLM workers' split is not on the driver).
* **training** = ``policy.train(data, loss_fn, ...)`` inside ``timer.time("policy_training")`` (calls with
  ``eval_mode=True`` are not reported). Tokens from the ``train_data`` batch: ``input_lengths`` (all),
  ``token_mask`` row sums of the samples whose ``sample_mask`` is set (valid: the tokens the loss is on).

Between the phases: rewards, log-prob inference of the policy and reference, advantages,
``prepare_for_training``, checkpoints. The iteration is ``start_step`` + 1 + the updates seen so far, which
is grpo_train's ``total_steps + 1`` when ``start_step`` is ``grpo_save_state.total_steps``.

Colocated or not, ``grpo_train`` alternates the two, so one synchronous session over the node's GPUs (the
engines' and the policy's) is right for it.

Not covered: ``grpo_train_sync``, which ``examples/run_grpo.py`` picks when ``data_plane.enabled`` (off by
default): its rollouts run in a rollout actor and it does not update through ``policy.train``.

``async_grpo_train`` samples in an ``AsyncTrajectoryCollector`` actor while the driver trains: instrument it
without ``generation`` (training phases only; open the session with ``mode="async", role="training"``;
the generation GPUs need a session of their own, ``role="generation"``).
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from eerl.integrations._common import GuardedPhases, framework_version, warn_setup
from eerl.integrations._counting import as_ints, row_lengths, rows
from eerl.integrations._source import PhaseLike, PhaseSource
from eerl.integrations._wrapping import Patches
from eerl.phases import PhaseKind, Workload

__all__ = ["NEMO_RL_COMMIT", "NemoRlHook", "generation_workload", "instrument", "training_workload"]

NEMO_RL_COMMIT = "7ea279abfbeb698b092856d0dab61e7cf39bc909"
"""The NVIDIA-NeMo/RL commit whose ``grpo_train`` this hook was checked against."""

SYNC = "grpo_train"
TRAINING_ONLY = "training only (async_grpo_train, or no policy_generation)"

_EXPECTED = (
    "policy.train(data, loss_fn, ...) and policy_generation.clear_logger_metrics / generate / "
    "finish_generation (grpo_train's arguments)"
)


class NemoRlHook:
    """The hook on a policy (and its generation); :meth:`remove` restores them."""

    def __init__(self, policy: Any, session: PhaseSource, generation: Any, start_step: int) -> None:
        self._phases = GuardedPhases(session, "NeMo-RL")
        self._patches = Patches()
        self._step = start_step
        self._generation: PhaseLike | None = None
        self._generated: list[Workload] = []
        self.generation_hooked = False
        if generation is not None:
            self.generation_hooked = self._patches.wrap(
                generation, "clear_logger_metrics", self._begin_generation
            ) and self._patches.wrap(generation, "finish_generation", self._finish_generation)
            if self.generation_hooked:
                self._patches.wrap(generation, "generate", self._generate)
                if _is_async_generator(getattr(generation, "generate_async", None)):
                    self._patches.wrap(generation, "generate_async", self._generate_async)
        self.training_hooked = self._patches.wrap(policy, "train", self._training)
        version = f"NeMo-RL {framework_version('nemo-rl')}, checked against commit {NEMO_RL_COMMIT[:12]}"
        if not self.training_hooked or (generation is not None and not self.generation_hooked):
            missing = [
                name
                for name, hooked in (
                    ("training", self.training_hooked),
                    ("generation", self.generation_hooked),
                )
                if not hooked and (name == "training" or generation is not None)
            ]
            if not (self.training_hooked or self.generation_hooked):
                self._patches.undo()
            warn_setup(
                f"NeMo-RL hook: no {' or '.join(missing)} step found to wrap on {type(policy).__name__}"
                f"{'' if generation is None else ' / ' + type(generation).__name__} ({version}); expected "
                f"{_EXPECTED}. Those phases will not be reported."
            )
        self.variant = (
            SYNC
            if self.generation_hooked and self.training_hooked
            else TRAINING_ONLY
            if self.training_hooked and generation is None
            else ""
        )

    def remove(self) -> None:
        """Ends an open generation phase and undoes the wrapping."""
        self._end_generation()
        self._patches.undo()

    def _begin_generation(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def clear_logger_metrics(*args: Any, **kwargs: Any) -> Any:
            result = original(*args, **kwargs)
            if self._generation is None:
                self._generated = []
                self._generation = self._phases.begin(PhaseKind.GENERATION, self._step + 1)
            return result

        return clear_logger_metrics

    def _finish_generation(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def finish_generation(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            finally:
                self._end_generation()

        return finish_generation

    def _end_generation(self) -> None:
        phase, self._generation = self._generation, None
        generated, self._generated = self._generated, []
        self._phases.report(phase, lambda: _sum(generated))
        self._phases.end(phase)

    def _count(self, output: Any) -> None:
        if self._generation is not None:
            self._generated.append(self._phases.count(lambda: generation_workload(output)))

    def _generate(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def generate(*args: Any, **kwargs: Any) -> Any:
            output = original(*args, **kwargs)
            self._count(output)
            return output

        return generate

    def _generate_async(self, original: Callable[..., Any]) -> Callable[..., Any]:
        async def generate_async(*args: Any, **kwargs: Any) -> AsyncIterator[Any]:
            inner = original(*args, **kwargs)
            try:
                async for item in inner:
                    self._count(item[1] if isinstance(item, tuple) and len(item) == 2 else item)
                    yield item
            finally:
                # a consumer that stops early closes this generator; close NeMo-RL's at once too, which
                # cancels its Ray calls (vllm_generation.py), as without the hook
                await inner.aclose()

        return generate_async

    def _training(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def train(data: Any, *args: Any, **kwargs: Any) -> Any:
            if kwargs.get("eval_mode") or (len(args) > 1 and args[1] is True):
                return original(data, *args, **kwargs)
            phase = self._phases.begin(PhaseKind.TRAINING, self._step + 1)
            try:
                self._phases.report(phase, lambda: training_workload(data))
                return original(data, *args, **kwargs)
            finally:
                self._step += 1
                self._phases.end(phase)

        return train


def instrument(
    policy: Any, session: PhaseSource, *, generation: Any = None, start_step: int = 0
) -> NemoRlHook:
    """Reports the phases of ``grpo_train(policy, generation, ...)`` to ``session``; returns the hook.

    ``generation``: the ``policy_generation`` passed to ``grpo_train`` (None for ``async_grpo_train``:
    training phases only). ``start_step``: ``grpo_save_state.total_steps`` when resuming. Warns
    (:class:`~eerl.integrations.HookWarning`) when it finds nothing to wrap; never raises."""
    return NemoRlHook(policy, session, generation, start_step)


def generation_workload(output: Any) -> Workload:
    """The workload of one ``generate`` output (``GenerationOutputSpec``): ``generation_lengths`` (tokens,
    sequences, longest) and ``unpadded_sequence_lengths`` − ``generation_lengths`` (prompt tokens)."""
    generated = as_ints(_get(output, "generation_lengths"))
    whole = as_ints(_get(output, "unpadded_sequence_lengths"))
    return Workload(
        tokens=sum(generated),
        sequences=len(generated),
        max_response_tokens=max(generated, default=0),
        prompt_tokens=max(0, sum(whole) - sum(generated)) if whole else 0,
    )


def training_workload(data: Any) -> Workload:
    """The workload of a ``train_data`` batch: ``input_lengths`` (all tokens), ``token_mask`` row sums of the
    samples whose ``sample_mask`` is non-zero (valid tokens, longest), sequences."""
    lengths = as_ints(_get(data, "input_lengths"))
    token_mask = _get(data, "token_mask")
    keep = [bool(flag) for flag in _floats(_get(data, "sample_mask"))]
    per_row = row_lengths(token_mask)
    if len(keep) != len(per_row):
        keep = [True] * len(per_row)
    valid = [length for length, kept in zip(per_row, keep, strict=True) if kept]
    all_tokens = sum(lengths)
    return Workload(
        tokens=all_tokens,
        valid_tokens=sum(valid),
        sequences=len(lengths) or rows(token_mask),
        max_response_tokens=max(valid, default=0),
        prompt_tokens=max(0, all_tokens - sum(per_row)),
    )


def _sum(workloads: list[Workload]) -> Workload:
    return Workload(
        tokens=sum(w.tokens for w in workloads),
        sequences=sum(w.sequences for w in workloads),
        max_response_tokens=max((w.max_response_tokens for w in workloads), default=0),
        prompt_tokens=sum(w.prompt_tokens for w in workloads),
    )


def _get(batch: Any, key: str) -> Any:
    if isinstance(batch, Mapping) or hasattr(batch, "get"):
        try:
            return batch.get(key)
        except Exception:
            return None
    return None


def _floats(values: Any) -> list[float]:
    if values is None:
        return []
    if hasattr(values, "tolist"):
        values = values.tolist()
    return [float(value) for value in values]


def _is_async_generator(method: Any) -> bool:
    try:
        return callable(method) and inspect.isasyncgenfunction(inspect.unwrap(method))
    except Exception:
        return False
