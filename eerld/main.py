"""``eerld``: parse and validate the configuration, then serve (or ``--reset-clocks`` and exit).

Exit codes: 0 after a clean stop; 2 for a bad configuration (one ``Error: ...`` line); 1 when the GPUs
or the sockets cannot be set up.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

import structlog

from eerld.config import load_config
from eerld.errors import ConfigError, EerlError
from eerld.logging import configure_logging
from eerld.server import create_server, reset_all_clocks, serve


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
            results = reset_all_clocks(config)
            failed = [r for r in results if r.degraded_reason]
            for r in failed:
                print(f"Error: GPU {r.index} ({r.uuid}): {r.degraded_reason}", file=sys.stderr)
            return 1 if failed else 0
        return serve(create_server(config))
    except ConfigError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 2
    except (EerlError, OSError) as e:
        if config.debug:
            structlog.get_logger("eerld").exception("start_failed")
        print(f"Error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
