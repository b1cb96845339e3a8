"""One process of a given user that holds many sessions on one socket, each through ``eerl.connect``.

Imports the eerl client as root, drops privileges, then opens ``N`` sessions on ``SOCKET`` (session ``i``
claims GPU ``i`` under job id ``wall-<i>``), waits for them to connect, runs one generation phase in each and
flushes; then prints one line of JSON (``{"connected": [...], "stats": [...]}``, each session's client
statistics) and holds every session open until a line arrives on stdin; then closes them all.

Usage: python sessions_as_user.py UID GID GROUPS SOCKET N PATIENCE_S   (GROUPS: comma-separated gids or "")
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time

import eerl
from attacker import drop_privileges  # this directory: it also imports what grpc would import lazily
from eerl.config import ClientConfig


def main() -> int:
    uid, gid = int(sys.argv[1]), int(sys.argv[2])
    groups = [int(g) for g in sys.argv[3].split(",") if g]
    socket_path, count, patience_s = sys.argv[4], int(sys.argv[5]), float(sys.argv[6])
    drop_privileges(uid, gid, groups)
    config = ClientConfig.uds(socket_path)
    deadline_s = time.monotonic() + patience_s
    sessions = [eerl.connect(gpus=[i], job_id=f"wall-{i}", config=config) for i in range(count)]
    connected = [s.wait_until_connected(max(0.1, deadline_s - time.monotonic())) for s in sessions]
    for session in sessions:
        with session.phase("generation", 0) as phase:
            phase.report(tokens=100)
    for session in sessions:
        session.flush(max(0.1, deadline_s - time.monotonic()))
    stats = [dataclasses.asdict(s.stats()) for s in sessions]
    print(json.dumps({"connected": connected, "stats": stats}), flush=True)
    sys.stdin.readline()
    for session in sessions:
        session.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
