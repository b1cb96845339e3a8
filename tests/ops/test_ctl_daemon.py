"""eerlctl and the metrics end to end against the real daemon (in process, fake GPU backend)."""

from __future__ import annotations

import io
import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from eerl.v1 import eerl_pb2, eerl_pb2_grpc

from eerld.ctl import main
from eerld.metrics import MetricsServer, start_metrics_server
from eerld.testing import DaemonHandle, running_daemon


@pytest.fixture
def daemon(sock_dir: Path) -> Iterator[DaemonHandle]:
    """A daemon with one session on GPU 0 (one generation phase metered, the next one running)."""
    with running_daemon(sock_dir) as handle, grpc.insecure_channel(f"unix:{handle.socket_path}") as channel:
        stub = eerl_pb2_grpc.PhaseServiceStub(channel)
        opened = stub.OpenSession(
            eerl_pb2.OpenSessionRequest(job_id="job-42", rank=0, gpus=[eerl_pb2.GpuRef(index=0)])
        )
        gen = eerl_pb2.PHASE_KIND_GENERATION
        stub.BeginPhase(eerl_pb2.BeginPhaseRequest(session_id=opened.session_id, kind=gen, iteration=0))
        workload = eerl_pb2.Workload(tokens=1000, valid_tokens=800, sequences=8)
        stub.EndPhase(
            eerl_pb2.EndPhaseRequest(session_id=opened.session_id, kind=gen, iteration=0, workload=workload)
        )
        stub.BeginPhase(eerl_pb2.BeginPhaseRequest(session_id=opened.session_id, kind=gen, iteration=1))
        yield handle


def ctl(handle: DaemonHandle, *argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    code = main(["--socket", str(handle.admin_socket_path), *argv], out=out, err=err)
    return code, out.getvalue(), err.getvalue()


def ctl_json(handle: DaemonHandle, *argv: str) -> Any:
    code, out, err = ctl(handle, "--json", *argv)
    assert (code, err) == (0, "")
    return json.loads(out)


class TestEerlctlAgainstEerld:
    def test_status_shows_the_session_and_a_pin(self, daemon: DaemonHandle) -> None:
        """After a pin on GPU 1, status --json shows GPU 0 held by the session and GPU 1 pinned."""
        assert ctl(daemon, "pin", "--gpus", "1", "--sm-mhz", "1005", "--reason", "test")[0] == 0
        status = ctl_json(daemon, "status")
        gpu0, gpu1 = status["gpus"][0], status["gpus"][1]
        assert (gpu0["owner"]["job_id"], gpu0["locked_sm_clock_mhz"]) == ("job-42", 1200)
        assert (gpu1["owner"]["pin"]["reason"], gpu1["locked_sm_clock_mhz"]) == ("test", 1005)
        assert status["gpus"][2]["locked_sm_clock_mhz"] is None
        assert [s["current_phase"] for s in status["sessions"]] == ["generation"]

    def test_an_unsupported_pin_names_the_nearest_clocks(self, daemon: DaemonHandle) -> None:
        """The daemon's INVALID_ARGUMENT message, naming the nearest supported clocks, is the Error line."""
        code, _, err = ctl(daemon, "pin", "--gpus", "1", "--sm-mhz", "1001")
        assert code == 1
        assert err.startswith("Error: ")
        assert "990" in err
        assert "1005" in err

    def test_unpin_returns_the_gpu_to_the_default_governor(self, daemon: DaemonHandle) -> None:
        """Unpinning GPU 1 leaves it unlocked with no owner."""
        ctl(daemon, "pin", "--gpus", "1", "--sm-mhz", "1005")
        assert ctl(daemon, "unpin", "--gpus", "1")[0] == 0
        gpu1 = ctl_json(daemon, "status")["gpus"][1]
        assert (gpu1["locked_sm_clock_mhz"], gpu1["owner"]) == (None, None)

    def test_reset_closes_the_session_holding_the_gpu(self, daemon: DaemonHandle) -> None:
        """reset --gpus 0 closes the session and returns GPU 0 to default clocks."""
        result = ctl_json(daemon, "reset", "--gpus", "0")
        assert len(result["closed_session_ids"]) == 1
        assert ctl_json(daemon, "sessions")["sessions"] == []
        assert ctl_json(daemon, "status")["gpus"][0]["locked_sm_clock_mhz"] is None

    def test_decisions_list_the_controllers_choices(self, daemon: DaemonHandle) -> None:
        """The fixed controller's decisions for generation are listed at 1200 MHz."""
        decisions = ctl_json(daemon, "decisions", "--phase", "generation")["decisions"]
        assert decisions
        assert {d["sm_clock_mhz"] for d in decisions} == {1200}

    def test_health_on_both_sockets(self, daemon: DaemonHandle) -> None:
        """The probes' health check answers SERVING on the admin and on the worker socket."""
        assert ctl(daemon, "health")[:2] == (0, "SERVING\n")
        out = io.StringIO()
        assert main(["--socket", str(daemon.socket_path), "health"], out=out, err=io.StringIO()) == 0

    def test_admin_calls_on_the_worker_socket_are_refused(self, daemon: DaemonHandle) -> None:
        """The worker socket does not serve AdminService: one Error line says so."""
        err = io.StringIO()
        assert main(["--socket", str(daemon.socket_path), "status"], out=io.StringIO(), err=err) == 1
        assert err.getvalue().startswith("Error: eerld at ")


@pytest.fixture
def metrics(daemon: DaemonHandle) -> Iterator[MetricsServer]:
    server = start_metrics_server(daemon.daemon, "127.0.0.1:0", hostname="node-a")
    try:
        yield server
    finally:
        server.close()


def scrape(server: MetricsServer) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as reply:
        body: bytes = reply.read()
    return body.decode()


class TestMetricsOfTheDaemon:
    def test_the_session_and_gpus_are_exported(self, daemon: DaemonHandle, metrics: MetricsServer) -> None:
        """The daemon's session appears per phase, and its GPU 0 as locked at 1.2 GHz."""
        text = scrape(metrics)
        labels = 'Hostname="node-a",gpus="0",job_id="job-42",phase="generation",rank="0"'
        assert f"eerl_session_phases_total{{{labels}}} 1.0" in text
        assert 'eerl_gpu_locked_sm_clock_hertz{Hostname="node-a",UUID="GPU-fake-0000' in text

    def test_rpcs_after_the_start_are_counted(self, daemon: DaemonHandle, metrics: MetricsServer) -> None:
        """An eerlctl call made after the metrics server started is counted by method and code."""
        ctl(daemon, "status")
        assert 'eerl_rpc_requests_total{code="OK",method="Status"} 1.0' in scrape(metrics)

    def test_closing_detaches_from_the_daemon(self, daemon: DaemonHandle) -> None:
        """After close() the daemon no longer calls the metrics' observers."""
        before = daemon.daemon.subscribers
        server = start_metrics_server(daemon.daemon, "127.0.0.1:0")
        assert daemon.daemon.subscribers == (before[0] + 1, before[1] + 1)
        server.close()
        assert daemon.daemon.subscribers == before
