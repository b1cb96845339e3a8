"""Prometheus metrics for eerld: a collector that reads the daemon at scrape time, plus RPC hooks.

Why a collector rather than gauges set on every event: GPU power, clocks and energy change continuously,
so they are read when Prometheus asks and never go stale; session metrics appear and disappear with their
sessions without any clean-up code. Everything lives in an own :class:`CollectorRegistry` (no global
state), and the HTTP server binds an explicit address, 127.0.0.1:9478 by default (the library default is
every interface; 9400 is dcgm-exporter's port and 9100 node-exporter's).

The HTTP server is eerld's own (:class:`_HttpServer`), because the endpoint is reachable by every local
user (and, on ``0.0.0.0``, by the monitoring network) while the daemon runs as root: a selector loop and
two worker threads, so a connection costs a descriptor and a buffer, never a thread; at most
:data:`METRICS_MAX_CONNECTIONS` open, each with a deadline to send its request and one in all. The
thread-per-connection server of the library spent one thread per idle connection, with no cap and no
timeout.

The daemon meets this module at :class:`MetricsSource`: one method returning a :class:`MetricsSnapshot`
of plain values. :func:`start_metrics_server` accepts either such a source or the daemon itself
(adapted by :class:`DaemonMetricsSource` through its ``status()``). For the daemon, the server also
subscribes to its RPC and phase observers, which feed :meth:`EerlMetrics.observe_rpc`,
:meth:`EerlMetrics.observe_phase_event` and :meth:`EerlMetrics.observe_phase`: the only metrics kept in
process.

GPU series carry dcgm-exporter's labels (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``,
``Hostname``) so that dashboards can join them with ``DCGM_FI_*`` series. Session series are labelled by
``job_id``, ``rank``, ``gpus`` and ``phase``, never by session id: the session id is a bearer token.
"""

from __future__ import annotations

import contextlib
import enum
import io
import logging
import os
import queue
import selectors
import socket
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from wsgiref.simple_server import WSGIRequestHandler

from eerl.phases import ControllerState, PhaseKind
from prometheus_client import CollectorRegistry, Counter, Histogram, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.registry import Collector

from eerld.errors import ConfigError

if TYPE_CHECKING:
    from wsgiref.types import WSGIApplication

    from eerld.daemon import Daemon, PhaseRecord, StatusView

__all__ = [
    "DEFAULT_METRICS_ADDRESS",
    "DEFAULT_METRICS_PORT",
    "METRICS_CONNECTION_TIMEOUT_S",
    "METRICS_MAX_CONNECTIONS",
    "METRICS_MAX_REQUEST_BYTES",
    "METRICS_REQUEST_TIMEOUT_S",
    "DaemonMetricsSource",
    "DaemonSample",
    "EerlCollector",
    "EerlMetrics",
    "GpuSample",
    "MetricsServer",
    "MetricsSnapshot",
    "MetricsSource",
    "PhaseSample",
    "SessionSample",
    "parse_address",
    "snapshot_from_status",
    "start_metrics_server",
]

_log = logging.getLogger(__name__)

DEFAULT_METRICS_PORT = 9478
DEFAULT_METRICS_ADDRESS = f"127.0.0.1:{DEFAULT_METRICS_PORT}"
METRICS_MAX_CONNECTIONS = 16
"""Connections ``/metrics`` holds open at once; each costs a descriptor and a buffer, never a thread."""
METRICS_REQUEST_TIMEOUT_S = 5.0
"""Time a connection has, from being accepted, to send its request line and headers."""
METRICS_CONNECTION_TIMEOUT_S = 10.0
"""Time a connection may stay open in all, its answer included."""
METRICS_MAX_REQUEST_BYTES = 8192
"""Request line plus headers; a longer request is answered 431. No request body is ever read."""

_MHZ_TO_HZ = 1_000_000.0
_GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname")
# ``gpus`` keeps series unique when one job rank holds two sessions (async pools): claims are exclusive.
_PHASE_LABELS = ("job_id", "rank", "gpus", "phase", "Hostname")

# Phase events take milliseconds (a clock lock is ~1-10 ms on hardware); RPCs up to seconds.
_PHASE_EVENT_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_RPC_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


@dataclass(frozen=True, slots=True)
class GpuSample:
    """One GPU as the daemon sees it at scrape time."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str
    energy_j: float
    """The GPU's total energy counter (since the driver loaded)."""
    power_w: float
    power_limit_w: float
    sm_clock_mhz: int
    """SM clock that holds now."""
    locked_sm_clock_mhz: int | None
    """The SM clock lock in force; None on the default governor."""
    admin_pinned: bool = False
    degraded_reason: str = ""
    """Non-empty when the GPU is degraded."""


@dataclass(frozen=True, slots=True)
class PhaseSample:
    """A session's controller view of one phase kind."""

    kind: PhaseKind
    state: ControllerState
    sm_clock_mhz: int | None
    """Clock chosen for the phase; None for the default governor."""
    phases: int = 0
    energy_j: float = 0.0
    valid_tokens: int = 0
    energy_per_valid_token_j: float = 0.0
    throughput_tokens_per_s: float = 0.0
    estimated_savings_fraction: float = 0.0
    exploration_cost_j: float = 0.0
    predictor_error_fraction: float = 0.0


@dataclass(frozen=True, slots=True)
class SessionSample:
    """An open session (identified by job and rank; the session id is a secret)."""

    job_id: str
    rank: int
    gpu_indices: tuple[int, ...]
    mode: str
    """"sync" or "async"."""
    phases: tuple[PhaseSample, ...] = ()


@dataclass(frozen=True, slots=True)
class DaemonSample:
    """Facts about the daemon itself."""

    version: str
    backend: str
    controller: str
    dry_run: bool
    hostname: str
    started_at_unix_s: float


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """Everything one scrape reports, read in one go so that the numbers agree with each other."""

    daemon: DaemonSample
    gpus: tuple[GpuSample, ...] = ()
    sessions: tuple[SessionSample, ...] = ()


@runtime_checkable
class MetricsSource(Protocol):
    """What the metrics need from the daemon: one consistent snapshot, taken at scrape time."""

    def metrics_snapshot(self) -> MetricsSnapshot:
        """Read the GPUs and sessions now. May raise an :class:`eerld.errors.EerlError`."""
        ...


class EerlCollector(Collector):
    """Turns a :class:`MetricsSnapshot` into metric families at scrape time."""

    def __init__(self, source: MetricsSource, *, hostname: str | None = None) -> None:
        """``hostname`` overrides the daemon's for the ``Hostname`` label (in Kubernetes: the node name)."""
        self._source = source
        self._hostname = hostname
        self._collect_errors = 0
        self._lock = threading.Lock()

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: describing would call the daemon at registration time."""
        return ()

    def collect(self) -> Iterable[Metric]:
        """Read the source once and yield every family; a failing read yields only the error counter."""
        try:
            snapshot = self._source.metrics_snapshot()
        except Exception:
            _log.exception("metrics: reading the daemon failed")
            with self._lock:
                self._collect_errors += 1
            snapshot = None
        errors = CounterMetricFamily(
            "eerl_metrics_collect_errors",
            "Scrapes during which reading the daemon failed.",
        )
        with self._lock:
            errors.add_metric([], float(self._collect_errors))
        yield errors
        if snapshot is None:
            return
        hostname = self._hostname or snapshot.daemon.hostname
        yield from _daemon_families(snapshot.daemon, hostname)
        yield from _gpu_families(snapshot.gpus, hostname)
        yield from _session_families(snapshot.sessions, hostname)


def _daemon_families(daemon: DaemonSample, hostname: str) -> Iterator[Metric]:
    build = InfoMetricFamily("eerl_build", "eerld version, GPU backend and controller in use.")
    build.add_metric(
        [],
        {
            "version": daemon.version,
            "backend": daemon.backend,
            "controller": daemon.controller,
            "Hostname": hostname,
        },
    )
    yield build
    start = GaugeMetricFamily(
        "eerl_daemon_start_time_seconds", "When eerld started, seconds since the Unix epoch."
    )
    start.add_metric([], daemon.started_at_unix_s)
    yield start
    dry_run = GaugeMetricFamily("eerl_daemon_dry_run", "1 when eerld decides clocks but never applies them.")
    dry_run.add_metric([], 1.0 if daemon.dry_run else 0.0)
    yield dry_run


def _gpu_families(gpus: Iterable[GpuSample], hostname: str) -> Iterator[Metric]:
    energy = CounterMetricFamily(
        "eerl_gpu_energy_joules", "GPU energy counter since the driver loaded.", labels=_GPU_LABELS
    )
    power = GaugeMetricFamily("eerl_gpu_power_watts", "GPU power draw.", labels=_GPU_LABELS)
    power_limit = GaugeMetricFamily(
        "eerl_gpu_power_limit_watts", "Enforced GPU board power limit.", labels=_GPU_LABELS
    )
    sm_clock = GaugeMetricFamily("eerl_gpu_sm_clock_hertz", "SM clock that holds now.", labels=_GPU_LABELS)
    locked_clock = GaugeMetricFamily(
        "eerl_gpu_locked_sm_clock_hertz",
        "SM clock lock in force (absent on the default governor).",
        labels=_GPU_LABELS,
    )
    locked = GaugeMetricFamily("eerl_gpu_locked", "1 when the SM clock is locked.", labels=_GPU_LABELS)
    pinned = GaugeMetricFamily(
        "eerl_gpu_admin_pinned", "1 when an administrator's pin holds the GPU.", labels=_GPU_LABELS
    )
    degraded = GaugeMetricFamily(
        "eerl_gpu_degraded", "1 when a backend error degraded the GPU.", labels=_GPU_LABELS
    )
    for gpu in gpus:
        labels = [
            str(gpu.index),
            gpu.uuid,
            gpu.pci_bus_id,
            f"nvidia{gpu.index}",
            gpu.name,
            hostname,
        ]
        energy.add_metric(labels, gpu.energy_j)
        power.add_metric(labels, gpu.power_w)
        power_limit.add_metric(labels, gpu.power_limit_w)
        sm_clock.add_metric(labels, gpu.sm_clock_mhz * _MHZ_TO_HZ)
        if gpu.locked_sm_clock_mhz is not None:
            locked_clock.add_metric(labels, gpu.locked_sm_clock_mhz * _MHZ_TO_HZ)
        locked.add_metric(labels, 0.0 if gpu.locked_sm_clock_mhz is None else 1.0)
        pinned.add_metric(labels, 1.0 if gpu.admin_pinned else 0.0)
        degraded.add_metric(labels, 1.0 if gpu.degraded_reason else 0.0)
    yield from (energy, power, power_limit, sm_clock, locked_clock, locked, pinned, degraded)


def _session_families(sessions: Iterable[SessionSample], hostname: str) -> Iterator[Metric]:
    sessions = tuple(sessions)
    open_sessions = GaugeMetricFamily("eerl_sessions", "Open sessions.")
    open_sessions.add_metric([], float(len(sessions)))
    yield open_sessions

    info = InfoMetricFamily(
        "eerl_session",
        "An open session and its execution mode.",
        labels=("job_id", "rank", "gpus", "Hostname"),
    )
    per_phase: dict[str, GaugeMetricFamily | CounterMetricFamily] = {
        "eerl_session_phases": CounterMetricFamily(
            "eerl_session_phases", "Phases metered so far.", labels=_PHASE_LABELS
        ),
        "eerl_session_energy_joules": CounterMetricFamily(
            "eerl_session_energy_joules", "Energy of the metered phases.", labels=_PHASE_LABELS
        ),
        "eerl_session_valid_tokens": CounterMetricFamily(
            "eerl_session_valid_tokens", "Valid training tokens credited to the phases.", labels=_PHASE_LABELS
        ),
        "eerl_session_energy_per_valid_token_joules": GaugeMetricFamily(
            "eerl_session_energy_per_valid_token_joules",
            "Energy per valid training token over the recent window.",
            labels=_PHASE_LABELS,
        ),
        "eerl_session_throughput_tokens_per_second": GaugeMetricFamily(
            "eerl_session_throughput_tokens_per_second",
            "Token throughput over the recent window.",
            labels=_PHASE_LABELS,
        ),
        "eerl_session_sm_clock_hertz": GaugeMetricFamily(
            "eerl_session_sm_clock_hertz",
            "SM clock the controller chose for the phase (absent for the default governor).",
            labels=_PHASE_LABELS,
        ),
        "eerl_session_estimated_savings_ratio": GaugeMetricFamily(
            "eerl_session_estimated_savings_ratio",
            "Estimated fraction of energy saved against the predicted default governor.",
            labels=_PHASE_LABELS,
        ),
        "eerl_session_exploration_cost_joules": GaugeMetricFamily(
            "eerl_session_exploration_cost_joules",
            "Energy spent on trial clocks that missed the throughput threshold.",
            labels=_PHASE_LABELS,
        ),
        "eerl_session_predictor_error_ratio": GaugeMetricFamily(
            "eerl_session_predictor_error_ratio",
            "Median absolute relative error of the baseline predictor.",
            labels=_PHASE_LABELS,
        ),
    }
    state = StateSetMetricFamily(
        "eerl_session_controller_state", "The controller's state for the phase.", labels=_PHASE_LABELS
    )
    for session in sessions:
        gpus = ",".join(str(i) for i in session.gpu_indices)
        info.add_metric([session.job_id, str(session.rank), gpus, hostname], {"mode": session.mode})
        for phase in session.phases:
            labels = [session.job_id, str(session.rank), gpus, phase.kind.value, hostname]
            values: Mapping[str, float | None] = {
                "eerl_session_phases": float(phase.phases),
                "eerl_session_energy_joules": phase.energy_j,
                "eerl_session_valid_tokens": float(phase.valid_tokens),
                "eerl_session_energy_per_valid_token_joules": phase.energy_per_valid_token_j,
                "eerl_session_throughput_tokens_per_second": phase.throughput_tokens_per_s,
                "eerl_session_sm_clock_hertz": (
                    None if phase.sm_clock_mhz is None else phase.sm_clock_mhz * _MHZ_TO_HZ
                ),
                "eerl_session_estimated_savings_ratio": phase.estimated_savings_fraction,
                "eerl_session_exploration_cost_joules": phase.exploration_cost_j,
                "eerl_session_predictor_error_ratio": phase.predictor_error_fraction,
            }
            for name, value in values.items():
                if value is not None:
                    per_phase[name].add_metric(labels, value)
            state.add_metric(labels, {s.value: s is phase.state for s in ControllerState})
    yield info
    yield from per_phase.values()
    yield state


@dataclass
class EerlMetrics:
    """The registry of one daemon: the scrape-time collector plus the in-process RPC metrics.

    Create one per daemon (tests create many); nothing here is module-global.
    """

    source: MetricsSource
    hostname: str | None = None
    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=False))

    def __post_init__(self) -> None:
        self.registry.register(EerlCollector(self.source, hostname=self.hostname))
        self._rpcs = Counter(
            "eerl_rpc_requests",
            "RPCs handled, by method and gRPC status code.",
            labelnames=("method", "code"),
            registry=self.registry,
        )
        self._rpc_duration = Histogram(
            "eerl_rpc_duration_seconds",
            "Time eerld took to handle an RPC, by method.",
            labelnames=("method",),
            buckets=_RPC_BUCKETS_S,
            registry=self.registry,
        )
        self._phase_event_duration = Histogram(
            "eerl_phase_event_duration_seconds",
            "Time from receiving a phase event to having applied its decision (begin) or metered it (end).",
            labelnames=("event",),
            buckets=_PHASE_EVENT_BUCKETS_S,
            registry=self.registry,
        )
        # Node totals per phase kind: no job label, so closed sessions keep counting and the
        # cardinality stays fixed; rate(energy) / rate(valid tokens) is the node's J per valid token.
        self._phases = Counter(
            "eerl_phases", "Phases metered on this node.", labelnames=("phase",), registry=self.registry
        )
        self._phase_energy = Counter(
            "eerl_phase_energy_joules",
            "Energy of the phases metered on this node.",
            labelnames=("phase",),
            registry=self.registry,
        )
        self._phase_valid_tokens = Counter(
            "eerl_phase_valid_tokens",
            "Valid training tokens credited to the phases metered on this node.",
            labelnames=("phase",),
            registry=self.registry,
        )
        self._phase_duration = Counter(
            "eerl_phase_duration_seconds",
            "Wall time of the phases metered on this node.",
            labelnames=("phase",),
            registry=self.registry,
        )

    def observe_rpc(self, method: str, code: str, duration_s: float) -> None:
        """Count one handled RPC, e.g. ``observe_rpc("BeginPhase", "OK", 0.003)``.

        ``method`` is the short RPC name and ``code`` the gRPC status code's name (``"OK"``,
        ``"INVALID_ARGUMENT"`` …); both are bounded sets, so the label cardinality stays small.
        """
        self._rpcs.labels(method=method, code=code).inc()
        self._rpc_duration.labels(method=method).observe(max(duration_s, 0.0))

    def observe_phase_event(self, event: str, duration_s: float) -> None:
        """Record the latency of one phase event: ``event`` is ``"begin"`` or ``"end"``."""
        self._phase_event_duration.labels(event=event).observe(max(duration_s, 0.0))

    def observe_phase(self, kind: PhaseKind, energy_j: float, valid_tokens: int, duration_s: float) -> None:
        """Add one metered phase to the node's totals (which outlive the session that ran it)."""
        labels = {"phase": kind.value}
        self._phases.labels(**labels).inc()
        self._phase_energy.labels(**labels).inc(max(energy_j, 0.0))
        self._phase_valid_tokens.labels(**labels).inc(max(valid_tokens, 0))
        self._phase_duration.labels(**labels).inc(max(duration_s, 0.0))


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; :meth:`close` stops it. The observation hooks are on ``metrics``."""

    metrics: EerlMetrics
    host: str
    port: int
    _server: _HttpServer
    _detach: list[Any] = field(default_factory=list)

    def close(self) -> None:
        """Stop serving, detach from the daemon and release the port; idempotent."""
        while self._detach:
            self._detach.pop()()
        self._server.close()


def parse_address(address: str) -> tuple[str, int]:
    """Split ``"host:port"`` (``"[::1]:9478"`` for IPv6); port 0 picks a free port.

    Raises :class:`ConfigError` naming the flag's expected form.
    """
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ConfigError(f"--metrics-address: expected HOST:PORT, got {address!r}")
    port = int(port_text)
    if port > 65535:
        raise ConfigError(f"--metrics-address: port {port} is out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


def start_metrics_server(
    daemon: object,
    address: str = DEFAULT_METRICS_ADDRESS,
    *,
    hostname: str | None = None,
    max_connections: int = METRICS_MAX_CONNECTIONS,
    request_timeout_s: float = METRICS_REQUEST_TIMEOUT_S,
    connection_timeout_s: float = METRICS_CONNECTION_TIMEOUT_S,
    max_request_bytes: int = METRICS_MAX_REQUEST_BYTES,
) -> MetricsServer:
    """Serve ``/metrics`` for ``daemon`` on ``address`` in background threads.

    ``daemon`` is a :class:`MetricsSource`, or the eerld :class:`~eerld.daemon.Daemon`, which is adapted
    to one and whose RPC and phase observers then feed the in-process metrics. ``hostname`` overrides the
    ``Hostname`` label; when None, ``$NODE_NAME`` does (set from the downward API in Kubernetes, where the
    host name is the pod's), else the daemon's host name.

    What a connection may cost is bounded: at most ``max_connections`` are open at once (one more closes
    the oldest that has not yet sent its request, or is refused with 503 when every one is being answered);
    each has ``request_timeout_s`` from being accepted to send its request line and headers, at most
    ``max_request_bytes`` of them (no body is read), and ``connection_timeout_s`` in all. A connection
    costs a file descriptor and a buffer, never a thread. Raises :class:`ConfigError` when the address is
    malformed or cannot be bound, or a limit is not positive.
    """
    limits = _Limits(max_connections, request_timeout_s, connection_timeout_s, max_request_bytes)
    source = daemon if isinstance(daemon, MetricsSource) else _adapt(daemon)
    metrics = EerlMetrics(source, hostname=hostname or os.environ.get("NODE_NAME") or None)
    host, port = parse_address(address)
    try:
        server = _HttpServer(host, port, make_wsgi_app(metrics.registry), limits)
    except OSError as e:
        raise ConfigError(f"--metrics-address: cannot listen on {address}: {e.strerror or e}") from e
    server.start()
    handle = MetricsServer(metrics=metrics, host=host, port=server.port, _server=server)
    if isinstance(source, DaemonMetricsSource):
        handle._detach.extend(_attach_observers(source.daemon, metrics))
    return handle


# --------------------------------------------------------------------------- the HTTP server

_WORKERS = 2
"""Threads that build answers; a scrape takes milliseconds and Prometheus scrapes every few seconds."""
_ACCEPT_BACKLOG = 1024
"""Connections the kernel queues before the loop accepts them: kernel memory, at no cost to the daemon;
a deep queue keeps a burst of connections from dropping (and so delaying by a second) a scrape's SYN."""
_RECV_BYTES = 4096
_STOP_JOIN_S = 1.0
"""How long :meth:`_HttpServer.close` waits for a worker inside a slow scrape (they are daemon threads)."""


def _plain_reply(status: str, text: str) -> bytes:
    """A whole HTTP/1.0 answer with a text body, for the answers the loop gives without the app."""
    body = text.encode()
    head = f"HTTP/1.0 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


_BUSY = _plain_reply("503 Service Unavailable", "/metrics is busy; retry later.\n")
_TOO_LARGE = _plain_reply("431 Request Header Fields Too Large", "Request line and headers are too large.\n")


@dataclass(frozen=True, slots=True)
class _Limits:
    """What one connection may cost; see :func:`start_metrics_server`."""

    max_connections: int
    request_timeout_s: float
    connection_timeout_s: float
    max_request_bytes: int

    def __post_init__(self) -> None:
        for name in ("max_connections", "request_timeout_s", "connection_timeout_s", "max_request_bytes"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"metrics: {name} must be positive, got {getattr(self, name)!r}")


class _State(enum.Enum):
    READING = "reading"
    """Registered for reading, until the request line and headers are in."""
    ANSWERING = "answering"
    """Queued for, or in, a worker; not registered."""
    WRITING = "writing"
    """Registered for writing, until the answer is out."""
    CLOSED = "closed"


@dataclass(eq=False, slots=True)
class _Connection:
    """One client connection; only the loop thread touches it (workers read ``state`` as a hint)."""

    sock: socket.socket
    peer: tuple[Any, ...]
    read_deadline: float
    deadline: float
    state: _State = _State.READING
    request: bytearray = field(default_factory=bytearray)
    answer: bytes = b""
    sent: int = 0

    def expires_at(self) -> float:
        return min(self.read_deadline, self.deadline) if self.state is _State.READING else self.deadline


class _HttpServer:
    """HTTP/1.0 for ``/metrics`` where a connection costs a descriptor and a buffer, never a thread.

    One thread (``eerl-metrics``) runs a selector loop that never blocks on a client: it accepts, reads each
    request line and headers without blocking, enforces the limits and deadlines, and writes each answer
    without blocking. :data:`_WORKERS` threads run the WSGI app on a request read in full (wsgiref's own
    request handler on in-memory buffers, so status line, headers, gzip and error pages are what the
    thread-per-connection server it replaces sent). One request per connection, then close (HTTP/1.0).
    """

    def __init__(self, host: str, port: int, app: WSGIApplication, limits: _Limits) -> None:
        self._limits = limits
        self._app = app
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(_ACCEPT_BACKLOG)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        bound_host, self.port = listener.getsockname()[:2]
        # What wsgiref's WSGIServer.setup_environ puts in every request's environment.
        self._base_environ = {
            "SERVER_NAME": socket.getfqdn(bound_host),
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PORT": str(self.port),
            "REMOTE_HOST": "",
            "CONTENT_LENGTH": "",
            "SCRIPT_NAME": "",
        }
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ, _Listener.ACCEPT)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _Listener.WAKE)
        self._connections: dict[int, _Connection] = {}
        self._accept_paused_until: float | None = None
        self._accept_failing = False
        self._accepts_per_turn = max(1, limits.max_connections // 2)
        self._jobs: queue.Queue[tuple[_Connection, bytes] | None] = queue.Queue(limits.max_connections)
        self._answers: queue.SimpleQueue[tuple[_Connection, bytes]] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._loop = threading.Thread(target=self._run, name="eerl-metrics", daemon=True)
        self._workers = [
            threading.Thread(target=self._work, name=f"eerl-metrics-worker-{i}", daemon=True)
            for i in range(_WORKERS)
        ]

    def start(self) -> None:
        for worker in self._workers:
            worker.start()
        self._loop.start()

    def close(self) -> None:
        """Stop the loop and the workers, close every connection and the port; idempotent."""
        self._stopping.set()
        self._wake()
        for _ in self._workers:
            with contextlib.suppress(queue.Full):
                self._jobs.put_nowait(None)
        if self._loop.ident is None:  # never started
            self._shut()
        elif self._loop is not threading.current_thread():
            self._loop.join()
        give_up_at = time.monotonic() + _STOP_JOIN_S
        for worker in self._workers:
            if worker.ident is not None and worker is not threading.current_thread():
                worker.join(max(0.0, give_up_at - time.monotonic()))
        self._wake_w.close()

    # ----------------------------------------------------------------------- the loop thread

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                ready = self._selector.select(self._timeout_s())
                accept = False
                for key, events in ready:
                    if key.data is _Listener.ACCEPT:
                        accept = True
                    elif key.data is _Listener.WAKE:
                        self._drain_wake()
                    else:
                        self._serve(key.data, events)
                self._take_answers()
                if accept:  # after reading: a request already in must not be evicted by newcomers
                    self._accept()
                self._expire()
        except Exception:
            _log.exception("metrics: the HTTP server failed; /metrics is down")
        finally:
            self._shut()

    def _timeout_s(self) -> float | None:
        deadlines = [c.expires_at() for c in self._connections.values()]
        if self._accept_paused_until is not None:
            deadlines.append(self._accept_paused_until)
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _accept(self) -> None:
        for _ in range(self._accepts_per_turn):
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as e:  # EMFILE, ENFILE, ENOBUFS: stop listening a moment rather than spin
                if not self._accept_failing:
                    _log.warning("metrics: cannot accept connections: %s", e)
                self._accept_failing = True
                self._selector.unregister(self._listener)
                self._accept_paused_until = time.monotonic() + 0.1
                return
            self._accept_failing = False
            self._admit(sock, peer)

    def _admit(self, sock: socket.socket, peer: tuple[Any, ...]) -> None:
        sock.setblocking(False)
        if len(self._connections) >= self._limits.max_connections:
            waiting = [c for c in self._connections.values() if c.state is _State.READING]
            if not waiting:  # every slot is being answered: refuse at once
                with contextlib.suppress(OSError):  # a request left unread would reset the 503
                    sock.recv(self._limits.max_request_bytes)
                with contextlib.suppress(OSError):
                    sock.send(_BUSY)
                    sock.shutdown(socket.SHUT_WR)
                sock.close()
                return
            self._close(min(waiting, key=lambda c: c.read_deadline))
        now = time.monotonic()
        conn = _Connection(
            sock,
            peer,
            read_deadline=now + self._limits.request_timeout_s,
            deadline=now + self._limits.connection_timeout_s,
        )
        self._connections[sock.fileno()] = conn
        self._selector.register(sock, selectors.EVENT_READ, conn)
        self._serve(conn, selectors.EVENT_READ)  # the request is often in already

    def _serve(self, conn: _Connection, events: int) -> None:
        try:
            if conn.state is _State.READING and events & selectors.EVENT_READ:
                self._read(conn)
            elif conn.state is _State.WRITING and events & selectors.EVENT_WRITE:
                self._write(conn)
        except OSError:  # reset by the peer, or any other failure of this one connection
            self._close(conn)

    def _read(self, conn: _Connection) -> None:
        limit = self._limits.max_request_bytes
        while True:
            try:
                chunk = conn.sock.recv(_RECV_BYTES)
            except BlockingIOError:
                return
            if not chunk:
                self._close(conn)
                return
            conn.request += chunk
            end = _end_of_headers(conn.request)
            if end is not None and end <= limit:
                self._dispatch(conn, bytes(conn.request[:end]))
                return
            if len(conn.request) > limit:
                self._reply(conn, _TOO_LARGE)
                return

    def _dispatch(self, conn: _Connection, request: bytes) -> None:
        self._selector.unregister(conn.sock)
        conn.state = _State.ANSWERING
        conn.request = bytearray()
        try:
            self._jobs.put_nowait((conn, request))
        except queue.Full:  # the workers are stuck (a hung GPU read): answer at once rather than queue
            self._reply(conn, _BUSY)

    def _take_answers(self) -> None:
        while True:
            try:
                conn, answer = self._answers.get_nowait()
            except queue.Empty:
                return
            if conn.state is _State.ANSWERING:
                self._reply(conn, answer)

    def _reply(self, conn: _Connection, answer: bytes) -> None:
        if not answer:
            self._close(conn)
            return
        if conn.state is _State.READING:
            self._selector.unregister(conn.sock)
        conn.state, conn.answer, conn.sent = _State.WRITING, answer, 0
        self._selector.register(conn.sock, selectors.EVENT_WRITE, conn)
        self._serve(conn, selectors.EVENT_WRITE)

    def _write(self, conn: _Connection) -> None:
        view = memoryview(conn.answer)
        while conn.sent < len(view):
            try:
                conn.sent += conn.sock.send(view[conn.sent :])
            except BlockingIOError:
                return
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_WR)
        self._close(conn)

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self._connections.values() if c.expires_at() <= now]:
            self._close(conn)
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._accept_paused_until = None
            self._selector.register(self._listener, selectors.EVENT_READ, _Listener.ACCEPT)

    def _close(self, conn: _Connection) -> None:
        if conn.state is _State.CLOSED:
            return
        if conn.state is not _State.ANSWERING:
            self._selector.unregister(conn.sock)
        del self._connections[conn.sock.fileno()]
        conn.state = _State.CLOSED
        conn.sock.close()

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(_RECV_BYTES):
                pass

    def _shut(self) -> None:
        for conn in list(self._connections.values()):
            self._close(conn)
        self._selector.close()
        self._listener.close()
        self._wake_r.close()

    # ----------------------------------------------------------------------- the worker threads

    def _work(self) -> None:
        while not self._stopping.is_set():
            job = self._jobs.get()
            if job is None:
                return
            conn, request = job
            if conn.state is not _State.ANSWERING:  # timed out while queued
                continue
            try:
                answer = _BufferedHandler(request, conn.peer, self._base_environ, self._app).answer()
            except Exception:
                _log.exception("metrics: answering a scrape failed")
                answer = b""
            self._answers.put((conn, answer))
            self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: a wake-up is pending anyway; closed: stopped
            self._wake_w.send(b"\0")


class _Listener(enum.Enum):
    """Selector keys that are not connections."""

    ACCEPT = "accept"
    WAKE = "wake"


def _end_of_headers(request: bytearray) -> int | None:
    """Where the request line and headers end, or None while they have not all come.

    They end at the first empty line, ``\\r\\n`` or a bare ``\\n``, as :mod:`http.client` reads them.
    """
    ends = [i + len(mark) for mark in (b"\n\r\n", b"\n\n") if (i := request.find(mark)) >= 0]
    return min(ends) if ends else None


class _Gateway:
    """What wsgiref's request handler asks of its server: the base environment and the application."""

    def __init__(self, base_environ: dict[str, str], app: WSGIApplication) -> None:
        self.base_environ = base_environ
        self._app = app

    def get_app(self) -> WSGIApplication:
        return self._app


class _BufferedHandler(WSGIRequestHandler):
    """wsgiref's request handler on a request read in full, answering into memory instead of a socket."""

    def __init__(
        self, request: bytes, peer: tuple[Any, ...], base_environ: dict[str, str], app: WSGIApplication
    ) -> None:
        # Not BaseRequestHandler.__init__, which would read from and write to the socket itself.
        self.client_address = peer
        self.server = _Gateway(base_environ, app)  # type: ignore[assignment]  # uses only these two
        self.rfile = io.BytesIO(request)
        self._out = self.wfile = io.BytesIO()

    def answer(self) -> bytes:
        """Handle the request; the bytes to send (status line, headers, body)."""
        self.handle()
        return self._out.getvalue()

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood stderr with access-log lines."""


def _adapt(daemon: object) -> DaemonMetricsSource:
    """Wrap the daemon object in a :class:`MetricsSource`."""
    if not callable(getattr(daemon, "status", None)):
        raise ConfigError(f"metrics: {type(daemon).__name__} is neither a MetricsSource nor the eerld Daemon")
    return DaemonMetricsSource(daemon)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- the eerld daemon as a source

_PHASE_EVENT_RPCS = {"BeginPhase": "begin", "EndPhase": "end"}


class DaemonMetricsSource:
    """The eerld :class:`~eerld.daemon.Daemon` seen through :class:`MetricsSource` (its ``status()``)."""

    def __init__(self, daemon: Daemon, *, wall_clock: Callable[[], float] = time.time) -> None:
        self.daemon = daemon
        self._wall = wall_clock

    def metrics_snapshot(self) -> MetricsSnapshot:
        """One ``Daemon.status()`` call, converted."""
        return snapshot_from_status(self.daemon.status(), now_unix_s=self._wall())


def snapshot_from_status(status: StatusView, *, now_unix_s: float) -> MetricsSnapshot:
    """Convert the daemon's Status view (pure; ``now_unix_s`` turns uptime into a start time)."""
    d = status.daemon
    daemon = DaemonSample(
        version=d.version,
        backend=d.backend,
        controller=d.controller,
        dry_run=d.dry_run,
        hostname=d.hostname,
        started_at_unix_s=float(round(now_unix_s - d.uptime_s)),
    )
    gpus = tuple(
        GpuSample(
            index=g.info.index,
            uuid=g.info.uuid,
            name=g.info.name,
            pci_bus_id=g.info.pci_bus_id,
            energy_j=g.energy_mj / 1000.0,
            power_w=g.power_w,
            power_limit_w=g.power_limit_w,
            sm_clock_mhz=g.sm_clock_mhz,
            locked_sm_clock_mhz=g.locked_sm_clock_mhz,
            admin_pinned=g.pin is not None,
            degraded_reason=g.degraded_reason,
        )
        for g in status.gpus
    )
    sessions = tuple(
        SessionSample(
            job_id=s.job_id,
            rank=s.rank,
            gpu_indices=tuple(s.gpu_indices),
            mode=s.mode.value,
            phases=tuple(
                PhaseSample(
                    kind=p.kind,
                    state=p.state,
                    sm_clock_mhz=p.sm_clock_mhz,
                    phases=p.phases,
                    energy_j=p.energy_mj / 1000.0,
                    valid_tokens=p.valid_tokens,
                    energy_per_valid_token_j=p.energy_per_valid_token_j,
                    throughput_tokens_per_s=p.throughput_tokens_per_s,
                    estimated_savings_fraction=p.estimated_savings_fraction,
                    exploration_cost_j=p.exploration_cost_mj / 1000.0,
                    predictor_error_fraction=p.predictor_error_fraction,
                )
                for p in s.phases
            ),
        )
        for s in status.sessions
    )
    return MetricsSnapshot(daemon=daemon, gpus=gpus, sessions=sessions)


def _attach_observers(daemon: Daemon, metrics: EerlMetrics) -> list[Callable[[], None]]:
    """Subscribe to the daemon's RPC and phase observers; return the callables that unsubscribe."""

    def on_rpc(method: str, code: str, duration_s: float) -> None:
        metrics.observe_rpc(method, code, duration_s)
        event = _PHASE_EVENT_RPCS.get(method)
        if event is not None and code == "OK":
            metrics.observe_phase_event(event, duration_s)

    def on_phase(record: PhaseRecord) -> None:
        metrics.observe_phase(record.kind, record.energy_mj / 1000.0, record.valid_tokens, record.duration_s)

    daemon.rpc_observers.append(on_rpc)
    daemon.phase_observers.append(on_phase)
    return [
        lambda: _discard(daemon.rpc_observers, on_rpc),
        lambda: _discard(daemon.phase_observers, on_phase),
    ]


def _discard(observers: list[Any], observer: object) -> None:
    if observer in observers:
        observers.remove(observer)
