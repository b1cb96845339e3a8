"""eerlctl and the metrics end to end against the real daemon (in process, fake GPU backend)."""

from __future__ import annotations

import io
import json
import os
import pwd
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from eerl.v1 import eerl_pb2, eerl_pb2_grpc

from eerlctl.main import main
from eerld.errors import GpuLost
from eerld.metrics import MetricsServer, start_metrics_server
from eerld.testing import DaemonHandle, FakeGpuBackend, running_daemon


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
    def test_grant_own_directory_puts_the_socket_in_a_directory_of_its_own(
        self, daemon: DaemonHandle
    ) -> None:
        """``--own-directory``: ``<grant dir>/<name>/eerld.sock``, the directory 0711, for a bind mount."""
        plain = ctl_json(daemon, "grant", "--gpus", "2", "--uid", "65534", "--name", "plain")
        own = ctl_json(daemon, "grant", "--gpus", "3", "--uid", "65534", "--name", "own", "--own-directory")
        grant_dir = Path(plain["socket_path"]).parent
        socket = Path(own["socket_path"])
        assert Path(plain["socket_path"]) == grant_dir / "plain.sock"
        assert socket == grant_dir / "own" / "eerld.sock"
        assert socket.is_socket()
        assert socket.parent.stat().st_mode & 0o777 == 0o711

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

    def test_report_of_a_finished_job_in_words_and_json(self, daemon: DaemonHandle) -> None:
        """After a reset ends job-42's session, ``report`` lists it and ``report job-42`` gives its energy
        (kWh), tokens and threshold; an unknown job is one Error line."""
        assert ctl_json(daemon, "report") == {"reports": []}
        ctl_json(daemon, "reset", "--gpus", "0")
        listed = ctl_json(daemon, "report")["reports"]
        assert [(r["job_id"], r["reason"]) for r in listed] == [("job-42", "admin reset: eerlctl reset")]
        job = ctl_json(daemon, "report", "job-42")
        assert job["energy_j"] > 0
        assert job["energy_kwh"] == pytest.approx(job["energy_j"] / 3.6e6)
        assert (job["valid_tokens"], job["threshold"], job["under_threshold"]) == (800, 0.95, False)
        assert [p["kind"] for p in job["phases"]] == ["generation", "training"]
        assert {"energy_per_valid_token_j", "estimated_savings_fraction", "throughput_ratio"} <= set(job)
        code, text, _ = ctl(daemon, "report", "job-42")
        assert code == 0
        assert text.startswith("Job job-42: 1 session on this node")
        assert " kWh (" in text
        code, _, err = ctl(daemon, "report", "job-43")
        assert code == 1
        assert err == "Error: no report of job 'job-43' on this node (eerlctl report lists the ones kept)\n"

    def test_close_session_answers_with_the_session_s_report(self, daemon: DaemonHandle) -> None:
        """The worker's CloseSession carries the same report the admin reads."""
        sid = ctl_json(daemon, "--show-tokens", "sessions")["sessions"][0]["session_id"]
        with grpc.insecure_channel(f"unix:{daemon.socket_path}") as channel:
            stub = eerl_pb2_grpc.PhaseServiceStub(channel)
            reply = stub.CloseSession(eerl_pb2.CloseSessionRequest(session_id=sid))
        assert reply.report.job_id == "job-42"
        assert reply.report.energy_j == pytest.approx(reply.energy_mj / 1000.0)
        assert reply.report.valid_tokens == 800
        assert reply.report.reason == "closed by client"

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

    def test_a_finished_job_s_totals_outlive_its_session(
        self, daemon: DaemonHandle, metrics: MetricsServer
    ) -> None:
        """While job-42 runs it has session series and no job series; once its session ends the session
        series are gone and the job's totals stay: energy as the report says, valid tokens, threshold."""
        job = 'Hostname="node-a",job_id="job-42"'
        before = scrape(metrics)
        assert f"eerl_job_energy_joules{{{job}}}" not in before
        ctl_json(daemon, "reset", "--gpus", "0")
        report = ctl_json(daemon, "report", "job-42")
        after = scrape(metrics)
        assert 'eerl_session_phases_total{Hostname="node-a",gpus="0",job_id="job-42"' not in after
        assert f"eerl_job_finished_sessions{{{job}}} 1.0" in after
        assert f"eerl_job_valid_tokens{{{job}}} 800.0" in after
        assert f"eerl_job_threshold_ratio{{{job}}} 0.95" in after
        assert f"eerl_job_under_threshold{{{job}}} 0.0" in after
        energy = next(
            line for line in after.splitlines() if line.startswith(f"eerl_job_energy_joules{{{job}}}")
        )
        assert float(energy.split()[-1]) == pytest.approx(report["energy_j"])
        assert f"eerl_job_throughput_ratio{{{job}}}" not in after  # the fixed controller predicts none

    def test_rpcs_after_the_start_are_counted(self, daemon: DaemonHandle, metrics: MetricsServer) -> None:
        """An eerlctl call made after the metrics server started is counted by method and code."""
        ctl(daemon, "status")
        assert 'eerl_rpc_requests_total{Hostname="node-a",code="OK",method="Status"} 1.0' in scrape(metrics)

    def test_closing_detaches_from_the_daemon(self, daemon: DaemonHandle) -> None:
        """After close() the daemon no longer calls the metrics' observers."""
        before = daemon.daemon.events.subscribers
        server = start_metrics_server(daemon.daemon, "127.0.0.1:0")
        assert daemon.daemon.events.subscribers == (before[0] + 1, before[1] + 1)
        server.close()
        assert daemon.daemon.events.subscribers == before


class TestPinsMeanWhatTheySay:
    def test_a_second_pin_on_a_pinned_gpu_is_refused_naming_the_pin_in_force(
        self, daemon: DaemonHandle
    ) -> None:
        """Re-pinning without --replace fails (exit 1) with the existing pin's clock, reason and expiry;
        the operator's pin stays as it was."""
        assert (
            ctl(daemon, "pin", "--gpus", "1", "--sm-mhz", "1200", "--for", "10m", "--reason", "maint")[0] == 0
        )
        code, out, err = ctl(daemon, "pin", "--gpus", "1", "--sm-mhz", "1005")
        pin = ctl_json(daemon, "status")["gpus"][1]["owner"]["pin"]
        assert (code, out) == (1, "")
        assert 'GPU 1 is already pinned: 1200 MHz "maint"' in err
        assert "expires 20" in err
        assert "--replace" in err
        assert (pin["sm_clock_mhz"], pin["reason"]) == (1200, "maint")
        assert pin["expires_at_unix_s"] is not None

    def test_replace_replaces_and_says_what_it_replaced(self, daemon: DaemonHandle) -> None:
        """With --replace the new pin holds, and the reply names the pin it replaced."""
        ctl(daemon, "pin", "--gpus", "1", "--sm-mhz", "1200", "--for", "10m", "--reason", "maint")
        code, out, _ = ctl(daemon, "pin", "--gpus", "1", "--sm-mhz", "1005", "--replace", "--reason", "tune")
        data = ctl_json(daemon, "pin", "--gpus", "1", "--sm-mhz", "990", "--replace")
        assert code == 0
        assert 'GPU 1: replaced the pin at 1200 MHz "maint"' in out
        assert [(r["index"], r["sm_clock_mhz"], r["reason"]) for r in data["replaced"]] == [(1, 1005, "tune")]
        assert ctl_json(daemon, "status")["gpus"][1]["locked_sm_clock_mhz"] == 990

    def test_a_gpu_listed_twice_is_refused(self, daemon: DaemonHandle) -> None:
        """``--gpus 0,0`` pins nothing and says why."""
        code, _, err = ctl(daemon, "pin", "--gpus", "1,1", "--sm-mhz", "1005")
        assert (code, err) == (1, "Error: --gpus: GPU 1 is listed twice\n")
        assert ctl_json(daemon, "status")["gpus"][1]["owner"] is None

    def test_a_negative_duration_is_a_real_message(self, daemon: DaemonHandle) -> None:
        """``--for -5m`` reaches the duration parser (not argparse's "expected one argument")."""
        code, _, err = ctl(daemon, "pin", "--gpus", "1", "--sm-mhz", "1005", "--for", "-5m")
        assert code == 1
        assert err == "Error: --for: '-5m': a duration cannot be negative; give how long, e.g. 30m or 2h\n"

    def test_unpin_names_the_pin_removed_and_the_clock_read_back_after(self, daemon: DaemonHandle) -> None:
        """The reply's clock is the GPU's clock after the pin went (the default governor's), not the pin's;
        a GPU with no pin says so."""
        ctl(daemon, "pin", "--gpus", "1", "--sm-mhz", "1005", "--reason", "maint")
        data = ctl_json(daemon, "unpin", "--gpus", "1,2")
        after = daemon.backend.clocks(1).sm_clock_mhz
        assert [(r["index"], r["sm_clock_mhz"], r["reason"]) for r in data["removed"]] == [(1, 1005, "maint")]
        assert [(c["index"], c["sm_clock_mhz"], c["source"]) for c in data["clocks"]] == [
            (1, after, "default")
        ]
        assert after != 1005
        assert data["not_pinned"] == [2]
        code, out, _ = ctl(daemon, "unpin", "--gpus", "1")
        assert (code, out) == (0, "GPU 1: had no pin; nothing changed\n")

    def test_a_pin_records_who_set_it(self, daemon: DaemonHandle) -> None:
        """The user eerlctl runs as and the admin socket's owner are recorded and shown by ``pins``."""
        ctl(daemon, "pin", "--gpus", "1", "--sm-mhz", "1005", "--reason", "maint")
        pins = ctl_json(daemon, "pins")["pins"]
        uid = os.getuid()
        assert [(p["index"], p["reason"]) for p in pins] == [(1, "maint")]
        assert f"{pwd.getpwuid(uid).pw_name} (uid {uid}" in pins[0]["set_by"]
        assert (
            f"via the admin socket of {pwd.getpwuid(uid).pw_name} (uid {uid}, mode 0600)" in pins[0]["set_by"]
        )
        table = ctl(daemon, "pins")[1]
        assert "SET BY" in table
        # the table names the user; the socket's owner and mode stay in --json (the column was ~90 wide)
        assert f"{pwd.getpwuid(uid).pw_name} (uid {uid})" in table
        assert "via the admin socket" not in table
        assert max(len(line) for line in table.splitlines()) < 100

    def test_reset_keep_pins_closes_the_session_and_leaves_the_pin(self, daemon: DaemonHandle) -> None:
        """``reset --keep-pins`` closes the session on GPU 0 and leaves GPU 1's pin locked."""
        ctl(daemon, "pin", "--gpus", "1", "--sm-mhz", "1005", "--reason", "maint")
        result = ctl_json(daemon, "reset", "--keep-pins")
        gpus = ctl_json(daemon, "status")["gpus"]
        assert len(result["closed_session_ids"]) == 1
        assert (gpus[0]["locked_sm_clock_mhz"], gpus[0]["owner"]) == (None, None)
        assert (gpus[1]["locked_sm_clock_mhz"], gpus[1]["owner"]["pin"]["reason"]) == (1005, "maint")


def open_on(handle: DaemonHandle, index: int) -> str:
    with grpc.insecure_channel(f"unix:{handle.socket_path}") as channel:
        reply = eerl_pb2_grpc.PhaseServiceStub(channel).OpenSession(
            eerl_pb2.OpenSessionRequest(job_id="job-43", gpus=[eerl_pb2.GpuRef(index=index)]), timeout=10
        )
    session_id: str = reply.session_id
    return session_id


class TestDrain:
    def test_a_drained_gpu_refuses_new_claims_naming_the_drain_until_undrained(
        self, daemon: DaemonHandle
    ) -> None:
        """drain closes the session on GPU 0; a new OpenSession is FAILED_PRECONDITION naming the drain;
        status shows it; after undrain the GPU may be claimed again."""
        drained = ctl_json(daemon, "drain", "--gpus", "0", "--for", "15m", "--reason", "fan swap")
        with pytest.raises(grpc.RpcError) as refused:
            open_on(daemon, 0)
        status = ctl_json(daemon, "status")
        text = ctl(daemon, "status")[1]
        assert (drained["gpu_indices"], len(drained["closed_session_ids"])) == ([0], 1)
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "GPU 0 is drained until 20" in (refused.value.details() or "")
        assert "fan swap" in (refused.value.details() or "")
        assert status["sessions"] == []
        assert status["gpus"][0]["drain"]["reason"] == "fan swap"
        assert status["gpus"][0]["drain"]["expires_at_unix_s"] > time.time() + 14 * 60
        assert status["gpus"][1]["drain"] is None
        assert 'DRAINED "fan swap" until' in text
        assert open_on(daemon, 1)  # the other GPUs are not drained
        assert ctl(daemon, "undrain", "--gpus", "0")[1] == "GPU 0: undrained; it may be claimed again\n"
        assert open_on(daemon, 0)
        assert ctl(daemon, "undrain", "--gpus", "0")[1] == "GPU 0: was not drained; nothing changed\n"

    def test_keep_sessions_lets_the_holder_run_and_a_drain_ends_by_itself(self, daemon: DaemonHandle) -> None:
        """With --keep-sessions the session on GPU 0 stays; once the drain's time is up, claims work again."""
        ctl_json(daemon, "drain", "--gpus", "1", "--for", "1s", "--keep-sessions")
        drained = ctl_json(daemon, "drain", "--gpus", "0", "--keep-sessions")
        with pytest.raises(grpc.RpcError):
            open_on(daemon, 1)
        time.sleep(1.1)
        daemon.daemon.tick()
        assert drained["closed_session_ids"] == []
        assert len(ctl_json(daemon, "sessions")["sessions"]) == 1
        assert open_on(daemon, 1)


class TestBetweenPhases:
    @staticmethod
    def end_generation(daemon: DaemonHandle) -> str:
        session_id = daemon.daemon.reads.sessions()[0].session_id
        with grpc.insecure_channel(f"unix:{daemon.socket_path}") as channel:
            eerl_pb2_grpc.PhaseServiceStub(channel).EndPhase(
                eerl_pb2.EndPhaseRequest(
                    session_id=session_id,
                    kind=eerl_pb2.PHASE_KIND_GENERATION,
                    iteration=1,
                    workload=eerl_pb2.Workload(tokens=10, valid_tokens=8, sequences=1),
                )
            )
        return session_id

    def test_after_end_phase_the_gpu_is_at_default_and_no_phase_shows(self, daemon: DaemonHandle) -> None:
        """The lock ends with its phase: between phases the session's GPU runs the default governor."""
        assert isinstance(daemon.backend, FakeGpuBackend)
        assert daemon.backend.locked() == {0: 1200}
        self.end_generation(daemon)
        session = ctl_json(daemon, "status")["sessions"][0]
        text = ctl(daemon, "status")[1]
        assert daemon.backend.locked() == {}
        assert (session["current_phase"], session["held_sm_clock_mhz"]) == (None, None)
        assert "none@1" in text
        assert "held at" not in text

    def test_a_lock_whose_release_failed_shows_as_held_and_since_when(self, daemon: DaemonHandle) -> None:
        """The reset at EndPhase fails: status says no phase runs, the GPU is still locked, and since when
        (UTC)."""
        assert isinstance(daemon.backend, FakeGpuBackend)
        daemon.backend.fail(0, "reset_sm_clock", GpuLost("fell off the bus", gpu_index=0))
        before = time.time()
        self.end_generation(daemon)
        ended = time.time()
        session = ctl_json(daemon, "status")["sessions"][0]
        text = ctl(daemon, "status")[1]
        assert daemon.backend.locked() == {0: 1200}
        assert session["current_phase"] is None
        assert session["held_sm_clock_mhz"] == 1200
        assert before <= session["held_since_unix_s"] <= ended  # held from the EndPhase on
        assert "none@1, held at 1200 MHz since 20" in text

    def test_during_a_phase_nothing_is_held(self, daemon: DaemonHandle) -> None:
        """The fixture's session is in its generation phase: no held_since."""
        session = ctl_json(daemon, "status")["sessions"][0]
        assert (session["current_phase"], session["held_since_unix_s"]) == ("generation", None)
