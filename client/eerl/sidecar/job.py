"""The sidecar of one node of a multi-node job (``eerl-sidecar --job-nodes``): the same HTTP API, served
through the job-level control instead of a session of its own.

The job posts its phases to its node's sidecar unchanged (``POST /v1/phases/begin|end``). Instead of opening
a session with :func:`eerl.connect` (whose own controller would decide for this node alone, which is wrong
for a job gated by its slowest node: docs/multinode.md), the sidecar hands every edge to its
:class:`~eerl.sidecar._seat.JobSeat`, which turns it into the job-level collective step (the directive
broadcast at a begin, the reports gathered at an end) and applies it at the node's daemon.

The answers keep the sidecar's bound: a call waits for its step at most the answer timeout, and only while
job-level control is on; a step that takes longer (the other nodes are not there yet) still runs, and the
answer says ``"clock": "unknown"`` (``"metered": false``) as when the daemon is slow. Each answer carries a
``job`` object: whether the step was done in time, the directive and the daemon's verdict on it.
"""

from __future__ import annotations

import argparse
import importlib.util
import threading
import time
from collections.abc import Mapping
from typing import Any

from eerl._answers import PhaseAnswer
from eerl._version import __version__
from eerl.config import ClientConfig
from eerl.errors import ConfigError
from eerl.gpus import GpuId
from eerl.phases import PhaseKind
from eerl.sidecar._api import BeginRequest, EndRequest, begin_answer, end_answer
from eerl.sidecar._book import OpenPhases, Tallies
from eerl.sidecar._seat import JobSeat, SeatOptions, SeatState, Step
from eerl.sidecar._world import job_world

__all__ = ["JobSidecar", "add_job_arguments", "job_sidecar"]

DEFAULT_JOB_TIMEOUT_S = 5.0
"""The side group's timeout (``--job-timeout-s``), as :class:`eerl.dist.DistJob`'s."""
DEFAULT_RENDEZVOUS_TIMEOUT_S = 300.0
"""How long the nodes' sidecars wait for each other to start (``--rendezvous-timeout-s``)."""


class JobSidecar:
    """The phase state machine behind the HTTP API in job mode: the phases open, each edge a :class:`Step`
    of the node's seat. Thread-safe as :class:`eerl.sidecar.server.Sidecar` is (one request at a time)."""

    def __init__(
        self,
        seat: JobSeat,
        *,
        job_id: str | None,
        gpus: tuple[GpuId, ...] | None,
        answer_timeout_s: float,
    ) -> None:
        self._seat = seat
        self._job_id = job_id
        self._gpus = gpus or ()
        self._answer_timeout_s = answer_timeout_s
        self._lock = threading.Lock()
        self._open: OpenPhases[Step] = OpenPhases()
        self._next_iteration: dict[PhaseKind, int] = {}
        self._tallies = Tallies()
        self._started_s = time.monotonic()
        self._refused = 0

    @property
    def seat(self) -> JobSeat:
        return self._seat

    @property
    def job_id(self) -> str | None:
        return self._job_id

    def refused(self) -> None:
        """Counts a request refused with a 4xx (for :meth:`status`)."""
        self._refused += 1

    def wait_until_ready(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for the side group to form (before ``-- command`` starts the job)."""
        return self._seat.wait_until_ready(timeout_s)

    def close(self) -> None:
        """Leaves the job: the node's session closes (its daemon resets the GPUs; the job-level controller's
        figures are the job's report, not this node's)."""
        self._seat.close()

    def begin(self, request: BeginRequest) -> dict[str, Any]:
        """Begins a phase: its step queued, waited for (bounded); raises ApiError (409)."""
        with self._lock:
            self._open.check_new(request.kind, request.iteration)
            iteration = request.iteration
            if iteration is None:
                iteration = self._next_iteration.get(request.kind, 0)
            self._next_iteration[request.kind] = iteration + 1
            step = Step(True, request.kind, iteration, request.hints)
            self._submit(step)
            self._open.add(request.kind, iteration, step)
            done = step.done.is_set()
            began = step.node_begin if done else None
            answer = None
            if began is not None and began.reached:
                answer = PhaseAnswer(begin=True, sm_clock_mhz=began.sm_clock_mhz or 0, state=None)
            self._tallies.note(request.kind, answer)
            reply = begin_answer(request.kind, iteration, self._seat.connected, answer)
            reply["job"] = {
                "done": done,
                "verdict": began.verdict.value if answer is not None and began is not None else None,
                "directive": _directive(step) if done else None,
            }
            return reply

    def end(self, request: EndRequest) -> dict[str, Any]:
        """Ends a phase begun before: its step queued, waited for (bounded); raises ApiError (409)."""
        with self._lock:
            iteration, _ = self._open.pop(request.kind, request.iteration)
            step = Step(False, request.kind, iteration, request.workload)
            self._submit(step)
            done = step.done.is_set()
            report = step.report if done else None
            answer = None
            if report is not None and report.gpus > 0:
                answer = PhaseAnswer(
                    begin=False,
                    sm_clock_mhz=report.sm_clock_mhz or 0,
                    state=None,
                    duration_s=report.duration_s,
                    energy_j=report.energy_j,
                    mean_power_w=report.energy_j / report.duration_s if report.duration_s > 0 else 0.0,
                    gpus=report.gpus,
                )
            self._tallies.note(request.kind, answer)
            reply = end_answer(request.kind, iteration, self._seat.connected, answer)
            reply["job"] = {
                "done": done,
                "verdict": report.verdict.value if answer is not None and report is not None else None,
            }
            return reply

    def status(self) -> dict[str, Any]:
        """``GET /v1/status``: as the plain sidecar's, and ``job``: the node's place, job-level control."""
        seat = self._seat
        return {
            "version": __version__,
            "job_id": self._job_id,
            "gpus": [str(gpu) for gpu in self._gpus],
            "enabled": seat.state is not SeatState.OFF,
            "connected": seat.connected,
            "attached": seat.connected,
            "session": None,
            "uptime_s": round(time.monotonic() - self._started_s, 3),
            "open_phases": self._open.listing(),
            "phases": self._tallies.as_json(),
            "refused_requests": self._refused,
            "job": seat.status(),
        }

    def _submit(self, step: Step) -> None:
        """Queues the step and waits for it, at most the answer timeout and only while control is on."""
        if self._seat.submit(step) and self._seat.state is SeatState.ON:
            step.done.wait(self._answer_timeout_s)


def _directive(step: Step) -> dict[str, Any] | None:
    directive = step.directive
    if directive is None:
        return None
    return {
        "incarnation": directive.incarnation,
        "epoch": directive.epoch,
        "sm_clock_mhz": directive.sm_clock_mhz,
        "purpose": directive.purpose.value,
    }


# -- the command's part --------------------------------------------------------------------------------------


def add_job_arguments(parser: argparse.ArgumentParser) -> None:
    """``--job-nodes`` and the flags that go with it."""
    group = parser.add_argument_group(
        "multi-node job without Ray (docs/sidecar.md): one sidecar per node, job-level control over gloo"
    )
    group.add_argument(
        "--job-nodes",
        metavar="N|auto",
        help="this sidecar is one node of a job of N nodes (auto: EERL_JOB_NODES, SLURM_NNODES, else "
        "WORLD_SIZE); node 0's runs the job-level controller (needs torch)",
    )
    group.add_argument(
        "--node-rank",
        type=int,
        help="this node's rank in 0..N-1 (default: EERL_NODE_RANK, NODE_RANK, SLURM_NODEID, else RANK)",
    )
    group.add_argument(
        "--rendezvous",
        metavar="tcp://HOST:PORT",
        help="where the nodes' sidecars meet, the same on every node; node 0's listens there (default: "
        "EERL_RENDEZVOUS, else MASTER_ADDR and MASTER_PORT + 1: MASTER_PORT is the job's own)",
    )
    group.add_argument(
        "--job-timeout-s",
        type=float,
        default=DEFAULT_JOB_TIMEOUT_S,
        help="a node this much behind the others turns job-level control off, everywhere "
        f"(default {DEFAULT_JOB_TIMEOUT_S:g})",
    )
    group.add_argument(
        "--rendezvous-timeout-s",
        type=float,
        default=DEFAULT_RENDEZVOUS_TIMEOUT_S,
        help=f"how long the sidecars wait for each other (default {DEFAULT_RENDEZVOUS_TIMEOUT_S:g})",
    )
    group.add_argument(
        "--job-policy",
        default="eerl",
        choices=["eerl", "fixed", "off"],
        help="the job-level controller (default eerl; fixed: --job-fixed-clocks)",
    )
    group.add_argument(
        "--job-fixed-clocks",
        metavar="generation=MHZ,training=MHZ",
        default="",
        help="the clocks of --job-policy fixed",
    )


def job_sidecar(
    args: argparse.Namespace,
    config: ClientConfig,
    gpus: tuple[GpuId, ...] | None,
    env: Mapping[str, str],
) -> JobSidecar | None:
    """The job-mode sidecar the flags ask for (None: no ``--job-nodes``), not started; raises ConfigError."""
    world = job_world(args.job_nodes, args.node_rank, args.rendezvous, env)
    if world is None:
        return None
    missing = [name for name in ("torch", "numpy") if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(
            f"--job-nodes: job mode needs {' and '.join(missing)}, not installed here "
            "(pip install 'eerl-client[dist]' torch)"
        )
    if args.job_timeout_s <= 0 or args.rendezvous_timeout_s <= 0:
        raise ConfigError("--job-timeout-s and --rendezvous-timeout-s must be positive")
    options = SeatOptions(
        config=config,
        job_id=args.job_id or config.job_id or env.get("SLURM_JOB_ID") or None,
        gpus=gpus if gpus is not None else config.gpus,
        timeout_s=args.job_timeout_s,
        rendezvous_timeout_s=args.rendezvous_timeout_s,
        policy=args.job_policy,
        fixed_clocks=_fixed_clocks(args.job_fixed_clocks),
        threshold=args.threshold if args.threshold is not None else 0.95,
    )
    return JobSidecar(
        JobSeat(world, options),
        job_id=options.job_id,
        gpus=options.gpus,
        answer_timeout_s=args.answer_timeout_s,
    )


def _fixed_clocks(text: str) -> dict[PhaseKind, int]:
    """``generation=1200,training=1500`` (a kind's alias is fine); raises ConfigError."""
    clocks: dict[PhaseKind, int] = {}
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep or not value.strip().isdigit():
            raise ConfigError(f"--job-fixed-clocks: {part!r} is not KIND=MHZ")
        clocks[PhaseKind.parse(name.strip())] = int(value)
    return clocks
