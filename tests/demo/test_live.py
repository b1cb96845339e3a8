"""``python -m demo`` as a user runs it: real daemon, simulated worker, summary, plot."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.demo.conftest import ROOT

RUN_TIMEOUT_S = 120.0


def _work_dir(stdout: str) -> Path:
    match = re.search(r"^eerld \(pid \d+\): .*, (/\S+)$", stdout, re.MULTILINE)
    assert match is not None, stdout
    return Path(match.group(1))


def _daemon_pid(stdout: str) -> int:
    match = re.search(r"^eerld \(pid (\d+)\)", stdout, re.MULTILINE)
    assert match is not None, stdout
    return int(match.group(1))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


class TestShortRun:
    def test_completes_prints_the_summary_writes_the_plot_and_leaves_no_gpu_locked(
        self, tmp_path: Path, demo_env: dict[str, str]
    ) -> None:
        """Two fast iterations end with the summary, a PNG at the printed path and all GPUs unlocked."""
        out = tmp_path / "out"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "demo",
                "--iterations",
                "2",
                "--speedup",
                "400",
                "--out",
                str(out),
            ],
            cwd=ROOT,
            env=demo_env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, done.stdout + done.stderr
        assert "Summary · 2 iterations" in done.stdout
        assert "default governor: simulator, same iterations" in done.stdout
        assert re.search(r"^\s+1  training ", done.stdout, re.MULTILINE)
        assert "GPUs after SIGTERM: all 8 at default clocks, none locked" in done.stdout
        assert re.search(r"throughput over the whole run \d+\.\d%", done.stdout), done.stdout
        # the daemon's report of the finished job, as eerlctl report prints it
        assert "Job eerl-demo: 1 session on this node" in done.stdout
        assert re.search(r"^  energy +[0-9.]+ kWh \(", done.stdout, re.MULTILINE)
        plot = re.search(r"timeline plot: (\S+)", done.stdout)
        assert plot is not None
        assert Path(plot.group(1)) == (out / "eerl-demo-timeline.png").resolve()
        assert Path(plot.group(1)).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert not _work_dir(done.stdout).exists()
        assert _gone(_daemon_pid(done.stdout))


class TestInterrupt:
    def test_ctrl_c_stops_the_daemon_and_removes_the_temporary_files(
        self, tmp_path: Path, demo_env: dict[str, str]
    ) -> None:
        """SIGINT mid-run exits with 130, stops eerld, leaves no GPU locked and no temporary directory."""
        # A terminal's Ctrl-C, even where this suite runs as a background job: a shell without job control
        # starts those with SIGINT ignored, an ignore survives exec, and Python then keeps it. A handler
        # does not survive exec, so with one here the demo starts with the default disposition.
        previous = signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            demo = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "demo",
                    "--iterations",
                    "50",
                    "--speedup",
                    "100",
                    "--out",
                    str(tmp_path),
                ],
                cwd=ROOT,
                env=demo_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        finally:
            signal.signal(signal.SIGINT, previous)
        assert demo.stdout is not None
        seen: list[str] = []
        for line in demo.stdout:
            seen.append(line)
            if re.match(r"^\s+0  generation ", line):
                break
        demo.send_signal(signal.SIGINT)
        rest, errors = demo.communicate(timeout=RUN_TIMEOUT_S)
        stdout = "".join(seen) + rest
        assert demo.returncode == 130, stdout + errors
        assert "interrupted" in errors
        assert "left locked" not in errors
        assert not _work_dir(stdout).exists()
        assert _gone(_daemon_pid(stdout))
