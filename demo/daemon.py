"""``python -m demo.daemon EERLD-FLAGS…``: the demo's eerld, the real server on a sim backend without fsync.

The server, daemon, controller, arbiter and ledger are eerld's own (:func:`eerld.api.server.create_server`,
which times phases on the sim device's clock); the only difference from ``eerld --backend sim`` is that the
simulated GPUs' state-file writes skip fsync (the demo's state lives in a temporary folder). It stops with
the demo that started it (:func:`die_with_parent`), so it never outlives a killed demo.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
from collections.abc import Sequence

from eerld.api.server import create_server, serve
from eerld.config import load_config
from eerld.errors import ConfigError, DaemonError
from eerld.gpu.sim import create_sim_backend
from eerld.logging import configure_logging
from eerld.sim.profiles import builtin_profile

PARENT_ENV = "EERL_DEMO_PARENT_PID"
"""The environment variable that names the demo process (set by :mod:`demo.live` for its children)."""
_PR_SET_PDEATHSIG = 1


def serve_daemon(argv: Sequence[str]) -> int:
    """``eerld`` with the same flags, on a sim backend without fsync on its state file; the exit code."""
    die_with_parent()
    try:
        config = load_config(list(argv))
        if config.backend != "sim":
            raise ConfigError("serve_daemon: only --backend sim has a simulated clock")
        configure_logging(config.log_format, debug=config.debug)
        backend = create_sim_backend(
            builtin_profile(config.sim_profile),
            config.sim_gpus,
            speedup=config.sim_speedup,
            state_file=config.sim_state,
            durable_writes=False,
        )
        server = create_server(config, backend=backend)
    except (DaemonError, OSError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    return serve(server)


def die_with_parent() -> None:
    """SIGTERM when the demo that started this process dies (Linux), so it never outlives a killed demo.

    ``EERL_DEMO_PARENT_PID`` names the demo; if it is already gone, stop at once.
    """
    parent = os.environ.get(PARENT_ENV)
    if not parent:
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    if str(os.getppid()) != parent:
        os.kill(os.getpid(), signal.SIGTERM)


if __name__ == "__main__":
    sys.exit(serve_daemon(sys.argv[1:]))
