"""A local user's connection flood cannot exhaust the daemon through ``/metrics``.

The attack: ``nobody`` opens thousands of idle TCP connections to the metrics port and never sends a byte.
The thread-per-connection server it once hit spawned one thread per connection (4000 connections: 4000
threads, RSS +80 MB) and never timed one out. The daemon here is a real in-process one, so its threads and
file descriptors are this test process's.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from eerld.metrics import start_metrics_server
from eerld.testing import FakeGpuBackend, ManualClock, running_daemon
from tests.ops.fakes import FakeMetricsSource
from tests.reliability.test_privilege import free_port
from tests.security.conftest import NOBODY_UID, NOGROUP_GID

FLOOD_CONNECTIONS = 3000
MAX_CONNECTIONS = 16
"""The metrics server's default cap on connections it holds open."""
SYSTEM_PYTHON = "/usr/bin/python3"
"""An interpreter ``nobody`` may execute (the checkout's virtual environment may not be readable)."""

FLOOD = r"""
import json, os, resource, socket, sys
host, port, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
socks, failed = [], 0
for _ in range(n):
    try:
        socks.append(socket.create_connection((host, port), timeout=5))
    except OSError:
        failed += 1
print(json.dumps({"uid": os.getuid(), "open": len(socks), "failed": failed}), flush=True)
for line in sys.stdin:  # each line asks how many connections the server has closed so far
    closed = 0
    for s in socks:
        s.setblocking(False)
        try:
            closed += s.recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    print(json.dumps({"closed": closed}), flush=True)
"""


@dataclass
class Flood:
    """The attacker process, holding its connections open until the test ends."""

    proc: subprocess.Popen[str]
    opened: int

    def closed_by_server(self) -> int:
        """How many of the attacker's connections the server has closed."""
        stdin, stdout = self._pipes()
        stdin.write("?\n")
        stdin.flush()
        return int(json.loads(stdout.readline())["closed"])

    def _pipes(self) -> tuple[IO[str], IO[str]]:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        return self.proc.stdin, self.proc.stdout


@contextmanager
def flood_as_nobody(port: int, connections: int) -> Iterator[Flood]:
    """``nobody`` opens ``connections`` idle connections to ``127.0.0.1:port`` and holds them."""
    proc = subprocess.Popen(
        [SYSTEM_PYTHON, "-c", FLOOD, "127.0.0.1", str(port), str(connections)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        user=NOBODY_UID,
        group=NOGROUP_GID,
        extra_groups=[],
    )
    try:
        assert proc.stdout is not None
        ready: dict[str, Any] = json.loads(proc.stdout.readline() or "{}")
        assert ready.get("uid") == NOBODY_UID, f"the attacker did not start: {ready}"
        yield Flood(proc, int(ready["open"]))
    finally:
        proc.kill()
        proc.communicate(timeout=30)


def raise_fd_limit() -> None:
    """Let this process (the daemon) hold the server's side of every connection, as the old server did."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def peak_threads(over_s: float) -> int:
    """The most Python threads alive in this process at any sample over ``over_s`` seconds."""
    peak, end = threading.active_count(), time.monotonic() + over_s
    while time.monotonic() < end:
        peak = max(peak, threading.active_count())
        time.sleep(0.05)
    return peak


def scrape(port: int) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as reply:
        return int(reply.status), reply.read().decode()


def wait_until(condition: Any, patience_s: float = 60.0) -> bool:
    end = time.monotonic() + patience_s
    while not condition():
        if time.monotonic() > end:
            return False
        time.sleep(0.1)
    return True


def test_an_idle_connection_flood_costs_no_thread_and_a_scrape_still_answers(sock_dir: Path) -> None:
    raise_fd_limit()
    port = free_port()
    clock = ManualClock()
    with running_daemon(
        sock_dir,
        backend=FakeGpuBackend(2, clock=clock),
        clock=clock,
        reaper=False,
        metrics_address=f"127.0.0.1:{port}",
    ):
        status, _ = scrape(port)
        assert status == 200
        threads_before, fds_before = threading.active_count(), open_fds()
        with flood_as_nobody(port, FLOOD_CONNECTIONS) as flood:
            assert flood.opened >= FLOOD_CONNECTIONS // 2, "the attacker could not even connect"
            threads_during = peak_threads(over_s=1.0)
            fds_during = open_fds()
            assert threads_during <= threads_before + 10, (threads_before, threads_during)
            assert fds_during <= fds_before + MAX_CONNECTIONS + 10, (fds_before, fds_during)
            status, text = scrape(port)
            all_but_the_cap_closed = wait_until(
                lambda: flood.closed_by_server() >= flood.opened - MAX_CONNECTIONS
            )
    assert status == 200
    assert "eerl_build_info" in text
    assert all_but_the_cap_closed, "connections beyond the cap were held open"


def test_an_idle_connection_is_closed_after_the_request_timeout() -> None:
    server = start_metrics_server(FakeMetricsSource(), "127.0.0.1:0", request_timeout_s=0.3)
    try:
        with socket.create_connection((server.host, server.port), timeout=30) as idle:
            got = idle.recv(1)
        status, _ = scrape(server.port)
    finally:
        server.close()
    assert got == b""
    assert status == 200
