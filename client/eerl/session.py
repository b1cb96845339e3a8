"""Sessions and phases: what an RL job calls.

Fail-open is the first promise. :func:`connect` never raises because of the daemon, and a phase never
waits for it: entering and leaving a phase only queue an event for the background sender
(:mod:`eerl._pump`, :mod:`eerl._sender`), which talks to the daemon on its own thread over a link
(:mod:`eerl.link`). If the daemon is absent, slow or
dies, the job runs on at the default clocks; one warning says so, and the sender reconnects when it can.

The trade-off: the daemon applies a phase's clock when it receives ``BeginPhase``, so the phase body may
start a few milliseconds before the clock lands. A caller who prefers to wait can pass
``wait_for_clock_s`` (a bound, never an unbounded wait).
"""

from __future__ import annotations

import functools
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType
from typing import ParamSpec, TypeVar

from eerl._answers import PhaseAnswer
from eerl._pump import ClientStats, Event, EventSink, _Counters
from eerl._sender import OpenRequest, Sender
from eerl._tally import ReportsToInnermost, WorkloadTally
from eerl._version import __version__
from eerl.config import ClientConfig
from eerl.errors import ConfigError
from eerl.gpus import GpuId, parse_gpus, visible_gpus
from eerl.link.base import Connect
from eerl.phases import ExecutionMode, GpuRole, PhaseKind, Workload, parse_enum
from eerl.reports import SessionReport
from eerl.wire.enums import MODE_TO_PB, ROLE_TO_PB
from eerl.wire.limits import MAX_ITERATION, to_count

logger = logging.getLogger("eerl")

_P = ParamSpec("_P")
_R = TypeVar("_R")

IterationSpec = int | Callable[..., int] | None
"""An explicit iteration, a callable that returns one, or None for the session's own counter."""

_DISABLED_STATS = _Counters().snapshot(connected=False, session_id=None, attached=False, queued=0)


class Phase(WorkloadTally):
    """One phase of one iteration: a context manager, or a decorator when applied to a function.

    ``with session.phase("generation", iteration=i) as p: ... p.report(tokens=n)``. Reports add up, so a
    loop over micro-batches may report each one. The end of the phase is sent even if its body raises
    (the exception propagates unchanged).
    """

    __slots__ = (
        "_iteration",
        "_iteration_spec",
        "_kind",
        "_phase_id",
        "_session",
        "_wait_for_clock_s",
        "hints",
    )

    def __init__(
        self,
        session: Session,
        kind: PhaseKind,
        iteration: IterationSpec,
        hints: Workload | None,
        wait_for_clock_s: float,
    ) -> None:
        self._session = session
        self._kind = kind
        self._iteration_spec = iteration
        self._iteration = -1
        self._phase_id = 0
        self.hints = hints
        self._wait_for_clock_s = wait_for_clock_s
        super().__init__()

    @property
    def kind(self) -> PhaseKind:
        """Generation or training."""
        return self._kind

    @property
    def iteration(self) -> int:
        """The iteration of this phase (-1 before it began)."""
        return self._iteration

    def __enter__(self) -> Phase:
        spec = self._iteration_spec
        self._session._begin(self, spec() if callable(spec) else spec)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._session._end(self)

    def __call__(self, function: Callable[_P, _R]) -> Callable[_P, _R]:
        """Decorates ``function`` so that every call runs as one phase of this kind.

        The iteration comes from the session's counter, or from the callable given as ``iteration``,
        which receives the decorated function's arguments.
        """
        session, kind, spec = self._session, self._kind, self._iteration_spec
        hints, wait_s = self.hints, self._wait_for_clock_s

        @functools.wraps(function)
        def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
            iteration = spec(*args, **kwargs) if callable(spec) else spec
            with Phase(session, kind, iteration, hints, wait_s):
                return function(*args, **kwargs)

        return wrapper


class Session(ReportsToInnermost):
    """A job's claim on its GPUs at the daemon, kept alive by the background sender.

    Use it as a context manager, or call :meth:`close`. A disabled session (``EERL_DISABLE=1``, no GPUs
    named on the shared socket, or a configuration it could not read) accepts the same calls and does
    nothing.
    """

    def __init__(self, sender: EventSink | None, *, gpus: tuple[GpuId, ...] = (), job_id: str = "") -> None:
        self._sender = sender
        self._gpus = gpus
        self._job_id = job_id
        self._next_iteration: dict[PhaseKind, int] = {}
        self._phase_ids = itertools.count(1)
        self._local = threading.local()
        self._closed = False

    @property
    def enabled(self) -> bool:
        """False when this session never talks to a daemon."""
        return self._sender is not None

    @property
    def gpus(self) -> tuple[GpuId, ...]:
        """The GPUs this session claims, as they were named."""
        return self._gpus

    @property
    def job_id(self) -> str:
        """The job id sent to the daemon."""
        return self._job_id

    @property
    def session_id(self) -> str | None:
        """The daemon's id for the session now open, or None."""
        return self.stats().session_id

    def phase(
        self,
        kind: str | PhaseKind,
        iteration: IterationSpec = None,
        *,
        hints: Workload | None = None,
        wait_for_clock_s: float = 0.0,
    ) -> Phase:
        """A phase of ``kind`` ("generation" or "training"); see :class:`Phase`.

        ``iteration`` None counts up per kind (0, 1, 2, … after the last explicit one). ``hints`` is what
        is known before the phase starts (it helps the controller choose). ``wait_for_clock_s`` > 0
        waits, at most that long, until the daemon has applied the phase's clock.
        """
        if hints is not None and not isinstance(hints, Workload):
            raise ConfigError(f"hints: {type(hints).__name__} is not an eerl.Workload")
        return Phase(self, PhaseKind.parse(kind), iteration, hints, max(0.0, wait_for_clock_s))

    def _innermost(self) -> Phase | None:
        """The phase :meth:`report` reports to: the innermost open on this thread (decorated functions)."""
        return self.current_phase()

    def current_phase(self) -> Phase | None:
        """The innermost phase open on this thread, if any."""
        stack: list[Phase] | None = getattr(self._local, "stack", None)
        return stack[-1] if stack else None

    def stats(self) -> ClientStats:
        """What the sender has done so far (all zero for a disabled session)."""
        return self._sender.stats() if self._sender is not None else _DISABLED_STATS

    def answer(self, phase: Phase, *, begin: bool) -> PhaseAnswer | None:
        """The daemon's answer to ``phase``'s begin (or, ``begin=False``, its end): the clock applied, or
        what was metered. None until the sender has it, and for an event that got none (not sent, refused,
        a disabled session); the answers to a session's last 64 events are kept. Never waits: a caller who
        wants the answer waits with ``wait_for_clock_s`` or :meth:`flush` first (the sidecar does)."""
        if self._sender is None or phase._phase_id == 0:
            return None
        return self._sender.answer(phase._phase_id, begin)

    def wait_until_connected(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for the daemon session to be open; True if it is."""
        return self._sender.wait_until_connected(timeout_s) if self._sender is not None else False

    def flush(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` until the events queued so far were handled; True if they were."""
        if self._sender is None or self._closed:
            return True
        done = threading.Event()
        self._sender.submit(Event(False, None, 0, 0, None, time.monotonic(), done))
        return done.wait(timeout_s)

    def close(self) -> SessionReport | None:
        """Flushes queued events (bounded by ``close_timeout_s``) and ends the daemon session; the daemon's
        report of it (energy, tokens, savings, throughput against the threshold: :mod:`eerl.reports`),
        logged in one line, or None (no daemon session, or no answer in time). Idempotent."""
        if self._sender is None:
            return None
        if not self._closed:
            self._closed = True
            self._sender.close()
            report = self._sender.report()
            if report is not None:
                logger.info("eerl: %s", report.summary())
        return self._sender.report()

    def __enter__(self) -> Session:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- called by Phase -----------------------------------------------------------------------------

    def _begin(self, phase: Phase, given: object) -> None:
        kind = phase._kind
        if given is None:
            iteration = self._next_iteration.get(kind, 0)
        elif type(given) is int:
            iteration = given
        else:  # a NumPy integer, say; the sender drops the phase if this is -1 (with one warning)
            converted = to_count(given)
            iteration = converted if converted is not None else -1
        if 0 <= iteration <= MAX_ITERATION:
            self._next_iteration[kind] = iteration + 1
        phase._iteration = iteration
        phase._phase_id = next(self._phase_ids)
        stack: list[Phase] | None = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        stack.append(phase)
        sender = self._sender
        if sender is None or self._closed:
            return
        wait_s = phase._wait_for_clock_s
        done = threading.Event() if wait_s > 0 and sender.connected else None
        shown = iteration if given is None or iteration >= 0 else given  # named by the sender if it drops it
        sender.submit(Event(True, kind, shown, phase._phase_id, phase.hints, time.monotonic(), done))
        if done is not None:
            done.wait(wait_s)

    def _end(self, phase: Phase) -> None:
        stack: list[Phase] | None = getattr(self._local, "stack", None)
        if stack and stack[-1] is phase:
            stack.pop()
        elif stack and phase in stack:
            stack.remove(phase)
        sender = self._sender
        if sender is None or self._closed:
            return
        sender.submit(
            Event(
                False,
                phase._kind,
                phase._iteration,
                phase._phase_id,
                phase.workload,
                time.monotonic(),
                None,
                phase._rejected,
                phase._rejected_what,
            )
        )


def connect(
    gpus: list[int | str] | tuple[int | str, ...] | None = None,
    job_id: str | None = None,
    *,
    config: ClientConfig | None = None,
    mode: str | ExecutionMode = "sync",
    role: str | GpuRole = "both",
    rank: int = 0,
    world_size: int = 0,
    threshold: float | None = None,
    link: Connect | None = None,
) -> Session:
    """Opens a session with the node's daemon in the background and returns at once.

    ``gpus``: indices or UUIDs; default ``config.gpus`` (``EERL_GPUS``), else ``CUDA_VISIBLE_DEVICES``.
    On a scoped socket (``config.scoped``) none may be named: the daemon then claims every GPU the socket
    and the claim tickets cover.
    ``job_id``: default ``config.job_id`` (``EERL_JOB_ID``), else ``SLURM_JOB_ID``, else host and pid.
    ``config``: default :meth:`ClientConfig.from_env`. ``threshold``: the minimum throughput, as a
    fraction of the default clocks' (daemon default when None). ``link``: how to reach the daemon (default:
    gRPC to ``config``'s socket); tests give :meth:`eerl.link.memory.MemoryDaemon.connect`.

    Raises :class:`ConfigError` only for invalid arguments; a daemon that is absent or an environment it
    cannot read gives a disabled or retrying session and one warning, never an exception.
    """
    execution_mode = parse_enum(ExecutionMode, mode, "mode")
    gpu_role = parse_enum(GpuRole, role, "role")
    if threshold is not None and not 0 < threshold <= 1:
        raise ConfigError(f"threshold: {threshold} is not in (0, 1]")
    if rank < 0 or world_size < 0:
        raise ConfigError("rank, world_size: must not be negative")
    explicit_gpus = parse_gpus(gpus) if gpus is not None else None
    if config is None:
        try:
            config = ClientConfig.from_env()
        except ConfigError as e:
            logger.warning("eerl: %s; eerl is off for this job", e)
            return Session(None)
    if config.disabled:
        logger.debug("eerl: disabled by configuration")
        return Session(None)
    if config.transport == "sidecar":
        # The sidecar holds the daemon session (its own GPUs and job id); this session only forwards.
        from eerl.sidecar.client import SidecarSender  # noqa: PLC0415 - only jobs that use a sidecar load it

        sidecar = SidecarSender(config)
        sidecar.start()
        return Session(sidecar, gpus=explicit_gpus or (), job_id=job_id or config.job_id or "")
    try:
        chosen_gpus = explicit_gpus if explicit_gpus is not None else _default_gpus(config)
    except ConfigError as e:
        logger.warning("eerl: %s; eerl is off for this job", e)
        return Session(None)
    if not chosen_gpus and not config.scoped:
        # Only a scoped socket (a grant's, a GPU's, or several) knows which GPUs are this job's.
        logger.warning(
            "eerl: no GPUs named (gpus=, EERL_GPUS or CUDA_VISIBLE_DEVICES); eerl is off for this job"
        )
        return Session(None)
    chosen_job_id = job_id or config.job_id or _default_job_id()
    client_name = f"eerl-client {__version__}" + (f" / {config.client_name}" if config.client_name else "")
    sender = Sender(
        config,
        OpenRequest(
            job_id=chosen_job_id,
            rank=rank,
            world_size=world_size,
            gpus=chosen_gpus,
            mode=MODE_TO_PB[execution_mode],
            role=ROLE_TO_PB[gpu_role],
            throughput_threshold=threshold or 0.0,
            client_name=client_name,
        ),
        connect=link,
    )
    sender.start()
    return Session(sender, gpus=chosen_gpus, job_id=chosen_job_id)


def _default_gpus(config: ClientConfig) -> tuple[GpuId, ...]:
    return config.gpus if config.gpus is not None else visible_gpus()


def _default_job_id() -> str:
    return os.environ.get("SLURM_JOB_ID") or f"{socket.gethostname()}-{os.getpid()}"
