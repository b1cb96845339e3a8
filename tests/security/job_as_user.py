"""An RL job's process as a given user: imports the eerl client as root, drops privileges, then uses it.

It configures nothing: the client finds its socket the way a real job's would (``SLURM_JOB_ID`` or
``EERL_JOB_ID`` and ``EERL_RUN_DIR`` from the environment). It prints ``connected`` or ``not connected``,
runs one generation phase and, inside it, prints ``in phase`` and waits for a line on stdin; then it closes
the session and prints its client statistics as JSON.

Usage: python job_as_user.py UID GID [CONNECT_WAIT_S]
"""

from __future__ import annotations

import dataclasses
import json
import sys

import eerl
from attacker import drop_privileges  # this directory: it also imports what grpc would import lazily


def main() -> int:
    uid, gid = int(sys.argv[1]), int(sys.argv[2])
    wait_s = float(sys.argv[3]) if len(sys.argv) > 3 else 10.0
    drop_privileges(uid, gid, [])
    session = eerl.connect()
    connected = session.wait_until_connected(wait_s)
    print("connected" if connected else "not connected", flush=True)
    with session.phase("generation", 0, wait_for_clock_s=5.0 if connected else 0.0) as phase:
        session.flush(5 if connected else 0.1)
        print("in phase", flush=True)
        sys.stdin.readline()
        phase.report(tokens=100, valid_tokens=0)
    session.flush(5 if connected else 0.1)
    stats = session.stats()
    session.close()
    print(json.dumps(dataclasses.asdict(stats)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
