"""The client against the real eerld (sim GPU backend) over its Unix worker socket."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from pathlib import Path

import eerl
import grpc
import pytest
from eerl import ClientConfig, PhaseKind
from eerl.v1 import eerl_pb2, eerl_pb2_grpc

from eerld.testing import DaemonHandle, FakeGpuBackend, running_daemon

from .conftest import SimDaemon


def _wait(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline_s = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline_s:
            return False
        time.sleep(0.01)
    return True


class TestRealDaemon:
    def test_the_daemon_meters_each_phase_with_the_reported_tokens(self, sim_daemon: SimDaemon) -> None:
        with eerl.connect(gpus=[0, 1], job_id="job-real", config=sim_daemon.config) as session:
            for i in range(2):
                with session.phase("generation", iteration=i) as p:
                    p.report(tokens=100 + i, sequences=4, max_response_tokens=40, prompt_tokens=30)
                with session.phase("training", iteration=i) as p:
                    p.report(tokens=130 + i, valid_tokens=100 + i, sequences=4)
            assert session.flush(5)
        assert [(r.kind, r.iteration, r.tokens, r.valid_tokens, r.job_id) for r in sim_daemon.records] == [
            (PhaseKind.GENERATION, 0, 100, 0, "job-real"),
            (PhaseKind.TRAINING, 0, 130, 100, "job-real"),
            (PhaseKind.GENERATION, 1, 101, 0, "job-real"),
            (PhaseKind.TRAINING, 1, 131, 101, "job-real"),
        ]

    def test_close_returns_the_daemon_s_report_and_logs_it_in_one_line(
        self, sim_daemon: SimDaemon, caplog: pytest.LogCaptureFixture
    ) -> None:
        """``close()`` gives the session's report (the daemon's totals, its threshold) and logs one line."""
        session = eerl.connect(gpus=[0, 1], job_id="job-report", config=sim_daemon.config, threshold=0.9)
        with session.phase("generation", iteration=0) as p:
            p.report(tokens=100, sequences=4)
        with session.phase("training", iteration=0) as p:
            p.report(tokens=130, valid_tokens=100, sequences=4)
        with caplog.at_level(logging.INFO, logger="eerl"):
            report = session.close()
        assert report is not None
        assert (report.job_id, report.valid_tokens, report.threshold) == ("job-report", 100, 0.9)
        assert report.gpu_indices == (0, 1)
        assert [k.phases for k in report.kinds] == [1, 1]
        lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("eerl: job job-report")]
        assert len(lines) == 1
        assert "(rank 0, GPUs 0,1)" in lines[0]
        assert "100 valid tokens" in lines[0]
        assert "(threshold 90%)" in lines[0]
        assert session.close() is report  # idempotent, and no second line

    def test_an_end_s_answer_says_whether_its_duration_is_simulated_time(
        self, sim_daemon: SimDaemon, sock_dir: Path
    ) -> None:
        """On the sim backend a phase's duration is the simulator's time, and the answer says so; on a real
        clock (here the fake backend of eerld.testing) it says wall time."""
        with eerl.connect(gpus=[0], job_id="sim-time", config=sim_daemon.config) as session:
            with session.phase("generation", iteration=0) as p:
                p.report(tokens=10)
            assert session.flush(5)
            answer = session.answer(p, begin=False)
            assert answer is not None
            assert answer.simulated_time is True
        with (
            running_daemon(sock_dir / "wall", backend=FakeGpuBackend(1)) as handle,
            eerl.connect(gpus=[0], job_id="wall", config=ClientConfig.uds(handle.socket_path)) as session,
        ):
            with session.phase("generation", iteration=0) as p:
                p.report(tokens=10)
            assert session.flush(5)
            answer = session.answer(p, begin=False)
            assert answer is not None
            assert answer.simulated_time is False

    def test_a_disabled_session_closes_with_no_report(self) -> None:
        session = eerl.connect(gpus=[0], config=ClientConfig.disabled_config())
        assert session.close() is None

    def test_a_gpu_named_by_uuid_is_the_daemons_gpu_of_that_uuid(self, sim_daemon: SimDaemon) -> None:
        uuid = sim_daemon.gpu_uuid(1)
        with eerl.connect(gpus=[uuid], config=sim_daemon.config) as session:
            assert session.wait_until_connected(5)
            assert [s.gpu_indices for s in sim_daemon.sessions()] == [(1,)]

    def test_the_session_is_bound_to_the_stream_and_ends_with_close(self, sim_daemon: SimDaemon) -> None:
        session = eerl.connect(gpus=[0], config=sim_daemon.config)
        assert session.wait_until_connected(5)
        assert _wait(lambda: [s.attached for s in sim_daemon.sessions()] == [True])
        session.close()
        assert sim_daemon.sessions() == ()

    def test_the_client_reopens_after_the_daemon_restarts(self, sim_daemon: SimDaemon) -> None:
        with eerl.connect(gpus=[0], job_id="job-restart", config=sim_daemon.config) as session:
            with session.phase("generation", iteration=0) as p:
                p.report(tokens=5)
            assert session.flush(5)
            with session.phase("training", iteration=0) as p:
                sim_daemon.stop()
                sim_daemon.start()
                assert _wait(lambda: len(sim_daemon.sessions()) == 1)
                p.report(tokens=9, valid_tokens=5)
            with session.phase("generation", iteration=1) as p:
                p.report(tokens=6)
            assert session.flush(5)
            assert session.stats().opens == 2
        assert [(r.kind, r.iteration, r.tokens) for r in sim_daemon.records] == [
            (PhaseKind.GENERATION, 0, 5),
            (PhaseKind.GENERATION, 1, 6),
        ]


def _discovered(run_dir: Path, **env: str) -> ClientConfig:
    config = ClientConfig.from_env({"EERL_RUN_DIR": str(run_dir), **env})
    return dataclasses.replace(config, reconnect_initial_s=0.05, reconnect_max_s=0.5)


def _grant(handle: DaemonHandle, job_id: str, gpus: list[int]) -> None:
    with grpc.insecure_channel(f"unix:{handle.admin_socket_path}") as channel:
        request = eerl_pb2.GrantRequest(gpus=[eerl_pb2.GpuRef(index=i) for i in gpus], uid=0, job_id=job_id)
        eerl_pb2_grpc.AdminServiceStub(channel).Grant(request, timeout=10)


class TestScopedSockets:
    def test_on_per_gpu_sockets_a_job_that_names_no_gpu_claims_each_socket_it_finds(
        self, sock_dir: Path
    ) -> None:
        fake = FakeGpuBackend(3)
        with running_daemon(
            sock_dir, backend=fake, tenancy="multi", gpu_socket_dir=sock_dir / "gpus"
        ) as handle:
            config = _discovered(sock_dir)
            assert len(config.socket_paths) == 3
            with eerl.connect(job_id="k8s-job", config=config) as session:
                assert session.wait_until_connected(5)
                assert [s.gpu_indices for s in handle.daemon.reads.sessions()] == [(0, 1, 2)]
                with session.phase("training", iteration=0):
                    assert _wait(lambda: fake.locked() == {0: 1500, 1: 1500, 2: 1500})

    def test_a_job_started_while_eerld_is_away_reaches_it_through_the_gpu_directories(
        self, sock_dir: Path
    ) -> None:
        """The GPU directories outlive eerld: a job discovers them while eerld is down, and claims its GPUs
        through the sockets the next eerld creates in them."""
        gpu_dir = sock_dir / "gpus"
        with running_daemon(sock_dir, backend=FakeGpuBackend(2), tenancy="multi", gpu_socket_dir=gpu_dir):
            pass
        config = _discovered(sock_dir)
        assert config.socket_paths == tuple(str(p / "eerld.sock") for p in sorted(gpu_dir.iterdir()))
        with eerl.connect(job_id="k8s-job", config=config) as session:
            assert not session.wait_until_connected(0.2)
            with running_daemon(
                sock_dir, backend=FakeGpuBackend(2), tenancy="multi", gpu_socket_dir=gpu_dir
            ) as handle:
                assert session.wait_until_connected(10)
                assert [s.gpu_indices for s in handle.daemon.reads.sessions()] == [(0, 1)]

    def test_a_job_finds_its_grant_and_claims_the_grants_gpus(self, sock_dir: Path) -> None:
        fake = FakeGpuBackend(4)
        with running_daemon(sock_dir, backend=fake, tenancy="multi") as handle:
            _grant(handle, "4711", [1, 3])
            config = _discovered(sock_dir, SLURM_JOB_ID="4711")
            assert config.socket_paths == (str(sock_dir / "grants" / "job-4711.sock"),)
            with eerl.connect(job_id="4711", config=config) as session:
                assert session.wait_until_connected(5)
                assert [s.gpu_indices for s in handle.daemon.reads.sessions()] == [(1, 3)]

    def test_the_shared_socket_of_a_multi_tenant_node_refuses_with_one_warning_and_a_hint(
        self, sock_dir: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        with running_daemon(sock_dir, backend=FakeGpuBackend(1), tenancy="multi") as handle:
            config = dataclasses.replace(ClientConfig.uds(handle.socket_path), reconnect_initial_s=0.01)
            with eerl.connect(gpus=[0], job_id="j", config=config) as session:
                assert _wait(lambda: session.stats().connect_failures >= 1)
                assert handle.daemon.reads.sessions() == ()
        warnings = [
            r.getMessage() for r in caplog.records if r.name == "eerl" and r.levelno >= logging.WARNING
        ]
        assert len(warnings) == 1
        assert "refused the session (PERMISSION_DENIED: this node is multi-tenant" in warnings[0]
        # the daemon's refusal names the way out; the hint is not repeated after it
        assert warnings[0].count("eerlctl grant") == 1
        assert warnings[0].count("docs/security.md") == 1
