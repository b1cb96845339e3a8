"""slime: put a job's rollouts and actor updates into eerl sessions.

slime is not on the package index, so this hook is written and tested against the structure of its source,
THUDM/slime at commit 624b824a898ab0ec1fcb4d373004c7f3852bf515 (tests/frameworks/test_slime.py runs the
driver loops of that commit's ``train.py`` and ``train_async.py`` on stand-ins, and checks the call sites in
excerpts of ``slime/ray/rollout.py`` and ``slime/ray/actor_group.py``). The driver's loop is a function,
``train(args)``, over two objects: ``rollout_manager`` (a Ray actor, ``RolloutManager``: SGLang engines on
the rollout GPUs) and ``actor_model`` (a ``RayTrainGroup`` of Megatron actors on the training GPUs).
Adopting it is two lines after ``create_training_models`` (``overlap=True`` in ``train_async.py``)::

    job = eerl.integrations.slime.instrument_job(rollout_manager, actor_model, overlap=False)
    ...                                                # the loop, unchanged
    job.close()

* **generation** = ``rollout_manager.generate(rollout_id)``; its tokens are counted inside the rollout
  manager, on the samples its ``self._get_rollout_data(rollout_id=...)`` returns (``response_length``
  generated, ``tokens`` prompt + response). ``eval`` is not reported. ``max_worker_kv_tokens`` is 0: the
  SGLang router spreads requests over the engines and the samples do not record which engine decoded them.
* **training** = ``actor_model.async_train(rollout_id, rollout_data_ref)`` until every train actor is done
  (the driver waits for its refs, which ``train.py`` and ``train_async.py`` ``ray.get`` right after anyway);
  tokens from the same rollout's training data (``_convert_samples_to_train_data``, counted in the rollout
  manager and asked of it by rollout id): ``tokens`` (all), the ``loss_masks`` sums (valid). A critic
  group's ``async_train`` is not wrapped: it runs alongside the actor's, inside the phase.
* Between the phases: offload/onload, checkpoints, the weight update to the engines, evaluation.

**Sessions.** ``train.py`` runs the pools one after the other, colocated or not: the iteration is the sum
of the two phases, which is what a synchronous session budgets, so one session in the driver (the GPUs of
both pools on its node) reports both; the driver's ``rollout_manager.generate.remote`` waits for the
rollout (which the loop gets at once anyway). ``train_async.py`` (``overlap=True``; disaggregated,
slime's default and the only placement it allows) generates rollout k + 1 while it trains on k: each pool
keeps one role and the two run at once, so each gets a session of its own in async mode —
``role="generation"`` inside the rollout manager's actor (where ``_get_rollout_data`` is the phase), and
``role="training"`` in the driver — and the daemon's async slack lets the pool that waits for the other
run slower first. Each session covers one node.

**Pools on several nodes.** Given a job object (``job=``: an :class:`eerl.ray.RayJob` with ``pools``, see
:func:`ray_pools`), the driver reports both phases through it instead of opening sessions, and the rollout
manager's actor only counts: with ``overlap=True`` the driver's ``rollout_manager.generate.remote`` opens the
generation phase and returns at once, a background thread ends it when the rollout is ready (``ray.wait``,
no fetch), so that training k and generation k + 1 are open at once, each on its own pool's nodes, and the
job-level controller of each pool decides for it (docs/multinode.md, "Pools").
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from eerl.integrations._common import GuardedPhases, logger, warn_setup
from eerl.integrations._source import PhaseLike, PhaseSource
from eerl.integrations._wrapping import Patches
from eerl.phases import PhaseKind, Workload

if TYPE_CHECKING:
    from eerl.config import ClientConfig

__all__ = [
    "SLIME_COMMIT",
    "SlimeJob",
    "SlimeRolloutHook",
    "SlimeTrainHook",
    "instrument",
    "instrument_job",
    "ray_pools",
    "samples_workload",
    "train_data_workload",
]

SLIME_COMMIT = "624b824a898ab0ec1fcb4d373004c7f3852bf515"
"""The THUDM/slime commit whose driver loops and classes this hook was checked against."""

_KEPT_ROLLOUTS = 8
"""How many rollouts' workloads the rollout manager keeps for the driver to ask about (train_async.py is
one rollout ahead)."""


class _NoSource:
    """A PhaseSource that opens nothing: the rollout manager only counts (the driver reports generation)."""

    def phase(self, kind: Any, iteration: int | None = None, **kwargs: Any) -> PhaseLike:
        raise LookupError("no session here")


class SlimeRolloutHook:
    """Inside the ``RolloutManager``: counts each rollout's tokens and, given a session, reports its sampling
    as a generation phase; :meth:`remove` restores it.

    Ray calls an actor's remote methods on its class, not on the instance, so ``generate`` itself cannot be
    wrapped here; what ``generate`` calls on ``self`` can: ``_get_rollout_data(rollout_id=...)`` (the
    rollout function: the engines sampling, the rewards) is the phase, counted on the samples it returns,
    and ``_convert_samples_to_train_data`` gives the rollout's training tokens (``self.rollout_id`` is the
    rollout ``generate`` set)."""

    def __init__(self, manager: Any, session: PhaseSource | None) -> None:
        self._manager = manager
        self._phases = GuardedPhases(session or _NoSource(), "slime")
        self._reporting = session is not None
        self._patches = Patches()
        self.workloads: dict[int, tuple[Workload, Workload]] = {}
        """Per rollout id: (generation, training) workload, the last few rollouts."""
        self.attached = self._patches.wrap(manager, "_get_rollout_data", self._sample) and self._patches.wrap(
            manager, "_convert_samples_to_train_data", self._convert
        )
        if not self.attached:
            self._patches.undo()
            warn_setup(
                f"slime hook: {type(manager).__name__} has no _get_rollout_data(rollout_id) and "
                f"_convert_samples_to_train_data(samples) (checked against slime {SLIME_COMMIT[:12]}); "
                "expected a RolloutManager. Nothing will be reported."
            )

    def remove(self) -> None:
        """Undoes the wrapping."""
        self._patches.undo()

    def workload(self, rollout_id: int) -> tuple[Workload, Workload]:
        """The (generation, training) workload of ``rollout_id``; empty ones when it is not known."""
        return self.workloads.get(rollout_id, (Workload(), Workload()))

    def _keep(self, rollout: int, generation: Workload | None, training: Workload | None) -> None:
        known = self.workload(rollout)
        self.workloads[rollout] = (generation or known[0], training or known[1])
        for old in sorted(self.workloads)[:-_KEPT_ROLLOUTS]:
            del self.workloads[old]

    def _sample(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def get_rollout_data(*args: Any, **kwargs: Any) -> Any:
            rollout = _as_int(kwargs.get("rollout_id", args[0] if args else None))
            phase = self._phases.begin(PhaseKind.GENERATION, rollout) if self._reporting else None
            try:
                result = original(*args, **kwargs)
                samples = result[0] if isinstance(result, tuple) else result
                generated = self._phases.count(lambda: samples_workload(samples))
                if rollout is not None:
                    self._keep(rollout, generated, None)
                self._phases.report(phase, lambda: generated)
                return result
            finally:
                self._phases.end(phase)

        return get_rollout_data

    def _convert(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def convert_samples_to_train_data(*args: Any, **kwargs: Any) -> Any:
            data = original(*args, **kwargs)
            rollout = _as_int(getattr(self._manager, "rollout_id", None))
            if rollout is not None:
                self._keep(rollout, None, self._phases.count(lambda: train_data_workload(data)))
            return data

        return convert_samples_to_train_data


class SlimeTrainHook:
    """In the driver: reports ``RayTrainGroup.async_train`` (until its actors are done) as a training phase,
    and — when the pools take turns — the rollout manager's ``generate`` as a generation phase;
    :meth:`remove` restores."""

    def __init__(
        self,
        group: Any,
        session: PhaseSource,
        *,
        rollout_manager: Any = None,
        generation: bool = False,
        overlap: bool = False,
    ) -> None:
        self._phases = GuardedPhases(session, "slime")
        self._patches = Patches()
        self._manager = rollout_manager
        self._generate: _RemoteGenerate | None = None
        self.training_hooked = self._patches.wrap(group, "async_train", self._training)
        self.generation_hooked = False
        if generation and rollout_manager is not None:
            self.generation_hooked = self._patches.wrap(
                rollout_manager, "generate", self._wrap_generate(overlap)
            )
        if not self.training_hooked:
            self._patches.undo()
            warn_setup(
                f"slime hook: {type(group).__name__} has no async_train(rollout_id, rollout_data_ref) "
                f"(checked against slime {SLIME_COMMIT[:12]}); expected the RayTrainGroup actor_model. "
                "Nothing will be reported."
            )

    def remove(self) -> None:
        """Undoes the wrapping (after the last overlapping generation phase ended, bounded)."""
        self._patches.undo()
        if self._generate is not None:
            self._generate.join()

    def _wrap_generate(self, overlap: bool) -> Callable[[Any], Any]:
        def wrap(method: Any) -> _RemoteGenerate:
            self._generate = _RemoteGenerate(method, self, overlap=overlap)
            return self._generate

        return wrap

    def fetch(self, rollout_id: int) -> tuple[Workload, Workload]:
        """The rollout's workloads, asked of the rollout manager's hook (one small call)."""
        import ray  # noqa: PLC0415 - Ray is there whenever slime is

        if self._manager is None:
            return Workload(), Workload()
        ref = self._manager.__ray_call__.remote(_workload_of, rollout_id)
        workloads: tuple[Workload, Workload] = ray.get(ref, timeout=30)
        return workloads

    def wait(self, refs: Sequence[Any]) -> None:
        """Waits until every ref is done, without fetching (``ray.get`` after it returns at once)."""
        import ray  # noqa: PLC0415 - Ray is there whenever slime is

        pending = [ref for ref in refs if ref is not None]
        if pending:
            ray.wait(pending, num_returns=len(pending), fetch_local=False)

    def _training(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def async_train(rollout_id: int, *args: Any, **kwargs: Any) -> Any:
            iteration = _as_int(rollout_id)
            phase = self._phases.begin(PhaseKind.TRAINING, iteration)
            try:
                refs = original(rollout_id, *args, **kwargs)
                self._guarded(lambda: self.wait(list(refs)))
                if iteration is not None:
                    self._phases.report(phase, lambda: self.fetch(iteration)[1])
                return refs
            finally:
                self._phases.end(phase)

        return async_train

    def _guarded(self, action: Callable[[], None]) -> None:
        try:
            action()
        except Exception:
            logger.debug("eerl: slime hook: waiting for the actors failed; the phase ends now", exc_info=True)


class _RemoteGenerate:
    """Stands in for the rollout manager's ``generate`` actor method in the driver: ``.remote(rollout_id)``
    opens the generation phase, submits, waits for the rollout (pools taking turns: ``train.py`` gets it at
    once anyway), reports its tokens and ends the phase; with ``overlap`` (a pools job, ``train_async.py``)
    it returns the ref at once and a background thread does the waiting, reporting and ending. Anything
    else goes to the real method."""

    _JOIN_S = 60.0
    """The longest a new rollout or :meth:`join` waits for the previous rollout's phase to end."""

    def __init__(self, method: Any, hook: SlimeTrainHook, *, overlap: bool = False) -> None:
        self._method = method
        self._hook = hook
        self._overlap = overlap
        self._waiter: threading.Thread | None = None

    def remote(self, rollout_id: Any, *args: Any, **kwargs: Any) -> Any:
        hook, iteration = self._hook, _as_int(rollout_id)
        self.join()  # one generation phase at a time (train_async.py has got the previous rollout by now)
        phase = hook._phases.begin(PhaseKind.GENERATION, iteration)
        if not self._overlap:
            try:
                ref = self._method.remote(rollout_id, *args, **kwargs)
                self._finish(phase, iteration, ref)
                return ref
            finally:
                hook._phases.end(phase)
        try:
            ref = self._method.remote(rollout_id, *args, **kwargs)
        except BaseException:
            hook._phases.end(phase)
            raise
        waiter = threading.Thread(
            target=self._finish_and_end, args=(phase, iteration, ref), name="eerl-slime-rollout", daemon=True
        )
        self._waiter = waiter
        waiter.start()
        return ref

    def join(self) -> None:
        """Waits (bounded) for the background thread of the previous rollout, if any."""
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.join(self._JOIN_S)

    def _finish(self, phase: PhaseLike | None, iteration: int | None, ref: Any) -> None:
        hook = self._hook
        hook._guarded(lambda: hook.wait([ref]))
        if iteration is not None:
            hook._phases.report(phase, lambda: hook.fetch(iteration)[0])

    def _finish_and_end(self, phase: PhaseLike | None, iteration: int | None, ref: Any) -> None:
        try:
            self._finish(phase, iteration, ref)
        finally:
            self._hook._phases.end(phase)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._method(*args, **kwargs)  # Ray's own answer: actor methods are called with .remote()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._method, name)


def instrument(target: Any, session: PhaseSource | None, *, rollout_manager: Any = None) -> Any:
    """The hook for one slime object: a ``RolloutManager`` instance (inside its actor: generation phases
    reported to ``session``, or only counted when it is None) or the driver's ``RayTrainGroup`` (training
    phases; ``rollout_manager``, the manager's actor handle, gives their tokens). Returns its hook; warns
    (:class:`~eerl.integrations.HookWarning`) when it finds nothing to wrap; never raises."""
    if callable(getattr(target, "async_train", None)):
        if session is None:
            session = _NoSource()
        return SlimeTrainHook(target, session, rollout_manager=rollout_manager)
    return SlimeRolloutHook(target, session)


class SlimeJob:
    """What :func:`instrument_job` attached: the driver's session and hook; :meth:`close` ends them."""

    def __init__(self, session: Any, hook: SlimeTrainHook | None, attached_in_manager: bool) -> None:
        self.session = session
        self.hook = hook
        self.attached_in_manager = attached_in_manager

    def close(self) -> None:
        """Undoes the driver's wrapping and closes its session (the rollout manager's ends with its actor)."""
        if self.hook is not None:
            self.hook.remove()
        try:
            self.session.close()
        except Exception:
            logger.debug("eerl: slime hook: closing the driver's session failed", exc_info=True)


def instrument_job(
    rollout_manager: Any,
    actor_model: Any,
    *,
    overlap: bool,
    job_id: str | None = None,
    gpus: Mapping[str, Sequence[int | str]] | None = None,
    timeout_s: float = 60.0,
    config: ClientConfig | None = None,
    job: PhaseSource | None = None,
) -> SlimeJob | None:
    """Attaches eerl to a slime job from its driver, after ``create_training_models`` (see the module
    docstring). ``overlap`` False (``train.py``): one sync session in the driver reports both phases, the
    rollout manager's actor only counts. True (``train_async.py``): the rollout manager's actor reports
    generation in a ``mode="async", role="generation"`` session of its own, the driver training in a
    ``role="training"`` one. ``gpus``: each pool's GPUs on this node by role (``"generation"``,
    ``"training"``; the sync session takes both lists); absent, each session takes ``EERL_GPUS``.
    ``config``: the driver session's (default ``EERL_SOCKET`` …; the actor's reads its own environment).
    ``job``: a job object to report both phases through instead (an :class:`eerl.ray.RayJob`; with
    ``overlap=True`` one with ``pools``, see :func:`ray_pools`): no session is opened, the rollout manager's
    actor only counts, and :meth:`SlimeJob.close` closes ``job``. None (with a warning) when it could not
    attach."""
    import eerl  # noqa: PLC0415 - the client package imports this module lazily

    gpus = gpus or {}
    try:
        import ray  # noqa: PLC0415 - Ray is there whenever slime is

        role = "generation" if overlap and job is None else None
        ref = rollout_manager.__ray_call__.remote(
            _attach, role, job_id, list(gpus.get("generation", ())) or None
        )
        attached = bool(ray.get(ref, timeout=timeout_s))
    except Exception:
        warn_setup(
            "slime hook: could not attach inside the rollout manager's actor (expected a RolloutManager "
            f"actor handle with __ray_call__, slime {SLIME_COMMIT[:12]}). Nothing will be reported."
        )
        return None
    if job is not None:
        if overlap and not getattr(job, "pools", ()):
            warn_setup(
                "slime hook: overlap=True with a job that has no pools: every phase goes to all its nodes; "
                'give eerl.ray.RayJob pools={"generation": …, "training": …} '
                "(eerl.integrations.slime.ray_pools)"
            )
        hook = SlimeTrainHook(
            actor_model, job, rollout_manager=rollout_manager, generation=True, overlap=overlap
        )
        return SlimeJob(job, hook, attached)
    if not overlap:
        both = list(dict.fromkeys([*gpus.get("generation", ()), *gpus.get("training", ())]))
        session = eerl.connect(gpus=both or None, job_id=job_id, config=config)
    else:
        session = eerl.connect(
            gpus=list(gpus.get("training", ())) or None,
            job_id=job_id,
            config=config,
            mode="async",
            role="training",
        )
    hook = SlimeTrainHook(actor_model, session, rollout_manager=rollout_manager, generation=not overlap)
    return SlimeJob(session, hook, attached)


def ray_pools(
    pgs: Mapping[str, Any], args: Any
) -> tuple[dict[str, list[str]], dict[str, dict[str, list[int | str]]]]:
    """The pools of a disaggregated slime job for :class:`eerl.ray.RayJob`: ``(pools, gpus)``, each by kind,
    from what ``create_placement_groups(args)`` returned. slime places both pools in one placement group:
    ``pgs["actor"]`` and ``pgs["rollout"]`` are ``(pg, bundle indices, GPU ids)``, the actor's list holding
    every bundle (the actor takes the first ``actor_num_nodes × actor_num_gpus_per_node``), the rollout's
    those from the rollout offset on. Each pool's nodes are its bundles' nodes; its GPUs per node the
    bundles' GPU ids::

        pools, gpus = eerl.integrations.slime.ray_pools(pgs, args)
        job = eerl.ray.RayJob(job_id="my-run", pools=pools, gpus=gpus)
    """
    from ray.util import placement_group_table  # noqa: PLC0415 - Ray is there whenever slime is

    actors = int(args.actor_num_nodes) * int(args.actor_num_gpus_per_node)
    pools: dict[str, list[str]] = {}
    gpus: dict[str, dict[str, list[int | str]]] = {}
    for kind, key, count in (("generation", "rollout", None), ("training", "actor", actors)):
        pg, indices, gpu_ids = pgs[key][:3]
        table = placement_group_table(pg).get("bundles_to_node_id", {})
        nodes: dict[str, list[int | str]] = {}
        for index, gpu in list(zip(indices, gpu_ids, strict=True))[:count]:
            node = table.get(index)
            if node:
                nodes.setdefault(node, []).append(gpu)
        pools[kind] = list(nodes)
        gpus[kind] = nodes
    return pools, gpus


def samples_workload(samples: Sequence[Any]) -> Workload:
    """The generation workload of slime's samples (``Sample``: ``tokens`` prompt + response,
    ``response_length``)."""
    responses = [int(sample.response_length) for sample in samples]
    totals = sum(len(sample.tokens) for sample in samples)
    return Workload(
        tokens=sum(responses),
        sequences=len(responses),
        max_response_tokens=max(responses, default=0),
        prompt_tokens=max(0, totals - sum(responses)),
    )


def train_data_workload(data: Mapping[str, Any]) -> Workload:
    """The training workload of slime's training data (what ``_convert_samples_to_train_data`` returns):
    ``tokens`` (prompt + response) trained on, the ``loss_masks`` sums as the valid tokens."""
    responses = [int(length) for length in data.get("response_lengths", ())]
    all_tokens = sum(len(tokens) for tokens in data.get("tokens", ()))
    valid = [int(sum(mask)) for mask in data.get("loss_masks", ())] or responses
    return Workload(
        tokens=all_tokens,
        valid_tokens=sum(valid),
        sequences=len(responses),
        max_response_tokens=max(responses, default=0),
        prompt_tokens=max(0, all_tokens - sum(responses)),
    )


def _attach(manager: Any, role: str | None, job_id: str | None, gpus: list[int | str] | None) -> bool:
    """Runs inside the rollout manager's actor: its hook (kept on ``manager.eerl_hook``), with a session of
    its own (``manager.eerl_session``) when ``role`` is given."""
    import eerl  # noqa: PLC0415 - runs in another process

    session = eerl.connect(gpus=gpus, job_id=job_id, mode="async", role=role) if role else None
    manager.eerl_session = session
    manager.eerl_hook = SlimeRolloutHook(manager, session)
    return bool(manager.eerl_hook.attached)


def _workload_of(manager: Any, rollout_id: int) -> tuple[Workload, Workload]:
    """Runs inside the rollout manager's actor: the workloads its hook counted for ``rollout_id``."""
    hook = getattr(manager, "eerl_hook", None)
    return hook.workload(rollout_id) if hook is not None else (Workload(), Workload())


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
