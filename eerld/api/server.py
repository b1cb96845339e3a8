"""Serve what :mod:`eerld.app` built over gRPC: sockets, servers, health, reflection, grant sockets.

:func:`create_server` checks the state directory and the sockets (a live daemon on the path is an error, a
stale file of a dead one is removed), has :func:`eerld.app.build` make the backend and the
:class:`~eerld.daemon.Daemon`, and binds the worker and admin services on separate servers, so that an
admin RPC can never be served on the worker socket; each grant's socket gets a server of its own
(:class:`Server` is the daemon's :class:`~eerld.access.SocketHost`). :meth:`Server.start` recovers the
ledger and starts serving; :meth:`Server.stop` marks health NOT_SERVING, stops with a grace period and
resets every GPU eerld locked. :func:`serve` adds signals.
"""

from __future__ import annotations

import contextlib
import grp
import os
import resource
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import structlog
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from eerld import files
from eerld.api.interceptors import ErrorMappingInterceptor, StreamGuardInterceptor
from eerld.api.podresources import KubeletPodResources
from eerld.api.reflection import REFLECTION_SERVICES, enable_reflection
from eerld.api.servicers import AdminServicer, PhaseServicer
from eerld.app import App, build
from eerld.config import Config
from eerld.errors import ConfigError
from eerld.gpu.base import GpuBackend
from eerld.grants import GRANT_DIR_MODE, OWN_DIRECTORY_SOCKET, SHARED_NAME, Grant, GrantKind
from eerld.pods.owners import GpuOwners
from eerld.pods.watch import PodClaimWatch
from eerld.sdnotify import sd_notify
from eerld.signals import serve_until_signal

log = structlog.get_logger("eerld.server")

WORKER_SOCKET_MODE = 0o660
ADMIN_SOCKET_MODE = 0o600
ADMIN_GROUP_SOCKET_MODE = 0o660
GPU_SOCKET_DIR_MODE = 0o700
"""Root only: a per-GPU socket (mode 0666, in a 0711 directory of its GPU) is reached only where a CDI spec
mounts its GPU's directory into a container."""
PHASE_SERVICE = pb.DESCRIPTOR.services_by_name["PhaseService"].full_name
ADMIN_SERVICE = pb.DESCRIPTOR.services_by_name["AdminService"].full_name
ATTACH_METHOD = f"/{PHASE_SERVICE}/Attach"
HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
WORKER_SERVICES = (PHASE_SERVICE, HEALTH_SERVICE, *REFLECTION_SERVICES)
ADMIN_SERVICES = (ADMIN_SERVICE, HEALTH_SERVICE, *REFLECTION_SERVICES)
ADMIN_WORKERS = 8
GRANT_BASE_WORKERS = 4
"""A grant's socket has this many threads plus two per GPU: each session's Attach stream holds one, and a
node's GPUs bound its sessions (not capped: a cap below the GPUs left a large grant's sessions no thread)."""
MAX_STREAMS_PER_CONNECTION = 8
"""HTTP/2 streams one connection may have open at once (a client needs two: Attach and one call)."""
MAX_OPEN_STREAMS = 4
"""Streams other than Attach (reflection, health Watch) one socket serves at once."""
IDLE_CONNECTION_S = 300.0
"""A connection with no call open for this long is closed (a client reconnects by itself)."""
HANDSHAKE_TIMEOUT_S = 10.0
"""A TCP client must finish its TLS handshake within this."""


def prepare_socket_path(path: Path, flag: str) -> None:
    """Make ``path`` bindable: a live daemon is an error, a stale socket is removed, anything else refused."""
    files.ensure_socket_dir(path.parent, flag)
    if files.remove_stale_socket(path, flag, "eerld"):
        log.info("stale_socket_removed", path=str(path))


@contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _secure_socket(path: Path, mode: int, uid: int | None, gid: int | None) -> None:
    """Hand the socket eerld just bound to its owner and mode, never following a symlink."""
    files.secure_socket(path, mode, -1 if uid is None else uid, -1 if gid is None else gid, flag=str(path))


@dataclass(slots=True)
class Endpoint:
    """One gRPC server on one socket, with its own worker threads: one caller's flood stays on its socket."""

    name: str
    server: grpc.Server
    socket_path: Path | None
    health: health.HealthServicer
    services: tuple[str, ...]


def server_options(config: Config) -> list[tuple[str, Any]]:
    """Channel arguments of every server: bounded connections and streams, keepalive, idle ones closed.

    Keepalive pings from the server find a client that is gone or stuck (a SIGSTOPped process answers no
    ping): its connection closes, its Attach stream ends, and its GPUs return to default clocks.
    """
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", config.max_message_bytes),
        ("grpc.max_send_message_length", 16 * 1024 * 1024),
        ("grpc.so_reuseport", 0),
        ("grpc.max_concurrent_streams", MAX_STREAMS_PER_CONNECTION),
        ("grpc.max_connection_idle_ms", int(IDLE_CONNECTION_S * 1000)),
        ("grpc.max_allowed_incoming_connections", config.max_connections),
        ("grpc.server_handshake_timeout_ms", int(HANDSHAKE_TIMEOUT_S * 1000)),
        ("grpc.http2.max_ping_strikes", 2),
        ("grpc.http2.min_ping_interval_without_data_ms", 5000),
    ]
    if config.keepalive_s > 0:
        options += [
            ("grpc.keepalive_time_ms", int(config.keepalive_s * 1000)),
            ("grpc.keepalive_timeout_ms", int(config.keepalive_timeout_s * 1000)),
            # The timeout that applies to the ping actually sent (gRPC's own default is 60 s).
            ("grpc.http2.ping_timeout_ms", int(config.keepalive_timeout_s * 1000)),
            ("grpc.keepalive_permit_without_calls", 1),
            ("grpc.http2.max_pings_without_data", 0),
        ]
    return options


class Server:
    """The admin server and one worker server per worker socket (shared, grants, per-GPU) around a Daemon.

    Each socket has a gRPC server of its own, with its own thread pool and concurrency bound, so that
    what one socket's callers do (idle streams, floods) cannot take the threads of another's.
    """

    def __init__(self, app: App, *, reaper: bool = True) -> None:
        self.app = app
        self.config = config = app.config
        self.daemon = daemon = app.daemon
        self._reaper = reaper
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self._endpoints_lock = threading.Lock()
        self._grant_endpoints: dict[str, Endpoint] = {}
        self._serving = False
        self._options = server_options(config)
        worker = self._build(
            SHARED_NAME, WORKER_SERVICES, config.max_workers, PhaseServicer(daemon, SHARED_NAME)
        )
        admin = self._build(
            "admin", ADMIN_SERVICES, ADMIN_WORKERS, AdminServicer(daemon, config.admin_socket_path)
        )
        self.worker, self.worker_health = worker.server, worker.health
        self.admin, self.admin_health = admin.server, admin.health
        self._worker_endpoint, self._admin_endpoint = worker, admin
        self._bind()
        daemon.access.set_host(self)

    def _build(self, name: str, services: tuple[str, ...], workers: int, servicer: Any) -> Endpoint:
        interceptors: list[Any] = [
            ErrorMappingInterceptor(self.daemon.events.rpc_done, services, workers=workers),
            StreamGuardInterceptor(MAX_OPEN_STREAMS, self.config.stream_lifetime_s, exempt=(ATTACH_METHOD,)),
        ]
        server = grpc.server(
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"eerld-{name[:24]}"),
            interceptors=interceptors,
            options=self._options,
            maximum_concurrent_rpcs=workers * 2,
        )
        if PHASE_SERVICE in services:
            pb_grpc.add_PhaseServiceServicer_to_server(servicer, server)
        else:
            pb_grpc.add_AdminServiceServicer_to_server(servicer, server)
        health_servicer = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
        enable_reflection(services, server)
        return Endpoint(name, server, None, health_servicer, services)

    def _bind(self) -> None:
        config = self.config
        shared_gid = _gid(config.socket_group) if config.socket_group else None
        admin_gid = _gid(config.admin_group) if config.admin_group else None
        _bind_unix(self.worker, config.socket_path, WORKER_SOCKET_MODE, None, shared_gid)
        self._worker_endpoint.socket_path = config.socket_path
        admin_mode = ADMIN_GROUP_SOCKET_MODE if config.admin_group else ADMIN_SOCKET_MODE
        _bind_unix(self.admin, config.admin_socket_path, admin_mode, None, admin_gid)
        self._admin_endpoint.socket_path = config.admin_socket_path
        if config.listen is not None:
            assert config.tls_cert is not None
            assert config.tls_key is not None
            assert config.tls_client_ca is not None
            credentials = grpc.ssl_server_credentials(
                [(config.tls_key.read_bytes(), config.tls_cert.read_bytes())],
                root_certificates=config.tls_client_ca.read_bytes(),
                require_client_auth=True,
            )
            port = self.worker.add_secure_port(config.listen, credentials)
            if port == 0:
                raise ConfigError(f"--listen: cannot bind {config.listen}")

    # -- grant sockets (SocketHost) -----------------------------------------------------------------

    def open_socket(self, grant: Grant) -> None:
        """Create the grant's socket (owner and mode from the grant), serve it with its own threads."""
        if grant.kind is GrantKind.SHARED:
            return
        directory = grant.socket_path.parent
        if grant.kind is GrantKind.GPU:
            files.ensure_narrow_dir(directory.parent, "gpu_socket_dir", GPU_SOCKET_DIR_MODE)
            files.ensure_narrow_dir(directory, "gpu_socket_dir", GRANT_DIR_MODE)
        elif grant.own_directory:
            # eerl-csi may have made it already (published while eerld was away): empty, ours, 0711 at most
            files.ensure_narrow_dir(directory.parent, "grant_dir", GRANT_DIR_MODE)
            files.ensure_own_socket_dir(directory, "grant_dir", GRANT_DIR_MODE, OWN_DIRECTORY_SOCKET)
        else:
            files.ensure_narrow_dir(directory, "grant_dir", GRANT_DIR_MODE)
        workers = GRANT_BASE_WORKERS + 2 * len(grant.gpu_uuids)
        endpoint = self._build(grant.name, WORKER_SERVICES, workers, PhaseServicer(self.daemon, grant.name))
        prepare_socket_path(grant.socket_path, f"grant {grant.name}")
        uid = grant.uid if grant.uid is not None else 0
        gid = grant.gid if grant.gid is not None else 0
        try:
            _bind_unix(endpoint.server, grant.socket_path, grant.socket_mode, uid, gid)
        except BaseException:
            endpoint.server.stop(None)
            raise
        endpoint.socket_path = grant.socket_path
        with self._endpoints_lock:
            old = self._grant_endpoints.pop(grant.name, None)
            self._grant_endpoints[grant.name] = endpoint
            if self._serving:
                endpoint.server.start()
                _set_health(endpoint, serving=True)
        if old is not None:
            old.server.stop(None)
        log.info("grant_socket_open", grant=grant.name, socket=str(grant.socket_path), workers=workers)

    def close_socket(self, grant: Grant) -> None:
        """Stop serving the grant's socket at once and remove its file (and its own directory, if any)."""
        with self._endpoints_lock:
            endpoint = self._grant_endpoints.pop(grant.name, None)
        if endpoint is None:
            return
        _set_health(endpoint, serving=False)
        endpoint.server.stop(None)
        if endpoint.socket_path is not None:
            with contextlib.suppress(FileNotFoundError):
                endpoint.socket_path.unlink()
        if grant.own_directory:
            # only this grant's directory, and only when empty (a mount of it elsewhere does not hold it)
            with contextlib.suppress(OSError):
                grant.socket_path.parent.rmdir()
        log.info("grant_socket_closed", grant=grant.name, socket=str(grant.socket_path))

    def _endpoints(self) -> list[Endpoint]:
        with self._endpoints_lock:
            return [self._worker_endpoint, self._admin_endpoint, *self._grant_endpoints.values()]

    # -- life cycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Reset what the ledger names, re-apply pins, serve, then open the grants' sockets."""
        self.daemon.start()
        with self._endpoints_lock:
            self._serving = True
        self.worker.start()
        self.admin.start()
        self.daemon.admin.open_grants()
        for endpoint in self._endpoints():
            _set_health(endpoint, serving=True)
        if self._reaper:
            self.daemon.start_reaper()
        self.app.start_metrics()
        self.app.start_pod_watch()
        log.info(
            "serving",
            socket=str(self.config.socket_path),
            admin_socket=str(self.config.admin_socket_path),
            listen=self.config.listen,
            tenancy=self.config.tenancy,
            grant_sockets=len(self._grant_endpoints),
            controller=self.config.controller,
            backend=self.app.backend.name,
            dry_run=self.config.dry_run,
        )
        sd_notify("READY=1\nSTATUS=serving")

    def stop(self, grace_s: float | None = None) -> None:
        """Health NOT_SERVING, stop serving with a grace period, reset every GPU eerld locked."""
        with self._stop_lock:
            if self._stopped.is_set():
                return
            sd_notify("STOPPING=1")
            endpoints = self._endpoints()
            for endpoint in endpoints:
                _set_health(endpoint, serving=False)
            grace = self.config.grace_s if grace_s is None else grace_s
            done = [e.server.stop(grace) for e in endpoints]
            self.app.stop_pod_watch()  # it ends no session while the daemon closes them all
            self.daemon.shutdown()
            for event in done:
                event.wait(grace + 1)
            for endpoint in endpoints:
                if endpoint.socket_path is not None:
                    with contextlib.suppress(FileNotFoundError):
                        endpoint.socket_path.unlink()
            self.app.close()
            self._stopped.set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until stopped."""
        return self._stopped.wait(timeout_s)


def _set_health(endpoint: Endpoint, *, serving: bool) -> None:
    status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
    endpoint.health.set("", status)
    endpoint.health.set(endpoint.services[0], status)


def _gid(group: str) -> int:
    return grp.getgrnam(group).gr_gid


def _bind_unix(server: grpc.Server, path: Path, mode: int, uid: int | None, gid: int | None) -> None:
    """Bind ``server`` to a Unix socket created 0600 (umask), then hand it to its owner and mode."""
    with _umask(0o177):
        server.add_insecure_port(f"unix:{path}")
    _secure_socket(path, mode, uid, gid)


def create_server(
    config: Config,
    *,
    backend: GpuBackend | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    phase_clock: Callable[[], float] | None = None,
    reaper: bool = True,
) -> Server:
    """Check state directory and sockets, build backend and daemon (:func:`eerld.app.build`), bind both
    servers; nothing is reset or served yet.

    ``backend`` replaces the configured one; ``phase_clock`` times phases, by default the backend's own
    clock when it has one (the simulator's accelerated time), else ``clock``.
    """
    files.ensure_private_dir(config.state_dir, "--state-dir")
    prepare_socket_path(config.socket_path, "--socket")
    prepare_socket_path(config.admin_socket_path, "--admin-socket")
    app = build(config, backend=backend, clock=clock, wall_clock=wall_clock, phase_clock=phase_clock)
    if config.pod_resources_socket is not None:
        _wire_pod_resources(app, config.pod_resources_socket, optional=config.pod_resources_optional)
    try:
        return Server(app, reaper=reaper)
    except BaseException:
        app.close()
        raise


def _wire_pod_resources(app: App, socket_path: Path, *, optional: bool) -> None:
    """The kubelet's pod-resources for the metrics' pod labels (with metrics on) and for the watch that
    ends the sessions of GPUs that left their pod (always).

    The watch's client is strict: a socket that is missing is a kubelet that does not answer (the kubelet
    removes its socket while it restarts), never a listing of no pods; with ``auto`` the watch lists only
    while the socket exists, so that a node without Kubernetes logs nothing.
    """
    if app.config.metrics_address is not None:
        app.pods = GpuOwners(KubeletPodResources(socket_path, optional=optional))
    app.pod_watch = PodClaimWatch(
        app.daemon.book,
        KubeletPodResources(socket_path),
        poll_s=app.config.pod_resources_poll_s,
        present=socket_path.exists if optional else lambda: True,
    )


def serve(server: Server, *, on_started: Callable[[], None] | None = None) -> int:
    """Run until SIGTERM or SIGINT, then stop gracefully (every GPU reset); return the exit code 0.

    ``on_started`` runs once both sockets serve (``eerld --sim`` then says how to reach them)."""
    _raise_open_files_limit()

    def start() -> None:
        server.start()
        if on_started is not None:
            on_started()

    return serve_until_signal(start, server.stop)


def _raise_open_files_limit() -> None:
    """Soft RLIMIT_NOFILE up to the hard limit: every socket's connection cap must fit in it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(
                resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard)
            )
