"""``python -m eerld.livedemo``: the real daemon steering a simulated RL job, live, in under two minutes.

What runs: ``eerld`` in its own process on the ``sim`` backend (8 simulated H100s shared through a state
file, simulated time running ``--speedup`` times faster than real time), and a simulated RL worker
(:mod:`eerld.simworker`) in another process that runs the ``sync-h100`` reference scenario on the same GPUs
and reports its phases through the ``eerl`` client over the daemon's Unix socket. The daemon's controller
(EE-RL when this build has it, else ``fixed``) picks a clock per phase; the worker's GPU work runs at
whatever clock holds. This module only starts, watches and stops them: it reads the controller's view over
the admin socket (Status, GetDecisions), prints one line per phase, and ends with a summary against the
default governor (predicted by the simulator for the very same iterations: common random numbers) and a
timeline plot. On exit — normal, error or Ctrl-C — the daemon gets SIGTERM, and the demo checks in the
simulated GPUs' state that none was left locked. docs/demo.md explains how to read the output.

Time base: eerld times phases on the sim device's clock (simulated seconds, like the energy counters).
The demo starts the daemon through :func:`serve_daemon`, the very same server as ``eerld`` on a sim
backend whose state-file writes skip fsync (the demo's state lives in a temp folder).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import grpc
from eerl._pb_enums import KIND_FROM_PB, KIND_TO_PB, STATE_FROM_PB
from eerl.phases import ControllerState, PhaseKind
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.config import load_config
from eerld.errors import ConfigError, EerlError
from eerld.gpu.sim import SimBackend, create_sim_backend, open_sim_device
from eerld.logging import configure_logging
from eerld.server import create_server, serve
from eerld.sim.evaluate import evaluate_phase, sample_iteration
from eerld.sim.profiles import builtin_profile
from eerld.sim.scenario import load_scenario
from eerld.simworker import KINDS, PhaseRun

DEFAULT_ITERATIONS = 30
DEFAULT_SPEEDUP = 50.0
DEFAULT_SCENARIO = "sync-h100"
FIXED_CLOCKS = "generation=1110,training=1470"
"""For ``--controller fixed``: about the offline sweep's best pair on sync-h100."""
"""``--controller fixed`` when EE-RL is not in this build: the sweep's best pair for sync-h100 (sim-model)."""
STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 20.0
RPC_TIMEOUT_S = 5.0
JOB_ID = "eerl-demo"
_PARENT_ENV = "EERL_DEMO_PARENT_PID"
_PR_SET_PDEATHSIG = 1

_DAEMON_LAUNCHER = "import sys; from eerld.livedemo import serve_daemon; sys.exit(serve_daemon(sys.argv[1:]))"


# ---- the daemon, with simulated time -----------------------------------------------------------------------


def serve_daemon(argv: Sequence[str]) -> int:
    """``eerld`` with the same flags, on a sim backend without fsync on its state file (a temp file).

    The server, daemon, controller, arbiter and ledger are eerld's own (:func:`eerld.server.create_server`),
    which times phases on the sim device's clock.
    """
    _die_with_parent()
    try:
        config = load_config(list(argv))
        if config.backend != "sim":
            raise ConfigError("serve_daemon: only --backend sim has a simulated clock")
        configure_logging(config.log_format, debug=config.debug)
        backend = create_sim_backend(
            builtin_profile(config.sim_profile),
            config.sim_gpus,
            speedup=config.sim_speedup,
            state_file=config.sim_state,
            durable_writes=False,
        )
        server = create_server(config, backend=backend)
    except (EerlError, OSError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    return serve(server)


def _die_with_parent() -> None:
    """In the daemon: SIGTERM when the demo that started it dies (Linux), so it never outlives a killed demo.

    ``EERL_DEMO_PARENT_PID`` names the demo; if it is already gone, stop at once.
    """
    parent = os.environ.get(_PARENT_ENV)
    if not parent:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if str(os.getppid()) != parent:
        os.kill(os.getpid(), signal.SIGTERM)


def _child_env() -> dict[str, str]:
    """The environment of the children: this eerld importable whatever the current directory."""
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parent.parent)
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("EERL_DISABLE", None)
    env[_PARENT_ENV] = str(os.getpid())
    return env


# ---- what the demo records ---------------------------------------------------------------------------------


@dataclass(slots=True)
class PhaseView:
    """One phase: the worker's measurement and the controller's state when the phase began."""

    run: PhaseRun
    state: ControllerState | None
    default_duration_s: float
    default_energy_j: float


@dataclass(slots=True)
class Totals:
    """Energy, simulated time and valid tokens over some iterations."""

    energy_j: float = 0.0
    duration_s: float = 0.0
    valid_tokens: int = 0

    def add(self, energy_j: float, duration_s: float, valid_tokens: int) -> None:
        """Accumulate one iteration."""
        self.energy_j += energy_j
        self.duration_s += duration_s
        self.valid_tokens += valid_tokens

    @property
    def energy_per_valid_token_j(self) -> float:
        """The figure of merit (NaN without tokens)."""
        return self.energy_j / self.valid_tokens if self.valid_tokens else math.nan

    @property
    def throughput_tokens_per_s(self) -> float:
        """Valid training tokens per simulated second (NaN without time)."""
        return self.valid_tokens / self.duration_s if self.duration_s > 0 else math.nan


@dataclass(frozen=True, slots=True)
class Overhead:
    """Live over predicted, for the same phases at the same clocks (1.0: none)."""

    time: float
    energy: float
    phases: int = 0


_NO_OVERHEAD = Overhead(1.0, 1.0)


@dataclass(slots=True)
class Record:
    """Everything the demo saw, in order."""

    phases: dict[tuple[int, PhaseKind], PhaseView] = field(default_factory=dict)
    session_id: str = ""
    final_status: pb.StatusResponse | None = None
    decisions: list[pb.Decision] = field(default_factory=list)

    def iterations(self) -> list[int]:
        """Iterations with both phases done."""
        return sorted(
            i for (i, kind) in self.phases if kind is PhaseKind.TRAINING and (i, KINDS[0]) in self.phases
        )

    def iteration(self, i: int) -> tuple[PhaseView, PhaseView]:
        """Generation and training of iteration ``i``."""
        return self.phases[(i, PhaseKind.GENERATION)], self.phases[(i, PhaseKind.TRAINING)]

    def totals(
        self,
        iterations: Sequence[int],
        *,
        default: bool,
        overhead: Mapping[PhaseKind, Overhead] | None = None,
    ) -> Totals:
        """Measured totals over ``iterations``; with ``default``, the simulator's default-governor prediction
        for the same iterations, times this run's ``overhead`` per phase kind when given."""
        totals = Totals()
        for i in iterations:
            views = self.iteration(i)
            if default:
                scale = [overhead.get(v.run.kind, _NO_OVERHEAD) if overhead else _NO_OVERHEAD for v in views]
                totals.add(
                    sum(v.default_energy_j * o.energy for v, o in zip(views, scale, strict=True)),
                    sum(v.default_duration_s * o.time for v, o in zip(views, scale, strict=True)),
                    views[1].run.workload.valid_tokens,
                )
            else:
                totals.add(
                    sum(v.run.energy_j for v in views),
                    sum(v.run.duration_s for v in views),
                    views[1].run.workload.valid_tokens,
                )
        return totals

    def committed_iterations(self) -> list[int]:
        """Iterations whose phases both ran a committed clock."""
        return [
            i
            for i in self.iterations()
            if all(
                v.state is ControllerState.COMMITTED and v.run.sm_lock_mhz is not None
                for v in self.iteration(i)
            )
        ]

    def overhead(self) -> dict[PhaseKind, Overhead]:
        """Per phase kind, live over predicted time and energy of the phases run under the default governor.

        Queuing a phase's work and the RPCs around it take wall time, which the speed-up turns into simulated
        seconds the simulator's prediction does not have; this measures how much, where both ran the same
        clocks.
        """
        result: dict[PhaseKind, Overhead] = {}
        for kind in KINDS:
            views = [
                v
                for v in self.phases.values()
                if v.run.kind is kind and v.run.sm_lock_mhz is None and v.default_duration_s > 0
            ]
            if views:
                result[kind] = Overhead(
                    time=sum(v.run.duration_s for v in views) / sum(v.default_duration_s for v in views),
                    energy=sum(v.run.energy_j for v in views) / sum(v.default_energy_j for v in views),
                    phases=len(views),
                )
        return result


# ---- admin socket ------------------------------------------------------------------------------------------


class Admin:
    """The admin RPCs the demo uses; a failing call returns None (the demo never stops for a read)."""

    def __init__(self, socket_path: Path) -> None:
        self._channel = grpc.insecure_channel(f"unix:{socket_path}")
        self._stub = pb_grpc.AdminServiceStub(self._channel)

    def wait_ready(self, timeout_s: float) -> bool:
        """True once the admin service answers."""
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            return False
        return self.status() is not None

    def status(self) -> pb.StatusResponse | None:
        """Status, or None."""
        try:
            reply: pb.StatusResponse = self._stub.Status(pb.StatusRequest(), timeout=RPC_TIMEOUT_S)
        except grpc.RpcError:
            return None
        return reply

    def decisions(self, session_id: str, kind: PhaseKind | None = None, limit: int = 0) -> list[pb.Decision]:
        """The controller's decisions for a session (oldest first), or [] when the call fails."""
        request = pb.GetDecisionsRequest(session_id=session_id, limit=limit)
        if kind is not None:
            request.kind = KIND_TO_PB[kind]
        try:
            reply: pb.GetDecisionsResponse = self._stub.GetDecisions(request, timeout=RPC_TIMEOUT_S)
        except grpc.RpcError:
            return []
        return list(reply.decisions)

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()


def _session_id(status: pb.StatusResponse | None) -> str:
    if status is None:
        return ""
    return next((s.session_id for s in status.sessions if s.job_id == JOB_ID), "")


def _state(decisions: list[pb.Decision]) -> ControllerState | None:
    return STATE_FROM_PB.get(decisions[-1].state) if decisions else None


# ---- the demo ----------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Options:
    """The demo's knobs."""

    iterations: int = DEFAULT_ITERATIONS
    speedup: float = DEFAULT_SPEEDUP
    out_dir: Path = Path("out/demo")
    scenario: str = DEFAULT_SCENARIO
    controller: str = "eerl"


def _work_dir() -> Path:
    """Temporary files (sockets, sim state, ledger): in RAM where there is /dev/shm (no disk writes)."""
    shm = Path("/dev/shm")  # noqa: S108 - only the parent of a private mkdtemp directory
    base = str(shm) if shm.is_dir() and os.access(shm, os.W_OK) else None
    return Path(tempfile.mkdtemp(prefix="eerl-demo-", dir=base))


class LiveDemo:
    """Starts the daemon and the worker, follows them, stops them; :meth:`run` returns the exit code."""

    def __init__(
        self,
        options: Options,
        work_dir: Path,
        out: IO[str] = sys.stdout,
        *,
        started_wall_s: float | None = None,
    ) -> None:
        self.options = options
        self.work = work_dir
        self.out = out
        self.scenario = load_scenario(options.scenario)
        self.controller = options.controller
        self.state_file = work_dir / "sim-state.json"
        self.socket = work_dir / "eerld.sock"
        self.admin_socket = work_dir / "admin.sock"
        self.record = Record()
        self.daemon: subprocess.Popen[bytes] | None = None
        self.worker: subprocess.Popen[str] | None = None
        self.admin: Admin | None = None
        self.started_wall_s = time.monotonic() if started_wall_s is None else started_wall_s
        self.plot_path: Path | None = None
        self.locked_after_stop: list[int] | None = None
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
                [sys.executable, "-c", _DAEMON_LAUNCHER, *self.daemon_args()],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                env=_child_env(),
                start_new_session=True,
            )
        self.admin = Admin(self.admin_socket)

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
        self.worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "eerld.simworker",
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
            stderr=(self.work / "worker.log").open("wb"),
            text=True,
            env=_child_env(),
            start_new_session=True,
        )

    def stop(self) -> None:
        """Stop the worker, SIGTERM the daemon, check that no simulated GPU is left locked (idempotent)."""
        if self._stopped:
            return
        self._stopped = True
        if self.worker is not None:
            _end_process(self.worker, signal.SIGTERM, STOP_TIMEOUT_S)
            if self.worker.stdin is not None:
                with contextlib.suppress(OSError):
                    self.worker.stdin.close()
            if self.worker.stdout is not None:
                self.worker.stdout.close()
        if self.admin is not None:
            self.admin.close()
        if self.daemon is not None:
            _end_process(self.daemon, signal.SIGTERM, STOP_TIMEOUT_S)
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
        threading.Thread(target=_preload_plotting, name="preload-matplotlib", daemon=True).start()
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
        self.say(_HEADER)
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

    def _on_event(self, event: dict[str, Any]) -> bool:
        """Handle one worker event; True when the worker is done."""
        assert self.admin is not None
        assert self.worker is not None
        name = event.get("event")
        if name == "connected":
            if not event.get("connected"):
                raise RuntimeError("the worker could not open a session with eerld")
            self.record.session_id = _session_id(self.admin.status())
        elif name == "begin":
            kind = PhaseKind(event["kind"])
            self._pending_state = _state(self.admin.decisions(self.record.session_id, kind, limit=1))
        elif name == "phase":
            self._on_phase(PhaseRun.from_json(event))
        elif name == "finished":
            self.record.final_status = self.admin.status()
            self.record.decisions = self.admin.decisions(self.record.session_id)
            if self.worker.stdin is not None:
                self.worker.stdin.close()
        elif name == "done":
            return True
        return False

    _pending_state: ControllerState | None = None

    def _on_phase(self, run: PhaseRun) -> None:
        sample = sample_iteration(self.scenario, run.iteration)
        default = evaluate_phase(self.scenario, sample, run.kind, [None])
        view = PhaseView(run, self._pending_state, float(default.duration_s[0]), float(default.energy_j[0]))
        self.record.phases[(run.iteration, run.kind)] = view
        self.say(self._phase_line(view))

    def _phase_line(self, view: PhaseView) -> str:
        run = view.run
        state = view.state.value if view.state is not None else "?"
        clock = "default" if run.sm_lock_mhz is None else f"{run.sm_lock_mhz} MHz"
        line = (
            f"{run.iteration:>4}  {run.kind.value:<10}  {state:<9}  {clock:>8}  "
            f"{run.duration_s:>7.1f} s  {run.energy_j / 1000:>6.1f} kJ"
        )
        if run.kind is PhaseKind.TRAINING and (run.iteration, PhaseKind.GENERATION) in self.record.phases:
            live = self.record.totals([run.iteration], default=False).energy_per_valid_token_j
            default = self.record.totals([run.iteration], default=True).energy_per_valid_token_j
            line += f"   {live:.4f}   {default:.4f}   {_pct(live / default - 1):>6}"
        return line

    # -- the end --------------------------------------------------------------------------------------------

    def report(self) -> None:
        """Summary table, the controller's view, the checks and the plot."""
        record = self.record
        iterations = record.iterations()
        default = record.totals(iterations, default=True)
        live = record.totals(iterations, default=False)
        committed = record.committed_iterations()
        wall_s = time.monotonic() - self.started_wall_s
        self.say()
        self.say(
            f"Summary · {len(iterations)} iterations, {live.duration_s:,.0f} simulated s "
            f"in {wall_s:.0f} s of wall time"
        )
        overhead = record.overhead()
        calibrated = record.totals(iterations, default=True, overhead=overhead)
        rows: list[tuple[str, Totals, Totals | None]] = [
            ("default governor: simulator, same iterations", default, None)
        ]
        if overhead:
            rows.append(("default governor: simulator × this run's overhead¹", calibrated, None))
        rows.append((f"{self.controller} controller, live, whole run", live, calibrated))
        if committed:
            span = f"{len(committed)} it. from {committed[0]}"
            rows.append(
                (
                    f"{self.controller} controller, live, committed ({span})",
                    record.totals(committed, default=False),
                    record.totals(committed, default=True, overhead=overhead),
                )
            )
        self.say(f"  {'':<52}  {'J/valid tok':>11}  {'valid tok/s':>11}  {'energy':>8}  {'throughput':>10}")
        for label, totals, base in rows:
            line = (
                f"  {label:<52}  {totals.energy_per_valid_token_j:>11.4f}  "
                f"{totals.throughput_tokens_per_s:>11,.0f}"
            )
            if base is not None:
                line += f"  {_pct(_saving(totals, base)):>8}  {_speed(totals, base):>10.1%}"
            self.say(line)
        if overhead:
            parts = [
                f"{kind.value} time {_pct(o.time - 1)}, energy {_pct(o.energy - 1)} ({o.phases} phases)"
                for kind, o in overhead.items()
            ]
            self.say(f"  ¹ live over simulator where both ran the default governor: {'; '.join(parts)}")
            self.say(
                "    (queuing work and RPCs take wall time, which the speed-up turns into simulated s); "
                f"against the simulator alone: energy {_pct(_saving(live, default))}, "
                f"throughput {_speed(live, default):.1%}"
            )
        if not committed and self.controller == "eerl":
            self.say("  (the controller had not committed a clock pair yet: run more --iterations)")
        self.say()
        for line in self._controller_lines():
            self.say(line)
        locked = self.locked_after_stop
        if locked is None:
            self.say("  GPUs after SIGTERM: could not read the simulated GPUs' state")
        elif locked:
            self.say(f"  GPUs after SIGTERM: LOCKED: {', '.join(map(str, locked))}")
        else:
            self.say(
                f"  GPUs after SIGTERM: all {self.scenario.workload.gpus} at default clocks, none locked"
            )
        self.plot_path = self.write_outputs()
        self.say(f"  timeline plot: {self.plot_path}")

    def _controller_lines(self) -> list[str]:
        record = self.record
        lines: list[str] = []
        status = record.final_status
        session = (
            next((s for s in status.sessions if s.session_id == record.session_id), None) if status else None
        )
        if session is None:
            return ["  controller: no Status from eerld at the end of the run"]
        for phase in session.phases:
            kind = KIND_FROM_PB.get(phase.kind)
            if kind is None:
                continue
            state = STATE_FROM_PB.get(phase.state, ControllerState.OFF).value
            clock = f"{phase.sm_clock_mhz} MHz" if phase.sm_clock_mhz else "default"
            commit = next(
                (
                    d.iteration
                    for d in record.decisions
                    if KIND_FROM_PB.get(d.kind) is kind and d.state == pb.CONTROLLER_STATE_COMMITTED
                ),
                None,
            )
            first = f", first committed at it. {commit}" if commit is not None else ""
            cost = phase.exploration_cost_mj / 1e9
            estimate = (
                f"; by its own estimate it saves {phase.estimated_savings_fraction:.1%} against its "
                "predicted "
                "default"
                if phase.estimated_savings_fraction
                else ""
            )
            lines.append(
                f"  controller, {kind.value}: {state} at {clock}{first}{estimate}"
                + (f" (exploration cost {cost:.2f} MJ)" if cost > 0.005 else "")
            )
        daemon_j = sum(p.energy_mj for p in session.phases) / 1000.0
        valid = sum(p.valid_tokens for p in session.phases)
        worker_j = sum(v.run.energy_j for v in record.phases.values())
        if valid and worker_j:
            lines.append(
                f"  daemon's own meter (counters at BeginPhase/EndPhase): {daemon_j / 1e6:.2f} MJ, "
                f"{daemon_j / valid:.4f} J/valid tok; the worker's meter: {worker_j / 1e6:.2f} MJ "
                f"({_pct(daemon_j / worker_j - 1)})"
            )
        return lines

    def write_outputs(self) -> Path:
        """The timeline plot and a JSON of every phase; returns the plot's path."""
        out = self.options.out_dir
        out.mkdir(parents=True, exist_ok=True)
        phases = [
            {
                **json.loads(view.run.to_json()),
                "controller_state": view.state.value if view.state else None,
                "default_duration_s": view.default_duration_s,
                "default_energy_j": view.default_energy_j,
            }
            for view in self.record.phases.values()
        ]
        (out / "eerl-demo.json").write_text(
            json.dumps(
                {
                    "scenario": self.scenario.name,
                    "controller": self.controller,
                    "speedup": self.options.speedup,
                    "phases": phases,
                    "locked_after_stop": self.locked_after_stop,
                },
                indent=1,
            )
        )
        path = out / "eerl-demo-timeline.png"
        timeline_plot(
            self.record,
            top_clock_mhz=int(self.scenario.gpu.sm_clock_max_mhz),
            path=path,
            title=f"eerl live demo: {self.scenario.name}, controller {self.controller}, "
            f"simulated time ×{self.options.speedup:g}",
        )
        return path.resolve()


_HEADER = (
    "iter  phase       state         clock   sim time    energy   J/valid tok  default   vs default\n"
    "----  ----------  ---------  --------  ---------  --------  ------------  -------  -----------"
)


def _saving(totals: Totals, base: Totals) -> float:
    return totals.energy_per_valid_token_j / base.energy_per_valid_token_j - 1


def _speed(totals: Totals, base: Totals) -> float:
    return totals.throughput_tokens_per_s / base.throughput_tokens_per_s


def _pct(fraction: float) -> str:
    return f"{fraction:+.1%}".replace("-", "−")


def _parse(line: str) -> dict[str, Any] | None:
    try:
        event = json.loads(line)
    except json.JSONDecodeError:
        return None
    return event if isinstance(event, dict) else None


def _end_process(process: subprocess.Popen[Any], sig: signal.Signals, timeout_s: float) -> None:
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


# ---- plot --------------------------------------------------------------------------------------------------

_STATE_COLOURS = {
    ControllerState.BASELINE: "#e4e4e4",
    ControllerState.EXPLORING: "#ffe08a",
    ControllerState.RETUNING: "#f7b0a8",
    ControllerState.COMMITTED: "#d8f0d0",
    ControllerState.FIXED: "#d8e4f8",
}


def _preload_plotting() -> None:
    """Import matplotlib while the demo runs (seconds of CPU that would otherwise delay the summary)."""
    with contextlib.suppress(ImportError):
        import matplotlib  # noqa: PLC0415 - warming the import cache only

        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: PLC0415 - warming the import cache only


def timeline_plot(record: Record, *, top_clock_mhz: int, path: Path, title: str) -> None:
    """Clock per phase, energy per valid token and throughput per iteration, controller states shaded."""
    # matplotlib is slow to import and only the plot needs it (the daemon launcher imports this module).
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415
    from matplotlib.patches import Patch  # noqa: PLC0415

    iterations = record.iterations()
    fig, axes = plt.subplots(3, 1, figsize=(10, 8), sharex=True)
    for kind, style in zip(KINDS, ("o-", "s--"), strict=True):
        views = [record.phases[(i, kind)] for i in iterations]
        clocks = [top_clock_mhz if v.run.sm_lock_mhz is None else v.run.sm_lock_mhz for v in views]
        axes[0].plot(iterations, clocks, style, ms=3, lw=1, label=f"{kind.value} lock")
    axes[0].set_ylabel(f"SM clock lock (MHz)\ndefault governor = {top_clock_mhz}")
    axes[0].legend(loc="lower left", fontsize=8)
    live = [record.totals([i], default=False) for i in iterations]
    default = [record.totals([i], default=True) for i in iterations]
    axes[1].plot(iterations, [t.energy_per_valid_token_j for t in live], "o-", ms=3, lw=1, label="live")
    axes[1].plot(
        iterations,
        [t.energy_per_valid_token_j for t in default],
        lw=1,
        alpha=0.7,
        label="default (predicted)",
    )
    axes[1].set_ylabel("energy / valid token (J)")
    axes[1].legend(loc="upper right", fontsize=8)
    axes[2].plot(iterations, [t.throughput_tokens_per_s for t in live], "o-", ms=3, lw=1, label="live")
    axes[2].plot(
        iterations, [t.throughput_tokens_per_s for t in default], lw=1, alpha=0.7, label="default (predicted)"
    )
    axes[2].set_ylabel("valid tokens / simulated s")
    axes[2].set_xlabel("RL iteration")
    axes[2].legend(loc="lower right", fontsize=8)
    for i in iterations:
        states = [v.state for v in record.iteration(i)]
        state = next((s for s in _STATE_COLOURS if s in states), None)
        if state is not None:
            for axis in axes:
                axis.axvspan(i - 0.5, i + 0.5, color=_STATE_COLOURS[state], lw=0, zorder=0)
    seen = [s for s in _STATE_COLOURS if any(v.state is s for v in record.phases.values())]
    fig.legend(
        [Patch(color=_STATE_COLOURS[s]) for s in seen],
        [f"controller {s.value}" for s in seen],
        loc="upper center",
        bbox_to_anchor=(0.5, 0.965),
        ncol=5,
        fontsize=8,
        frameon=False,
    )
    axes[2].xaxis.get_major_locator().set_params(integer=True)
    fig.suptitle(title, y=0.995, fontsize=10)
    fig.tight_layout(rect=(0, 0, 1, 0.94))
    fig.savefig(path, dpi=90)
    plt.close(fig)


# ---- command line ------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m eerld.livedemo``."""
    p = argparse.ArgumentParser(
        prog="python -m eerld.livedemo",
        description="Run eerld on simulated GPUs with a simulated RL job, live, and summarise what it saved.",
    )
    p.add_argument(
        "--iterations",
        type=int,
        default=DEFAULT_ITERATIONS,
        help=f"RL iterations (default {DEFAULT_ITERATIONS})",
    )
    p.add_argument(
        "--speedup",
        type=float,
        default=DEFAULT_SPEEDUP,
        help=f"simulated seconds per wall second (default {DEFAULT_SPEEDUP:g})",
    )
    p.add_argument(
        "--out", type=Path, default=Path("out/demo"), help="where the plot and JSON go (default out/demo)"
    )
    p.add_argument(
        "--scenario", default=DEFAULT_SCENARIO, help=f"a sync scenario (default {DEFAULT_SCENARIO})"
    )
    p.add_argument(
        "--controller",
        choices=("eerl", "fixed", "off"),
        default="eerl",
        help="default: eerl if available, else fixed",
    )
    return p


@contextlib.contextmanager
def _no_interrupts() -> Iterator[None]:
    """Shield cleanup from a second Ctrl-C (the children are stopped either way)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (0: ran and left no GPU locked; 130 after Ctrl-C)."""
    started_wall_s = time.monotonic()
    args = build_parser().parse_args(argv)
    if args.iterations < 1 or not (math.isfinite(args.speedup) and args.speedup > 0):
        print("Error: --iterations must be ≥ 1 and --speedup a positive number", file=sys.stderr)
        return 2
    options = Options(args.iterations, args.speedup, args.out, args.scenario, args.controller)
    work = _work_dir()
    demo: LiveDemo | None = None
    try:
        demo = LiveDemo(options, work, started_wall_s=started_wall_s)
        return demo.run()
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the worker and eerld", file=sys.stderr)
        return 130
    except (EerlError, RuntimeError, OSError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    finally:
        with _no_interrupts():
            if demo is not None:
                demo.stop()
                if demo.locked_after_stop:
                    print(f"Error: GPUs left locked: {demo.locked_after_stop}", file=sys.stderr)
            _remove_tree(work)


def _remove_tree(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
