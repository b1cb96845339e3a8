"""The attack suite's fixtures: an unprivileged attacker process and a daemon its user can reach.

Attacks run in a separate process as ``nobody`` (:func:`run_as`), optionally with extra groups such as the
worker socket's group: the kernel, not the test, decides what that process may connect to.
"""

from __future__ import annotations

import grp
import json
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

ATTACKER = Path(__file__).with_name("attacker.py")
NOBODY_UID = 65534
NOGROUP_GID = 65534
SOCKET_GROUP = "daemon"
"""A group every Debian system has, standing in for the site's ``eerl`` group."""


def socket_group_gid() -> int:
    """The gid of :data:`SOCKET_GROUP`."""
    return grp.getgrnam(SOCKET_GROUP).gr_gid


@dataclass(frozen=True, slots=True)
class Outcome:
    """One RPC as the attacker saw it."""

    code: str
    details: str
    response: dict[str, Any]


def run_as(
    target: str,
    calls: Sequence[dict[str, Any]],
    *,
    uid: int = NOBODY_UID,
    gid: int = NOGROUP_GID,
    groups: Sequence[int] = (),
    tls: dict[str, str] | None = None,
) -> list[Outcome]:
    """Make ``calls`` from a process running as ``uid``/``gid``/``groups``; their outcomes, in order."""
    spec = {"uid": uid, "gid": gid, "groups": list(groups), "target": target, "tls": tls}
    spec["calls"] = list(calls)
    done = subprocess.run(
        [sys.executable, str(ATTACKER)],
        input=json.dumps(spec) + "\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    if done.returncode != 0:
        raise AssertionError(f"attacker failed ({done.returncode}): {done.stderr.strip()[-2000:]}")
    reply = json.loads(done.stdout)
    assert reply["euid"] == uid
    return [Outcome(r["code"], r["details"], r["response"]) for r in reply["results"]]


def call(service: str, method: str, request: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    """One call for :func:`run_as`."""
    return {"service": service, "method": method, "request": request or {}, **extra}


@pytest.fixture
def reachable_dir(sock_dir: Path) -> Path:
    """A socket directory anyone may traverse, so that only the sockets' own modes decide."""
    sock_dir.chmod(0o755)
    return sock_dir


@contextmanager
def holding_streams(
    target: str, streams: int, *, channels: int = 1, groups: Sequence[int] = ()
) -> Iterator[dict[str, int]]:
    """An attacker (``nobody``) holding ``streams`` idle streams open; yields what ended at once, by code."""
    spec = {"uid": NOBODY_UID, "gid": NOGROUP_GID, "groups": list(groups), "target": target}
    spec["hold"] = {"streams": streams, "channels": channels}
    proc = subprocess.Popen(
        [sys.executable, str(ATTACKER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    try:
        proc.stdin.write(json.dumps(spec) + "\n")
        proc.stdin.flush()
        ready = json.loads(proc.stdout.readline() or "{}")
        if not ready.get("ready"):
            raise AssertionError(f"attacker failed: {proc.stderr.read() if proc.stderr else ''}")
        yield ready["ended_at_once"]
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
