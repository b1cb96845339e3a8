"""Every option of eerld, declared once: the fields of :class:`Config`, each with its :class:`Option`.

A field declared with :func:`option` carries its default (the field's), its flag, its config-file key, its
value rule (:mod:`eerld.config.values`), its ``--help`` line and its row of docs/operations.md. The parser,
the file's accepted keys, validation and the docs' table are all made from these declarations
(:mod:`eerld.config.load`, ``scripts/gen_options_doc.py``); a new option is one new field here.

A field without an Option (``max_workers``, ``pod_resources_optional``, ``sim_home``) is no option: code
sets it.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from eerl.control.registry import CONTROLLER_NAMES, DEFAULT_CONTROLLER
from eerl.job.admission import DEFAULT_MAX_TRIALS, DEFAULT_TRIAL_WINDOW_S
from eerl.phases import PhaseKind

from eerld.access import TENANCIES
from eerld.clocks.ratelimit import DEFAULT_MAX_CHANGES_PER_S
from eerld.config.values import (
    Choice,
    Float,
    Int,
    Or,
    Rule,
    fixed_clocks,
    group,
    host_port,
    path,
    text,
    true_or_false,
    value_rule,
)
from eerld.daemon.core import DEFAULT_LEASE_TTL_S
from eerld.errors import ConfigError
from eerld.pods.owners import DEFAULT_POD_RESOURCES_SOCKET, REFRESH_S
from eerld.sessions import DEFAULT_MAX_LEASE_TTL_S

__all__ = [
    "CONFIG_FILE",
    "DEFAULT_ADMIN_SOCKET",
    "DEFAULT_GRANT_DIR",
    "DEFAULT_METRICS_ADDRESS",
    "DEFAULT_SOCKET",
    "DEFAULT_STATE_DIR",
    "Config",
    "Option",
    "option",
    "options",
]

DEFAULT_SOCKET = Path("/run/eerld/eerld.sock")
DEFAULT_ADMIN_SOCKET = Path("/run/eerld/admin.sock")
DEFAULT_GRANT_DIR = Path("/run/eerld/grants")
DEFAULT_STATE_DIR = Path("/var/lib/eerld")
DEFAULT_METRICS_ADDRESS = "127.0.0.1:9478"
DEFAULT_MAX_MESSAGE_BYTES = 64 * 1024
MAX_LEASE_TTL_BOUND_S = 3600.0
BACKENDS = ("nvml", "sim")
LOG_FORMATS = ("json", "console")
CLOCK_ACTUATORS = ("lock", "application")
JOB_MODES = ("allow", "deny")

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Option:
    """How one Config field is set: by flag, by config-file key or both, through one value rule."""

    flag: str | None
    """``--backend``; None: the config file only."""
    key: str | None
    """The config file's key; None: the command line only."""
    rule: Rule[Any]
    help: str
    """One line of ``eerld --help`` (its default is added from the field)."""
    doc: str | None = None
    """The option's row in docs/operations.md (markdown; None: ``help``)."""
    metavar: str | None = None
    """How ``--help`` shows the value (None: the rule's)."""
    shown_default: str | None = None
    """The default as people read it, where the field's value would mislead (``auto``, ``off``)."""

    @property
    def label(self) -> str:
        """What an error about this option names: the flag, else the file key."""
        name = self.flag or self.key
        assert name is not None
        return name


class _Unset(enum.Enum):
    UNSET = enum.auto()


def option(
    default: T | Literal[_Unset.UNSET] = _Unset.UNSET,
    /,
    *,
    factory: Callable[[], T] | None = None,
    flag: str | None,
    key: str | None,
    rule: Rule[T],
    help: str,
    doc: str | None = None,
    metavar: str | None = None,
    shown_default: str | None = None,
) -> T:
    """A Config field with a default (or a ``factory``) whose metadata holds its Option.

    The rule's type is the field's: mypy refuses a rule that reads a value the field cannot hold.
    """
    metadata = {
        "option": Option(flag, key, rule, help, doc=doc, metavar=metavar, shown_default=shown_default)
    }
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    assert default is not _Unset.UNSET, "an option needs a default or a factory"
    return dataclasses.field(default=default, metadata=metadata)


@value_rule("NAME")
def _sim_profile(value: object, label: str) -> str:
    """A profile's name; which names exist is the simulator's to say, where the sim backend is built."""
    return text(value, label)


@value_rule("PATH")
def _kubelet_socket(value: object, label: str) -> Path:
    word = text(value, label)
    socket_path = path(value, label)
    if not socket_path.is_absolute():
        raise ConfigError(f"{label}: expected an absolute path, 'auto' or 'off', got {word!r}")
    return socket_path


@dataclass(frozen=True, slots=True)
class Config:
    """Everything eerld needs to start; defaults are the production ones."""

    backend: str = option(
        "nvml", flag="--backend", key="backend", rule=Choice(BACKENDS),
        help="GPU backend: nvml for real GPUs, sim for simulated ones",
        doc="`nvml`: real GPUs; `sim`: simulated GPUs (demo, tests)",
    )  # fmt: skip
    sim: bool = option(
        False, flag="--sim", key=None, rule=true_or_false,
        help="try eerld by hand without root or GPUs: simulated GPUs, one tenant, sockets and state in your "
        "runtime directory (other flags still win)",
        doc="try eerld by hand without root or GPUs: `--backend sim --tenancy single`, no grants, metrics or "
        "kubelet, sockets and state in `$XDG_RUNTIME_DIR/eerld-sim` (else `/tmp/eerld-sim-<uid>`), made 0700 "
        "and refused if another user made it; prints the `export EERL_SOCKET=…` and `eerlctl` lines "
        "(docs/quickstart.md); flags and the config file win over what it sets",
    )  # fmt: skip
    sim_home: Path | None = None
    """The directory ``--sim`` made its own (None without ``--sim``; code sets it, no option)."""
    sim_profile: str = option(
        "h100-sxm", flag="--sim-profile", key="sim_profile", rule=_sim_profile,
        help="simulated GPU profile (h100-sxm, gb200, a100-sxm, a40)",
        doc="simulated GPU model: `h100-sxm`, `gb200`, `a100-sxm`, `a40`",
    )  # fmt: skip
    sim_gpus: int = option(
        8, flag="--sim-gpus", key="sim_gpus", rule=Int(1, 64), help="number of simulated GPUs (1–64)"
    )
    sim_speedup: float = option(
        1.0, flag="--sim-speedup", key="sim_speedup", rule=Float(0.001, 1e6),
        help="simulated time runs this many times faster than real time",
    )  # fmt: skip
    sim_state: Path | None = option(
        None, flag="--sim-state", key="sim_state", rule=path, metavar="FILE",
        help="file holding the simulated GPUs' state (locks, counters) across processes",
    )  # fmt: skip
    socket_path: Path = option(
        DEFAULT_SOCKET, flag="--socket", key="socket", rule=path, help="worker socket (PhaseService)"
    )
    socket_group: str | None = option(
        None, flag="--socket-group", key="socket_group", rule=group,
        help="group that may use the worker socket (mode 0660)",
    )  # fmt: skip
    admin_socket_path: Path = option(
        DEFAULT_ADMIN_SOCKET, flag="--admin-socket", key="admin_socket", rule=path,
        help="admin socket (AdminService)",
    )  # fmt: skip
    admin_group: str | None = option(
        None, flag="--admin-group", key="admin_group", rule=group,
        help="group that may use the admin socket (0660 instead of 0600)",
    )  # fmt: skip
    tenancy: str = option(
        "multi", flag="--tenancy", key="tenancy", rule=Choice(TENANCIES),
        help="multi: GPU claims only through grants or per-GPU sockets; single: the shared worker socket may "
        "claim every GPU",
        doc="`multi`: GPUs are claimed only through grant and per-GPU sockets, the shared socket refuses "
        "claims with a message saying so; `single`: the shared socket may claim every GPU (one tenant per "
        "node)",
    )  # fmt: skip
    grant_dir: Path | None = option(
        DEFAULT_GRANT_DIR, flag="--grant-dir", key="grant_dir", rule=Or("off", None, path),
        metavar="DIR|off", help="where eerlctl grant makes sockets (off: no grants)",
        doc="where `eerlctl grant` makes sockets (`off`: no grants)",
    )  # fmt: skip
    gpu_socket_dir: Path | None = option(
        None, flag="--gpu-socket-dir", key="gpu_socket_dir", rule=path, metavar="DIR",
        help="serve one socket per GPU here (Kubernetes CDI)",
        doc="serve one socket per GPU, `DIR/<GPU-UUID>/eerld.sock` (Kubernetes CDI)",
    )  # fmt: skip
    keepalive_s: float = option(
        10.0, flag="--keepalive-s", key="keepalive_s", rule=Float(0.0, 3600.0), metavar="S",
        help="ping every connection this often, seconds (0: off)",
        doc="eerld pings every connection this often; one that does not answer within `keepalive_timeout_s` "
        "is closed, ending a stuck client's session; `0`: no pings",
    )  # fmt: skip
    keepalive_timeout_s: float = option(
        5.0, flag=None, key="keepalive_timeout_s", rule=Float(0.1, 600.0),
        help="how long a keepalive ping may go unanswered before its connection is closed, seconds",
    )  # fmt: skip
    max_connections: int = option(
        256, flag=None, key="max_connections", rule=Int(4, 65536),
        help="connections each socket accepts at once; more are closed at once (one user cannot take them "
        "all)",
    )  # fmt: skip
    stream_lifetime_s: float = option(
        60.0, flag=None, key="stream_lifetime_s", rule=Float(0.1, 86400.0),
        help="a stream other than Attach (reflection, health Watch) is cancelled after this long, seconds",
        doc="streams other than Attach (reflection, health Watch) are cancelled after this long; at most 4 "
        "are open per socket",
    )  # fmt: skip
    state_dir: Path = option(
        DEFAULT_STATE_DIR, flag="--state-dir", key="state_dir", rule=path, metavar="DIR",
        help="the lock ledger, the admin pins and the grants",
    )  # fmt: skip
    metrics_address: str | None = option(
        DEFAULT_METRICS_ADDRESS, flag="--metrics-address", key="metrics_address",
        rule=Or("off", None, host_port), help="HOST:PORT of Prometheus /metrics, or off",
        doc="Prometheus `/metrics`; `off` disables it",
    )  # fmt: skip
    pod_resources_socket: Path | None = option(
        DEFAULT_POD_RESOURCES_SOCKET, flag="--pod-resources-socket", key="pod_resources_socket",
        rule=Or("off", None, Or("auto", DEFAULT_POD_RESOURCES_SOCKET, _kubelet_socket)),
        metavar="PATH|auto|off", shown_default="auto",
        help=f"the kubelet's pod-resources socket, for the metrics' namespace/pod/container labels (auto: "
        f"{DEFAULT_POD_RESOURCES_SOCKET} where it exists)",
        doc="the kubelet's pod-resources socket, for the `namespace`, `pod` and `container` labels of the "
        "session metrics and to end the session of a GPU that left its pod (docs/deployment.md, \"When a pod "
        f"ends\"); `auto`: `{DEFAULT_POD_RESOURCES_SOCKET}` where it exists (nothing off Kubernetes); a "
        "path: that socket (a missing one is logged); `off`",
    )  # fmt: skip
    pod_resources_optional: bool = True
    """Whether a missing kubelet socket is fine: True unless ``pod_resources_socket`` named one (not auto)."""
    pod_resources_poll_s: float = option(
        REFRESH_S, flag=None, key="pod_resources_poll_s", rule=Float(0.1, 600.0),
        help="how often the kubelet's allocations are listed to end the sessions of GPUs that left their pod",
        doc="how often the kubelet's allocations are listed to find GPUs that left their pod (0.1–600); a "
        "GPU is gone once the listings of one such period in a row say so",
    )  # fmt: skip
    listen: str | None = option(
        None, flag="--listen", key="listen", rule=host_port,
        help="also serve the worker API on TCP HOST:PORT (mutual TLS required)",
        doc="also serve PhaseService on TCP, mutual TLS only",
    )  # fmt: skip
    tls_cert: Path | None = option(
        None, flag="--tls-cert", key="tls_cert", rule=path, metavar="FILE",
        help="server certificate (PEM) for --listen", doc="server certificate (PEM) for `--listen`",
    )  # fmt: skip
    tls_key: Path | None = option(
        None, flag="--tls-key", key="tls_key", rule=path, metavar="FILE",
        help="server key (PEM) for --listen", doc="server key (PEM) for `--listen`",
    )  # fmt: skip
    tls_client_ca: Path | None = option(
        None, flag="--tls-client-ca", key="tls_client_ca", rule=path, metavar="FILE",
        help="CA that signs client certificates for --listen",
        doc="the CA that signs client certificates, for `--listen`",
    )  # fmt: skip
    controller: str = option(
        DEFAULT_CONTROLLER, flag="--controller", key="controller", rule=Choice(CONTROLLER_NAMES),
        help="eerl: the online controller; fixed: --fixed-clocks; off: meter only",
        doc="`eerl` online controller, `fixed` clocks, `off` meter only",
    )  # fmt: skip
    fixed_clocks_mhz: Mapping[PhaseKind, int] = option(
        factory=dict, flag="--fixed-clocks", key="fixed_clocks", rule=fixed_clocks,
        help="for --controller fixed: generation=MHZ,training=MHZ",
        doc="for `fixed`: `generation=1200,training=1500` (TOML: a table)",
    )  # fmt: skip
    lease_ttl_s: float = option(
        DEFAULT_LEASE_TTL_S, flag="--lease-ttl", key="lease_ttl_s", rule=Float(1.0, MAX_LEASE_TTL_BOUND_S),
        metavar="S", help="the lease of a heartbeat session that asks for none, seconds",
        doc="lease of sessions that are not bound to a stream and ask for none, seconds (1–3600; at most "
        "`--max-lease-ttl`, else the start is refused)",
    )  # fmt: skip
    max_lease_ttl_s: float = option(
        DEFAULT_MAX_LEASE_TTL_S, flag="--max-lease-ttl", key="max_lease_ttl_s",
        rule=Float(1.0, MAX_LEASE_TTL_BOUND_S), metavar="S",
        help="the longest lease a session is granted, whatever it asks for, seconds",
        doc="the longest lease any session is granted, whatever it asks for, seconds (1–3600): OpenSession "
        "grants the smaller of the two and its reply's `lease_ttl_s` says which (`lease_capped` in the log "
        "when it was cut); so a session without an Attach stream ends at most this long after its last "
        "heartbeat or phase event",
    )  # fmt: skip
    energy_sample_ms: float = option(
        20.0, flag="--energy-sample-ms", key="energy_sample_ms", rule=Float(0.0, 1000.0), metavar="N",
        help="nvml: read energy counters in the background every N ms, 0 to read at each phase event",
        doc="`nvml`: read the energy counters in the background every N ms, so phase events never wait on a "
        "counter read (~3 ms each on an H200); `0` reads them at each phase event. The sim backend always "
        "reads directly",
    )  # fmt: skip
    clock_actuator: str = option(
        "lock", flag="--clock-actuator", key="clock_actuator", rule=Choice(CLOCK_ACTUATORS),
        help="lock: SM clock locks; application: application clocks, where locks do not work",
        doc="`lock`: SM clock locks; `application`: application clocks, where locks do not work (GB200-NVL)",
    )  # fmt: skip
    max_clock_changes_per_s: float = option(
        DEFAULT_MAX_CHANGES_PER_S, flag="--max-clock-changes-per-s", key="max_clock_changes_per_s",
        rule=Float(0.0, 10_000.0), help="per-GPU limit on session clock changes per second (0: no limit)",
        doc="per-GPU limit on clock changes (token bucket, burst 20): a session's change over it is skipped, "
        "an admin pin over it is refused (RESOURCE_EXHAUSTED; `eerlctl pin` retries within `--timeout`), a "
        "reset is never held back but spends the budget; `0` disables it",
    )  # fmt: skip
    job_mode: str = option(
        "allow", flag="--job-mode", key="job_mode", rule=Choice(JOB_MODES),
        help="allow or deny sessions in job mode (multi-node control)",
        doc="whether sessions may open in job mode, their clock per phase coming from a job-level "
        "controller's directive that eerld checks ([multinode.md](multinode.md#the-daemons-checks)); `deny` "
        "refuses them with FAILED_PRECONDITION",
    )  # fmt: skip
    job_clock_floor_mhz: int | None = option(
        None, flag="--job-clock-floor-mhz", key="job_clock_floor_mhz", rule=Or("auto", None, Int(0, 10_000)),
        metavar="MHZ|auto", shown_default="auto",
        help="lowest clock a job directive may ask for, MHz, or auto (40% of the top clock)",
        doc="no job directive may ask for a lower SM clock (verdict `below_floor`); `auto`: 40 % of the "
        "session's top supported clock; `0`: no floor but the grid",
    )  # fmt: skip
    job_max_trials: int = option(
        DEFAULT_MAX_TRIALS, flag="--job-max-trials", key="job_max_trials", rule=Int(0, 100_000),
        help="trial directives a job-mode session may have accepted per window",
        doc="trial directives a job-mode session may have accepted per window (more: verdict `trial_budget`)",
    )  # fmt: skip
    job_trial_window_s: float = option(
        DEFAULT_TRIAL_WINDOW_S, flag="--job-trial-window-s", key="job_trial_window_s",
        rule=Float(1.0, 7 * 86400.0), metavar="S", help="the trial budget's sliding window, seconds",
    )  # fmt: skip
    dry_run: bool = option(
        False, flag="--dry-run", key="dry_run", rule=true_or_false, help="decide and meter, never lock",
        doc="decide and meter, never lock (cannot be combined with `--reset-clocks`)",
    )  # fmt: skip
    reset_clocks: bool = option(
        False, flag="--reset-clocks", key=None, rule=true_or_false,
        help="reset every GPU, then exit",
        doc="reset every GPU of the node whatever the ledger says (a corrupt ledger is set aside), then exit",
    )  # fmt: skip
    log_format: str | None = option(
        None, flag="--log-format", key="log_format", rule=Choice(LOG_FORMATS),
        shown_default="JSON unless stderr is a terminal", help="json or console", doc="`json` or `console`",
    )  # fmt: skip
    debug: bool = option(
        False, flag="--debug", key=None, rule=true_or_false, help="debug logs and tracebacks",
        doc="debug logs; tracebacks for start-up errors",
    )  # fmt: skip

    grace_s: float = option(
        5.0, flag=None, key="grace_s", rule=Float(0.0, 600.0), help="grace period for in-flight RPCs at stop"
    )
    max_message_bytes: int = option(
        DEFAULT_MAX_MESSAGE_BYTES, flag=None, key="max_message_bytes", rule=Int(1024, 64 * 1024 * 1024),
        help="largest request accepted (larger: RESOURCE_EXHAUSTED)",
    )  # fmt: skip
    max_workers: int = 128
    """Threads of the shared worker socket's server (no option)."""


CONFIG_FILE = Option(
    flag="--config", key=None, rule=path, metavar="FILE", shown_default="none",
    help="TOML config file; flags override it", doc="TOML file; flags override it (see below)",
)  # fmt: skip
"""The one flag that is no Config field: where the other options' file is."""


def options() -> Iterator[tuple[str, Option]]:
    """Every option as (Config field name, Option), in declaration order."""
    for f in dataclasses.fields(Config):
        spec = f.metadata.get("option")
        if spec is not None:
            yield f.name, spec
