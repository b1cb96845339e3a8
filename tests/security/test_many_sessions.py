"""One process holds many sessions on one socket (issue 32, item 4: the per-process wall).

The daemon bounds the HTTP/2 streams of one connection (8, eerld/api/server.py) and each session holds one,
its Attach stream. gRPC shares one connection between every channel of a process with the same target and
options, so one process's sessions all landed on one connection: with 8, their Attach streams filled it and
no phase event got through; with 16, every open past the eighth was refused (``UNAVAILABLE: … RST_STREAM``).
Each session's channel now has a connection of its own; the per-connection bound stays as it was.

The process runs as ``nobody`` against a real ``eerld`` process (sim backend, 64 GPUs), each session
through ``eerl.connect``, as a job would.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from soak.daemon import DaemonProcess
from tests.security.conftest import NOBODY_UID, NOGROUP_GID, SOCKET_GROUP, socket_group_gid

SESSIONS = 64
"""At least this many sessions in one process on one socket (the issue's target; the sim's most GPUs)."""
PATIENCE_S = 240.0
"""How long the process may take to open every session and flush its phase (generous: a shared box)."""
HOLDER = Path(__file__).with_name("sessions_as_user.py")

pytestmark = pytest.mark.slow


@contextmanager
def sessions_of_one_process(socket_path: Path, count: int, groups: list[int]) -> Iterator[dict[str, Any]]:
    """A process of ``nobody`` holding ``count`` sessions on ``socket_path``; yields its report while it
    holds them (each session's connected flag and client statistics)."""
    argv = [str(NOBODY_UID), str(NOGROUP_GID), ",".join(map(str, groups)), str(socket_path)]
    proc = subprocess.Popen(
        [sys.executable, str(HOLDER), *argv, str(count), str(PATIENCE_S)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        if not line:
            raise AssertionError(f"the process failed: {proc.stderr.read()[-3000:] if proc.stderr else ''}")
        yield json.loads(line)
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()


def metered_generation_phases(daemon: DaemonProcess) -> dict[str, int]:
    """Generation phases metered per job id, for every open session of a ``wall-*`` job."""
    out: dict[str, int] = {}
    for session in daemon.sessions():
        if session.job_id.startswith("wall-"):
            out[session.job_id] = sum(p.phases for p in session.phases if p.kind == pb.PHASE_KIND_GENERATION)
    return out


def test_one_process_holds_64_sessions_on_one_socket_each_connected_and_metered(reachable_dir: Path) -> None:
    args = [f"--socket-group={SOCKET_GROUP}"]
    with (
        DaemonProcess(reachable_dir, gpus=SESSIONS, extra_args=args) as daemon,
        sessions_of_one_process(daemon.socket_path, SESSIONS, [socket_group_gid()]) as report,
    ):
        stats = report["stats"]
        working = [s["connected"] and s["attached"] and s["sent_events"] == 2 for s in stats]
        failed = [
            (i, s["failed_events"], s["connect_failures"]) for i, s in enumerate(stats) if s["failed_events"]
        ]
        assert sum(report["connected"]) == SESSIONS, f"connected {sum(report['connected'])} of {SESSIONS}"
        assert sum(working) == SESSIONS, f"{sum(working)} of {SESSIONS} attached and sent; failed: {failed}"
        assert metered_generation_phases(daemon) == {f"wall-{i}": 1 for i in range(SESSIONS)}
        assert sum(s["opens"] for s in stats) == SESSIONS  # none lost and reopened on the way


GRANT_SESSIONS = 40
"""More sessions than a grant's socket had threads before (it capped them at 32: 28 sessions worked)."""


def test_one_process_holds_as_many_sessions_as_its_grant_has_gpus(reachable_dir: Path) -> None:
    """A grant's socket has threads for every session its GPUs allow (each Attach stream holds one)."""
    with DaemonProcess(reachable_dir, gpus=GRANT_SESSIONS, extra_args=["--tenancy", "multi"]) as daemon:
        with grpc.insecure_channel(f"unix:{daemon.admin_socket_path}") as channel:
            request = pb.GrantRequest(
                name="many", gpus=[pb.GpuRef(index=i) for i in range(GRANT_SESSIONS)], uid=NOBODY_UID
            )
            reply = pb_grpc.AdminServiceStub(channel).Grant(request, timeout=10)
        with sessions_of_one_process(Path(reply.grant.socket_path), GRANT_SESSIONS, []) as report:
            assert sum(report["connected"]) == GRANT_SESSIONS
            assert metered_generation_phases(daemon) == {f"wall-{i}": 1 for i in range(GRANT_SESSIONS)}
