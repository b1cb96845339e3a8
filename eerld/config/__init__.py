"""Daemon configuration: a TOML file, overridden by flags, every value validated before anything starts.

Each option is declared once, as a field of :class:`Config` with its flag, file key, rule and help
(:mod:`eerld.config.options`); the parser, the file's keys, validation (:mod:`eerld.config.load`) and the
table of docs/operations.md (``make options-doc``) are made from those declarations. The value rules are
in :mod:`eerld.config.values`.

A bad value raises :class:`~eerld.errors.ConfigError` with one line naming it; ``main`` prints it as
``Error: ...`` and exits 2. A config file another user owns or may write (or one in a directory another
user may write) is refused (:func:`eerld.files.check_config_file`): the daemon runs as root and the file
decides which sockets and groups it exposes.
"""

from eerld.config.load import build_parser, load_config, read_config_file, validate
from eerld.config.options import (
    DEFAULT_ADMIN_SOCKET,
    DEFAULT_GRANT_DIR,
    DEFAULT_METRICS_ADDRESS,
    DEFAULT_SOCKET,
    DEFAULT_STATE_DIR,
    Config,
    Option,
)
from eerld.config.values import parse_fixed_clocks

__all__ = [
    "DEFAULT_ADMIN_SOCKET",
    "DEFAULT_GRANT_DIR",
    "DEFAULT_METRICS_ADDRESS",
    "DEFAULT_SOCKET",
    "DEFAULT_STATE_DIR",
    "Config",
    "Option",
    "build_parser",
    "load_config",
    "parse_fixed_clocks",
    "read_config_file",
    "validate",
]
