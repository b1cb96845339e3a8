"""The soak's daemon: a real ``eerld`` process on the sim backend, and what an outside observer checks.

:class:`DaemonProcess` starts ``python -m eerld.main --backend sim`` in a directory, kills it like the real
thing and restarts it on the same state; after each blow the soak (:mod:`soak`) and the tests
(tests/reliability, tests/security) check from outside: the sim GPUs' locks (read from the shared state
file, as one would read the hardware), the ledger on disk, the daemon's own view over the admin socket.
The sidecar, Ray and Prometheus tests, the sidecar benchmark (:mod:`perf.sidecar_overhead`) and the
multi-node demo (:mod:`demo.multinode`, through ``module="demo.daemon"``) start theirs with it; the latency
benchmark keeps its own launcher (:func:`perf.phase_latency.start_eerld`), which also starts eerld's
variants with part of the work taken out.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import grpc
from eerl.v1 import eerl_pb2 as pb

from eerlctl.client import AdminClient
from eerld.clocks.ledger import LEDGER_FILE, Ledger
from eerld.gpu.sim import SimDevice, open_sim_device

REPO = Path(__file__).resolve().parents[1]
"""The checkout: every process the soak starts runs from it (``python -m eerld.main``, ``-m soak.worker``)."""
GEN, TRAIN = pb.PHASE_KIND_GENERATION, pb.PHASE_KIND_TRAINING
PATIENCE_S = 60.0
"""How long to wait for something that must happen (generous: the machine is shared and noisy)."""
STREAM_RESET_BOUND_S = 2.0
"""The daemon's promise: a stream-bound client's GPUs are back on default within 2 s of its death."""


def stop_process(proc: subprocess.Popen[Any], *, timeout_s: float = 30.0) -> int:
    """SIGTERM, wait ``timeout_s``, then SIGKILL (by the process's own id); the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            return proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()


def wait_for(condition: Callable[[], bool], what: str, patience_s: float = PATIENCE_S) -> float:
    """Poll ``condition`` until true; return the seconds it took; AssertionError after ``patience_s``."""
    t0 = time.monotonic()
    while not condition():
        if time.monotonic() - t0 > patience_s:
            raise AssertionError(f"timed out after {patience_s:.0f} s waiting for {what}")
        time.sleep(0.01)
    return time.monotonic() - t0


@dataclass
class DaemonProcess:
    """``python -m eerld.main`` on the sim backend in ``directory``; restartable on the same state.

    The defaults are the soak's; a caller changes what it needs: the simulated clock's ``sim_speedup``, the
    ``controller`` (``fixed`` locks ``fixed_clocks``; ``off`` locks nothing), ``extra_args`` appended to the
    command line (a later flag wins), ``env`` added to this process's environment, and ``module``, a module
    that takes eerld's flags (``demo.daemon``).
    """

    directory: Path
    gpus: int
    sim_state: bool = True
    sim_speedup: float = 10.0
    controller: str = "fixed"
    fixed_clocks: str = "generation=1200,training=1500"
    lease_ttl_s: float = 10.0
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    module: str = "eerld.main"
    proc: subprocess.Popen[bytes] | None = None
    starts: int = 0

    @property
    def socket_path(self) -> Path:
        return self.directory / "w.sock"

    @property
    def admin_socket_path(self) -> Path:
        return self.directory / "a.sock"

    @property
    def state_dir(self) -> Path:
        return self.directory / "state"

    @property
    def state_file(self) -> Path:
        return self.directory / "sim.state"

    @property
    def log_path(self) -> Path:
        return self.directory / "eerld.log"

    def args(self) -> list[str]:
        args = [
            sys.executable,
            "-m",
            self.module,
            "--backend=sim",
            f"--sim-gpus={self.gpus}",
            f"--sim-speedup={self.sim_speedup:g}",
            f"--socket={self.socket_path}",
            f"--admin-socket={self.admin_socket_path}",
            f"--state-dir={self.state_dir}",
            f"--grant-dir={self.directory / 'grants'}",  # never the node's /run/eerld/grants
            "--tenancy=single",
            f"--controller={self.controller}",
            *([f"--fixed-clocks={self.fixed_clocks}"] if self.controller == "fixed" else []),
            "--metrics-address=off",
            "--log-format=json",
            f"--lease-ttl={self.lease_ttl_s}",
            *self.extra_args,
        ]
        if self.sim_state:
            args.append(f"--sim-state={self.state_file}")
        return args

    def start(self) -> None:
        """Start and wait until both sockets answer."""
        self.launch()
        self.wait_ready()

    def __enter__(self) -> Self:
        """:meth:`start` (the process stopped again if it does not come up); :meth:`stop` on exit."""
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def launch(self) -> None:
        """Start the process and return at once (:meth:`wait_ready` waits for it): several start together."""
        env = {**os.environ, **self.env} if self.env else None
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(self.args(), cwd=REPO, env=env, stdout=log, stderr=log)
        self.starts += 1

    def wait_ready(self, patience_s: float = PATIENCE_S) -> None:
        """Wait until the daemon answers Status on its admin socket (it serves both sockets by then).

        RuntimeError with the log's tail if the process exits first; AssertionError with it after
        ``patience_s``.
        """
        try:
            wait_for(self._serving, "eerld to serve", patience_s)
        except AssertionError as e:
            raise AssertionError(f"{e}:\n{self.log_tail()}") from None

    def log_tail(self, chars: int = 2000) -> str:
        """The end of the daemon's log (stdout and stderr), for a failure's message."""
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def _serving(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise RuntimeError(f"eerld exited with {self.proc.returncode}:\n{self.log_tail()}")
        if not self.admin_socket_path.exists():
            return False
        try:
            self.status(timeout_s=2.0)
        except grpc.RpcError:
            return False
        return True

    def status(self, timeout_s: float = 10.0) -> pb.StatusResponse:
        """The daemon's Status over the admin socket (grpc.RpcError when it does not answer)."""
        with AdminClient(self.admin_socket_path) as admin:
            return admin.status(timeout_s=timeout_s)

    def sessions(self) -> list[pb.SessionInfo]:
        """The daemon's open sessions over the admin socket."""
        with AdminClient(self.admin_socket_path) as admin:
            return admin.sessions(timeout_s=10.0)

    def kill(self) -> None:
        """SIGKILL: no shutdown path runs, locks stay on the (simulated) hardware."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> int:
        """SIGTERM and wait; return the exit code."""
        return stop_process(self.proc) if self.proc is not None else 0

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def device(self) -> SimDevice:
        """The simulated GPUs as an outside observer (a worker, nvidia-smi) sees them."""
        return open_sim_device(self.state_file)

    def hardware_locks(self) -> list[int | None]:
        """Each GPU's SM clock lock as the simulated hardware holds it (None: the default governor), read
        through the state file's store (a reader never sees a half-written file)."""
        device = self.device()
        return [device.observe(index).sm_lock_mhz for index in range(self.gpus)]

    def ledger_entries(self) -> dict[int, str]:
        """The ledger on disk (ConfigError if it is corrupt): locked GPU index -> owner kind."""
        return {i: e.owner for i, e in Ledger(self.state_dir).entries().items()}

    def ledger_bytes(self) -> bytes:
        path = self.state_dir / LEDGER_FILE
        return path.read_bytes() if path.exists() else b""

    def reset_clocks(self, timeout_s: float = 120.0) -> subprocess.CompletedProcess[str]:
        """``eerld --reset-clocks`` on this daemon's flags, as systemd's ExecStopPost or an epilog runs it."""
        return subprocess.run(
            [*self.args(), "--reset-clocks"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=False,
        )


def locked_gpus(device: SimDevice, gpus: int) -> dict[int, int]:
    """SM clock locks in force on the sim GPUs, by index."""
    out: dict[int, int] = {}
    for index in range(gpus):
        lock = device.observe(index).sm_lock_mhz
        if lock is not None:
            out[index] = lock
    return out


def owned_gpus(status: pb.StatusResponse) -> set[int]:
    """GPUs the daemon says a session holds or a pin holds."""
    owned: set[int] = set()
    for gpu in status.gpus:
        if gpu.owner.session_id or gpu.owner.HasField("pin"):
            owned.add(gpu.info.index)
    return owned
