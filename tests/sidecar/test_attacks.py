"""The sidecar's API attacked by another local user (``nobody``, a real process over the real sockets):
a Unix socket of mode 0600 refuses that user; on loopback TCP, which any local user reaches (the API has
no authentication, docs/sidecar.md), junk and a flood of slow connections neither wedge the sidecar nor
change its phases, and its bounded connections come back once the attacker leaves."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from eerl.sidecar._address import parse_address
from eerl.sidecar.client import SidecarHttp

from tests.sidecar.conftest import SidecarProcess, SimEerld, sidecar_for, wait_until

ATTACKER = Path(__file__).with_name("_http_attacker.py")
REPO = Path(__file__).resolve().parents[2]
NOBODY = 65534


@contextmanager
def attacker(target: str, requests: Sequence[bytes] = (), hold: int = 0) -> Iterator[dict[str, Any]]:
    """Runs :mod:`tests.sidecar._http_attacker` as ``nobody``; its results, while it holds ``hold``
    connections open (until the block ends)."""
    spec = {"target": target, "requests": [r.decode("latin-1") for r in requests], "hold": hold}
    with subprocess.Popen(
        [sys.executable, "-m", "tests.sidecar._http_attacker"],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdin is not None
        assert proc.stdout is not None
        assert proc.stderr is not None
        try:
            proc.stdin.write(json.dumps(spec) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            if not line:
                proc.wait(timeout=30)
                raise AssertionError(f"the attacker failed ({proc.returncode}): {proc.stderr.read()[-2000:]}")
            reply = json.loads(line)
            assert reply["euid"] == NOBODY
            yield reply
        finally:
            proc.stdin.close()
            proc.wait(timeout=30)


def unix_sidecar(
    start: Callable[..., SidecarProcess], directory: Path, name: str, *extra: str
) -> tuple[SidecarProcess, Path]:
    path = directory / name
    sidecar = start(
        "--job-id",
        name,
        "--gpus",
        "0",
        "--listen",
        f"unix:{path}",
        "--socket",
        str(directory / "none"),
        *extra,
    )
    return sidecar, path


class TestUnixSocket:
    def test_mode_0600_refuses_another_user_and_0666_is_what_lets_it_in(
        self, start_sidecar: Callable[..., SidecarProcess], sock_dir: Path
    ) -> None:
        sock_dir.chmod(0o755)  # the directory lets nobody through: only the socket's own mode decides
        _, private = unix_sidecar(start_sidecar, sock_dir, "private.sock")
        _, shared = unix_sidecar(start_sidecar, sock_dir, "shared.sock", "--socket-mode", "0666")
        info = os.stat(private)
        assert stat.S_ISSOCK(info.st_mode)
        assert (stat.S_IMODE(info.st_mode), info.st_uid) == (0o600, os.geteuid())
        healthz = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n"
        begin = b'{"kind": "generation", "iteration": 0}'
        post = b"POST /v1/phases/begin HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (
            len(begin),
            begin,
        )
        with attacker(f"unix:{private}", [healthz, post]) as refused:
            assert refused["results"] == ["PermissionError", "PermissionError"]
        with attacker(f"unix:{shared}", [healthz]) as admitted:  # the control: the same attack, let in
            assert admitted["results"] == [200]
        owner = SidecarHttp(parse_address(f"unix:{private}"), 10)
        try:
            code, status = owner.request("GET", "/v1/status")
        finally:
            owner.close()
        assert code == 200
        assert status["open_phases"] == []  # nothing the refused attacker sent got in
        assert status["refused_requests"] == 0


class TestLoopbackTcp:
    def test_junk_and_a_slow_connection_flood_from_another_user_neither_wedge_nor_change_the_sidecar(
        self, eerld_sim: SimEerld, start_sidecar: Callable[..., SidecarProcess]
    ) -> None:
        sidecar = sidecar_for(start_sidecar, eerld_sim.socket_path, "attacked", "--max-connections", "3")
        wait_until("the sidecar's session", lambda: sidecar.status()["connected"])
        assert sidecar.post("/v1/phases/begin", {"kind": "generation", "iteration": 4})[0] == 200
        before = sidecar.status()
        target = sidecar.url.removeprefix("http://")
        junk = [
            b"GET / NOT-HTTP\r\n\r\n",  # http.server answers HTTP/0.9-style (no status line) and closes
            b"\x00\xff / HTTP/1.1\r\n\r\n",
            b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n",  # a request line beyond http.server's bound
            b"POST /v1/phases/begin HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999\r\n\r\n",
            b"POST /v1/phases/begin HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
            b"POST /v1/phases/end HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n{bad}",
            b"POST /v1/phases/begin HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
            b"DELETE /v1/status HTTP/1.1\r\nHost: x\r\n\r\n",
        ]
        with attacker(target, junk, hold=3) as attack:
            assert attack["results"] == ["no reply", 501, 414, 413, 413, 400, 411, 501]
            assert attack["held"] == 3
            # Every slot is held by the slow attacker: the owner is told so at once, never left waiting.
            wait_until("a 503 for the owner", lambda: _code(sidecar, "/healthz") == 503)
        wait_until(
            "a free connection once the attacker is gone", lambda: _code(sidecar, "/healthz") == 200, 15
        )
        after = sidecar.status()
        assert after["open_phases"][0]["iteration"] == 4
        assert [p["kind"] for p in after["open_phases"]] == ["generation"]
        assert after["phases"] == before["phases"]
        assert after["client"]["sent_events"] == before["client"]["sent_events"]
        code, ended = sidecar.post("/v1/phases/end", {"kind": "generation", "iteration": 4, "tokens": 7})
        assert (code, ended["metered"]) == (200, True)
        assert eerld_sim.metered("attacked") == {"PHASE_KIND_GENERATION": 1, "PHASE_KIND_TRAINING": 0}


def _code(sidecar: SidecarProcess, path: str) -> int:
    return sidecar.request("GET", path)[0]
