"""verl: put a ``RayPPOTrainer``'s rollout and actor update into an eerl session.

verl has no callback API: its ``RayPPOTrainer.fit()`` times the rollout as ``marked_timer("gen", …)`` and
the policy update as ``marked_timer("update_actor", …)``. This hook wraps the calls inside those two
blocks on the trainer object (call it after ``trainer.init_workers()`` and before ``trainer.fit()``)::

    session = eerl.connect(gpus=[0, 1, 2, 3, 4, 5, 6, 7], job_id="my-ppo-run")
    eerl.integrations.verl.instrument(trainer, session)
    trainer.fit()

On several nodes, pass ``eerl.ray.RayJob(job_id=...)`` instead of the session: one clock decision per phase
for every node of the job (docs/multinode.md).

* **generation** wraps ``trainer.async_rollout_manager.generate_sequences`` (agent-loop / async rollout)
  and ``trainer.actor_rollout_wg.generate_sequences`` (the older synchronous rollout), whichever the run
  uses. Tokens are the response tokens generated (``response_mask``, or the response part of
  ``attention_mask``); prompt tokens, sequences and the longest response go with them.
* **training** wraps ``trainer._update_actor`` (verl ≥ 0.6) or else
  ``trainer.actor_rollout_wg.update_actor``. ``valid_tokens`` are the response tokens of the batch
  trained on (``response_mask`` sum), ``tokens`` all its tokens (``attention_mask`` sum).

The iteration is ``trainer.global_steps``. Rollouts made by ``trainer._validate()`` are not reported.
The driver process usually sees no GPU (``CUDA_VISIBLE_DEVICES`` is empty there), so name the node's
GPUs with ``gpus=`` or ``EERL_GPUS``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eerl.integrations._counting import longest_row, rows, total
from eerl.integrations._source import PhaseSource
from eerl.integrations._wrapping import Patches
from eerl.phases import PhaseKind


class VerlHook:
    """The hook on one trainer; :meth:`remove` restores it."""

    def __init__(self, trainer: Any, session: PhaseSource) -> None:
        self._trainer = trainer
        self._session = session
        self._patches = Patches()
        self._active = False
        self._validating = False
        workers = getattr(trainer, "actor_rollout_wg", None)
        self._patches.wrap(
            getattr(trainer, "async_rollout_manager", None), "generate_sequences", self._generation
        )
        self._patches.wrap(workers, "generate_sequences", self._generation)
        if not self._patches.wrap(trainer, "_update_actor", self._training):
            self._patches.wrap(workers, "update_actor", self._training)
        self._patches.wrap(trainer, "_validate", self._validation)

    def remove(self) -> None:
        """Undoes the wrapping."""
        self._patches.undo()

    def _iteration(self) -> int | None:
        steps = getattr(self._trainer, "global_steps", None)
        return int(steps) if steps is not None else None

    def _generation(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def generate_sequences(*args: Any, **kwargs: Any) -> Any:
            if self._active or self._validating:
                return original(*args, **kwargs)
            self._active = True
            try:
                with self._session.phase(PhaseKind.GENERATION, iteration=self._iteration()) as phase:
                    output = original(*args, **kwargs)
                    batch = getattr(output, "batch", None)
                    if batch is not None:
                        response_mask = _response_mask(batch)
                        phase.report(
                            tokens=total(response_mask),
                            sequences=rows(response_mask),
                            max_response_tokens=longest_row(response_mask),
                            prompt_tokens=max(0, total(_get(batch, "attention_mask")) - total(response_mask)),
                        )
                    return output
            finally:
                self._active = False

        return generate_sequences

    def _training(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def update_actor(batch: Any, *args: Any, **kwargs: Any) -> Any:
            if self._active:
                return original(batch, *args, **kwargs)
            self._active = True
            try:
                with self._session.phase(PhaseKind.TRAINING, iteration=self._iteration()) as phase:
                    tensors = getattr(batch, "batch", None)
                    if tensors is not None:
                        response_mask = _response_mask(tensors)
                        all_tokens = total(_get(tensors, "attention_mask"))
                        valid_tokens = total(response_mask)
                        phase.report(
                            tokens=all_tokens,
                            valid_tokens=valid_tokens,
                            sequences=rows(response_mask),
                            max_response_tokens=longest_row(response_mask),
                            prompt_tokens=max(0, all_tokens - valid_tokens),
                        )
                    return original(batch, *args, **kwargs)
            finally:
                self._active = False

        return update_actor

    def _validation(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def validate(*args: Any, **kwargs: Any) -> Any:
            self._validating = True
            try:
                return original(*args, **kwargs)
            finally:
                self._validating = False

        return validate


def instrument(trainer: Any, session: PhaseSource) -> VerlHook:
    """Reports ``trainer``'s (a verl ``RayPPOTrainer``, after ``init_workers()``) phases to ``session``."""
    return VerlHook(trainer, session)


def _get(batch: Any, key: str) -> Any:
    try:
        return batch[key] if key in batch.keys() else None  # noqa: SIM118 - TensorDict refuses `in`
    except (KeyError, TypeError, AttributeError):
        return None


def _response_mask(batch: Any) -> Any:
    """verl's ``response_mask``, or the response columns of ``attention_mask`` (as verl computes it)."""
    mask = _get(batch, "response_mask")
    if mask is not None:
        return mask
    responses = _get(batch, "responses")
    attention_mask = _get(batch, "attention_mask")
    if responses is None or attention_mask is None:
        return None
    return attention_mask[:, -responses.shape[-1] :]
