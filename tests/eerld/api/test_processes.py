"""Failure paths with real processes: a client or the daemon killed, the daemon stopped by signal."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
from eerl.v1 import eerl_pb2_grpc as pb_grpc
from eerl_sim.gpu import open_sim_device
from grpc_health.v1 import health_pb2, health_pb2_grpc

from eerld.app import SIM_MISSING_ERROR
from eerld.testing import FakeGpuBackend, ManualClock, running_daemon
from tests.eerld.conftest import GEN, REPO_ROOT, begin, open_session

CLIENT = Path(__file__).resolve().parents[1] / "client_proc.py"
PATIENCE_S = 20.0
"""How long to wait for something that must happen (generous: the machine is shared and noisy)."""

pytestmark = pytest.mark.slow


def wait_for(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + PATIENCE_S
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def spawn_client(socket_path: Path, mode: str, gpus: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(CLIENT), str(socket_path), mode, gpus], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    return proc


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()


class TestClientDeath:
    def test_a_client_killed_mid_phase_has_its_gpus_reset_when_its_attach_stream_breaks(self, sock_dir):
        clock = ManualClock()
        fake = FakeGpuBackend(4, clock=clock)
        with running_daemon(sock_dir, backend=fake, clock=clock, reaper=True) as handle:
            proc = spawn_client(handle.socket_path, "stream", "1,2")
            assert fake.locked() == {1: 1200, 2: 1200}
            kill(proc)
            # the manual clock never moves, so no lease can expire: only the broken stream can reset
            wait_for(
                lambda: fake.locked() == {} and handle.daemon.reads.sessions() == (),
                "the session closed and its GPUs reset after the client's death",
            )

    def test_a_lease_bound_client_killed_mid_phase_has_its_gpus_reset_once_the_lease_runs_out(self, sock_dir):
        clock = ManualClock()
        fake = FakeGpuBackend(4, clock=clock)
        with running_daemon(sock_dir, backend=fake, clock=clock, reaper=True) as handle:
            proc = spawn_client(handle.socket_path, "lease", "3")
            kill(proc)
            assert fake.locked() == {3: 1200}
            clock.advance(10.0 + 1.0)
            wait_for(lambda: fake.locked() == {}, "the reaper to end the expired lease")


def daemon_args(tmp: Path) -> list[str]:
    return [
        sys.executable,
        "-m",
        "eerld.main",
        "--backend=sim",
        "--sim-gpus=2",
        f"--sim-state={tmp / 'sim.state'}",
        f"--socket={tmp / 'w.sock'}",
        f"--admin-socket={tmp / 'a.sock'}",
        f"--state-dir={tmp / 'state'}",
        "--tenancy=single",
        "--controller=fixed",
        "--fixed-clocks=generation=1200,training=1500",
        "--metrics-address=off",
        "--log-format=json",
    ]


def start_daemon_process(tmp: Path) -> subprocess.Popen[bytes]:
    log = (tmp / "daemon.log").open("ab")
    proc = subprocess.Popen(daemon_args(tmp), cwd=REPO_ROOT, stdout=log, stderr=log)
    log.close()

    def serving() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"eerld exited with {proc.returncode}: {(tmp / 'daemon.log').read_text()}")
        if not (tmp / "w.sock").exists():
            return False
        with grpc.insecure_channel(f"unix:{tmp / 'w.sock'}") as channel:
            try:
                reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
            except grpc.RpcError:
                return False
        return reply.status == health_pb2.HealthCheckResponse.SERVING

    wait_for(serving, "eerld to serve")
    return proc


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def locks(tmp: Path) -> dict[int, int]:
    device = open_sim_device(tmp / "sim.state")
    return {i: lock for i in (0, 1) if (lock := device.observe(i).sm_lock_mhz) is not None}


def lock_both_gpus(tmp: Path) -> None:
    with grpc.insecure_channel(f"unix:{tmp / 'w.sock'}") as channel:
        stub = pb_grpc.PhaseServiceStub(channel)
        session = open_session(stub, 0, 1)
        begin(stub, session.session_id, GEN, 0)


class TestSimBackendLoading:
    """eerld loads the sim backend (the eerl-sim distribution) by name, only for ``--backend sim``."""

    def test_without_eerl_sim_backend_sim_stops_at_start_with_one_line_saying_what_to_install(self, sock_dir):
        """As on a node with the daemon's wheel only: exit code 2, one line, no socket, no traceback."""
        hide = (
            "import sys; sys.modules['eerl_sim'] = None; "
            "from eerld.main import main; sys.exit(main(sys.argv[1:]))"
        )
        done = subprocess.run(
            [sys.executable, "-c", hide, *daemon_args(sock_dir)[3:]],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
            timeout=PATIENCE_S,
        )
        assert (done.returncode, done.stdout) == (2, "")
        assert done.stderr == f"Error: {SIM_MISSING_ERROR}\n"
        assert "pip install eerl-sim" in done.stderr
        assert "pip install -e ./sim" in done.stderr
        assert not (sock_dir / "w.sock").exists()

    def test_without_eerl_sim_the_nvml_backend_never_looks_for_it(self, sock_dir):
        """Only ``--backend sim`` needs the simulator: eerld's own modules import none of it."""
        probe = (
            "import sys; sys.modules['eerl_sim'] = None; "
            "import eerld.main, eerld.app, eerld.api.server, eerld.testing, eerlctl.main; print('ok')"
        )
        done = subprocess.run(
            [sys.executable, "-c", probe], cwd=REPO_ROOT, capture_output=True, text=True, check=False
        )
        assert (done.returncode, done.stdout, done.stderr) == (0, "ok\n", "")

    def test_with_eerl_sim_backend_sim_serves(self, sock_dir, procs):
        procs.append(start_daemon_process(sock_dir))
        lock_both_gpus(sock_dir)
        assert locks(sock_dir) == {0: 1200, 1: 1200}


class TestDaemonProcess:
    def test_a_daemon_killed_with_locks_held_leaves_them_and_the_next_start_resets_them_from_the_ledger(
        self, sock_dir, procs
    ):
        procs.append(start_daemon_process(sock_dir))
        lock_both_gpus(sock_dir)
        assert locks(sock_dir) == {0: 1200, 1: 1200}
        procs[0].send_signal(signal.SIGKILL)
        procs[0].wait()
        assert locks(sock_dir) == {0: 1200, 1: 1200}
        procs.append(start_daemon_process(sock_dir))
        assert locks(sock_dir) == {}
        assert "ledger_reset" in (sock_dir / "daemon.log").read_text()

    def test_sigterm_resets_every_gpu_and_exits_zero(self, sock_dir, procs):
        procs.append(start_daemon_process(sock_dir))
        lock_both_gpus(sock_dir)
        assert locks(sock_dir) == {0: 1200, 1: 1200}
        os.kill(procs[0].pid, signal.SIGTERM)
        assert procs[0].wait(timeout=PATIENCE_S) == 0
        assert locks(sock_dir) == {}
        assert not (sock_dir / "w.sock").exists()
