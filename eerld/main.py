"""``eerld``: parse and validate the configuration, then serve (or ``--reset-clocks`` and exit).

Exit codes: 0 after a clean stop; 2 for a bad configuration (one ``Error: ...`` line), a state directory,
socket directory or config file another user controls included; 1 when the GPUs or the sockets cannot
be set up. ``--reset-clocks`` resets every GPU of the node whatever the ledger says (a corrupt ledger is
set aside): 0 when every GPU was reset, 1 with one ``Error: GPU …`` line per GPU that was not, 2 when the
GPUs were reset but the state directory is not root's own (its ledger left untouched).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

import structlog

from eerld import files
from eerld.api.server import create_server, serve
from eerld.app import create_backend
from eerld.clocks.recovery import reset_node
from eerld.config import Config, load_config, trial
from eerld.errors import ConfigError, DaemonError
from eerld.logging import configure_logging


def reset_clocks(config: Config) -> int:
    """``eerld --reset-clocks``: every GPU back to its default clocks; the exit code."""
    backend = create_backend(config)
    try:
        outcome = reset_node(backend, config.state_dir)
    finally:
        backend.close()
    for r in outcome.failed:
        print(f"Error: GPU {r.index} ({r.uuid}): {r.degraded_reason}", file=sys.stderr)
    if outcome.state_dir_error:
        print(f"Error: {outcome.state_dir_error}", file=sys.stderr)
    if outcome.failed:
        return 1
    return 2 if outcome.state_dir_error else 0


def _announcer(config: Config) -> Callable[[], None] | None:
    """With ``--sim``: what prints, once eerld serves, the lines that reach it (docs/quickstart.md)."""
    home = config.sim_home
    if home is None:
        return None
    text = trial.announcement(
        home=home,
        socket_path=config.socket_path,
        admin_socket_path=config.admin_socket_path,
        gpus=config.sim_gpus,
        profile=config.sim_profile,
    )
    return lambda: print(text, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``eerld``; returns the process exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        config = load_config(args)
    except ConfigError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    configure_logging(config.log_format, debug=config.debug)
    try:
        if config.reset_clocks:
            return reset_clocks(config)
        if config.sim_home is not None:  # before the state directory in it, which would make it 0755
            files.ensure_private_dir(config.sim_home, "--sim")
        # before anything reads or writes there: the ledger, the pins and the grants live in it
        files.ensure_private_dir(config.state_dir, "--state-dir")
        return serve(create_server(config), on_started=_announcer(config))
    except ConfigError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    except (DaemonError, OSError) as e:
        if config.debug:
            structlog.get_logger("eerld").exception("start_failed")
        print(f"Error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
