"""eerld on the in-memory fake backend, as a process: isolates the daemon's own cost from the simulator's.

Usage: python bench/fake_daemon.py GPUS [eerld flags...]  (same flags as eerld; --backend is ignored)
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from eerld.config import load_config  # noqa: E402 - after the path set-up above
from eerld.logging import configure_logging  # noqa: E402
from eerld.server import create_server, serve  # noqa: E402
from eerld.testing import FakeGpuBackend  # noqa: E402


def main() -> int:
    gpus = int(sys.argv[1])
    config = load_config(sys.argv[2:])
    configure_logging(config.log_format)
    return serve(create_server(config, backend=FakeGpuBackend(gpus)))


if __name__ == "__main__":
    sys.exit(main())
