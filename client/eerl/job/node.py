"""The node side of job mode: one node's session at its daemon, driven by the job's directives.

A :class:`NodeLink` holds one node's daemon session, opened in job mode (``OpenSessionRequest.job_mode``)
over the node's local worker socket (found as :meth:`eerl.ClientConfig.from_env` finds it) and bound to an
``Attach`` stream read by a daemon thread, so that the death of the process holding it (a node agent, a
rank) makes that daemon return the node's GPUs to their default clocks.

Unlike :class:`eerl.Session` it is synchronous: :meth:`NodeLink.begin` carries the job-level controller's
directive in the phase's ``BeginPhase`` and returns the daemon's verdict; :meth:`NodeLink.end` returns what
the daemon metered (a :class:`eerl.job.NodeReport`). Every call has a deadline, and none raises into the
job: a call that fails reports the phase as not applied (verdict ``MISSING``, nothing metered), and the next
:meth:`NodeLink.begin` reopens the session (with back-off), which bumps :attr:`NodeLink.session_epoch`, so
that the job-level controller drops the iteration that straddled the restart.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from eerl._version import __version__
from eerl.config import ClientConfig
from eerl.directives import Directive, DirectiveVerdict
from eerl.gpus import GpuId, parse_gpus, visible_gpus
from eerl.job.controller import NodeReport, common_clocks
from eerl.link import grpc_connect
from eerl.link.base import Code, Connect, DaemonLink, LinkError
from eerl.link.opening import claim_tickets, gpu_ref, open_session, watch_attach
from eerl.phases import ExecutionMode, GpuRole, PhaseKind, Workload
from eerl.v1 import eerl_pb2
from eerl.wire.enums import (
    KIND_TO_PB,
    MODE_TO_PB,
    PURPOSE_TO_PB,
    ROLE_TO_PB,
    VERDICT_FROM_PB,
    workload_to_pb,
)
from eerl.wire.limits import check_iteration, check_workload

__all__ = ["NodeBegin", "NodeLink"]

logger = logging.getLogger("eerl")

DEFAULT_TIMEOUT_S = 1.0
"""The deadline of one call to the daemon (open, begin, end, close) unless given."""
_FAILURES_BEFORE_REOPEN = 3


@dataclass(frozen=True, slots=True)
class NodeBegin:
    """The daemon's answer to one phase's ``BeginPhase`` on one node."""

    node_rank: int
    session_epoch: int
    """The :attr:`NodeLink.session_epoch` the phase began under (0: no session)."""
    verdict: DirectiveVerdict
    """``MISSING`` also when the node did not answer (then ``reached`` is False)."""
    sm_clock_mhz: int | None
    """The SM clock the daemon applied (None: the default governor)."""
    applied_epoch: int
    reached: bool
    """True when the daemon answered."""
    detail: str = ""


@dataclass(slots=True)
class _Held:
    """One job-mode session: its link, id, epoch and GPUs, and the state of its Attach stream and phase."""

    link: DaemonLink
    session_id: str
    epoch: int
    gpus: int
    supported: tuple[int, ...]
    cancel_attach: Callable[[], None] | None = None
    broken: threading.Event = field(default_factory=threading.Event)
    attached: threading.Event = field(default_factory=threading.Event)
    """Set by the first Attach event: from then on the session ends with this process."""
    open_phase: tuple[PhaseKind, int] | None = None
    begin_verdict: DirectiveVerdict = DirectiveVerdict.MISSING
    failures: int = 0


class NodeLink:
    """One node's job-mode session with its daemon; see the module docstring.

    ``config``: how to reach this node's daemon (default discovery: :meth:`ClientConfig.from_env`).
    ``gpus``: the GPUs of this node the job uses (default ``config.gpus`` / ``EERL_GPUS``, else
    ``CUDA_VISIBLE_DEVICES``; none on a scoped socket). ``role``: BOTH (a sync session, every kind), or the
    one kind of a pool's node (an async session with that role; the daemon refuses the other kind there).
    ``timeout_s``: every call's deadline. ``connect``:
    how to reach the daemon (default: gRPC to ``config``'s socket; tests give
    :meth:`eerl.link.memory.MemoryDaemon.connect`).
    """

    def __init__(
        self,
        config: ClientConfig,
        *,
        job_id: str,
        node_rank: int,
        incarnation: int,
        gpus: Sequence[int | str] | None = None,
        world_size: int = 0,
        role: GpuRole = GpuRole.BOTH,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        reopen_initial_s: float = 0.2,
        reopen_max_s: float = 5.0,
        connect: Connect | None = None,
    ) -> None:
        self._config = config
        self._connect = connect if connect is not None else grpc_connect(config)
        self._job_id = job_id
        self._node_rank = node_rank
        self._incarnation = incarnation
        self._world_size = world_size
        self._role = role
        self._timeout_s = timeout_s
        self._reopen_initial_s = reopen_initial_s
        self._reopen_max_s = reopen_max_s
        self._backoff_s = reopen_initial_s
        self._next_open_s = 0.0
        self._lock = threading.RLock()
        self._link: _Held | None = None
        self._epoch = 0
        self._closed = False
        self._warned: set[str] = set()
        self._supported: tuple[int, ...] = ()
        self._gpus: tuple[GpuId, ...] = ()
        self._disabled_why = ""
        try:
            if config.disabled:
                self._disabled_why = "disabled by configuration"
            elif config.transport == "sidecar":
                # A sidecar holds a one-node session; job mode needs the daemon's own socket.
                self._disabled_why = (
                    "EERL_SIDECAR names a sidecar, which cannot carry job-mode directives; give the node "
                    "agent the daemon's socket (EERL_SOCKET)"
                )
            else:
                chosen = parse_gpus(list(gpus)) if gpus is not None else _default_gpus(config)
                if not chosen and not config.scoped:
                    self._disabled_why = "no GPUs named (gpus=, EERL_GPUS or CUDA_VISIBLE_DEVICES)"
                self._gpus = chosen
        except Exception as e:  # a bad GPU list: never raise into the job
            self._disabled_why = str(e)
        if self._disabled_why:
            self._warn(f"node {node_rank}: {self._disabled_why}; this node runs at default clocks", "off")

    # -- what the job reads -------------------------------------------------------------------------

    @property
    def node_rank(self) -> int:
        return self._node_rank

    @property
    def enabled(self) -> bool:
        """False when this link never talks to a daemon (disabled, or no GPUs)."""
        return not self._disabled_why

    @property
    def connected(self) -> bool:
        """True while a session is open and its stream has not ended."""
        link = self._link
        return link is not None and not link.broken.is_set()

    @property
    def session_epoch(self) -> int:
        """+1 every time this link opened a daemon session (0 before the first)."""
        return self._epoch

    @property
    def supported_sm_clocks_mhz(self) -> tuple[int, ...]:
        """The SM clocks every GPU of the session supports, ascending (empty before a session opened)."""
        return self._supported

    @property
    def gpu_count(self) -> int:
        link = self._link
        return link.gpus if link is not None else 0

    def connect(self) -> bool:
        """Opens the session now if none is open (bounded by the deadline); True if one is open."""
        try:
            with self._lock:
                return self._ensure(force=True) is not None
        except Exception:
            self._bug("connect")
            return False

    # -- phases -------------------------------------------------------------------------------------

    def begin(self, directive: Directive | None, kind: PhaseKind, iteration: int) -> NodeBegin:
        """``BeginPhase`` with ``directive`` (None: the daemon's fallback); never raises."""
        try:
            with self._lock:
                return self._begin(directive, kind, iteration)
        except Exception:
            self._bug("begin")
            return self._no_begin()

    def end(self, kind: PhaseKind, iteration: int, workload: Workload | None = None) -> NodeReport:
        """``EndPhase``; the report of what this node metered (verdict ``MISSING`` if it could not)."""
        try:
            with self._lock:
                return self._end(kind, iteration, workload)
        except Exception:
            self._bug("end")
            return self._no_report(kind, iteration)

    def close(self) -> None:
        """Ends the session (bounded); idempotent. The node's GPUs return to their default clocks."""
        with self._lock:
            self._closed = True
            link, self._link = self._link, None
        if link is None:
            return
        try:
            link.link.close_session(link.session_id, self._timeout_s)
        except Exception as e:
            logger.debug("eerl: node %d: CloseSession failed (%s)", self._node_rank, e)
        finally:
            _drop(link)

    def __enter__(self) -> NodeLink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- internals ----------------------------------------------------------------------------------

    def _begin(self, directive: Directive | None, kind: PhaseKind, iteration: int) -> NodeBegin:
        link = self._ensure()
        checked = check_iteration(iteration)
        if link is None or checked is None:
            return self._no_begin()
        request = eerl_pb2.BeginPhaseRequest(
            session_id=link.session_id, kind=KIND_TO_PB[kind], iteration=checked
        )
        if directive is not None:
            request.directive.CopyFrom(_directive_pb(directive))
        link.open_phase = None
        try:
            reply = link.link.begin_phase(request, self._timeout_s)
        except LinkError as e:
            if e.code is Code.DEADLINE_EXCEEDED:
                link.open_phase = (kind, checked)  # most likely begun: let the end try
            self._on_error(link, e, "BeginPhase")
            return self._no_begin()
        if reply is None:  # pragma: no cover - only a relay answers nothing, and a node holds no relay
            return self._no_begin()
        link.failures = 0
        verdict = _verdict(reply.verdict)
        link.open_phase = (kind, checked)
        link.begin_verdict = verdict
        return NodeBegin(
            node_rank=self._node_rank,
            session_epoch=link.epoch,
            verdict=verdict,
            sm_clock_mhz=reply.target_sm_clock_mhz or None,
            applied_epoch=reply.applied_epoch,
            reached=True,
            detail=reply.verdict_detail,
        )

    def _end(self, kind: PhaseKind, iteration: int, workload: Workload | None) -> NodeReport:
        link = self._link
        if link is None or link.broken.is_set() or link.open_phase != (kind, iteration):
            return self._no_report(kind, iteration)
        link.open_phase = None
        request = eerl_pb2.EndPhaseRequest(
            session_id=link.session_id, kind=KIND_TO_PB[kind], iteration=iteration
        )
        if workload is not None:
            request.workload.CopyFrom(_workload_pb(workload))
        try:
            reply = link.link.end_phase(request, self._timeout_s)
        except LinkError as e:
            self._on_error(link, e, "EndPhase")
            return self._no_report(kind, iteration)
        if reply is None:  # pragma: no cover - only a relay answers nothing, and a node holds no relay
            return self._no_report(kind, iteration)
        link.failures = 0
        verdict = _verdict(reply.verdict) if reply.verdict else link.begin_verdict
        return NodeReport(
            node_rank=self._node_rank,
            session_epoch=link.epoch,
            iteration=iteration,
            kind=kind,
            applied_epoch=reply.applied_epoch,
            sm_clock_mhz=reply.sm_clock_mhz or None,
            verdict=verdict,
            duration_s=reply.duration_s,
            energy_j=reply.energy_mj / 1000.0,
            gpus=reply.gpus or link.gpus,
        )

    def _ensure(self, *, force: bool = False) -> _Held | None:
        """The open link, opening one if none is (or its stream ended), subject to back-off."""
        if self._closed or self._disabled_why:
            return None
        link = self._link
        if link is not None and not link.broken.is_set():
            return link
        if link is not None:
            self._link = None
            _drop(link)
            self._warn(
                f"node {self._node_rank}: lost the session with eerld at {self._config.target}; reopening",
                "lost",
            )
        now = time.monotonic()
        if not force and now < self._next_open_s:
            return None
        opened = self._open()
        if opened is None:
            self._next_open_s = time.monotonic() + self._backoff_s
            self._backoff_s = min(self._backoff_s * 2, self._reopen_max_s)
        else:
            self._backoff_s = self._reopen_initial_s
            self._next_open_s = 0.0
        return opened

    def _open(self) -> _Held | None:
        tickets = claim_tickets(self._connect, self._config.ticket_socket_paths, self._timeout_s)
        for path, why in tickets.missing:
            logger.debug("eerl: no claim ticket from %s (%s)", path, why)
        request = eerl_pb2.OpenSessionRequest(
            job_id=self._job_id,
            rank=self._node_rank,
            world_size=self._world_size,
            gpus=[gpu_ref(gpu) for gpu in self._gpus],
            # A pool's node (one role) runs at once with the other pool: async, as eerl.connect's pools do.
            mode=MODE_TO_PB[ExecutionMode.SYNC if self._role is GpuRole.BOTH else ExecutionMode.ASYNC],
            role=ROLE_TO_PB[self._role],
            client_name=f"eerl-client {__version__} / node agent",
            claim_tickets=tickets.tickets,
            job_mode=eerl_pb2.JobMode(enabled=True, incarnation=self._incarnation, node_rank=self._node_rank),
        )
        try:
            daemon, reply = open_session(self._connect, request, self._timeout_s)
        except LinkError as e:
            if e.code is Code.FAILED_PRECONDITION:
                self._backoff_s = self._reopen_max_s
            self._warn(
                f"node {self._node_rank}: cannot open a job-mode session with eerld at "
                f"{self._config.target} ({e.describe()}); this node runs at its daemon's fallback clocks "
                "and eerl keeps retrying",
                "open",
            )
            return None
        self._epoch += 1
        self._supported = _intersection(reply.gpus)
        link = _Held(daemon, reply.session_id, self._epoch, len(reply.gpus), self._supported)
        self._attach(link)
        # Wait (bounded) for the daemon to confirm the binding: until then the session is lease-bound, and
        # a phase begun in that window would outlive an agent that died in it.
        if not link.attached.wait(self._timeout_s):
            logger.debug("eerl: node %d: Attach not confirmed in %.1f s", self._node_rank, self._timeout_s)
        self._link = link
        if "open" in self._warned or "lost" in self._warned:
            logger.info("eerl: node %d: session open again (epoch %d)", self._node_rank, link.epoch)
        return link

    def _attach(self, link: _Held) -> None:
        def on_event(event: eerl_pb2.SessionEvent) -> None:
            link.attached.set()
            logger.debug("eerl: %s", event.message)

        def on_end(error: LinkError | None) -> None:
            if error is not None:
                logger.debug("eerl: the Attach stream ended (%s)", error.describe())
            link.broken.set()

        link.cancel_attach = watch_attach(
            link.link,
            link.session_id,
            name=f"eerl-node-{self._node_rank}-attach",
            on_event=on_event,
            on_end=on_end,
        )

    def _on_error(self, link: _Held, error: LinkError, rpc: str) -> None:
        """A failed call: the session is gone when the connection is lost or the daemon forgot it (both
        reopen at the next begin), or after ``_FAILURES_BEFORE_REOPEN`` failures in a row."""
        logger.debug("eerl: node %d: %s failed (%s)", self._node_rank, rpc, error.describe())
        link.failures += 1
        if error.connection_lost or error.session_lost or link.failures >= _FAILURES_BEFORE_REOPEN:
            link.broken.set()

    def _no_begin(self) -> NodeBegin:
        return NodeBegin(
            node_rank=self._node_rank,
            session_epoch=self._epoch if self.connected else 0,
            verdict=DirectiveVerdict.MISSING,
            sm_clock_mhz=None,
            applied_epoch=0,
            reached=False,
        )

    def _no_report(self, kind: PhaseKind, iteration: int) -> NodeReport:
        return NodeReport(
            node_rank=self._node_rank,
            session_epoch=self._epoch,
            iteration=iteration,
            kind=kind,
            applied_epoch=0,
            sm_clock_mhz=None,
            verdict=DirectiveVerdict.MISSING,
            duration_s=0.0,
            energy_j=0.0,
            gpus=0,
        )

    def _warn(self, message: str, key: str) -> None:
        if key in self._warned:
            logger.debug("eerl: %s", message)
            return
        self._warned.add(key)
        logger.warning("eerl: %s", message)

    def _bug(self, what: str) -> None:
        if "bug" in self._warned:
            logger.debug("eerl: node %d: unexpected error in %s", self._node_rank, what, exc_info=True)
            return
        self._warned.add("bug")
        logger.warning(
            "eerl: node %d: unexpected error in %s; the phase runs at the daemon's fallback clocks",
            self._node_rank,
            what,
            exc_info=True,
        )


def _drop(link: _Held) -> None:
    link.broken.set()
    if link.cancel_attach is not None:
        link.cancel_attach()
    link.link.close()


def _intersection(gpus: Sequence[eerl_pb2.GpuInfo]) -> tuple[int, ...]:
    return common_clocks(gpu.supported_sm_clocks_mhz for gpu in gpus)


def _verdict(value: eerl_pb2.DirectiveVerdict.ValueType) -> DirectiveVerdict:
    # UNSPECIFIED: a daemon that knows nothing of job mode; its own controller decided.
    return VERDICT_FROM_PB.get(value, DirectiveVerdict.NOT_JOB_MODE)


def _directive_pb(directive: Directive) -> eerl_pb2.Directive:
    return eerl_pb2.Directive(
        incarnation=directive.incarnation,
        epoch=directive.epoch,
        iteration=directive.iteration,
        kind=KIND_TO_PB[directive.kind],
        sm_clock_mhz=directive.sm_clock_mhz or 0,
        purpose=PURPOSE_TO_PB[directive.purpose],
    )


def _workload_pb(workload: Workload) -> eerl_pb2.Workload:
    return workload_to_pb(check_workload(workload).workload)


def _default_gpus(config: ClientConfig) -> tuple[GpuId, ...]:
    return config.gpus if config.gpus is not None else visible_gpus()
