"""The client's errors, and the two error concepts the client, the job and the daemon share.

The client raises only for mistakes in the caller's own code or configuration — never because the
daemon is absent, slow or broken (that is the fail-open promise; see :mod:`eerl.session`).

:class:`ConfigError` (a bad configuration value) and :class:`ValidationError` (a bad field) are one concept
on every side, and this module is their one home: eerld's tree (``eerld.errors``, rooted at ``DaemonError``;
the client cannot import it, eerld depends on this package) derives its own ``ConfigError`` and
``ValidationError`` from these two, so ``except ValidationError`` here catches a field the daemon refused too.

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
