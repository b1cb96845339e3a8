"""OpenRLHF: put a PPO trainer's sample generation and ``ppo_train`` into an eerl session.

Checked against the releases' own source (OpenRLHF 0.11.2 and 0.10.4; tests/frameworks). OpenRLHF has no
callback API, and its trainers are Ray actors, so the hook is attached inside the actor, on the trainer
object (``docs/integrations.md`` has the subclass to write):

* **the synchronous trainer** (``openrlhf.trainer.ppo_trainer.PPOTrainer``): **generation** wraps
  ``samples_generator.generate_samples(**kwargs)`` (vLLM sampling, in ``fit``); its tokens are the
  response tokens of the ``Experience`` list it returns (each one's ``action_mask`` sum, else its
  ``response_length``), with sequences, prompt tokens and the longest response. **Training** wraps
  ``ppo_train(global_steps)`` (the actor's and critic's updates); its ``valid_tokens`` are the response
  tokens of the samples handed to ``train_step`` (the ones trained on), its ``tokens`` those plus their
  prompt tokens (``attention_mask`` sum, else ``total_length``).
* **the asynchronous trainer** (``--train.async_enable``, ``ppo_trainer_async.PPOTrainerAsync``): the
  generation and the training run at once in two actors of their own, ``GenerateSamplesActor`` and
  ``TrainingActor``. :func:`instrument` on either reports that actor's phases (generation only, or
  training only); :func:`instrument_async`, called in ``PPOTrainerAsync.__init__``, attaches both through
  Ray's ``__ray_call__``, each with a session of its own (``mode="async"``, ``role`` its pool).

A generation phase also reports ``max_worker_kv_tokens``, the busiest vLLM engine's decode reads
(``eerl.integrations.decode_reads``: Σ response length² / 2 plus its decode steps' weight reads).
``SamplesGenerator._dispatch_prompts_to_vllm`` sends each prompt (with its ``n_samples_per_prompt``
samples) to one engine, the least loaded by a heap over the engines' unfinished requests, as
``engine.generate_responses.remote(prompt=..., label=...)``, and returns one Ray object ref per prompt;
``_generate_vllm`` turns each response into an ``Experience`` with ``_process_response_into_experience``
(openrlhf/trainer/ppo_utils/samples_generator.py, 0.10.4 and 0.11.2). The hook wraps those two as well:
it learns each prompt's engine from its ref (the Ray actor that runs the ref's task,
``ref.task_id().actor_id()``) and adds each response's length (its ``action_mask`` sum, as the tokens) to
the engine its prompt went to. It counts every response decoded in the phase, those that dynamic filtering
drops and those kept in the sample buffer for later steps included, since the engines decoded them then.
A response it cannot place — its prompt and label were sent to two engines in the same phase, or a ref
names no actor — makes the phase report 0 (unknown), never a guess.

The iteration is the ``global_steps`` passed to ``ppo_train`` (a generation takes the one after the last
one trained; the generator actor counts its own batches). Evaluation (``generate_eval_samples``) is not
reported. A trainer the hook finds nothing to wrap on gets a :class:`~eerl.integrations.HookWarning` naming
the OpenRLHF version and what it looked for. On several nodes, pass ``eerl.ray.RayJob(job_id=...)``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any

from eerl.integrations._common import GuardedPhases, framework_version, logger, warn_setup
from eerl.integrations._counting import as_ints, busiest_decode_reads, row_lengths, total
from eerl.integrations._source import PhaseSource
from eerl.integrations._wrapping import Patches
from eerl.phases import PhaseKind, Workload

__all__ = ["OpenRlhfHook", "instrument", "instrument_async", "run_name", "samples_workload"]

SYNC = "sync PPOTrainer"
GENERATOR = "async GenerateSamplesActor (generation only)"
TRAINER = "async TrainingActor (training only)"

_EXPECTED = (
    "samples_generator.generate_samples and/or ppo_train (the PPOTrainer actor, or the async trainer's "
    "GenerateSamplesActor and TrainingActor; for PPOTrainerAsync itself use instrument_async)"
)


class OpenRlhfHook:
    """The hook on one trainer; :meth:`remove` restores it. ``variant`` says which trainer it found."""

    def __init__(self, trainer: Any, session: PhaseSource) -> None:
        self._phases = GuardedPhases(session, "OpenRLHF")
        self._patches = Patches()
        self._trained = Workload()
        self._next_iteration: int | None = None
        self._engines: _EngineTally | None = None
        generator = getattr(trainer, "samples_generator", None)
        self.generation_hooked = self._patches.wrap(generator, "generate_samples", self._generation)
        if self.generation_hooked:
            self._patches.wrap(generator, "_dispatch_prompts_to_vllm", self._dispatch)
            self._patches.wrap(generator, "_process_response_into_experience", self._response)
        self.training_hooked = self._patches.wrap(trainer, "ppo_train", self._training)
        if self.training_hooked:
            self._patches.wrap(trainer, "train_step", self._train_step)
        self.variant = (
            SYNC
            if self.generation_hooked and self.training_hooked
            else GENERATOR
            if self.generation_hooked
            else TRAINER
            if self.training_hooked
            else ""
        )
        if not self.variant:
            kind = type(trainer).__name__
            hint = ""
            if hasattr(trainer, "generator_actor") and hasattr(trainer, "trainer_actor"):
                hint = " This is PPOTrainerAsync: call eerl.integrations.openrlhf.instrument_async(self)."
            warn_setup(
                f"OpenRLHF hook: found nothing to wrap on {kind} (OpenRLHF {framework_version('openrlhf')}); "
                f"expected {_EXPECTED}. Nothing will be reported.{hint}"
            )

    def remove(self) -> None:
        """Undoes the wrapping."""
        self._patches.undo()

    def _generation(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def generate_samples(*args: Any, **kwargs: Any) -> Any:
            phase = self._phases.begin(PhaseKind.GENERATION, self._next_iteration)
            engines = self._engines = _EngineTally()
            try:
                output = original(*args, **kwargs)
                samples = output[0] if isinstance(output, tuple) else output
                workload = self._phases.count(lambda: samples_workload(samples))
                self._trained = workload
                self._phases.report(
                    phase,
                    lambda: Workload(
                        tokens=workload.valid_tokens,
                        sequences=workload.sequences,
                        max_response_tokens=workload.max_response_tokens,
                        prompt_tokens=workload.prompt_tokens,
                        max_worker_kv_tokens=engines.busiest(),
                    ),
                )
                return output
            finally:
                self._engines = None
                self._phases.end(phase)

        return generate_samples

    def _dispatch(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``_dispatch_prompts_to_vllm(prompts, labels, ...)``: one ref per prompt, on its engine."""

        def dispatch_prompts_to_vllm(*args: Any, **kwargs: Any) -> Any:
            refs = original(*args, **kwargs)
            engines = self._engines
            if engines is not None:
                prompts = kwargs.get("prompts", args[0] if args else None)
                labels = kwargs.get("labels", args[1] if len(args) > 1 else None)
                engines.guarded(
                    lambda: engines.dispatched(_keys(prompts, labels), [_engine(r) for r in refs])
                )
            return refs

        return dispatch_prompts_to_vllm

    def _response(self, original: Callable[..., Any]) -> Callable[..., Any]:
        """``_process_response_into_experience(response, ...)``: one prompt's sample, decoded."""

        def process_response_into_experience(response: Any, *args: Any, **kwargs: Any) -> Any:
            experience = original(response, *args, **kwargs)
            engines = self._engines
            if engines is not None:
                engines.guarded(lambda: engines.decoded(_response_key(response), _sample_lengths(experience)))
            return experience

        return process_response_into_experience

    def _train_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def train_step(rollout_samples: Any, *args: Any, **kwargs: Any) -> Any:
            self._trained = self._phases.count(lambda: samples_workload(rollout_samples))
            return original(rollout_samples, *args, **kwargs)

        return train_step

    def _training(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def ppo_train(global_steps: int = 0, *args: Any, **kwargs: Any) -> Any:
            iteration = _as_int(global_steps)
            if iteration is not None:
                self._next_iteration = iteration + 1
            phase = self._phases.begin(PhaseKind.TRAINING, iteration)
            try:
                self._phases.report(phase, lambda: self._trained)
                return original(global_steps, *args, **kwargs)
            finally:
                self._phases.end(phase)

        return ppo_train


class _EngineTally:
    """One generation phase's decode work per vLLM engine: the engines each prompt was sent to, and the
    response lengths each engine decoded. Bookkeeping only; ``known`` turns False (and :meth:`busiest`
    0) as soon as one response cannot be placed on exactly one engine."""

    def __init__(self) -> None:
        self._sent: dict[Hashable, set[Hashable]] = {}
        self._decoded: dict[Hashable, list[int]] = {}
        self.known = True

    def dispatched(self, keys: Sequence[Hashable | None], engines: Sequence[Hashable | None]) -> None:
        """Prompts ``keys`` went to ``engines``, one each (a None is a prompt or engine not known)."""
        if len(keys) != len(engines):
            self.known = False
            return
        for key, engine in zip(keys, engines, strict=True):
            if key is None or engine is None:
                self.known = False
            else:
                self._sent.setdefault(key, set()).add(engine)

    def decoded(self, key: Hashable | None, lengths: Sequence[int]) -> None:
        """The samples of prompt ``key`` came back, of ``lengths`` response tokens."""
        engines = self._sent.get(key) if key is not None else None
        if engines is None or len(engines) != 1:
            self.known = False
            return
        (engine,) = engines
        self._decoded.setdefault(engine, []).extend(lengths)

    def busiest(self) -> int:
        """The largest decode reads of any one engine's responses (``busiest_decode_reads``); 0 when not
        known (or nothing decoded)."""
        return busiest_decode_reads(self._decoded.values()) if self.known else 0

    def guarded(self, record: Callable[[], None]) -> None:
        """Runs ``record``; a failure (a batch shaped unlike OpenRLHF's) makes the tally unknown."""
        try:
            record()
        except Exception:
            logger.debug("eerl: OpenRLHF hook: could not place a response on its engine", exc_info=True)
            self.known = False


def _sample_lengths(sample: Any) -> list[int]:
    """The response length of each sequence of an OpenRLHF ``Experience``: its ``action_mask`` row sums,
    else its ``response_length`` (or ``info["response_length"]``); [] when it has neither."""
    action_mask = getattr(sample, "action_mask", None)
    if action_mask is not None:
        return row_lengths(action_mask)
    lengths = getattr(sample, "response_length", None)
    info = getattr(sample, "info", None)
    if lengths is None and isinstance(info, Mapping):
        lengths = info.get("response_length")
    return as_ints(lengths)


def samples_workload(samples: Any) -> Workload:
    """The workload of OpenRLHF samples/experiences: response tokens (as valid), all tokens, sequences."""
    if not isinstance(samples, Sequence) or isinstance(samples, str | bytes):
        return Workload()
    response_tokens = all_tokens = sequences = longest = 0
    for sample in samples:
        lengths = _sample_lengths(sample)
        if not lengths:
            continue
        responses = sum(lengths)
        longest = max(longest, *lengths)
        response_tokens += responses
        sequences += len(lengths)
        attention_mask = getattr(sample, "attention_mask", None)
        total_length = getattr(sample, "total_length", None)
        if attention_mask is not None:
            all_tokens += total(attention_mask)
        elif total_length is not None:
            all_tokens += total(total_length)
        else:
            all_tokens += responses
    return Workload(
        tokens=all_tokens,
        valid_tokens=response_tokens,
        sequences=sequences,
        max_response_tokens=longest,
        prompt_tokens=max(0, all_tokens - response_tokens),
    )


def instrument(trainer: Any, session: PhaseSource) -> OpenRlhfHook:
    """Reports ``trainer``'s phases to ``session``: OpenRLHF's ``PPOTrainer``, or the async trainer's
    ``GenerateSamplesActor`` or ``TrainingActor``, from inside that actor; returns the hook.

    Warns (:class:`~eerl.integrations.HookWarning`) when it finds nothing to wrap; never raises."""
    return OpenRlhfHook(trainer, session)


def run_name(trainer: Any) -> str | None:
    """The run's name for a job id, read so that it never raises: ``args.logger.wandb.run_name``
    (OpenRLHF 0.10, 0.11: nested namespaces), else ``args.wandb_run_name`` (older flat args), else None."""
    args = getattr(trainer, "args", None)
    for path in (("logger", "wandb", "run_name"), ("wandb_run_name",)):
        value: Any = args
        for name in path:
            value = getattr(value, name, None)
        if isinstance(value, str) and value:
            return value
    return None


def instrument_async(
    trainer: Any,
    job_id: str | None = None,
    *,
    gpus: Mapping[str, Sequence[int | str]] | None = None,
    timeout_s: float = 60.0,
) -> bool:
    """Attaches the hook inside ``PPOTrainerAsync``'s two actors (call it at the end of its ``__init__``).

    Each actor opens its own session, ``eerl.connect(gpus=gpus[role], job_id=job_id, mode="async",
    role=role)`` with ``role`` ``"generation"`` (the generator actor: its vLLM engines' GPUs) or
    ``"training"`` (the training actor: the actor/critic GPUs); ``gpus`` None leaves each session to
    ``EERL_GPUS``. True when both were attached; on any failure it warns and the job runs on without it.
    """
    handles: dict[str, Any] = {
        "generation": getattr(trainer, "generator_actor", None),
        "training": getattr(trainer, "trainer_actor", None),
    }
    if any(getattr(handle, "__ray_call__", None) is None for handle in handles.values()):
        warn_setup(
            f"OpenRLHF hook: {type(trainer).__name__} (OpenRLHF {framework_version('openrlhf')}) has no "
            "generator_actor and trainer_actor Ray handles with __ray_call__ (ray >= 2.x); expected "
            "PPOTrainerAsync. Nothing will be reported."
        )
        return False
    try:
        import ray  # noqa: PLC0415 - Ray is there whenever a PPOTrainerAsync is

        refs = [
            handle.__ray_call__.remote(_attach, role, job_id, list((gpus or {}).get(role, ())) or None)
            for role, handle in handles.items()
        ]
        attached = ray.get(refs, timeout=timeout_s)
    except Exception:
        logger.warning("eerl: OpenRLHF hook: could not attach inside the async actors", exc_info=True)
        return False
    return all(attached)


def _attach(actor: Any, role: str, job_id: str | None, gpus: list[int | str] | None) -> bool:
    """Runs inside a Ray actor: opens its session and instruments it (kept on ``actor.eerl_session``)."""
    import eerl  # noqa: PLC0415 - runs in another process

    session = eerl.connect(gpus=gpus, job_id=job_id, mode="async", role=role)
    actor.eerl_session = session
    actor.eerl_hook = instrument(actor, session)
    return bool(actor.eerl_hook.variant)


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _key(prompt: Any, label: Any) -> Hashable | None:
    """What identifies a prompt on its way to an engine and back: (prompt, label), or the prompt alone
    when the label cannot be hashed; None when neither can."""
    for key in ((prompt, label), (prompt, None)):
        try:
            hash(key)
        except TypeError:
            continue
        return key
    return None


def _keys(prompts: Any, labels: Any) -> list[Hashable | None]:
    prompts = list(prompts) if prompts is not None else []
    labels = list(labels) if labels is not None else [None] * len(prompts)
    if len(labels) != len(prompts):
        return [None] * len(prompts)
    return [_key(prompt, label) for prompt, label in zip(prompts, labels, strict=True)]


def _response_key(response: Any) -> Hashable | None:
    """The key of the prompt a vLLM engine's response dict answers (its ``prompt`` and ``label``)."""
    if not isinstance(response, Mapping) or "prompt" not in response:
        return None
    return _key(response["prompt"], response.get("label"))


def _engine(ref: Any) -> Hashable | None:
    """The Ray actor (a vLLM engine) whose task ``ref`` is the result of, or None when it names none."""
    try:
        actor = ref.task_id().actor_id()
        return None if actor.is_nil() else bytes(actor.binary())
    except Exception:
        return None
