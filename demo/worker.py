"""The demo's simulated RL worker: a scenario's iterations on the shared simulated GPUs, through ``eerl``.

``python -m demo.worker`` plays the RL job in the live demo (:mod:`demo.live` starts it) and in process
tests. It joins the simulated device of a running ``eerld --backend sim --sim-state FILE`` (the same GPUs
the daemon locks and meters) and, for every phase of every iteration of a sync scenario:

1. opens the phase through the ``eerl`` client (one session on all its GPUs), waiting — bounded — until the
   daemon has applied the phase's clock, as a careful job would;
2. queues each GPU's segments of the scenario's sampled iteration on its GPU; the GPUs run in parallel and
   each segment runs at the clock that holds when it starts, whoever set it;
3. waits until the slowest GPU is done (the others idle meanwhile, as in synchronous RL);
4. reports the phase's token workload — exactly the scenario's sampled one — and closes the phase.

It also meters each phase itself, in simulated seconds and from the GPUs' energy counters (the daemon's own
metering code on its own backend handle), and writes one JSON line per event to stdout, so an orchestrator
can show progress and check the daemon's figures without trusting them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

import eerl
import numpy as np
from eerl.phases import ExecutionMode, PhaseKind, Workload

from eerld.energy import phase_energy, read_counters
from eerld.errors import ConfigError, DaemonError
from eerld.gpu.sim import SimBackend, SimDevice, WorkTicket, open_sim_device
from eerld.sim.evaluate import IterationSample, sample_iteration
from eerld.sim.scenario import Scenario, load_scenario
from eerld.sim.workload import Segments

KINDS = (PhaseKind.GENERATION, PhaseKind.TRAINING)
DEFAULT_WAIT_FOR_CLOCK_S = 2.0
"""How long a phase waits for the daemon to apply its clock before running anyway (fail-open)."""
CONNECT_TIMEOUT_S = 30.0
HOLD_TIMEOUT_S = 30.0
"""With ``--hold``, the longest the worker keeps its session open waiting for stdin to close."""

log = logging.getLogger("demo.worker")


@dataclass(frozen=True, slots=True)
class PhaseRun:
    """One phase as the worker ran and metered it (simulated seconds; energy of all its GPUs, idle too)."""

    iteration: int
    kind: PhaseKind
    start_s: float
    end_s: float
    energy_j: float
    sm_lock_mhz: int | None
    """The SM clock lock that held on the GPUs when the work started (None: the default governor)."""
    workload: Workload
    """What the worker reported to the daemon for this phase."""

    @property
    def duration_s(self) -> float:
        """Simulated seconds from the start of the work to the end of the slowest GPU's work."""
        return self.end_s - self.start_s

    def to_json(self) -> str:
        """One JSON line (``"event": "phase"``)."""
        body: dict[str, Any] = {
            "event": "phase",
            "iteration": self.iteration,
            "kind": self.kind.value,
            "start_s": self.start_s,
            "end_s": self.end_s,
            "energy_j": self.energy_j,
            "sm_lock_mhz": self.sm_lock_mhz,
            "workload": asdict(self.workload),
        }
        return json.dumps(body, separators=(",", ":"))

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PhaseRun:
        """The inverse of :meth:`to_json` (given the parsed object)."""
        lock = data["sm_lock_mhz"]
        return cls(
            iteration=int(data["iteration"]),
            kind=PhaseKind(data["kind"]),
            start_s=float(data["start_s"]),
            end_s=float(data["end_s"]),
            energy_j=float(data["energy_j"]),
            sm_lock_mhz=None if lock is None else int(lock),
            workload=Workload(**{k: int(v) for k, v in data["workload"].items()}),
        )


def reported_workload(sample: IterationSample, kind: PhaseKind) -> Workload:
    """What the worker reports at the end of a phase: the scenario's sampled workload of that phase."""
    return sample.phase(kind).workload


def phase_hints(sample: IterationSample, kind: PhaseKind) -> Workload:
    """What a real job knows before a phase: the prompts before generation, the batch before training."""
    workload = sample.phase(kind).workload
    if kind is PhaseKind.GENERATION:
        return Workload(tokens=0, sequences=workload.sequences, prompt_tokens=workload.prompt_tokens)
    return workload


def _slowest_first(segments: Segments, sm_clock_mhz: float) -> list[int]:
    """GPU slots with work, the one with the most work first.

    Queuing work takes a few milliseconds of wall time per GPU (many simulated seconds at a high speed-up);
    starting the GPU that gates the phase first keeps that from lengthening the phase.
    """
    bounds = segments.gpu_bounds
    work = [
        float(np.maximum(segments.compute_mhz_s[a:b] / sm_clock_mhz, segments.memory_s[a:b]).sum())
        for a, b in itertools.pairwise(bounds)
    ]
    slots = [slot for slot in range(len(work)) if bounds[slot + 1] > bounds[slot]]
    return sorted(slots, key=lambda slot: -work[slot])


class SimWorker:
    """Runs a sync scenario's phases on a shared :class:`SimDevice` and reports them through a session."""

    def __init__(
        self,
        scenario: Scenario,
        device: SimDevice,
        session: eerl.Session,
        *,
        gpu_indices: Sequence[int],
        wait_for_clock_s: float = DEFAULT_WAIT_FOR_CLOCK_S,
    ) -> None:
        spec = scenario.workload
        if spec.mode is not ExecutionMode.SYNC:
            raise ConfigError(
                f"simworker: scenario {scenario.name!r} is {spec.mode.value}; only sync is supported"
            )
        if len(gpu_indices) != spec.gpus:
            raise ConfigError(
                f"simworker: scenario {scenario.name!r} needs {spec.gpus} GPUs, got {len(gpu_indices)}"
            )
        for index in gpu_indices:
            device.check_index(index)
        self.scenario = scenario
        self.device = device
        self.session = session
        self.gpu_indices = tuple(gpu_indices)
        self.wait_for_clock_s = wait_for_clock_s
        self._meter = SimBackend(device)

    def run_phase(
        self,
        sample: IterationSample,
        kind: PhaseKind,
        on_begin: Callable[[int, PhaseKind], None] | None = None,
    ) -> PhaseRun:
        """One phase of ``sample`` on the worker's GPUs, reported and metered (see the module docstring).

        ``on_begin`` is called once the phase is open (its clock applied, or the wait for it over) and its
        work is queued.
        """
        segments = sample.phase(kind).segments
        workload = reported_workload(sample, kind)
        hints = phase_hints(sample, kind)
        with self.session.phase(
            kind.value, iteration=sample.iteration, hints=hints, wait_for_clock_s=self.wait_for_clock_s
        ) as phase:
            counters = read_counters(self._meter, self.gpu_indices, 0.0)
            # The phase starts when the first work is queued: reading the counters takes wall time, which
            # the speed-up turns into simulated idle seconds that are no part of the phase.
            begin = replace(counters, time_s=self.device.now_s())
            tickets = self._submit(segments)
            lock = self.device.observe(self.gpu_indices[0]).sm_lock_mhz
            if on_begin is not None:
                on_begin(sample.iteration, kind)
            results = [self.device.wait(ticket) for ticket in tickets]
            end_s = max((r.end_s for r in results), default=begin.time_s)
            end = read_counters(self._meter, self.gpu_indices, end_s)
            phase.report_workload(workload)
        energy = phase_energy(begin, end, self.gpu_indices)
        return PhaseRun(
            iteration=sample.iteration,
            kind=kind,
            start_s=begin.time_s,
            end_s=end_s,
            energy_j=energy.energy_mj / 1000.0,
            sm_lock_mhz=lock,
            workload=workload,
        )

    def _submit(self, segments: Segments) -> list[WorkTicket]:
        """Queue GPU work on the session's GPUs, the GPU that gates it first (see :func:`_slowest_first`)."""
        bounds = segments.gpu_bounds
        tickets = []
        for slot in _slowest_first(segments, self.scenario.gpu.sm_clock_max_mhz):
            rows = slice(int(bounds[slot]), int(bounds[slot + 1]))
            tickets.append(
                self.device.submit_segments(
                    self.gpu_indices[slot],
                    segments.compute_mhz_s[rows],
                    segments.memory_s[rows],
                    segments.mem_activity_scale[rows],
                    segments.duration_noise[rows],
                    segments.power_noise[rows],
                )
            )
        return tickets

    def run_between(self, sample: IterationSample) -> None:
        """The work between generation and training (``[workload.between]``), outside any phase: it runs at
        whatever clock holds, the default governor once eerld released the phase's lock."""
        if sample.between is None:
            return
        for ticket in self._submit(sample.between.segments):
            self.device.wait(ticket)

    def run(
        self,
        iterations: int,
        *,
        first_iteration: int = 0,
        on_begin: Callable[[int, PhaseKind], None] | None = None,
        on_phase: Callable[[PhaseRun], None] | None = None,
    ) -> list[PhaseRun]:
        """Iterations ``first_iteration`` … ``first_iteration + iterations - 1``: generation, the work between
        (if any), training."""
        runs: list[PhaseRun] = []
        for iteration in range(first_iteration, first_iteration + iterations):
            sample = sample_iteration(self.scenario, iteration)
            for kind in KINDS:
                if kind is PhaseKind.TRAINING:
                    self.run_between(sample)
                run = self.run_phase(sample, kind, on_begin)
                runs.append(run)
                if on_phase is not None:
                    on_phase(run)
        return runs


# ---- command line -----------------------------------------------------------------------------------


def _parse_gpus(text: str) -> list[int]:
    indices: list[int] = []
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        try:
            indices.extend(range(int(low), int(high) + 1) if sep else [int(low)])
        except ValueError:
            raise ConfigError(f"--gpus: expected indices like 0-7 or 0,1,2, got {text!r}") from None
    return indices


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m demo.worker``."""
    p = argparse.ArgumentParser(
        prog="python -m demo.worker",
        description="Run a scenario's RL iterations on the simulated GPUs of a running eerld (sim backend).",
    )
    p.add_argument("--sim-state", type=Path, required=True, help="the daemon's --sim-state file")
    p.add_argument("--socket", type=Path, required=True, help="the daemon's worker socket")
    p.add_argument("--scenario", default="sync-h100", help="built-in scenario name or TOML path")
    p.add_argument("--iterations", type=int, default=None, help="default: the scenario's iterations")
    p.add_argument("--first-iteration", type=int, default=0)
    p.add_argument("--gpus", default=None, help="GPU indices, e.g. 0-7 (default: 0 … scenario GPUs - 1)")
    p.add_argument("--job-id", default="simworker")
    p.add_argument("--wait-for-clock", type=float, default=DEFAULT_WAIT_FOR_CLOCK_S, dest="wait_for_clock_s")
    p.add_argument(
        "--hold",
        action="store_true",
        help="after the last phase, keep the session open until stdin closes (lets a caller read Status)",
    )
    return p


class _Output:
    """JSON lines to a stream, one writer at a time."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._lock = threading.Lock()

    def emit(self, line: str) -> None:
        with self._lock:
            self._stream.write(line + "\n")
            self._stream.flush()

    def event(self, name: str, **fields: Any) -> None:
        self.emit(json.dumps({"event": name, **fields}, separators=(",", ":")))


@contextmanager
def _sigterm_as_exit() -> Iterator[None]:
    """SIGTERM ends the worker like Ctrl-C does: the session is closed on the way out."""

    def handler(signum: int, _frame: FrameType | None) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _wait_for_stdin_close(timeout_s: float) -> None:
    done = threading.Event()

    def read() -> None:
        sys.stdin.read()
        done.set()

    threading.Thread(target=read, name="simworker-stdin", daemon=True).start()
    done.wait(timeout_s)


def _open_device(state_file: Path, timeout_s: float) -> SimDevice:
    """Join the daemon's simulated GPUs, waiting up to ``timeout_s`` for a daemon that is still starting."""
    deadline = time.monotonic() + timeout_s
    while not state_file.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return open_sim_device(state_file, durable_writes=False)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (2 for a bad argument or scenario, 1 for a device failure)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="simworker: %(message)s")
    out = _Output(sys.stdout)
    try:
        scenario = load_scenario(args.scenario)
        iterations = scenario.workload.iterations if args.iterations is None else args.iterations
        gpus = _parse_gpus(args.gpus) if args.gpus else list(range(scenario.workload.gpus))
        device = _open_device(args.sim_state, CONNECT_TIMEOUT_S)
    except ConfigError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    config = eerl.ClientConfig.uds(str(args.socket))
    with _sigterm_as_exit(), eerl.connect(gpus=list(gpus), job_id=args.job_id, config=config) as session:
        connected = session.wait_until_connected(CONNECT_TIMEOUT_S)
        out.event("connected", connected=connected, session_id=(session.session_id or "")[:8])
        try:
            worker = SimWorker(
                scenario, device, session, gpu_indices=gpus, wait_for_clock_s=args.wait_for_clock_s
            )
            worker.run(
                iterations,
                first_iteration=args.first_iteration,
                on_begin=lambda i, kind: out.event("begin", iteration=i, kind=kind.value),
                on_phase=lambda run: out.emit(run.to_json()),
            )
        except DaemonError as e:
            print(f"Error: {e}", file=sys.stderr)
            return 1 if not isinstance(e, ConfigError) else 2
        flushed = session.flush(CONNECT_TIMEOUT_S)
        out.event("finished", flushed=flushed)
        if args.hold:
            _wait_for_stdin_close(HOLD_TIMEOUT_S)
        stats = session.stats()
    out.event("done", sent_events=stats.sent_events, dropped_events=stats.dropped_events)
    return 0


if __name__ == "__main__":
    sys.exit(main())
