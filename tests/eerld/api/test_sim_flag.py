"""``eerld --sim`` by hand, as an unprivileged user: the printed lines reach it, and a neighbour's planted
directory is refused.

Every process here runs as ``nobody`` (the suite runs as root): the kernel, not the test, decides what the
daemon may create and what the client may reach.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

NOBODY = 65534
NEIGHBOUR = 12345
"""Another user of the node (no passwd entry needed: only the uid matters to the kernel)."""
PATIENCE_S = 60.0

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="runs the daemon as nobody, which needs root to set up"),
]

CLIENT = """
import json, sys, time
import eerl
session = eerl.connect(gpus=[0, 1], job_id="by-hand")
deadline = time.monotonic() + 30
while not session.stats().connected and time.monotonic() < deadline:
    time.sleep(0.05)
for i in range(2):
    with session.phase("generation", iteration=i) as p:
        time.sleep(0.05)
        p.report(tokens=1000, sequences=4)
    with session.phase("training", iteration=i) as p:
        time.sleep(0.05)
        p.report(tokens=2000, valid_tokens=900, sequences=4)
time.sleep(0.5)
stats = session.stats()
session.close()
print(json.dumps({"connected": stats.connected, "sent": stats.sent_events, "failed": stats.failed_events}))
"""


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A world-writable sticky directory like /tmp, in /tmp (so that nobody may reach it)."""
    path = Path(tempfile.mkdtemp(prefix="eerl-simflag-", dir="/tmp"))
    path.chmod(0o1777)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _env(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_RUNTIME_DIR", "EERL_SOCKET", "EERL_ADDRESS")}
    env.update(TMPDIR=str(tmp), HOME=str(tmp))
    return env


AS_USER = Path(__file__).with_name("as_user.py")


def _as_nobody(command: str, *args: str) -> list[str]:
    """The command line that runs ``command`` (eerld, eerlctl or client) as nobody."""
    return [sys.executable, str(AS_USER), str(NOBODY), str(NOBODY), command, *args]


def _run(argv: list[str], env: dict[str, str], stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv, env=env, input=stdin, capture_output=True, text=True, timeout=PATIENCE_S, check=False, cwd="/"
    )


EERLD_SIM = ("--sim", "--sim-gpus", "2", "--sim-speedup", "10")


class TestByHand:
    def test_the_printed_lines_reach_the_daemon_and_nothing_needs_root(self, shared_tmp: Path) -> None:
        """As nobody: eerld --sim starts, prints its export and eerlctl lines; a client through the export
        meters its phases, eerlctl through the printed line sees the GPUs; SIGTERM leaves exit 0, and the
        directory is nobody's, 0700."""
        env = _env(shared_tmp)
        daemon = subprocess.Popen(
            _as_nobody("eerld", *EERLD_SIM), env=env, cwd="/",
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            assert daemon.stdout is not None
            lines = [daemon.stdout.readline() for _ in range(4)]
            text = "".join(lines)
            export = re.search(r"^  export EERL_SOCKET=(\S+)$", text, re.MULTILINE)
            admin = re.search(r"^  eerlctl --socket (\S+) status$", text, re.MULTILINE)
            assert export is not None, text
            assert admin is not None, text
            home = shared_tmp / f"eerld-sim-{NOBODY}"
            assert Path(export.group(1)) == home / "eerld.sock"

            client = _run(_as_nobody("client"), {**env, "EERL_SOCKET": export.group(1)}, CLIENT)
            assert client.returncode == 0, client.stderr
            stats = json.loads(client.stdout.strip().splitlines()[-1])
            assert stats == {"connected": True, "sent": 8, "failed": 0}

            status = _run(_as_nobody("eerlctl", "--socket", admin.group(1), "--json", "status"), env)
            assert status.returncode == 0, status.stderr
            gpus = json.loads(status.stdout)["gpus"]
            assert len(gpus) == 2

            info = os.lstat(home)
            assert (info.st_uid, info.st_mode & 0o777) == (NOBODY, 0o700)
        finally:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(timeout=PATIENCE_S)
            for stream in (daemon.stdout, daemon.stderr):
                if stream is not None:
                    stream.close()
        assert daemon.returncode == 0


class TestANeighboursPlantedDirectory:
    def test_a_directory_another_user_made_first_is_refused_and_nothing_is_made_in_it(
        self, shared_tmp: Path
    ) -> None:
        """A neighbour who makes /tmp/eerld-sim-<your uid> first (to swap your sockets later) gets nothing:
        eerld --sim exits 2 naming the owner, and creates no socket or state there."""
        planted = shared_tmp / f"eerld-sim-{NOBODY}"
        planted.mkdir(mode=0o777)
        planted.chmod(0o777)
        os.chown(planted, NEIGHBOUR, NEIGHBOUR)
        done = _run(_as_nobody("eerld", *EERLD_SIM), _env(shared_tmp))
        assert done.returncode == 2, done.stdout + done.stderr
        assert f"Error: --sim: {planted} is owned by uid {NEIGHBOUR}" in done.stderr
        assert "refusing it" in done.stderr
        assert list(planted.iterdir()) == []
