"""A real Prometheus scrapes a real eerld on the sim backend; metrics are read back through its query API.

The set-up (scripts/ensure_prometheus.sh, run by `make test`) installs Debian's prometheus package; when
the binaries are missing these tests fail with that instruction rather than skip.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
from eerl.v1 import eerl_pb2, eerl_pb2_grpc

from eerld.ctl import main as eerlctl
from tests.ops.conftest import require_tool

pytestmark = pytest.mark.prometheus

ROOT = Path(__file__).resolve().parents[2]
NODE_NAME = "sim-node-1"
DCGM_CAMEL_CASE_LABELS = ("UUID", "modelName", "Hostname")
DEADLINE_S = 40.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(what: str, check: Any, proc: subprocess.Popen[bytes], log: Path) -> Any:
    """Poll ``check()`` until it returns a truthy value; fail with the process log if it never does."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what}: process exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            result = check()
        except (OSError, grpc.RpcError, ValueError):
            result = None
        if result:
            return result
        time.sleep(0.2)
    pytest.fail(f"{what}: not within {DEADLINE_S:.0f} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass(frozen=True)
class SimDaemon:
    socket_path: Path
    admin_socket_path: Path
    metrics_port: int
    process: subprocess.Popen[bytes]
    log: Path

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as reply:
            body: bytes = reply.read()
        return body.decode()


def admin_ok(daemon: SimDaemon, *argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = eerlctl(["--socket", str(daemon.admin_socket_path), *argv], out=out, err=err)
    assert code == 0, err.getvalue()
    return out.getvalue()


def healthy(daemon: SimDaemon) -> bool:
    out = io.StringIO()
    return eerlctl(["--socket", str(daemon.admin_socket_path), "health"], out=out, err=io.StringIO()) == 0


@pytest.fixture(scope="module")
def sim_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimDaemon]:
    """`eerld --backend sim` with one session (GPU 0, two iterations) and one admin pin (GPU 1)."""
    directory = Path(tempfile.mkdtemp(prefix="eerl-prom-", dir="/tmp"))
    log = tmp_path_factory.mktemp("eerld") / "eerld.log"
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "eerld.main",
        "--backend=sim",
        "--sim-gpus=2",
        f"--sim-state={directory / 'sim-state'}",
        f"--socket={directory / 'eerld.sock'}",
        f"--admin-socket={directory / 'admin.sock'}",
        f"--state-dir={directory / 'state'}",
        "--tenancy=single",
        f"--metrics-address=127.0.0.1:{port}",
        "--controller=fixed",
        "--fixed-clocks=generation=1200,training=1500",
        "--log-format=json",
    ]
    env = {**os.environ, "NODE_NAME": NODE_NAME, "PYTHONPATH": str(ROOT)}
    with log.open("wb") as log_file:
        proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    daemon = SimDaemon(directory / "eerld.sock", directory / "admin.sock", port, proc, log)
    try:
        wait_for("eerld serving", lambda: healthy(daemon), proc, log)
        wait_for("eerld /metrics", daemon.metrics_text, proc, log)
        with grpc.insecure_channel(f"unix:{daemon.socket_path}") as channel:
            stub = eerl_pb2_grpc.PhaseServiceStub(channel)
            opened = stub.OpenSession(
                eerl_pb2.OpenSessionRequest(
                    job_id="job-42",
                    rank=0,
                    gpus=[eerl_pb2.GpuRef(index=0)],
                    mode=eerl_pb2.EXECUTION_MODE_SYNC,
                ),
                timeout=10,
            )
            for iteration in range(2):
                for kind in (eerl_pb2.PHASE_KIND_GENERATION, eerl_pb2.PHASE_KIND_TRAINING):
                    sid = opened.session_id
                    stub.BeginPhase(
                        eerl_pb2.BeginPhaseRequest(session_id=sid, kind=kind, iteration=iteration)
                    )
                    workload = eerl_pb2.Workload(tokens=4096, valid_tokens=2048, sequences=16)
                    request = eerl_pb2.EndPhaseRequest(
                        session_id=sid, kind=kind, iteration=iteration, workload=workload
                    )
                    stub.EndPhase(request, timeout=10)
        admin_ok(
            daemon, "pin", "--gpus", "1", "--sm-mhz", "1005", "--for", "30m", "--reason", "prometheus test"
        )
        yield daemon
    finally:
        stop(proc)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def prometheus(sim_daemon: SimDaemon, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Prometheus server on a free loopback port scraping the daemon every second; yields its URL."""
    binary = require_tool("prometheus", "prometheus")
    directory = tmp_path_factory.mktemp("prometheus")
    config = directory / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: eerld\n    honor_labels: true\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{sim_daemon.metrics_port}']\n"
    )
    port = free_port()
    log = directory / "prometheus.log"
    args = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
    ]
    with log.open("wb") as log_file:
        proc = subprocess.Popen(args, cwd=directory, stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("prometheus ready", lambda: urllib.request.urlopen(f"{url}/-/ready", timeout=2), proc, log)
        # Wait until a scrape has landed, so each test queries stored samples.
        wait_for("first scrape", lambda: query(url, 'up{job="eerld"} == 1'), proc, log)
        yield url
    finally:
        stop(proc)


def query(url: str, promql: str) -> list[dict[str, Any]]:
    """Instant query through Prometheus's HTTP API: the result vector."""
    full = f"{url}/api/v1/query?{urllib.parse.urlencode({'query': promql})}"
    with urllib.request.urlopen(full, timeout=10) as reply:
        body = json.load(reply)
    assert body["status"] == "success", body
    result: list[dict[str, Any]] = body["data"]["result"]
    return result


def values(url: str, promql: str) -> dict[str, float]:
    """``{gpu or phase label: value}`` of an instant query."""
    return {
        r["metric"].get("gpu") or r["metric"].get("phase") or "": float(r["value"][1])
        for r in query(url, promql)
    }


class TestPrometheusScrapesEerld:
    def test_gpu_clocks_and_locks_arrive_with_dcgm_labels(self, prometheus: str) -> None:
        """The pinned GPU 1 is locked at 1005 MHz; its series carry the node name and the GPU's UUID."""
        assert values(prometheus, "eerl_gpu_locked") == {"0": 1.0, "1": 1.0}
        assert values(prometheus, 'eerl_gpu_locked_sm_clock_hertz{gpu="1"}') == {"1": 1.005e9}
        (series,) = query(prometheus, 'eerl_gpu_admin_pinned{gpu="1"}')
        assert series["metric"]["Hostname"] == NODE_NAME
        assert series["metric"]["UUID"].startswith("GPU-")
        assert series["value"][1] == "1"

    def test_energy_counters_grow_between_scrapes(self, prometheus: str) -> None:
        """rate() of the GPU energy counter is positive: the simulated GPUs draw power."""
        promql = "rate(eerl_gpu_energy_joules_total[10s]) > 0"
        deadline = time.monotonic() + DEADLINE_S
        while len(values(prometheus, promql)) < 2 and time.monotonic() < deadline:
            time.sleep(0.5)  # rate() needs two scrapes inside the window
        assert set(values(prometheus, promql)) == {"0", "1"}

    def test_session_metrics_per_phase(self, prometheus: str) -> None:
        """The session's chosen clocks per phase and its metered phases are queryable by job."""
        clocks = values(prometheus, 'eerl_session_sm_clock_hertz{job_id="job-42"}')
        assert clocks == {"generation": 1.2e9, "training": 1.5e9}
        assert values(prometheus, 'eerl_session_phases_total{job_id="job-42"}') == {
            "generation": 2.0,
            "training": 2.0,
        }
        states = query(prometheus, 'eerl_session_controller_state{job_id="job-42"} == 1')
        assert {r["metric"]["eerl_session_controller_state"] for r in states} == {"fixed"}

    def test_rpcs_and_phase_latency_are_counted(self, prometheus: str) -> None:
        """The RPC counter has the Pin and the phase events; the latency histogram has both events."""
        rpcs = query(prometheus, "eerl_rpc_requests_total")
        counted = {(r["metric"]["method"], r["metric"]["code"]): float(r["value"][1]) for r in rpcs}
        assert counted[("Pin", "OK")] == 1.0
        assert counted[("BeginPhase", "OK")] == 4.0
        latency = query(prometheus, "eerl_phase_event_duration_seconds_count")
        assert {r["metric"]["event"]: float(r["value"][1]) for r in latency} == {"begin": 4.0, "end": 4.0}

    def test_build_info_names_the_sim_backend(self, prometheus: str) -> None:
        """eerl_build_info reports the sim backend and the fixed controller."""
        (series,) = query(prometheus, "eerl_build_info")
        assert (series["metric"]["backend"], series["metric"]["controller"]) == ("sim", "fixed")


class TestExposition:
    def test_promtool_finds_nothing_but_the_dcgm_label_names(
        self, sim_daemon: SimDaemon, promtool: str
    ) -> None:
        """promtool check metrics: its only remarks are the camelCase lint, and they come from exactly the
        dcgm-exporter label names kept for joins (with those renamed, the exposition is clean)."""
        text = sim_daemon.metrics_text()
        done = subprocess.run(
            [promtool, "check", "metrics"], input=text, check=False, capture_output=True, text=True
        )
        remarks = {line for line in (done.stdout + done.stderr).splitlines() if line.strip()}
        assert remarks
        assert all(
            line.endswith("label names should be written in 'snake_case' not 'camelCase'") for line in remarks
        )
        renamed = text
        for label in DCGM_CAMEL_CASE_LABELS:
            renamed = re.sub(rf"\b{label}=", f"{label.lower()}=", renamed)
        clean = subprocess.run(
            [promtool, "check", "metrics"], input=renamed, check=False, capture_output=True, text=True
        )
        assert (clean.returncode, clean.stdout + clean.stderr) == (0, "")
