"""verl: put a PPO trainer's rollout and actor update into an eerl session.

Two trainers, both checked against the releases' own source (verl 0.9.1 and 0.8.0; tests/frameworks):

* **the v1 trainer** (verl ≥ 0.9, the default: ``trainer.use_v1=true``, ``TaskRunnerV1``;
  ``verl.trainer.ppo.v1.PPOTrainer`` and its registered modes ``sync``, ``colocate_async``,
  ``separate_async``). It has callbacks, and the hook uses them: the **generation** phase runs from
  ``on_sample_begin()`` to ``on_sample_end()`` — the ``marked_timer("gen")`` block around
  ``replay_buffer.sample(...)``, where the trainer waits for the rollout; its tokens are counted on the
  ``KVBatchMeta`` that ``sample`` returns (its per-sample ``tags``: ``response_len``, ``prompt_len``;
  padding samples excluded). **Training** wraps ``_update_actor(batch: KVBatchMeta, metrics)``, counted on
  the same tags. In ``separate_async`` mode the rollout runs on GPUs of its own, so the trainer's GPUs
  only train: the hook reports training phases alone (open the session with ``mode="async",
  role="training"``). Attach it in ``on_init_end`` of a registered trainer (``docs/integrations.md``).
* **the legacy ``RayPPOTrainer``** (verl 0.8, and 0.9 with ``trainer.use_v1=false``): generation wraps
  ``async_rollout_manager.generate_sequences`` (or the older ``actor_rollout_wg.generate_sequences``),
  counted on the ``DataProto`` it returns (``response_mask``, or the response columns of
  ``attention_mask``); training wraps ``_update_actor(batch: DataProto)`` (or
  ``actor_rollout_wg.update_actor``). Call :func:`instrument` after ``trainer.init_workers()``.

A generation phase also reports ``max_worker_kv_tokens`` (the busiest rollout engine's decode reads: Σ
response length² / 2 plus its decode steps' weight reads, ``_counting.decode_reads``) where the split of the
batch across engines can be known on the driver, and 0 (unknown: the predictor leaves the feature out) where
it cannot:

* **the agent-loop rollout** (the v1 trainer, and the legacy trainer's ``async_rollout_manager``; verl
  0.8, 0.9): ``AgentLoopManager.generate_sequences`` chunks the batch across agent-loop workers, but each
  request then goes to whichever server replica ``GlobalRequestLoadBalancer.acquire_server`` picks (the
  least in-flight requests, sticky per request id; verl/workers/rollout/router.py in 0.9,
  llm_server.py in 0.8), and no sample carries the server that decoded it. So the hook reports the batch's
  decode reads only when there is one engine — ``trainer.llm_server_manager.get_replicas()`` has one
  replica, ``rollout.data_parallel_size`` is 1 and prefill/decode disaggregation is off — and 0 otherwise.
* **the worker group's rollout** (``actor_rollout_wg.generate_sequences``, verl 0.6 and 0.7): registered
  with ``make_nd_compute_dataproto_dispatch_fn(mesh_name="rollout")``, it gives the rollout's data-parallel
  rank ``r`` the ``r``-th of ``max(dp_rank_mapping) + 1`` contiguous chunks (``DataProto.chunk``) and
  concatenates the outputs in rank order (verl/single_controller/base/decorator.py); the hook splits the
  output the same way, with the mapping verl keeps on the worker group (``_dispatch_info["rollout"]``).
  Before 0.6 (``Dispatch.DP_COMPUTE_PROTO``, no mapping) it reports 0.

The iteration is ``trainer.global_steps``; validation rollouts are not reported. A trainer the hook finds
nothing to wrap on gets a :class:`~eerl.integrations.HookWarning` naming the verl version and what it
looked for. On several nodes, pass ``eerl.ray.RayJob(job_id=...)`` instead of the session
(docs/multinode.md).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from eerl.integrations._common import GuardedPhases, framework_version, logger, warn_setup
from eerl.integrations._counting import (
    busiest_decode_reads,
    contiguous_chunks,
    longest_row,
    row_lengths,
    rows,
    total,
)
from eerl.integrations._source import PhaseLike, PhaseSource
from eerl.integrations._wrapping import Patches
from eerl.phases import PhaseKind, Workload

__all__ = ["VerlHook", "batch_workload", "generation_workload", "instrument"]

V1 = "v1"
V1_SEPARATE = "v1 separate_async (training only)"
LEGACY = "legacy RayPPOTrainer"

_EXPECTED = (
    "the v1 trainer's on_sample_begin / replay_buffer.sample / on_sample_end and _update_actor "
    "(verl >= 0.9, trainer.use_v1=true: attach in on_init_end), or the legacy RayPPOTrainer's "
    "async_rollout_manager.generate_sequences or actor_rollout_wg.generate_sequences and _update_actor "
    "(attach after init_workers())"
)


class VerlHook:
    """The hook on one trainer; :meth:`remove` restores it. ``variant`` says which trainer it found."""

    def __init__(self, trainer: Any, session: PhaseSource) -> None:
        self._trainer = trainer
        self._phases = GuardedPhases(session, "verl")
        self._patches = Patches()
        self._active = False
        self._validating = False
        self._generation: PhaseLike | None = None
        self.variant = ""
        self.generation_hooked = False
        self.training_hooked = False
        self._attach(trainer)

    def _attach(self, trainer: Any) -> None:
        version = framework_version("verl")
        replay_buffer = getattr(trainer, "replay_buffer", None)
        v1 = all(callable(getattr(trainer, name, None)) for name in ("on_sample_begin", "on_sample_end"))
        v1 = v1 and callable(getattr(replay_buffer, "sample", None))
        if v1:
            separate = str(getattr(trainer, "trainer_mode", "")) == "separate_async"
            self.variant = V1_SEPARATE if separate else V1
            if not separate:
                self.generation_hooked = (
                    self._patches.wrap(trainer, "on_sample_begin", self._sample_begin)
                    and self._patches.wrap(replay_buffer, "sample", self._sample)
                    and self._patches.wrap(trainer, "on_sample_end", self._sample_end)
                )
            else:
                logger.info(
                    "eerl: verl %s separate_async trainer: the rollout has GPUs of its own; "
                    "only training phases are reported (open the session with mode='async', role='training')",
                    version,
                )
            self.training_hooked = self._patches.wrap(trainer, "_update_actor", self._training)
        else:
            workers = getattr(trainer, "actor_rollout_wg", None)
            manager = getattr(trainer, "async_rollout_manager", None)
            self.generation_hooked = self._patches.wrap(
                manager,
                "generate_sequences",
                lambda f: self._legacy_generation(f, lambda: _server_engines(trainer)),
            )
            self.generation_hooked |= self._patches.wrap(
                workers,
                "generate_sequences",
                lambda f: self._legacy_generation(f, lambda: _dp_engines(workers)),
            )
            self.training_hooked = self._patches.wrap(trainer, "_update_actor", self._training) or (
                self._patches.wrap(workers, "update_actor", self._training)
            )
            if self.generation_hooked or self.training_hooked:
                self.variant = LEGACY
        self._patches.wrap(trainer, "_validate", self._validation)
        kind = type(trainer).__name__
        if not (self.generation_hooked or self.training_hooked):
            self._patches.undo()
            warn_setup(
                f"verl hook: found nothing to wrap on {kind} (verl {version}); expected {_EXPECTED}. "
                "Nothing will be reported."
            )
            return
        missing = [
            name
            for name, hooked in (("generation", self.generation_hooked), ("training", self.training_hooked))
            if not hooked and not (name == "generation" and self.variant == V1_SEPARATE)
        ]
        if missing:
            warn_setup(
                f"verl hook: on {kind} (verl {version}, {self.variant}) no {' or '.join(missing)} step "
                f"was found to wrap; expected {_EXPECTED}. Those phases will not be reported."
            )

    def remove(self) -> None:
        """Ends an open generation phase and undoes the wrapping."""
        self._end_generation()
        self._patches.undo()

    def _iteration(self) -> int | None:
        steps = getattr(self._trainer, "global_steps", None)
        try:
            return int(steps) if steps is not None else None
        except (TypeError, ValueError):
            return None

    # -- the v1 trainer: on_sample_begin → replay_buffer.sample → on_sample_end ----------------------

    def _sample_begin(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def on_sample_begin(*args: Any, **kwargs: Any) -> Any:
            if not self._validating and self._generation is None:
                self._generation = self._phases.begin(PhaseKind.GENERATION, self._iteration())
            return original(*args, **kwargs)

        return on_sample_begin

    def _sample(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def sample(*args: Any, **kwargs: Any) -> Any:
            try:
                result = original(*args, **kwargs)
            except BaseException:
                self._end_generation()
                raise
            partition = kwargs.get("partition_id", args[1] if len(args) > 1 else "train")
            if self._generation is not None and partition != "val":
                batch = result[0] if isinstance(result, tuple) else result
                self._phases.report(
                    self._generation, lambda: generation_workload(batch, _server_engines(self._trainer))
                )
            return result

        return sample

    def _sample_end(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def on_sample_end(*args: Any, **kwargs: Any) -> Any:
            try:
                return original(*args, **kwargs)
            finally:
                self._end_generation()

        return on_sample_end

    def _end_generation(self) -> None:
        phase, self._generation = self._generation, None
        self._phases.end(phase)

    # -- the legacy trainer: generate_sequences ------------------------------------------------------

    def _legacy_generation(
        self, original: Callable[..., Any], engines: Callable[[], int | None]
    ) -> Callable[..., Any]:
        """``engines()`` (read after the call, when verl has filled in its dispatch mapping): how many
        engines decoded contiguous chunks of the output, or None when that is not how it was split."""

        def generate_sequences(*args: Any, **kwargs: Any) -> Any:
            if self._active or self._validating:
                return original(*args, **kwargs)
            self._active = True
            phase = self._phases.begin(PhaseKind.GENERATION, self._iteration())
            try:
                output = original(*args, **kwargs)
                self._phases.report(phase, lambda: generation_workload(output, engines()))
                return output
            finally:
                self._phases.end(phase)
                self._active = False

        return generate_sequences

    # -- both: the actor update ----------------------------------------------------------------------

    def _training(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def update_actor(batch: Any, *args: Any, **kwargs: Any) -> Any:
            if self._active:
                return original(batch, *args, **kwargs)
            self._active = True
            phase = self._phases.begin(PhaseKind.TRAINING, self._iteration())
            try:
                self._phases.report(phase, lambda: batch_workload(batch))
                return original(batch, *args, **kwargs)
            finally:
                self._phases.end(phase)
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
    """Reports ``trainer``'s phases to ``session``: a v1 ``PPOTrainer`` (after ``init()``, e.g. in its
    ``on_init_end``) or a legacy ``RayPPOTrainer`` (after ``init_workers()``); returns the hook.

    Warns (:class:`~eerl.integrations.HookWarning`) when it finds nothing to wrap; never raises."""
    return VerlHook(trainer, session)


def batch_workload(batch: Any) -> Workload:
    """The workload of a verl batch: tokens (prompt + response), valid tokens (response), sequences, the
    longest response, prompt tokens.

    Takes a v1 ``KVBatchMeta`` (its per-sample ``tags``), a ``DataProto`` (its ``batch`` TensorDict) or a
    ``TensorDict`` itself; anything else counts as empty.
    """
    tags = _tags(batch)
    if tags is not None:
        return _tags_workload(tags)
    tensors = _tensors(batch)
    if tensors is None:
        return Workload()
    response_mask = _response_mask(tensors)
    all_tokens = total(_get(tensors, "attention_mask"))
    valid_tokens = total(response_mask)
    return Workload(
        tokens=all_tokens,
        valid_tokens=valid_tokens,
        sequences=rows(response_mask),
        max_response_tokens=longest_row(response_mask),
        prompt_tokens=max(0, all_tokens - valid_tokens),
    )


def generation_workload(batch: Any, engines: int | None) -> Workload:
    """The workload of a rollout batch (what :func:`batch_workload` reads) as a generation phase reports
    it: the response tokens generated as its tokens (no valid tokens: nothing is trained), and
    ``max_worker_kv_tokens`` for ``engines`` rollout engines that each decoded one contiguous chunk of the
    batch, in order (``DataProto.chunk``); ``engines`` None — the split is not known — reports 0."""
    workload = batch_workload(batch)
    kv = busiest_decode_reads(contiguous_chunks(_response_lengths(batch), engines)) if engines else 0
    return Workload(
        tokens=workload.valid_tokens,
        sequences=workload.sequences,
        max_response_tokens=workload.max_response_tokens,
        prompt_tokens=workload.prompt_tokens,
        max_worker_kv_tokens=kv,
    )


def _response_lengths(batch: Any) -> list[int]:
    """Each sample's response length, in batch order: a ``KVBatchMeta``'s ``response_len`` tags (padding
    left out), or a ``DataProto``'s (or ``TensorDict``'s) response mask row sums; [] for anything else."""
    tags = _tags(batch)
    if tags is not None:
        return [
            int(tag.get("response_len", 0) or 0)
            for tag in tags
            if isinstance(tag, Mapping) and not tag.get("is_padding", False)
        ]
    tensors = _tensors(batch)
    return row_lengths(_response_mask(tensors)) if tensors is not None else []


def _server_engines(trainer: Any) -> int | None:
    """1 when the trainer's agent-loop rollout has exactly one engine, else None; never raises.

    The agent loop load-balances requests across server replicas as they arrive (least in-flight,
    ``GlobalRequestLoadBalancer``) and no sample records its server, so with several engines the busiest
    one's samples cannot be named. One engine: ``llm_server_manager.get_replicas()`` is one replica (verl
    0.8, 0.9: the hybrid replicas, ``LLMServerManager._initialize_llm_servers``), with no data-parallel
    engines inside it (``rollout.data_parallel_size`` 1) and no prefill/decode disaggregation.
    """
    try:
        manager: Any = getattr(trainer, "llm_server_manager", None)
        get_replicas = getattr(manager, "get_replicas", None)
        replicas = get_replicas() if callable(get_replicas) else None
        config = getattr(manager, "rollout_config", None)
        disaggregation = getattr(config, "disaggregation", None)
        one = (
            isinstance(replicas, list | tuple)
            and len(replicas) == 1
            and _count(getattr(config, "data_parallel_size", None)) == 1
            and getattr(disaggregation, "enabled", False) is False
        )
    except Exception:
        return None
    return 1 if one else None


def _dp_engines(workers: Any) -> int | None:
    """How many data-parallel rollout engines the worker group's ``generate_sequences`` splits a batch
    across, or None when verl keeps no such mapping; never raises.

    verl 0.6, 0.7 dispatch it with ``make_nd_compute_dataproto_dispatch_fn(mesh_name="rollout")``:
    ``dispatch_lazy_compute_data_proto`` stores each rank's data-parallel rank in
    ``worker_group._dispatch_info["rollout"]`` and splits into ``max(mapping) + 1`` chunks.
    """
    try:
        info = getattr(workers, "_dispatch_info", None)
        mapping = info.get("rollout") if isinstance(info, dict) else None
        if not isinstance(mapping, list | tuple) or not mapping:
            return None
        if not all(_count(rank) is not None for rank in mapping):
            return None
        return int(max(mapping)) + 1
    except Exception:
        return None


def _count(value: Any) -> int | None:
    """``value`` when it is a plain non-negative int (a bool or anything else is not a count), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _tags_workload(tags: list[Any]) -> Workload:
    responses = prompts = sequences = longest = 0
    for tag in tags:
        if not isinstance(tag, Mapping) or tag.get("is_padding", False):
            continue
        response = int(tag.get("response_len", 0) or 0)
        prompt = int(tag.get("prompt_len", 0) or 0)
        if "prompt_len" not in tag and "seq_len" in tag:
            prompt = max(0, int(tag["seq_len"]) - response)
        responses += response
        prompts += prompt
        sequences += 1
        longest = max(longest, response)
    return Workload(
        tokens=responses + prompts,
        valid_tokens=responses,
        sequences=sequences,
        max_response_tokens=longest,
        prompt_tokens=prompts,
    )


def _tags(batch: Any) -> list[Any] | None:
    """A v1 ``KVBatchMeta``'s per-sample tags, or None for any other batch."""
    tags = getattr(batch, "tags", None)
    return tags if isinstance(tags, list) and hasattr(batch, "keys") else None


def _tensors(batch: Any) -> Any:
    """A ``DataProto``'s ``batch`` TensorDict, a ``TensorDict`` itself, or None."""
    tensors = getattr(batch, "batch", None)
    if tensors is None and callable(getattr(batch, "keys", None)):
        tensors = batch
    return tensors


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
