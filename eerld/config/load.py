"""From flags and a TOML file to a validated Config, all made from the declarations of :mod:`.options`.

Precedence: a flag beats the config file, which beats the field's default. Every value passes its
option's rule; then the options are checked against each other. The first bad value raises ConfigError.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, NoReturn

from eerld import __version__, files
from eerld.config import trial
from eerld.config.options import CONFIG_FILE, Config, Option, options
from eerld.config.values import true_or_false
from eerld.errors import ConfigError

__all__ = [
    "build_parser",
    "file_keys",
    "help_line",
    "load_config",
    "read_config_file",
    "shown_default",
    "validate",
]


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def shown_default(name: str, spec: Option) -> str:
    """The default of a Config field as people read it (``--help``, docs/operations.md)."""
    if spec.shown_default is not None:
        return spec.shown_default
    value = getattr(Config(), name)
    if value is None or (isinstance(value, Mapping) and not value):
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def help_line(name: str | None, spec: Option) -> str:
    """The option's ``--help`` text: its help, and its default where there is one to tell."""
    default = "none" if name is None else shown_default(name, spec)
    return spec.help if default in ("none", "false") else f"{spec.help} (default: {default})"


def build_parser(*, width: int | None = None) -> argparse.ArgumentParser:
    """The flags of ``eerld``; every default is None so that the config file can fill the gaps."""
    formatter = argparse.HelpFormatter if width is None else _width(width)
    p = _Parser(
        prog="eerld",
        description="Energy-efficient RL clock-control daemon for GPU nodes.",
        formatter_class=formatter,
    )
    # an action, not a config value: it prints and exits, and has no config-file key
    p.add_argument(
        "--version", action="version", version=f"eerld {__version__}", help="print the version and exit"
    )
    flagged: list[tuple[str | None, Option]] = [(None, CONFIG_FILE)]
    flagged += [(name, spec) for name, spec in options() if spec.flag is not None]
    for name, spec in flagged:
        assert spec.flag is not None
        dest = "config" if name is None else name
        text = help_line(name, spec).replace("%", "%%")
        if spec.rule is true_or_false:  # a flag without a value: true when given
            p.add_argument(spec.flag, dest=dest, action="store_true", default=None, help=text)
        else:
            metavar = spec.metavar or spec.rule.metavar
            p.add_argument(spec.flag, dest=dest, metavar=metavar, default=None, help=text)
    return p


def _width(width: int) -> type[argparse.HelpFormatter]:
    class Fixed(argparse.HelpFormatter):
        def __init__(self, prog: str) -> None:
            super().__init__(prog, width=width)

    return Fixed


def file_keys() -> dict[str, str]:
    """The config file's keys, each with the Config field it sets."""
    return {spec.key: name for name, spec in options() if spec.key is not None}


def read_config_file(path: Path) -> dict[str, Any]:
    """Raw values of a TOML config file, by Config field name; refuses files other users may change."""
    raw = files.check_config_file(path, "--config")
    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"--config: {path} is not valid TOML: {e}") from None
    keys = file_keys()
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in keys:
            raise ConfigError(f"--config: {path}: unknown key {key!r}")
        values[keys[key]] = value
    return values


def load_config(argv: Sequence[str]) -> Config:
    """Parse flags and the config file into a validated Config (ConfigError on the first bad value)."""
    args = vars(build_parser().parse_args(list(argv)))
    config_path = args.pop("config")
    values: dict[str, Any] = {}
    if config_path is not None:
        values.update(read_config_file(CONFIG_FILE.rule(config_path, CONFIG_FILE.label)))
    values.update({name: value for name, value in args.items() if value is not None})
    if values.get("sim") is not True:
        return validate(values)
    home = trial.sim_home(os.environ, os.geteuid())
    return replace(validate(trial.with_sim_defaults(values, home)), sim_home=home)


def validate(values: Mapping[str, Any]) -> Config:
    """A Config from raw values by field name (strings from flags, typed values from TOML), each checked."""
    out: dict[str, Any] = {}
    for name, spec in options():
        value = values.get(name)
        if value is not None:
            out[name] = spec.rule(value, spec.label)
    # A kubelet socket named outright must be there (its absence is logged); auto's may be missing.
    if "pod_resources_socket" in out:
        named = str(values["pod_resources_socket"]).strip() not in ("auto", "off")
        out["pod_resources_optional"] = not named
    config = replace(Config(), **out)
    _check_consistency(config)
    return config


def _check_consistency(config: Config) -> None:
    socket_dirs = [p for p in (config.grant_dir, config.gpu_socket_dir) if p is not None]
    if config.gpu_socket_dir is not None and config.gpu_socket_dir == config.grant_dir:
        raise ConfigError("--gpu-socket-dir: must differ from --grant-dir (their modes differ)")
    for directory in socket_dirs:
        if directory in (config.socket_path.parent, config.admin_socket_path.parent):
            raise ConfigError(f"{directory}: grant and per-GPU sockets need a directory of their own")
    if config.socket_path == config.admin_socket_path:
        raise ConfigError(
            "--admin-socket: must differ from --socket (admin RPCs never share the worker socket)"
        )
    if config.listen is not None:
        missing = [
            flag
            for flag, value in (
                ("--tls-cert", config.tls_cert),
                ("--tls-key", config.tls_key),
                ("--tls-client-ca", config.tls_client_ca),
            )
            if value is None
        ]
        if missing:
            raise ConfigError(f"--listen: TCP requires mutual TLS; missing {', '.join(missing)}")
        for flag, file in (
            ("--tls-cert", config.tls_cert),
            ("--tls-key", config.tls_key),
            ("--tls-client-ca", config.tls_client_ca),
        ):
            assert file is not None
            if not os.access(file, os.R_OK):
                raise ConfigError(f"{flag}: cannot read {file}")
    elif any(v is not None for v in (config.tls_cert, config.tls_key, config.tls_client_ca)):
        raise ConfigError("--tls-cert/--tls-key/--tls-client-ca: only meaningful with --listen")
    if config.lease_ttl_s > config.max_lease_ttl_s:
        raise ConfigError(
            f"--lease-ttl: the default lease ({config.lease_ttl_s:g} s) exceeds --max-lease-ttl "
            f"({config.max_lease_ttl_s:g} s), the longest lease any session is granted; lower the one or "
            "raise the other"
        )
    if config.controller == "fixed" and not config.fixed_clocks_mhz:
        raise ConfigError(
            "--fixed-clocks: required with --controller fixed (e.g. generation=1200,training=1500)"
        )
    if config.dry_run and config.reset_clocks:
        raise ConfigError("--reset-clocks: changes clocks, so it cannot be combined with --dry-run")
    if config.sim_state is not None and config.sim_state.is_dir():
        raise ConfigError(f"--sim-state: {config.sim_state} is a directory; name the state file in it")
    if config.backend != "sim" and config.sim_state is not None:
        raise ConfigError("--sim-state: only meaningful with --backend sim")
