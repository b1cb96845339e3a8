"""The live demo's orchestration: start eerld and the simulated RL worker, follow them, stop them.

What runs: ``eerld`` in its own process on the ``sim`` backend (:mod:`demo.daemon`: 8 simulated H100s
shared through a state file, simulated time running ``--speedup`` times faster than real time), and a
simulated RL worker (:mod:`demo.worker`) in another process that runs the ``sync-h100`` reference scenario
on the same GPUs and reports its phases through the ``eerl`` client over the daemon's Unix socket. The
daemon's controller (EE-RL when this build has it, else ``fixed``) picks a clock per phase; the worker's
GPU work runs at whatever clock holds. :class:`LiveDemo` reads the controller's view over the admin socket
(Status, GetDecisions, through eerlctl's :class:`eerlctl.client.AdminClient`), records each phase
(:mod:`demo.record`), prints a line per phase and the summary (:mod:`demo.report`) and draws the timeline
(:mod:`demo.plot`). On exit — normal, error or Ctrl-C — the daemon gets SIGTERM, and the demo checks in the
simulated GPUs' state that none was left locked. docs/demo.md explains how to read the output.

Time base: eerld times phases on the sim device's clock (simulated seconds, like the energy counters).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

import grpc
from eerl.phases import ControllerState, PhaseKind
from eerl.v1 import eerl_pb2 as pb
from eerl.wire.enums import STATE_FROM_PB
from eerl_sim.evaluate import evaluate_phase, sample_iteration
from eerl_sim.gpu import SimBackend, open_sim_device
from eerl_sim.scenario import load_scenario

from demo.daemon import PARENT_ENV
from demo.plot import preload_plotting, timeline_plot
from demo.record import PhaseView, Record, record_json
from demo.report import (
    HEADER,
    controller_lines,
    gpus_after_stop_line,
    job_report_lines,
    phase_line,
    summary_lines,
)
from demo.worker import PhaseRun
from eerlctl.client import AdminClient

T = TypeVar("T")

DEFAULT_ITERATIONS = 30
DEFAULT_SPEEDUP = 50.0
DEFAULT_SCENARIO = "sync-h100"
FIXED_CLOCKS = "generation=1110,training=1470"
"""``--controller fixed``: about the offline sweep's best pair on sync-h100 (sim-model)."""
STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
RPC_TIMEOUT_S = 5.0
JOB_ID = "eerl-demo"


# ---- the processes -----------------------------------------------------------------------------------------


def child_env() -> dict[str, str]:
    """The environment of the children: this checkout's ``demo`` and ``eerld`` importable wherever run."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("EERL_DISABLE", None)
    env[PARENT_ENV] = str(os.getpid())
    return env


def work_dir() -> Path:
    """Temporary files (sockets, sim state, ledger): in RAM where there is /dev/shm (no disk writes)."""
    shm = Path("/dev/shm")  # noqa: S108 - only the parent of a private mkdtemp directory
    base = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="eerl-demo-", dir=base))


def end_process(process: subprocess.Popen[Any], sig: signal.Signals, timeout_s: float) -> None:
    """Send ``sig`` unless it has exited; wait; SIGKILL as a last resort."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(sig)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def locked_gpus(state_file: Path) -> list[int]:
    """Indices of the simulated GPUs in ``state_file`` with any SM, memory or application clock lock."""
    backend = SimBackend(open_sim_device(state_file))
    locked = []
    for index in range(backend.device.gpus):
        gpu = backend.device.observe(index)
        if gpu.sm_lock_mhz is not None or gpu.mem_lock_mhz is not None or gpu.app_sm_clock_mhz is not None:
            locked.append(index)
    backend.close()
    return locked


def _read(call: Callable[[], T]) -> T | None:
    """An admin read, or None when it fails (the demo never stops for a read)."""
    try:
        return call()
    except grpc.RpcError:
        return None


def _parse(line: str) -> dict[str, Any] | None:
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


# ---- the demo ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Options:
    """The demo's knobs."""

    iterations: int = DEFAULT_ITERATIONS
    speedup: float = DEFAULT_SPEEDUP
    out_dir: Path = Path("out/demo")
    scenario: str = DEFAULT_SCENARIO
    controller: str = "eerl"


class LiveDemo:
    """Starts the daemon and the worker, follows them, stops them; :meth:`run` returns the exit code."""

    def __init__(
        self,
        options: Options,
        work: Path,
        out: IO[str] = sys.stdout,
        *,
        started_wall_s: float | None = None,
    ) -> None:
        self.options = options
        self.work = work
        self.out = out
        self.scenario = load_scenario(options.scenario)
        self.controller = options.controller
        self.state_file = work / "sim-state.json"
        self.socket = work / "eerld.sock"
        self.admin_socket = work / "admin.sock"
        self.record = Record()
        self.daemon: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[str] | None = None
        self.admin: AdminClient | None = None
        self.started_wall_s = time.monotonic() if started_wall_s is None else started_wall_s
        self.plot_path: Path | None = None
        self.locked_after_stop: list[int] | None = None
        self._pending_state: ControllerState | None = None
        self._stopped = False

    def say(self, text: str = "") -> None:
        """One line of output, at once."""
        self.out.write(text + "\n")
        self.out.flush()

    # -- processes ----------------------------------------------------------------------------------------

    def daemon_args(self) -> list[str]:
        """eerld's flags for this demo."""
        args = [
            "--backend",
            "sim",
            "--sim-profile",
            self.scenario.gpu.name,
            "--sim-gpus",
            str(self.scenario.workload.gpus),
            "--sim-speedup",
            f"{self.options.speedup:g}",
            "--sim-state",
            str(self.state_file),
            "--socket",
            str(self.socket),
            "--admin-socket",
            str(self.admin_socket),
            "--state-dir",
            str(self.work / "state"),
            "--tenancy",
            "single",
            "--metrics-address",
            "off",
            "--controller",
            self.controller,
            "--log-format",
            "json",
        ]
        if self.controller == "fixed":
            args += ["--fixed-clocks", FIXED_CLOCKS]
        return args

    def start_daemon(self) -> None:
        """Start eerld (it creates the simulated GPUs' state file, then serves)."""
        with (self.work / "eerld.log").open("wb") as log:
            self.daemon = subprocess.Popen(
                [sys.executable, "-m", "demo.daemon", *self.daemon_args()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=child_env(),
                start_new_session=True,
            )
        self.admin = AdminClient(self.admin_socket)

    def wait_for_daemon(self) -> None:
        """Wait until eerld's admin socket answers; RuntimeError with its log if it exits or hangs."""
        assert self.daemon is not None
        assert self.admin is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.daemon.poll() is not None:
                raise RuntimeError(
                    f"eerld exited with code {self.daemon.returncode}:\n{self.daemon_log_tail()}"
                )
            if self.admin_socket.exists() and self.admin.wait_ready(1.0):
                return
            time.sleep(0.1)
        raise RuntimeError(f"eerld did not answer within {STARTUP_TIMEOUT_S:g} s:\n{self.daemon_log_tail()}")

    def daemon_log_tail(self, lines: int = 15) -> str:
        """The end of eerld's log, for error messages."""
        try:
            text = (self.work / "eerld.log").read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def start_worker(self) -> None:
        """Start the simulated RL worker (it joins the daemon's sim device and socket)."""
        gpus = self.scenario.workload.gpus
        with (self.work / "worker.log").open("wb") as log:
            self.worker = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "demo.worker",
                    "--sim-state",
                    str(self.state_file),
                    "--socket",
                    str(self.socket),
                    "--scenario",
                    self.options.scenario,
                    "--iterations",
                    str(self.options.iterations),
                    "--gpus",
                    f"0-{gpus - 1}",
                    "--job-id",
                    JOB_ID,
                    "--hold",
                ],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=child_env(),
                start_new_session=True,
            )

    def stop(self) -> None:
        """Stop the worker, SIGTERM the daemon, check that no simulated GPU is left locked (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        if self.worker is not None:
            end_process(self.worker, signal.SIGTERM, STOP_TIMEOUT_S)
            if self.worker.stdin is not None:
                with contextlib.suppress(OSError):
                    self.worker.stdin.close()
            if self.worker.stdout is not None:
                self.worker.stdout.close()
        if self.admin is not None:
            self.admin.close()
        if self.daemon is not None:
            end_process(self.daemon, signal.SIGTERM, STOP_TIMEOUT_S)
            if self.state_file.exists():
                self.locked_after_stop = locked_gpus(self.state_file)

    # -- following ------------------------------------------------------------------------------------------

    def run(self) -> int:
        """The whole demo; the caller calls :meth:`stop` (also after Ctrl-C)."""
        self.say(
            f"eerl live demo · scenario {self.scenario.name}: {self.scenario.workload.gpus} × "
            f"{self.scenario.gpu.product_name}, {self.options.iterations} RL iterations, "
            f"simulated time ×{self.options.speedup:g}"
        )
        threading.Thread(target=preload_plotting, name="preload-matplotlib", daemon=True).start()
        self.start_daemon()
        self.start_worker()  # it waits for the daemon's state file and socket: both start up at once
        assert self.daemon is not None
        assert self.worker is not None
        assert self.worker.stdout is not None
        self.wait_for_daemon()
        self.say(
            f"eerld (pid {self.daemon.pid}): backend sim, controller {self.controller}, {self.socket.parent}"
        )
        self.say(
            f"simulated RL worker (pid {self.worker.pid}): "
            f"one eerl session on GPUs 0-{self.scenario.workload.gpus - 1}"
        )
        self.say()
        self.say(HEADER)
        for line in self.worker.stdout:
            event = _parse(line)
            if event is None:
                continue
            if self._on_event(event):
                break
        code = self.worker.wait(timeout=STOP_TIMEOUT_S)
        if code != 0 or len(self.record.iterations()) < self.options.iterations:
            tail = (self.work / "worker.log").read_text(errors="replace").strip().splitlines()[-10:]
            raise RuntimeError("the simulated worker failed (exit code " + f"{code}):\n" + "\n".join(tail))
        self.stop()
        self.report()
        return 0 if self.locked_after_stop == [] else 1

    def _status(self) -> pb.StatusResponse | None:
        admin = self.admin
        assert admin is not None
        return _read(lambda: admin.status(timeout_s=RPC_TIMEOUT_S))

    def _decisions(self, kind: PhaseKind | None = None, limit: int = 0) -> list[pb.Decision]:
        admin = self.admin
        assert admin is not None
        session_id = self.record.session_id
        decisions = _read(
            lambda: admin.decisions(session_id=session_id, kind=kind, limit=limit, timeout_s=RPC_TIMEOUT_S)
        )
        return decisions or []

    def _on_event(self, event: dict[str, Any]) -> bool:
        """Handle one worker event; True when the worker is done."""
        assert self.worker is not None
        name = event.get("event")
        if name == "connected":
            if not event.get("connected"):
                raise RuntimeError("the worker could not open a session with eerld")
            status = self._status()
            sessions = status.sessions if status is not None else []
            self.record.session_id = next((s.session_id for s in sessions if s.job_id == JOB_ID), "")
        elif name == "begin":
            decisions = self._decisions(PhaseKind(event["kind"]), limit=1)
            self._pending_state = STATE_FROM_PB.get(decisions[-1].state) if decisions else None
        elif name == "phase":
            self._on_phase(PhaseRun.from_json(event))
        elif name == "finished":
            self.record.final_status = self._status()
            self.record.decisions = self._decisions()
            if self.worker.stdin is not None:
                self.worker.stdin.close()
        elif name == "done":  # the worker closed its session: the daemon has its report
            admin = self.admin
            assert admin is not None
            self.record.reports = _read(lambda: admin.reports(job_id=JOB_ID, timeout_s=RPC_TIMEOUT_S)) or []
            return True
        return False

    def _on_phase(self, run: PhaseRun) -> None:
        sample = sample_iteration(self.scenario, run.iteration)
        default = evaluate_phase(self.scenario, sample, run.kind, [None])
        view = PhaseView(run, self._pending_state, float(default.duration_s[0]), float(default.energy_j[0]))
        self.record.phases[(run.iteration, run.kind)] = view
        self.say(phase_line(self.record, view))

    # -- the end --------------------------------------------------------------------------------------------

    def report(self) -> None:
        """Summary table, the controller's view, the checks and the plot."""
        wall_s = time.monotonic() - self.started_wall_s
        self.say()
        for line in summary_lines(self.record, controller=self.controller, wall_s=wall_s):
            self.say(line)
        self.say()
        for line in controller_lines(self.record):
            self.say(line)
        self.say(gpus_after_stop_line(self.locked_after_stop, self.scenario.workload.gpus))
        self.say()
        for line in job_report_lines(self.record):
            self.say(line)
        self.plot_path = self.write_outputs()
        self.say(f"  timeline plot: {self.plot_path}")

    def write_outputs(self) -> Path:
        """The timeline plot and a JSON of every phase; returns the plot's path."""
        out = self.options.out_dir
        out.mkdir(parents=True, exist_ok=True)
        data = record_json(
            self.record,
            scenario=self.scenario.name,
            controller=self.controller,
            speedup=self.options.speedup,
            locked_after_stop=self.locked_after_stop,
        )
        (out / "eerl-demo.json").write_text(json.dumps(data, indent=1))
        path = out / "eerl-demo-timeline.png"
        timeline_plot(
            self.record,
            top_clock_mhz=int(self.scenario.gpu.sm_clock_max_mhz),
            path=path,
            title=f"eerl live demo: {self.scenario.name}, controller {self.controller}, "
            f"simulated time ×{self.options.speedup:g}",
        )
        return path.resolve()
