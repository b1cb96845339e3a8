"""The sidecar's seat in a multi-node job (``--job-nodes``): its node's part of the job-level control, on a
thread of its own.

The sidecars of a job's nodes form one torch.distributed ``gloo`` group, one rank per node, at the
rendezvous the job's launcher gives (:mod:`eerl.sidecar._world`), and run one :class:`eerl.dist.DistJob` in
it, exactly as a torchrun job's ranks do: node 0's runs the job-level controller, each holds its node's
job-mode session (:class:`eerl.job.node.NodeLink`); a phase's begin broadcasts the directive, its end gathers
the nodes' reports. None of that is here: this module only hands DistJob the phases the job posted.

Why a thread: a collective waits for every node (up to the group's timeout), and the job's HTTP calls must
not. The HTTP side gives each phase edge to this thread as a :class:`Step`, in the order the job posted them,
and waits for its outcome only as long as its own answer timeout; the thread runs the steps in that order, so
that every node enters the same collectives in the same order (the nodes' jobs post the same phases in the
same order). A step whose collective is late still runs, late: the order is what keeps the nodes together.

Fail-open: torch missing, a rendezvous that fails or times out, a collective that fails or times out, phases
that do not line up across the nodes, a node's job running more than :data:`MAX_QUEUED` edges ahead of the
group: job-level control is off on this node for the rest of the job, with one warning (DistJob's or this
module's), the node's session closed (its daemon puts the GPUs back at the default clocks), and every later
step is dropped at once.
"""

from __future__ import annotations

import contextlib
import datetime
import enum
import logging
import queue
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from eerl.config import ClientConfig
from eerl.directives import Directive
from eerl.errors import one_line
from eerl.gpus import GpuId
from eerl.phases import PhaseKind, Workload
from eerl.sidecar._book import MAX_OPEN_PHASES
from eerl.sidecar._world import JobWorld

if TYPE_CHECKING:
    from eerl.dist import DistJob
    from eerl.job.controller import NodeReport
    from eerl.job.node import NodeBegin
    from eerl.job.runner import JobPhase

__all__ = ["JobSeat", "SeatOptions", "SeatState", "Step"]

logger = logging.getLogger("eerl.sidecar")

MAX_QUEUED = 64
"""Phase edges waiting for the side group; one more means the group is stuck: job-level control goes off."""
STOP_WAIT_S = 2.0
"""How long closing waits for the thread (closing the node's session); a process exit resets it anyway."""


class SeatState(enum.StrEnum):
    """Where the node's job-level control is: the group forming, on, or off for good."""

    FORMING = "forming"
    ON = "on"
    OFF = "off"


@dataclass(eq=False, slots=True)
class Step:
    """One phase edge the job posted; the thread fills in its outcome and sets ``done``."""

    begin: bool
    kind: PhaseKind
    iteration: int
    workload: Workload | None
    """A begin's hints, an end's workload."""
    done: threading.Event = field(default_factory=threading.Event)
    node_begin: NodeBegin | None = None
    directive: Directive | None = None
    report: NodeReport | None = None


@dataclass(frozen=True, slots=True)
class SeatOptions:
    """What the node's DistJob is made with (the sidecar's flags)."""

    config: ClientConfig
    job_id: str | None
    gpus: tuple[GpuId, ...] | None
    timeout_s: float
    """The side group's timeout: a node that lags this much behind the others turns job-level control off."""
    rendezvous_timeout_s: float
    policy: str
    fixed_clocks: Mapping[PhaseKind, int]
    threshold: float


class JobSeat:
    """This node's seat in the job: its DistJob on a thread of its own, fed :class:`Step`\\ s (see the module;
    not :class:`eerl.ray.NodeAgent`, the Ray actor that holds a node's session)."""

    def __init__(self, world: JobWorld, options: SeatOptions, *, max_queued: int = MAX_QUEUED) -> None:
        self._world = world
        self._options = options
        self._queue: queue.Queue[Step | None] = queue.Queue(maxsize=max_queued)
        self._state = SeatState.FORMING
        self._reason = ""
        self._decided = threading.Event()
        self._stopping = False
        self._warned = False
        self._job: DistJob | None = None
        self._phases: dict[tuple[PhaseKind, int], JobPhase] = {}
        self._lock = threading.Lock()
        """Guards the state's changes (the thread turns it on, an overflowing submit or a failure off)."""
        self._view: dict[str, Any] = {}
        """The status's view of the job, replaced whole by the thread (never changed in place)."""
        self._last_observation: dict[str, Any] | None = None
        self._last_step: dict[str, Any] | None = None
        self._observed = 0
        self._dropped = 0
        self._thread = threading.Thread(target=self._run, name="eerl-sidecar-job", daemon=True)

    def start(self) -> None:
        """Starts forming the group (in the background: the sidecar serves meanwhile)."""
        self._thread.start()

    @property
    def world(self) -> JobWorld:
        return self._world

    @property
    def state(self) -> SeatState:
        return self._state

    @property
    def connected(self) -> bool:
        """True while control is on and the node's job-mode session is open."""
        job = self._job
        link = job.link if job is not None else None
        return self._state is SeatState.ON and link is not None and link.connected

    def wait_until_ready(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for the group to form; True if control is on."""
        self._decided.wait(timeout_s)
        return self._state is SeatState.ON

    def submit(self, step: Step) -> bool:
        """Queues a phase edge for the group; False (nothing queued) once control is off."""
        if self._state is SeatState.OFF:
            return False
        try:
            self._queue.put_nowait(step)
        except queue.Full:
            self._off(f"more than {self._queue.maxsize} phase edges waited for the side group", warn=True)
            return False
        return True

    def close(self) -> None:
        """Ends the node's part: its session closed (the daemon resets its GPUs), the group left."""
        self._stopping = True
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)
        if self._thread.is_alive():
            self._thread.join(STOP_WAIT_S)

    def status(self) -> dict[str, Any]:
        """The ``job`` part of ``GET /v1/status``."""
        world = self._world
        return {
            "nodes": world.nodes,
            "node_rank": world.node_rank,
            "leader": world.leader,
            "rendezvous": world.rendezvous,
            "state": self._state.value,
            "enabled": self._state is not SeatState.OFF,
            "reason": self._reason or None,
            "timeout_s": self._options.timeout_s,
            "queued": self._queue.qsize(),
            **self._view,
        }

    # -- the thread ---------------------------------------------------------------------------------------

    def _run(self) -> None:
        job = self._form()
        if job is None:
            self._off("the sidecar stopped before the side group formed", warn=False)
            self._drain()
            return
        self._job = job
        try:
            if not job.enabled:
                self._off(job.disabled_reason or "the side group did not start", warn=False)  # DistJob warned
                return
            self._refresh(job)
            with self._lock:
                if self._state is SeatState.FORMING:
                    self._state = SeatState.ON
            self._decided.set()
            logger.info(
                "eerl-sidecar: node %d of %d in the job's side group (%s); job-level control is on%s",
                self._world.node_rank,
                self._world.nodes,
                self._world.rendezvous,
                ", this node runs the controller" if job.controller is not None else "",
            )
            while self._state is SeatState.ON and not self._stopping:
                step = self._queue.get()
                if step is None:
                    break
                self._run_step(job, step)
                if not job.enabled:
                    self._off(job.disabled_reason or "the side group failed", warn=False)  # DistJob warned
                self._refresh(job)
        except Exception:
            self._off("an unexpected error in the sidecar's job thread", warn=True, exc_info=True)
        finally:
            with contextlib.suppress(Exception):
                job.close()  # the node's session: its daemon puts the GPUs back at the default clocks
            self._leave()
            self._drain()

    def _form(self) -> DistJob | None:
        """Joins the group and builds the node's DistJob; None (control off, with a warning) if it cannot."""
        options, world = self._options, self._world
        try:
            import torch.distributed as dist  # noqa: PLC0415 - only a sidecar in job mode needs torch

            from eerl.dist import DistJob  # noqa: PLC0415 - it needs torch and the controller's numpy
        except ImportError as e:
            self._off(
                f"job mode needs torch and numpy ({e}): pip install 'eerl-client[dist]' torch", warn=True
            )
            return None
        try:
            dist.init_process_group(
                "gloo",
                init_method=world.rendezvous,
                rank=world.node_rank,
                world_size=world.nodes,
                timeout=datetime.timedelta(seconds=options.rendezvous_timeout_s),
            )
        except Exception as e:
            self._off(f"the rendezvous at {world.rendezvous} failed: {one_line(e)}", warn=True)
            return None
        if self._stopping:
            self._leave()
            return None
        return DistJob(
            job_id=options.job_id,
            config=options.config,
            local_rank=0,  # one sidecar per node: each is its node's leader, its rank the node's rank
            gpus=list(options.gpus) if options.gpus is not None else None,
            timeout_s=options.timeout_s,
            policy=options.policy,
            fixed_clocks=options.fixed_clocks,
            threshold=options.threshold,
        )

    def _run_step(self, job: DistJob, step: Step) -> None:
        key = (step.kind, step.iteration)
        try:
            if step.begin:
                phase = job.phase(step.kind, step.iteration, hints=step.workload)
                phase.__enter__()
                self._phases[key] = phase
                while len(self._phases) > MAX_OPEN_PHASES:  # as the HTTP side forgets them (never ended)
                    del self._phases[next(iter(self._phases))]
                step.node_begin = job.last_begin
                step.directive = job.directive(step.kind, step.iteration)
                return
            begun = self._phases.pop(key, None)
            if begun is None:  # its begin was dropped (before the group formed, or never posted)
                return
            begun.report_workload(step.workload or Workload())
            begun.__exit__(None, None, None)
            step.report = job.last_report
            observation = job.last_observation
            if observation is not None:
                self._observed += bool(observation.accepted)
                self._dropped += not observation.accepted
                self._last_observation = {
                    "kind": step.kind.value,
                    "iteration": step.iteration,
                    "accepted": bool(observation.accepted),
                    "reason": observation.reason or None,
                }
        finally:
            self._last_step = {
                "edge": "begin" if step.begin else "end",
                "kind": step.kind.value,
                "iteration": key[1],
            }
            step.done.set()

    def _refresh(self, job: DistJob) -> None:
        """The status's view of the job, taken on this thread (the controller is not thread-safe)."""
        view: dict[str, Any] = {"incarnation": None, "controller": None}
        controller = job.controller
        link = job.link
        view["session_epoch"] = link.session_epoch if link is not None else None
        if controller is not None:
            view["incarnation"] = controller.incarnation
            view["controller"] = {
                "epoch": controller.epoch,
                "lift_steps": controller.lift_steps,
                "observed": self._observed,
                "dropped": self._dropped,
                "phases": {
                    snap.kind.value: {
                        "state": snap.state.value,
                        "sm_clock_mhz": snap.sm_clock_mhz,
                        "phases": snap.phases,
                    }
                    for snap in controller.snapshot()
                },
            }
        view["last_step"] = self._last_step
        view["last_observation"] = self._last_observation
        self._view = view

    def _off(self, reason: str, *, warn: bool, exc_info: bool = False) -> None:
        with self._lock:
            if self._state is SeatState.OFF:
                return
            self._reason = reason
            self._state = SeatState.OFF
        self._decided.set()
        if warn and not self._warned:
            self._warned = True
            logger.warning(
                "eerl-sidecar: job-level control is off from now on (%s); the job goes on, this node at its "
                "default clocks",
                reason,
                exc_info=exc_info,
            )
        with contextlib.suppress(queue.Full):
            self._queue.put_nowait(None)  # wakes the thread if it waits for a step

    def _drain(self) -> None:
        """Drops the steps still queued (their callers stopped waiting, or stop now)."""
        while True:
            try:
                step = self._queue.get_nowait()
            except queue.Empty:
                return
            if step is not None:
                step.done.set()

    def _leave(self) -> None:
        with contextlib.suppress(Exception):
            import torch.distributed as dist  # noqa: PLC0415 - as in _form

            if dist.is_initialized():
                dist.destroy_process_group()
