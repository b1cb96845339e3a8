"""OpenRLHF: put a PPO trainer's sample generation and ``ppo_train`` into an eerl session.

OpenRLHF's Ray trainer (``openrlhf.trainer.ppo_trainer.PPOTrainer``, a ``@ray.remote`` class built on
``BasePPOTrainer``) has no callback API. Its loop draws samples from vLLM, turns them into experiences,
then calls ``self.ppo_train(global_steps)``. The hook wraps, on the trainer object:

* **generation**: the sample source the version has — ``train_streamer.make_sample_batch()`` (current),
  ``samples_generator.generate_samples(...)`` (0.8 – 0.9) or ``experience_maker.generate_samples(...)``
  (older). Tokens are the response tokens sampled (each sample's ``action_mask`` sum, or its
  ``info["response_length"]``); sequences and the longest response go with them.
* **training**: ``ppo_train(global_steps)``. Its ``valid_tokens`` are the response tokens of the samples
  generated last (the ones being trained on), its ``tokens`` their prompt + response tokens when the
  samples carry an ``attention_mask``.

The trainer runs inside a Ray actor, so the hook is attached there: subclass the actor class and call
:func:`instrument` at the end of ``__init__`` (see ``docs/integrations.md``). The iteration is the
``global_steps`` passed to ``ppo_train``; a generation gets the iteration that follows the last one trained.
On several nodes, pass ``eerl.ray.RayJob(job_id=...)`` instead of the session (docs/multinode.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eerl.integrations._counting import longest_row, rows, total
from eerl.integrations._source import PhaseSource
from eerl.integrations._wrapping import Patches
from eerl.phases import PhaseKind, Workload

_SAMPLE_SOURCES = (
    ("train_streamer", "make_sample_batch"),
    ("samples_generator", "generate_samples"),
    ("experience_maker", "generate_samples"),
)


class OpenRlhfHook:
    """The hook on one trainer; :meth:`remove` restores it."""

    def __init__(self, trainer: Any, session: PhaseSource) -> None:
        self._session = session
        self._patches = Patches()
        self._last_samples = Workload()
        self._next_iteration: int | None = None
        for owner_name, method in _SAMPLE_SOURCES:
            if self._patches.wrap(getattr(trainer, owner_name, None), method, self._generation):
                break
        self._patches.wrap(trainer, "ppo_train", self._training)

    def remove(self) -> None:
        """Undoes the wrapping."""
        self._patches.undo()

    def _generation(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def generate(*args: Any, **kwargs: Any) -> Any:
            with self._session.phase(PhaseKind.GENERATION, iteration=self._next_iteration) as phase:
                output = original(*args, **kwargs)
                samples = output[0] if isinstance(output, tuple) else output
                self._last_samples = samples_workload(samples if isinstance(samples, list) else [])
                phase.report(
                    tokens=self._last_samples.valid_tokens,
                    sequences=self._last_samples.sequences,
                    max_response_tokens=self._last_samples.max_response_tokens,
                    prompt_tokens=self._last_samples.prompt_tokens,
                )
            return output

        return generate

    def _training(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def ppo_train(global_steps: int = 0, *args: Any, **kwargs: Any) -> Any:
            self._next_iteration = int(global_steps) + 1
            with self._session.phase(PhaseKind.TRAINING, iteration=int(global_steps)) as phase:
                samples = self._last_samples
                phase.report(
                    tokens=samples.tokens,
                    valid_tokens=samples.valid_tokens,
                    sequences=samples.sequences,
                    max_response_tokens=samples.max_response_tokens,
                    prompt_tokens=samples.prompt_tokens,
                )
                return original(global_steps, *args, **kwargs)

        return ppo_train


def samples_workload(samples: list[Any]) -> Workload:
    """The workload of OpenRLHF samples/experiences: response tokens (as valid), all tokens, sequences."""
    response_tokens = all_tokens = sequences = longest = 0
    for sample in samples:
        action_mask = getattr(sample, "action_mask", None)
        info = getattr(sample, "info", None) or {}
        if action_mask is not None:
            responses = total(action_mask)
            count = rows(action_mask)
            longest = max(longest, longest_row(action_mask))
        elif "response_length" in info:
            responses = total(info["response_length"])
            count = rows(info["response_length"])
        else:
            continue
        response_tokens += responses
        sequences += count
        attention_mask = getattr(sample, "attention_mask", None)
        all_tokens += total(attention_mask) if attention_mask is not None else responses
    return Workload(
        tokens=all_tokens,
        valid_tokens=response_tokens,
        sequences=sequences,
        max_response_tokens=longest,
        prompt_tokens=max(0, all_tokens - response_tokens),
    )


def instrument(trainer: Any, session: PhaseSource) -> OpenRlhfHook:
    """Reports ``trainer``'s (an OpenRLHF PPO trainer, inside its actor) phases to ``session``."""
    return OpenRlhfHook(trainer, session)
