"""TRL: put a ``GRPOTrainer``'s generation and optimisation steps into an eerl session.

Usage (two lines besides the trainer)::

    session = eerl.connect(job_id="my-grpo-run")
    eerl.integrations.trl.instrument(trainer, session)
    trainer.train()

Under accelerate or torchrun on several nodes, pass ``eerl.dist.DistJob(job_id=...)`` (built on every rank)
instead of the session: one clock decision per step for every node (docs/multinode.md).

Where the phases are, in TRL's ``GRPOTrainer`` (checked against TRL 1.x):

* **generation** wraps ``_generate_and_score_completions`` — TRL's rollout: sampling completions, then
  scoring them (rewards, reference log-probs). Its tokens are the completion tokens generated
  (``completion_mask`` sum); ``prompt_tokens``, ``sequences`` and the longest completion go with them.
* **training** begins once a micro-batch's inputs are ready (after any generation inside
  ``_prepare_inputs``) and ends at the optimiser step (``on_step_end``). Its ``valid_tokens`` are the
  completion tokens of the samples trained on (``completion_mask`` sum over the step's micro-batches),
  its ``tokens`` those plus their prompt tokens.

Phases never nest: TRL generates inside ``training_step``, so a generation that starts while a training
phase is open ends that training phase first. The iteration is ``trainer.state.global_step``. Evaluation
(``model.training`` False) is not reported.
"""

from __future__ import annotations

from typing import Any

from eerl.integrations._counting import longest_row, rows, total
from eerl.integrations._source import PhaseLike, PhaseSource
from eerl.phases import PhaseKind


class TrlHook:
    """The hook on one trainer; :meth:`remove` restores the trainer."""

    def __init__(self, trainer: Any, session: PhaseSource) -> None:
        self._trainer = trainer
        self._session = session
        self._training: PhaseLike | None = None
        self._original_generate = trainer._generate_and_score_completions
        self._original_prepare = trainer._prepare_inputs
        self._callback = _StepCallback(self)
        trainer._generate_and_score_completions = self._generate_and_score_completions
        trainer._prepare_inputs = self._prepare_inputs
        trainer.add_callback(self._callback)

    def remove(self) -> None:
        """Ends an open training phase and undoes the wrapping."""
        self.end_training()
        trainer = self._trainer
        trainer._generate_and_score_completions = self._original_generate
        trainer._prepare_inputs = self._original_prepare
        trainer.remove_callback(self._callback)

    def _is_training(self) -> bool:
        return bool(getattr(self._trainer.model, "training", False))

    def _iteration(self) -> int:
        return int(self._trainer.state.global_step)

    def _generate_and_score_completions(self, inputs: Any) -> Any:
        if not self._is_training():
            return self._original_generate(inputs)
        self.end_training()
        with self._session.phase(PhaseKind.GENERATION, iteration=self._iteration()) as phase:
            output = self._original_generate(inputs)
            completion_mask = output.get("completion_mask")
            phase.report(
                tokens=total(completion_mask),
                sequences=rows(completion_mask),
                max_response_tokens=longest_row(completion_mask),
                prompt_tokens=total(output.get("prompt_mask")),
            )
        return output

    def _prepare_inputs(self, batch: Any) -> Any:
        inputs = self._original_prepare(batch)
        if not self._is_training():
            return inputs
        if self._training is None:
            self._training = self._session.phase(PhaseKind.TRAINING, iteration=self._iteration())
            self._training.__enter__()
        completion_mask = inputs.get("completion_mask")
        completion_tokens = total(completion_mask)
        prompt_tokens = total(inputs.get("prompt_mask"))
        self._training.report(
            tokens=prompt_tokens + completion_tokens,
            valid_tokens=completion_tokens,
            sequences=rows(completion_mask),
            max_response_tokens=longest_row(completion_mask),
            prompt_tokens=prompt_tokens,
        )
        return inputs

    def end_training(self) -> None:
        """Ends the open training phase, if any (called at the optimiser step)."""
        phase, self._training = self._training, None
        if phase is not None:
            phase.__exit__(None, None, None)


def instrument(trainer: Any, session: PhaseSource) -> TrlHook:
    """Reports ``trainer``'s (a TRL ``GRPOTrainer``) phases to ``session``; returns the hook."""
    return TrlHook(trainer, session)


class _StepCallback:
    """A ``transformers`` trainer callback that ends the training phase at each optimiser step.

    Duck-typed rather than a ``TrainerCallback`` subclass, so that the hook never imports transformers:
    the trainer's callback handler calls ``on_<event>(args, state, control, **kwargs)`` and keeps
    ``control`` when the answer is None; every event this class does not define is such a no-op.
    """

    def __init__(self, hook: TrlHook) -> None:
        self._hook = hook

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._hook.end_training()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._hook.end_training()

    def __getattr__(self, name: str) -> Any:
        if name.startswith("on_"):
            return _ignore_event
        raise AttributeError(name)


def _ignore_event(*args: Any, **kwargs: Any) -> None:
    return None
