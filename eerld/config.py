"""Daemon configuration: a TOML file, overridden by flags, every value validated before anything starts.

A bad value raises :class:`~eerld.errors.ConfigError` with one line naming it; ``main`` prints it as
``Error: ...`` and exits 2. A config file another user owns or may write (or one in a directory another
user may write) is refused (:func:`eerld.files.check_config_file`): the daemon runs as root and the file
decides which sockets and groups it exposes.
"""

from __future__ import annotations

import argparse
import grp
import ipaddress
import math
import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, NoReturn

from eerl.control.registry import CONTROLLER_NAMES, DEFAULT_CONTROLLER
from eerl.phases import PhaseKind

from eerld import files
from eerld.clocks.ratelimit import DEFAULT_MAX_CHANGES_PER_S
from eerld.daemon.jobmode import DEFAULT_MAX_TRIALS, DEFAULT_TRIAL_WINDOW_S
from eerld.errors import ConfigError
from eerld.podresources import DEFAULT_POD_RESOURCES_SOCKET, REFRESH_S
from eerld.sessions import DEFAULT_MAX_LEASE_TTL_S

DEFAULT_SOCKET = Path("/run/eerld/eerld.sock")
DEFAULT_ADMIN_SOCKET = Path("/run/eerld/admin.sock")
DEFAULT_GRANT_DIR = Path("/run/eerld/grants")
TENANCIES = ("single", "multi")
DEFAULT_STATE_DIR = Path("/var/lib/eerld")
DEFAULT_METRICS_ADDRESS = "127.0.0.1:9478"
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024
BACKENDS = ("nvml", "sim")
LOG_FORMATS = ("json", "console")
CLOCK_ACTUATORS = ("lock", "application")
JOB_MODES = ("allow", "deny")
DEFAULT_JOB_MAX_TRIALS = DEFAULT_MAX_TRIALS
DEFAULT_JOB_TRIAL_WINDOW_S = DEFAULT_TRIAL_WINDOW_S
DEFAULT_LEASE_TTL_S = 10.0
MAX_LEASE_TTL_BOUND_S = 3600.0


@dataclass(frozen=True, slots=True)
class Config:
    """Everything eerld needs to start; defaults are the production ones."""

    backend: str = "nvml"
    sim_profile: str = "h100-sxm"
    sim_gpus: int = 8
    sim_speedup: float = 1.0
    sim_state: Path | None = None
    socket_path: Path = DEFAULT_SOCKET
    socket_group: str | None = None
    admin_socket_path: Path = DEFAULT_ADMIN_SOCKET
    admin_group: str | None = None
    tenancy: str = "multi"
    """``multi``: claims only through grants and per-GPU sockets; ``single``: the shared socket claims all."""
    grant_dir: Path | None = DEFAULT_GRANT_DIR
    """Where grant sockets live (None: grants off)."""
    gpu_socket_dir: Path | None = None
    """Where per-GPU sockets live (None: off); a root-only directory that CDI mounts from."""
    keepalive_s: float = 10.0
    """The server pings each connection this often (0: off); one that does not answer is closed."""
    keepalive_timeout_s: float = 5.0
    max_connections: int = 256
    """Connections each socket accepts at once; more are closed at once (one user cannot take them all)."""
    stream_lifetime_s: float = 60.0
    """A stream other than Attach (reflection, health Watch) is cancelled after this long."""
    state_dir: Path = DEFAULT_STATE_DIR
    metrics_address: str | None = DEFAULT_METRICS_ADDRESS
    """None (``--metrics-address off``) disables the metrics endpoint."""
    pod_resources_socket: Path | None = DEFAULT_POD_RESOURCES_SOCKET
    """The kubelet's pod-resources socket, for the Kubernetes labels of the metrics (None: off)."""
    pod_resources_optional: bool = True
    """``auto`` (the default): the kubelet's default socket, where it exists; off Kubernetes, nothing."""
    pod_resources_poll_s: float = REFRESH_S
    """How often the kubelet's allocations are listed to end the sessions of GPUs that left their pod."""
    listen: str | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None
    controller: str = DEFAULT_CONTROLLER
    fixed_clocks_mhz: Mapping[PhaseKind, int] = field(default_factory=dict)
    dry_run: bool = False
    reset_clocks: bool = False
    log_format: str | None = None
    """None: JSON when stderr is not a terminal, console otherwise."""
    lease_ttl_s: float = DEFAULT_LEASE_TTL_S
    """The lease of a session that asks for none."""
    max_lease_ttl_s: float = DEFAULT_MAX_LEASE_TTL_S
    """The longest lease a session is granted, whatever it asks for."""
    energy_sample_ms: float = 20.0
    """NVML energy counters are read in the background this often (0: read at each phase event)."""
    clock_actuator: str = "lock"
    """``lock`` (SM clock locks) or ``application`` (application clocks: GB200-NVL's -lgc problem)."""
    max_clock_changes_per_s: float = DEFAULT_MAX_CHANGES_PER_S
    """Per-GPU limit on session-driven clock changes (token bucket, burst 20); 0 disables it."""
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    job_mode: str = "allow"
    """``allow``: sessions may open in job mode (their clocks from a job-level controller), or ``deny``."""
    job_clock_floor_mhz: int | None = None
    """No job directive may ask for a clock below this (None: ``auto``, 40 % of the session's top clock)."""
    job_max_trials: int = DEFAULT_JOB_MAX_TRIALS
    """Trial directives a job-mode session may have accepted per ``job_trial_window_s``."""
    job_trial_window_s: float = DEFAULT_JOB_TRIAL_WINDOW_S
    grace_s: float = 5.0
    max_workers: int = 128
    debug: bool = False


class _Parser(argparse.ArgumentParser):
    """argparse that raises ConfigError instead of printing usage and exiting."""

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message)


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``eerld``; every default is None so that the config file can fill the gaps."""
    p = _Parser(prog="eerld", description="Energy-efficient RL clock-control daemon for GPU nodes.")
    p.add_argument("--config", type=Path, help="TOML config file; flags override it")
    p.add_argument("--backend", help="GPU backend: nvml (default) or sim")
    p.add_argument("--sim-profile", help="simulated GPU profile (h100-sxm, gb200)")
    p.add_argument("--sim-gpus", help="number of simulated GPUs")
    p.add_argument("--sim-speedup", help="simulated time runs this many times faster than real time")
    p.add_argument("--sim-state", type=Path, help="file holding the simulated GPUs' state across processes")
    p.add_argument(
        "--socket", dest="socket_path", type=Path, help=f"worker socket (default {DEFAULT_SOCKET})"
    )
    p.add_argument("--socket-group", help="group that may use the worker socket (mode 0660)")
    p.add_argument("--admin-socket", dest="admin_socket_path", type=Path, help="admin socket")
    p.add_argument("--admin-group", help="group that may use the admin socket (0660 instead of 0600)")
    p.add_argument(
        "--tenancy",
        help="multi (default: GPU claims only through grants or per-GPU sockets) or single (the shared "
        "worker socket may claim every GPU)",
    )
    p.add_argument("--grant-dir", type=Path, help=f"grant sockets (default {DEFAULT_GRANT_DIR}; 'off')")
    p.add_argument("--gpu-socket-dir", type=Path, help="serve one socket per GPU here (Kubernetes CDI)")
    p.add_argument(
        "--keepalive-s", dest="keepalive_s", help="ping connections this often (default 10; 0 off)"
    )
    p.add_argument("--state-dir", type=Path, help=f"ledger and pins (default {DEFAULT_STATE_DIR})")
    p.add_argument(
        "--metrics-address", help=f"HOST:PORT of /metrics, or 'off' (default {DEFAULT_METRICS_ADDRESS})"
    )
    p.add_argument(
        "--pod-resources-socket",
        help="kubelet pod-resources socket for the metrics' namespace/pod/container labels: PATH, 'off' or "
        f"'auto' (default: {DEFAULT_POD_RESOURCES_SOCKET} where it exists)",
    )
    p.add_argument("--listen", help="also serve the worker API on TCP HOST:PORT (mutual TLS required)")
    p.add_argument("--tls-cert", type=Path, help="server certificate (PEM) for --listen")
    p.add_argument("--tls-key", type=Path, help="server key (PEM) for --listen")
    p.add_argument("--tls-client-ca", type=Path, help="CA that signs client certificates for --listen")
    p.add_argument("--controller", help=f"{'|'.join(CONTROLLER_NAMES)} (default {DEFAULT_CONTROLLER})")
    p.add_argument("--fixed-clocks", help="for --controller fixed: generation=MHZ,training=MHZ")
    p.add_argument("--lease-ttl", dest="lease_ttl_s", help="default lease TTL of heartbeat sessions, seconds")
    p.add_argument(
        "--max-lease-ttl",
        dest="max_lease_ttl_s",
        help="longest lease a session is granted, whatever it asks for, seconds "
        f"(default {DEFAULT_MAX_LEASE_TTL_S:g})",
    )
    p.add_argument(
        "--energy-sample-ms",
        dest="energy_sample_ms",
        help="nvml: read energy counters in the background every N ms, 0 to read at each phase event "
        "(default 20)",
    )
    p.add_argument(
        "--max-clock-changes-per-s",
        dest="max_clock_changes_per_s",
        help="per-GPU limit on session clock changes per second (default 10; 0: no limit)",
    )
    p.add_argument(
        "--clock-actuator",
        help="lock (default: SM clock locks) or application (application clocks, where locks do not work)",
    )
    p.add_argument("--job-mode", help="allow (default) or deny sessions in job mode (multi-node control)")
    p.add_argument(
        "--job-clock-floor-mhz",
        help="lowest clock a job directive may ask for, MHz, or auto (default: 40%% of the top clock)",
    )
    p.add_argument(
        "--job-max-trials",
        help=f"trial directives a job-mode session may have per window (default {DEFAULT_JOB_MAX_TRIALS})",
    )
    p.add_argument(
        "--job-trial-window-s",
        help=f"the trial budget's window, seconds (default {DEFAULT_JOB_TRIAL_WINDOW_S:g})",
    )
    p.add_argument("--dry-run", action="store_true", default=None, help="decide and meter, never lock")
    p.add_argument("--reset-clocks", action="store_true", default=None, help="reset every GPU, then exit")
    p.add_argument("--log-format", help="json or console (default: json unless stderr is a terminal)")
    p.add_argument("--debug", action="store_true", default=None, help="debug logs and tracebacks")
    return p


def parse_fixed_clocks(text: str, *, source: str = "--fixed-clocks") -> dict[PhaseKind, int]:
    """``generation=1200,training=1500`` → clocks per phase kind."""
    result: dict[PhaseKind, int] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            raise ConfigError(f"{source}: expected KIND=MHZ, got {part.strip()!r}")
        result.update(_fixed_entry(name.strip(), value.strip(), source))
    return result


def _fixed_entry(name: str, value: object, source: str) -> dict[PhaseKind, int]:
    try:
        kind = PhaseKind(name)
    except ValueError:
        raise ConfigError(f"{source}: unknown phase kind {name!r} (generation or training)") from None
    mhz = _int(value, f"{source} {name}", minimum=1, maximum=10_000)
    return {kind: mhz}


def _int(value: object, name: str, *, minimum: int, maximum: int) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected an integer, got {value!r}")
    try:
        number = int(value) if isinstance(value, int | str) else int(str(value), 10)
    except ValueError:
        raise ConfigError(f"{name}: expected an integer, got {value!r}") from None
    if not minimum <= number <= maximum:
        raise ConfigError(f"{name}: must be between {minimum} and {maximum}, got {number}")
    return number


def _float(value: object, name: str, *, minimum: float, maximum: float) -> float:
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected a number, got {value!r}")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: expected a number, got {value!r}") from None
    if not math.isfinite(number) or not minimum <= number <= maximum:
        raise ConfigError(
            f"{name}: must be a finite number between {minimum:g} and {maximum:g}, got {value!r}"
        )
    return number


def _host_port(value: str, name: str) -> str:
    host, sep, port = value.rpartition(":")
    if not sep or not host:
        raise ConfigError(f"{name}: expected HOST:PORT, got {value!r}")
    _int(port, f"{name} port", minimum=0, maximum=65535)
    bare = host.strip("[]")
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        if not bare.replace("-", "").replace(".", "").isalnum():
            raise ConfigError(f"{name}: {host!r} is not a host name or IP address") from None
    return value


_FILE_KEYS = {
    "backend": "backend",
    "sim_profile": "sim_profile",
    "sim_gpus": "sim_gpus",
    "sim_speedup": "sim_speedup",
    "sim_state": "sim_state",
    "socket": "socket_path",
    "socket_group": "socket_group",
    "admin_socket": "admin_socket_path",
    "admin_group": "admin_group",
    "tenancy": "tenancy",
    "grant_dir": "grant_dir",
    "gpu_socket_dir": "gpu_socket_dir",
    "keepalive_s": "keepalive_s",
    "keepalive_timeout_s": "keepalive_timeout_s",
    "max_connections": "max_connections",
    "stream_lifetime_s": "stream_lifetime_s",
    "state_dir": "state_dir",
    "metrics_address": "metrics_address",
    "pod_resources_socket": "pod_resources_socket",
    "pod_resources_poll_s": "pod_resources_poll_s",
    "listen": "listen",
    "tls_cert": "tls_cert",
    "tls_key": "tls_key",
    "tls_client_ca": "tls_client_ca",
    "controller": "controller",
    "fixed_clocks": "fixed_clocks",
    "lease_ttl_s": "lease_ttl_s",
    "max_lease_ttl_s": "max_lease_ttl_s",
    "energy_sample_ms": "energy_sample_ms",
    "max_clock_changes_per_s": "max_clock_changes_per_s",
    "clock_actuator": "clock_actuator",
    "dry_run": "dry_run",
    "log_format": "log_format",
    "grace_s": "grace_s",
    "max_message_bytes": "max_message_bytes",
    "job_mode": "job_mode",
    "job_clock_floor_mhz": "job_clock_floor_mhz",
    "job_max_trials": "job_max_trials",
    "job_trial_window_s": "job_trial_window_s",
}


def read_config_file(path: Path) -> dict[str, Any]:
    """Raw values of a TOML config file, by Config field name; refuses files other users may change."""
    raw = files.check_config_file(path, "--config")
    try:
        data = tomllib.loads(raw.decode())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"--config: {path} is not valid TOML: {e}") from None
    values: dict[str, Any] = {}
    for key, value in data.items():
        if key not in _FILE_KEYS:
            raise ConfigError(f"--config: {path}: unknown key {key!r}")
        values[_FILE_KEYS[key]] = value
    return values


def load_config(argv: Sequence[str]) -> Config:
    """Parse flags and the config file into a validated Config (ConfigError on the first bad value)."""
    args = vars(build_parser().parse_args(list(argv)))
    config_path = args.pop("config")
    values: dict[str, Any] = read_config_file(config_path) if config_path is not None else {}
    for key, value in args.items():
        if value is not None:
            values[key] = value
    return validate(values)


def validate(values: Mapping[str, Any]) -> Config:
    """A Config from raw values (strings from flags, typed values from TOML), each checked."""
    out: dict[str, Any] = {}
    known = {f.name for f in fields(Config)}

    def text(name: str, flag: str) -> str | None:
        value = values.get(name)
        if value is None:
            return None
        if not isinstance(value, str) or not value.strip():
            raise ConfigError(f"{flag}: expected a non-empty string, got {value!r}")
        return value.strip()

    def path(name: str, flag: str) -> Path | None:
        value = values.get(name)
        if value is None:
            return None
        if not isinstance(value, str | Path) or not str(value):
            raise ConfigError(f"{flag}: expected a path, got {value!r}")
        if "\0" in str(value):
            raise ConfigError(f"{flag}: a path cannot contain a NUL character, got {str(value)!r}")
        return Path(value)

    backend = text("backend", "--backend")
    if backend is not None:
        if backend not in BACKENDS:
            raise ConfigError(f"--backend: unknown backend {backend!r} (choose from {', '.join(BACKENDS)})")
        out["backend"] = backend
    profile = text("sim_profile", "--sim-profile")
    if profile is not None:
        out["sim_profile"] = profile
    if values.get("sim_gpus") is not None:
        out["sim_gpus"] = _int(values["sim_gpus"], "--sim-gpus", minimum=1, maximum=64)
    if values.get("sim_speedup") is not None:
        out["sim_speedup"] = _float(values["sim_speedup"], "--sim-speedup", minimum=0.001, maximum=1e6)
    for name, flag in (
        ("sim_state", "--sim-state"),
        ("socket_path", "--socket"),
        ("admin_socket_path", "--admin-socket"),
        ("state_dir", "--state-dir"),
        ("tls_cert", "--tls-cert"),
        ("tls_key", "--tls-key"),
        ("tls_client_ca", "--tls-client-ca"),
    ):
        value = path(name, flag)
        if value is not None:
            out[name] = value
    for name, flag in (("socket_group", "--socket-group"), ("admin_group", "--admin-group")):
        group = text(name, flag)
        if group is not None:
            _check_group(group, flag)
            out[name] = group
    tenancy = text("tenancy", "--tenancy")
    if tenancy is not None:
        if tenancy not in TENANCIES:
            raise ConfigError(f"--tenancy: expected single or multi, got {tenancy!r}")
        out["tenancy"] = tenancy
    grant_dir = path("grant_dir", "--grant-dir")
    if grant_dir is not None:
        out["grant_dir"] = None if str(grant_dir) == "off" else grant_dir
    gpu_socket_dir = path("gpu_socket_dir", "--gpu-socket-dir")
    if gpu_socket_dir is not None:
        out["gpu_socket_dir"] = gpu_socket_dir
    if values.get("keepalive_s") is not None:
        out["keepalive_s"] = _float(values["keepalive_s"], "--keepalive-s", minimum=0.0, maximum=3600.0)
    if values.get("keepalive_timeout_s") is not None:
        out["keepalive_timeout_s"] = _float(
            values["keepalive_timeout_s"], "keepalive_timeout_s", minimum=0.1, maximum=600.0
        )
    if values.get("max_connections") is not None:
        out["max_connections"] = _int(values["max_connections"], "max_connections", minimum=4, maximum=65536)
    if values.get("stream_lifetime_s") is not None:
        out["stream_lifetime_s"] = _float(
            values["stream_lifetime_s"], "stream_lifetime_s", minimum=0.1, maximum=86400.0
        )
    metrics = text("metrics_address", "--metrics-address")
    if metrics is not None:
        out["metrics_address"] = None if metrics == "off" else _host_port(metrics, "--metrics-address")
    pod_resources = text("pod_resources_socket", "--pod-resources-socket")
    if pod_resources == "off":
        out["pod_resources_socket"] = None
    elif pod_resources is not None and pod_resources != "auto":
        socket_path = path("pod_resources_socket", "--pod-resources-socket")
        if socket_path is None or not socket_path.is_absolute():
            raise ConfigError(
                f"--pod-resources-socket: expected an absolute path, 'auto' or 'off', got {pod_resources!r}"
            )
        out["pod_resources_socket"], out["pod_resources_optional"] = socket_path, False
    if values.get("pod_resources_poll_s") is not None:
        out["pod_resources_poll_s"] = _float(
            values["pod_resources_poll_s"], "pod_resources_poll_s", minimum=0.1, maximum=600.0
        )
    listen = text("listen", "--listen")
    if listen is not None:
        out["listen"] = _host_port(listen, "--listen")
    controller = text("controller", "--controller")
    if controller is not None:
        if controller not in CONTROLLER_NAMES:
            raise ConfigError(
                f"--controller: unknown controller {controller!r} (choose from {', '.join(CONTROLLER_NAMES)})"
            )
        out["controller"] = controller
    fixed = values.get("fixed_clocks")
    if fixed is not None:
        if isinstance(fixed, str):
            out["fixed_clocks_mhz"] = parse_fixed_clocks(fixed)
        elif isinstance(fixed, Mapping):
            parsed: dict[PhaseKind, int] = {}
            for k, v in fixed.items():
                parsed.update(_fixed_entry(str(k), v, "fixed_clocks"))
            out["fixed_clocks_mhz"] = parsed
        else:
            raise ConfigError(f"--fixed-clocks: expected generation=MHZ,training=MHZ, got {fixed!r}")
    if values.get("lease_ttl_s") is not None:
        out["lease_ttl_s"] = _float(
            values["lease_ttl_s"], "--lease-ttl", minimum=1.0, maximum=MAX_LEASE_TTL_BOUND_S
        )
    if values.get("max_lease_ttl_s") is not None:
        out["max_lease_ttl_s"] = _float(
            values["max_lease_ttl_s"], "--max-lease-ttl", minimum=1.0, maximum=MAX_LEASE_TTL_BOUND_S
        )
    if values.get("energy_sample_ms") is not None:
        out["energy_sample_ms"] = _float(
            values["energy_sample_ms"], "--energy-sample-ms", minimum=0.0, maximum=1000.0
        )
    if values.get("max_clock_changes_per_s") is not None:
        out["max_clock_changes_per_s"] = _float(
            values["max_clock_changes_per_s"], "--max-clock-changes-per-s", minimum=0.0, maximum=10_000.0
        )
    if values.get("grace_s") is not None:
        out["grace_s"] = _float(values["grace_s"], "grace_s", minimum=0.0, maximum=600.0)
    if values.get("max_message_bytes") is not None:
        out["max_message_bytes"] = _int(
            values["max_message_bytes"], "max_message_bytes", minimum=1024, maximum=64 * 1024 * 1024
        )
    job_mode = text("job_mode", "--job-mode")
    if job_mode is not None:
        if job_mode not in JOB_MODES:
            raise ConfigError(f"--job-mode: expected allow or deny, got {job_mode!r}")
        out["job_mode"] = job_mode
    floor = values.get("job_clock_floor_mhz")
    if floor is not None:
        if isinstance(floor, str) and floor.strip() == "auto":
            out["job_clock_floor_mhz"] = None
        else:
            out["job_clock_floor_mhz"] = _int(floor, "--job-clock-floor-mhz", minimum=0, maximum=10_000)
    if values.get("job_max_trials") is not None:
        out["job_max_trials"] = _int(values["job_max_trials"], "--job-max-trials", minimum=0, maximum=100_000)
    if values.get("job_trial_window_s") is not None:
        out["job_trial_window_s"] = _float(
            values["job_trial_window_s"], "--job-trial-window-s", minimum=1.0, maximum=7 * 86400.0
        )
    for name, flag in (("dry_run", "--dry-run"), ("reset_clocks", "--reset-clocks"), ("debug", "--debug")):
        value = values.get(name)
        if value is not None:
            if not isinstance(value, bool):
                raise ConfigError(f"{flag}: expected true or false, got {value!r}")
            out[name] = value
    actuator = text("clock_actuator", "--clock-actuator")
    if actuator is not None:
        if actuator not in CLOCK_ACTUATORS:
            choices = ", ".join(CLOCK_ACTUATORS)
            raise ConfigError(f"--clock-actuator: expected one of {choices}, got {actuator!r}")
        out["clock_actuator"] = actuator
    log_format = text("log_format", "--log-format")
    if log_format is not None:
        if log_format not in LOG_FORMATS:
            raise ConfigError(f"--log-format: expected json or console, got {log_format!r}")
        out["log_format"] = log_format
    unknown = set(out) - known
    assert not unknown, unknown
    config = replace(Config(), **out)
    _check_consistency(config)
    return config


def _check_group(group: str, flag: str) -> None:
    try:
        grp.getgrnam(group)
    except KeyError:
        raise ConfigError(f"{flag}: no group named {group!r} on this host") from None


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
