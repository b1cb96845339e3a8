"""A simulated RL worker process for the reliability soak, using the real fail-open client (``eerl``).

Usage: python -m soak.worker SOCKET STATE_FILE GPU MODE (from the repository root; soak.kills starts it)

- ``victim``: enter a generation phase, wait until its clock holds, print ``ready``, then run simulated work
  on the GPU inside the phase until killed (SIGKILL mid-phase).
- ``loop``: alternate generation and training phases forever, each running a little simulated work, and
  never stop because of the daemon (it may die and come back; the client reconnects on its own).
"""

from __future__ import annotations

import itertools
import sys
import time
from pathlib import Path

import eerl
from eerl_sim.gpu import open_sim_device

WORK_MHZ_S = 2000.0
"""Compute per segment: a few simulated ms at full clock (the daemon's sim runs 10x real time)."""


def main() -> None:
    """Run as a victim or a loop until killed (see the module docstring)."""
    socket_path, state_file, gpu, mode = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    device = open_sim_device(state_file, durable_writes=False)
    config = eerl.ClientConfig(
        transport="uds", socket_path=socket_path, reconnect_initial_s=0.05, reconnect_max_s=0.5
    )
    session = eerl.connect(gpus=[gpu], job_id=f"{mode}-{gpu}", config=config)
    if mode == "victim":
        if not session.wait_until_connected(60):
            raise SystemExit("never connected")
        with session.phase("generation", iteration=0, wait_for_clock_s=30):
            print("ready", flush=True)
            while True:
                device.run_segments(gpu, [WORK_MHZ_S] * 8, [0.001] * 8)
    for iteration in itertools.count():
        for kind in ("generation", "training"):
            with session.phase(kind, iteration=iteration) as phase:
                device.run_segments(gpu, [WORK_MHZ_S] * 4, [0.001] * 4)
                phase.report(tokens=64, valid_tokens=32, sequences=1)
        time.sleep(0.005)


if __name__ == "__main__":
    main()
