"""The client's errors.

The client raises only for mistakes in the caller's own code or configuration — never because the
daemon is absent, slow or broken (that is the fail-open promise; see :mod:`eerl.session`). The daemon
has its own tree in ``eerld.errors``; the client cannot import it (eerld depends on this package), so
eerld translates these where it calls client code (the controller, :mod:`eerl.control`).

    ClientError                   root of every error the client raises on purpose
    ├── ConfigError               an invalid configuration value (also a ValueError); names the value
    └── ValidationError           an invalid argument of the controller (also a ValueError); names the field
"""

from __future__ import annotations


class ClientError(Exception):
    """Root of every error the eerl client raises on purpose."""


class ConfigError(ClientError, ValueError):
    """A configuration value (argument or environment variable) is invalid; the message names it."""


class ValidationError(ClientError, ValueError):
    """An argument (such as a controller setting) is missing or invalid; ``field`` names it."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def one_line(error: BaseException, limit: int = 160) -> str:
    """An exception in one short line, for a warning or an error reply (gloo's and JSON's messages span
    lines and name source files)."""
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= limit else text[:limit] + "…"
