"""The eerl-sidecar process: its command line, its wrapper mode (``-- command``), and a clean stop."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.sidecar.conftest import (
    JOB_SH,
    SidecarProcess,
    SimEerld,
    parse_job_output,
    sidecar_for,
    wait_until,
)


def sidecar_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "eerl.sidecar.server", *args]


def run(*args: str, timeout_s: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "EERL_SIDECAR"}
    return subprocess.run(
        sidecar_command(*args), env=env, capture_output=True, text=True, timeout=timeout_s, check=False
    )


class TestCommandLine:
    def test_refuses_to_listen_beyond_loopback(self) -> None:
        result = run("--job-id", "j", "--gpus", "0", "--listen", "0.0.0.0:9479")
        assert result.returncode == 2
        assert "not a loopback address" in result.stderr

    @pytest.mark.parametrize(
        "args",
        [["--listen", "https://127.0.0.1:1"], ["--gpus", "0,,x y"], ["--socket-mode", "rw"]],
    )
    def test_bad_flags_are_usage_errors(self, args: list[str]) -> None:
        assert run("--job-id", "j", *args).returncode == 2

    def test_a_tcp_address_with_no_way_to_hand_out_its_secret_is_a_usage_error(self) -> None:
        result = run("--job-id", "j", "--gpus", "0", "--listen", "127.0.0.1:0")
        assert result.returncode == 2
        assert "--token-file" in result.stderr
        unix = run("--job-id", "j", "--gpus", "0", "--listen", "unix:/tmp/x.sock", "--token-file", "/tmp/t")
        assert unix.returncode == 2
        assert "only a TCP --listen takes a secret" in unix.stderr

    def test_without_listen_the_job_gets_a_private_unix_socket_and_no_secret(self, sock_dir: Path) -> None:
        env = {**os.environ, "TMPDIR": str(sock_dir), "EERL_SIDECAR_TOKEN": "stale"}
        env.pop("XDG_RUNTIME_DIR", None)
        done = subprocess.run(
            sidecar_command("--job-id", "j/1", "--gpus", "0", "--socket", "/nonexistent", "--",
                            "bash", "-c", 'echo "$EERL_SIDECAR ${EERL_SIDECAR_TOKEN:-none}"'),
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        first, child = done.stdout.splitlines()
        path = f"{sock_dir}/eerl-{os.geteuid()}/sidecar-j_1-"
        assert first.startswith(f"eerl-sidecar: listening on unix:{path}")
        assert child.startswith(f"unix:{path}")
        assert child.endswith(" none")  # a stale secret in the environment is not handed on

    def test_a_busy_port_is_an_error(self, start_sidecar: Callable[..., SidecarProcess]) -> None:
        first = sidecar_for(start_sidecar, Path("/nonexistent"), "j", gpus="0")
        result = run("--job-id", "j", "--gpus", "0", "--listen", first.url, "--socket", "/nonexistent")
        assert result.returncode == 1
        assert "cannot listen" in result.stderr


class TestLifecycle:
    def test_sigterm_closes_the_session_and_resets_the_gpus(
        self, eerld_sim: SimEerld, start_sidecar: Callable[..., SidecarProcess]
    ) -> None:
        sidecar = sidecar_for(start_sidecar, eerld_sim.socket_path, "term-job")
        wait_until("the sidecar's session", lambda: sidecar.status()["connected"])
        assert sidecar.post("/v1/phases/begin", {"kind": "training", "iteration": 0})[0] == 200
        assert eerld_sim.locks() == [1500, 1500]
        sidecar.stop()
        assert sidecar.process.returncode == 0
        assert eerld_sim.locks() == [None, None]
        assert eerld_sim.session_of("term-job") is None

    @pytest.mark.usefixtures("curl")
    def test_wrapping_a_job_sets_eerl_sidecar_and_exits_with_its_status(self, eerld_sim: SimEerld) -> None:
        wrapped = run(
            "--job-id", "wrapped", "--gpus", "0,1", "--listen", "127.0.0.1:0",
            "--socket", str(eerld_sim.socket_path), "--", "bash", str(JOB_SH),
        )  # fmt: skip
        assert wrapped.returncode == 0, wrapped.stderr
        first, *job_lines = wrapped.stdout.splitlines()
        assert first.startswith("eerl-sidecar: listening on http://127.0.0.1:")
        calls, finished = parse_job_output("\n".join(job_lines))
        assert finished
        assert len(calls) == 12
        assert all(c.code == 200 for c in calls)
        # The job started once the session was open (--connect-wait-s): every phase was metered.
        assert all(c.answer["metered"] for c in calls if c.edge == "end")
        assert eerld_sim.session_of("wrapped") is None  # closed when the job ended
        # When the job ends, the daemon's report of its session, on stderr (the job's stdout stays its own)
        lines = wrapped.stderr.splitlines()
        reports = [line for line in lines if line.startswith("eerl-sidecar: job wrapped")]
        assert len(reports) == 1, wrapped.stderr
        assert reports[0].startswith("eerl-sidecar: job wrapped (rank 0, GPUs 0,1): ")
        assert "(threshold 95%)" in reports[0] or "UNDER THE THRESHOLD (95%)" in reports[0]
        assert "eerl-sidecar: job" not in wrapped.stdout
        failing = run("--job-id", "x", "--gpus", "0", "--listen", "127.0.0.1:0", "--socket", "/nonexistent",
                      "--", "bash", "-c", "exit 3")  # fmt: skip
        assert failing.returncode == 3
        assert "eerl-sidecar: job" not in failing.stderr  # no daemon, no report
