"""structlog set-up: JSON lines when stderr is not a terminal (journald, files), readable lines otherwise."""

from __future__ import annotations

import logging as std_logging
import sys

import structlog


def configure_logging(log_format: str | None = None, *, debug: bool = False) -> None:
    """Configure structlog for the daemon; ``log_format`` None picks by whether stderr is a TTY."""
    fmt = log_format or ("console" if sys.stderr.isatty() else "json")
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if fmt == "json" else structlog.dev.ConsoleRenderer(colors=False)
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.StackInfoRenderer(),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(std_logging.DEBUG if debug else std_logging.INFO),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
