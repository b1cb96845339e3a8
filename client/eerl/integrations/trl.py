"""TRL: put an online trainer's generation and optimisation steps into an eerl session.

Usage (two lines besides the trainer)::

    session = eerl.connect(job_id="my-grpo-run")
    eerl.integrations.trl.instrument(trainer, session)
    trainer.train()

Under accelerate or torchrun on several nodes, pass ``eerl.dist.DistJob(job_id=...)`` (built on every rank)
instead of the session: one clock decision per step for every node (docs/multinode.md).

The trainers that share GRPO's generation path, checked against TRL 1.16.0 and 1.15.0 (tests/frameworks):
``GRPOTrainer``, ``RLOOTrainer`` and ``DistillationTrainer`` (each generates in ``_prepare_inputs`` through
``_generate_and_score_completions``, whose output carries ``completion_mask`` and ``prompt_mask``).

* **generation** wraps ``_generate_and_score_completions`` — TRL's rollout: sampling completions, then
  scoring them (rewards, reference log-probs). Its tokens are the completion tokens generated
  (``completion_mask`` sum); ``prompt_tokens``, ``sequences`` and the longest completion go with them, and
  ``max_worker_kv_tokens``, this process's decode reads (each process decodes its own completions, so its
  session's generation predictor sees its own decode work): Σ completion length² / 2 plus, for each decode
  step, the model's weights in KV-cache tokens (from ``trainer.model``'s config and parameter count).
* **training** begins once a micro-batch's inputs are ready (after any generation inside
  ``_prepare_inputs``) and ends at the optimiser step (``on_step_end`` of a ``transformers`` trainer
  callback, the framework's extension point). Its ``valid_tokens`` are the completion tokens of the samples
  trained on (``completion_mask`` sum over the step's micro-batches), its ``tokens`` those plus their prompt
  tokens.

Phases never nest: TRL generates inside ``training_step``, so a generation that starts while a training
phase is open ends that training phase first. The iteration is ``trainer.state.global_step``. Evaluation
(``model.training`` False) is not reported. With ``use_vllm=True, vllm_mode="server"`` the completions are
sampled by a ``trl vllm-serve`` process on GPUs of its own, which this session does not cover (its clocks
are not controlled); with ``vllm_mode="colocate"`` vLLM runs on the trainer's own GPUs, which are covered.
A trainer without these methods gets a :class:`~eerl.integrations.HookWarning` naming the TRL version.
"""

from __future__ import annotations

from typing import Any

from eerl.integrations._common import GuardedPhases, framework_version, logger, warn_setup
from eerl.integrations._counting import longest_row, mask_decode_reads, model_step_reads, rows, total
from eerl.integrations._source import PhaseLike, PhaseSource
from eerl.phases import PhaseKind, Workload

__all__ = ["TrlHook", "instrument"]

_NEEDED = ("_generate_and_score_completions", "_prepare_inputs", "add_callback", "remove_callback")


class TrlHook:
    """The hook on one trainer; :meth:`remove` restores the trainer."""

    def __init__(self, trainer: Any, session: PhaseSource) -> None:
        self._trainer = trainer
        self._phases = GuardedPhases(session, "TRL")
        self._training: PhaseLike | None = None
        self._callback = _StepCallback(self)
        self._step_reads = model_step_reads(getattr(trainer, "model", None))
        missing = [name for name in _NEEDED if not callable(getattr(trainer, name, None))]
        self.attached = not missing
        self.vllm_mode = _vllm_mode(trainer)
        if missing:
            warn_setup(
                f"TRL hook: {type(trainer).__name__} (TRL {framework_version('trl')}) has no "
                f"{', '.join(missing)}; expected an online trainer sharing GRPOTrainer's generation path "
                "(GRPOTrainer, RLOOTrainer, DistillationTrainer). Nothing will be reported."
            )
            return
        self._original_generate = trainer._generate_and_score_completions
        self._original_prepare = trainer._prepare_inputs
        trainer._generate_and_score_completions = self._generate_and_score_completions
        trainer._prepare_inputs = self._prepare_inputs
        trainer.add_callback(self._callback)
        if self.vllm_mode == "server":
            logger.info(
                "eerl: TRL vllm_mode='server': the vLLM server's GPUs are not in this session and their "
                "clocks are not controlled; generation phases clock only the trainer's GPUs, which wait"
            )

    def remove(self) -> None:
        """Ends an open training phase and undoes the wrapping."""
        self.end_training()
        if not self.attached:
            return
        trainer = self._trainer
        trainer._generate_and_score_completions = self._original_generate
        trainer._prepare_inputs = self._original_prepare
        trainer.remove_callback(self._callback)

    def _is_training(self) -> bool:
        return bool(getattr(getattr(self._trainer, "model", None), "training", False))

    def _iteration(self) -> int | None:
        try:
            return int(self._trainer.state.global_step)
        except Exception:
            return None

    def _generate_and_score_completions(self, inputs: Any) -> Any:
        if not self._is_training():
            return self._original_generate(inputs)
        self.end_training()
        phase = self._phases.begin(PhaseKind.GENERATION, self._iteration())
        try:
            output = self._original_generate(inputs)
            self._phases.report(phase, lambda: _generation_workload(output, self._step_reads))
            return output
        finally:
            self._phases.end(phase)

    def _prepare_inputs(self, batch: Any) -> Any:
        inputs = self._original_prepare(batch)
        if not self._is_training():
            return inputs
        if self._training is None:
            self._training = self._phases.begin(PhaseKind.TRAINING, self._iteration())
        self._phases.report(self._training, lambda: _training_workload(inputs))
        return inputs

    def end_training(self) -> None:
        """Ends the open training phase, if any (called at the optimiser step)."""
        phase, self._training = self._training, None
        self._phases.end(phase)


def instrument(trainer: Any, session: PhaseSource) -> TrlHook:
    """Reports ``trainer``'s (a TRL ``GRPOTrainer``, ``RLOOTrainer`` or ``DistillationTrainer``) phases to
    ``session``; returns the hook. Warns (:class:`~eerl.integrations.HookWarning`) on any other object."""
    return TrlHook(trainer, session)


def _generation_workload(output: Any, reads_per_step: float) -> Workload:
    completion_mask = output.get("completion_mask")
    return Workload(
        tokens=total(completion_mask),
        sequences=rows(completion_mask),
        max_response_tokens=longest_row(completion_mask),
        prompt_tokens=total(output.get("prompt_mask")),
        max_worker_kv_tokens=mask_decode_reads(completion_mask, reads_per_step),
    )


def _training_workload(inputs: Any) -> Workload:
    completion_mask = inputs.get("completion_mask")
    completion_tokens = total(completion_mask)
    prompt_tokens = total(inputs.get("prompt_mask"))
    return Workload(
        tokens=prompt_tokens + completion_tokens,
        valid_tokens=completion_tokens,
        sequences=rows(completion_mask),
        max_response_tokens=longest_row(completion_mask),
        prompt_tokens=prompt_tokens,
    )


def _vllm_mode(trainer: Any) -> str:
    """``"server"``, ``"colocate"`` or ``""`` (no vLLM), from the trainer's args; never raises."""
    args = getattr(trainer, "args", None)
    if not getattr(args, "use_vllm", False):
        return ""
    return str(getattr(args, "vllm_mode", "") or "")


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
