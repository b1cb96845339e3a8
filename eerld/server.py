"""Build the daemon's gRPC servers apart from running them.

:func:`create_server` checks the sockets (a live daemon on the path is an error, a stale file of a dead
one is removed), creates the backend and the :class:`~eerld.daemon.Daemon`, and binds the worker and
admin services on separate servers, so that an admin RPC can never be served on the worker socket.
:meth:`Server.start` recovers the ledger and starts serving; :meth:`Server.stop` marks health
NOT_SERVING, stops with a grace period and resets every GPU eerld locked. :func:`serve` adds signals.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import importlib
import os
import signal
import socket
import stat
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import grpc
import structlog
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from eerld.api.interceptors import ErrorMappingInterceptor
from eerld.api.servicers import AdminServicer, PhaseServicer
from eerld.clocks.arbiter import AppliedClock, ClockArbiter
from eerld.clocks.ledger import Ledger
from eerld.config import Config
from eerld.control.registry import controller_factory
from eerld.daemon import Daemon
from eerld.errors import ConfigError
from eerld.gpu.base import GpuBackend
from eerld.gpu.energy_sampler import SampledEnergyBackend
from eerld.sdnotify import sd_notify
from eerld.sim.profiles import builtin_profile

log = structlog.get_logger("eerld.server")

WORKER_SOCKET_MODE = 0o660
ADMIN_SOCKET_MODE = 0o600
ADMIN_GROUP_SOCKET_MODE = 0o660
PHASE_SERVICE = pb.DESCRIPTOR.services_by_name["PhaseService"].full_name
ADMIN_SERVICE = pb.DESCRIPTOR.services_by_name["AdminService"].full_name


def create_backend(config: Config) -> GpuBackend:
    """The GPU backend named by the config (imported lazily: only nvml.py imports pynvml)."""
    if config.backend == "sim":
        try:
            module = importlib.import_module("eerld.gpu.sim")
        except ImportError as e:
            raise ConfigError(f"--backend: the sim backend is not available in this build ({e})") from e
        profile = builtin_profile(config.sim_profile)
        if config.clock_actuator == "application":
            profile = profile.with_overrides({"locked_clocks": False}, source="--clock-actuator")
        backend: GpuBackend = module.create_sim_backend(
            profile,
            config.sim_gpus,
            speedup=config.sim_speedup,
            state_file=config.sim_state,
        )
        return backend
    module = importlib.import_module("eerld.gpu.nvml")
    nvml_backend: GpuBackend = module.NvmlBackend(use_locked_clocks=config.clock_actuator == "lock")
    if config.energy_sample_ms > 0 and not config.reset_clocks:
        # A counter read costs milliseconds on real GPUs: keep it off the phase events' path.
        return SampledEnergyBackend(nvml_backend, period_s=config.energy_sample_ms / 1000.0)
    return nvml_backend


def _socket_in_use(path: Path) -> bool:
    """Whether something accepts connections on the Unix socket at ``path``."""
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError as e:
        if e.errno in (errno.ECONNREFUSED, errno.ENOENT):
            return False
        raise ConfigError(f"{path}: cannot probe existing socket: {e.strerror}") from None
    finally:
        probe.close()
    return True


def prepare_socket_path(path: Path, flag: str) -> None:
    """Make ``path`` bindable: a live daemon is an error, a stale socket is removed, anything else refused."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        path.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"{flag}: {path} exists and is not a socket; refusing to replace it")
    if _socket_in_use(path):
        raise ConfigError(f"{flag}: another eerld is already serving on {path}")
    path.unlink()
    log.info("stale_socket_removed", path=str(path))


@contextmanager
def _umask(mask: int) -> Iterator[None]:
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def _secure_socket(path: Path, mode: int, group: str | None) -> None:
    if group is not None:
        os.chown(path, -1, grp.getgrnam(group).gr_gid)
    os.chmod(path, mode)


class Server:
    """The worker and admin gRPC servers around one Daemon."""

    def __init__(
        self,
        config: Config,
        daemon: Daemon,
        backend: GpuBackend,
        *,
        reaper: bool = True,
    ) -> None:
        self.config = config
        self.daemon = daemon
        self._backend = backend
        self._reaper = reaper
        self._stopped = threading.Event()
        self._stop_lock = threading.Lock()
        self._metrics: Any = None
        options = [
            ("grpc.max_receive_message_length", config.max_message_bytes),
            ("grpc.max_send_message_length", 16 * 1024 * 1024),
            ("grpc.so_reuseport", 0),
        ]
        health_name = health_pb2.DESCRIPTOR.services_by_name["Health"].full_name
        worker_services = (PHASE_SERVICE, health_name, reflection.SERVICE_NAME)
        admin_services = (ADMIN_SERVICE, health_name, reflection.SERVICE_NAME)
        self.worker = grpc.server(
            ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="eerld-rpc"),
            interceptors=[ErrorMappingInterceptor(daemon.rpc_observers, worker_services)],
            options=options,
            maximum_concurrent_rpcs=config.max_workers * 4,
        )
        self.admin = grpc.server(
            ThreadPoolExecutor(max_workers=8, thread_name_prefix="eerld-admin"),
            interceptors=[ErrorMappingInterceptor(daemon.rpc_observers, admin_services)],
            options=options,
        )
        pb_grpc.add_PhaseServiceServicer_to_server(PhaseServicer(daemon), self.worker)
        pb_grpc.add_AdminServiceServicer_to_server(AdminServicer(daemon), self.admin)
        self.worker_health = health.HealthServicer()
        self.admin_health = health.HealthServicer()
        health_pb2_grpc.add_HealthServicer_to_server(self.worker_health, self.worker)
        health_pb2_grpc.add_HealthServicer_to_server(self.admin_health, self.admin)
        reflection.enable_server_reflection(worker_services, self.worker)
        reflection.enable_server_reflection(admin_services, self.admin)
        self._bind()

    def _bind(self) -> None:
        config = self.config
        with _umask(0o177):
            self.worker.add_insecure_port(f"unix:{config.socket_path}")
            self.admin.add_insecure_port(f"unix:{config.admin_socket_path}")
        _secure_socket(config.socket_path, WORKER_SOCKET_MODE, config.socket_group)
        admin_mode = ADMIN_GROUP_SOCKET_MODE if config.admin_group else ADMIN_SOCKET_MODE
        _secure_socket(config.admin_socket_path, admin_mode, config.admin_group)
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

    def _set_health(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        for servicer, name in ((self.worker_health, PHASE_SERVICE), (self.admin_health, ADMIN_SERVICE)):
            servicer.set("", status)
            servicer.set(name, status)

    def start(self) -> None:
        """Reset what the ledger names, re-apply pins, then serve."""
        self.daemon.start()
        self.worker.start()
        self.admin.start()
        self._set_health(True)
        if self._reaper:
            self.daemon.start_reaper()
        if self.config.metrics_address is not None:
            self._start_metrics(self.config.metrics_address)
        log.info(
            "serving",
            socket=str(self.config.socket_path),
            admin_socket=str(self.config.admin_socket_path),
            listen=self.config.listen,
            controller=self.config.controller,
            backend=self._backend.name,
            dry_run=self.config.dry_run,
        )
        sd_notify("READY=1\nSTATUS=serving")

    def _start_metrics(self, address: str) -> None:
        try:
            module = importlib.import_module("eerld.metrics")
        except ImportError:
            log.info("metrics_unavailable", reason="eerld.metrics is not installed")
            return
        self._metrics = module.start_metrics_server(self.daemon, address)

    def stop(self, grace_s: float | None = None) -> None:
        """Health NOT_SERVING, stop serving with a grace period, reset every GPU eerld locked."""
        with self._stop_lock:
            if self._stopped.is_set():
                return
            sd_notify("STOPPING=1")
            self._set_health(False)
            grace = self.config.grace_s if grace_s is None else grace_s
            worker_done = self.worker.stop(grace)
            admin_done = self.admin.stop(grace)
            self.daemon.shutdown()
            worker_done.wait(grace + 1)
            admin_done.wait(grace + 1)
            for closer in ("shutdown", "close", "stop"):
                fn = getattr(self._metrics, closer, None)
                if callable(fn):
                    fn()
                    break
            for path in (self.config.socket_path, self.config.admin_socket_path):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
            self._backend.close()
            self._stopped.set()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until stopped."""
        return self._stopped.wait(timeout_s)


def create_server(
    config: Config,
    *,
    backend: GpuBackend | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    phase_clock: Callable[[], float] | None = None,
    reaper: bool = True,
) -> Server:
    """Check sockets, build backend and daemon, bind both servers; nothing is reset or served yet.

    ``phase_clock`` times phases; by default the backend's own clock when it has one (the simulator's
    accelerated time, so that durations agree with its energy counters), else ``clock``.
    """
    prepare_socket_path(config.socket_path, "--socket")
    prepare_socket_path(config.admin_socket_path, "--admin-socket")
    factory = controller_factory(config.controller)
    gpu_backend = backend if backend is not None else create_backend(config)
    try:
        daemon = Daemon(
            gpu_backend,
            config.state_dir,
            controller_name=config.controller,
            controller_factory=factory,
            fixed_clocks_mhz=config.fixed_clocks_mhz if config.controller == "fixed" else None,
            dry_run=config.dry_run,
            default_lease_ttl_s=config.lease_ttl_s,
            max_clock_changes_per_s=config.max_clock_changes_per_s,
            clock=clock,
            wall_clock=wall_clock,
            phase_clock=phase_clock if phase_clock is not None else backend_clock(gpu_backend),
        )
        return Server(config, daemon, gpu_backend, reaper=reaper)
    except BaseException:
        gpu_backend.close()
        raise


def backend_clock(backend: GpuBackend) -> Callable[[], float] | None:
    """The backend's own notion of time (the sim device's clock), or None for real hardware."""
    device = getattr(backend, "device", None)
    sim_clock = getattr(device, "clock", None)
    now_s = getattr(sim_clock, "now_s", None)
    return now_s if callable(now_s) else None


def reset_all_clocks(config: Config, backend: GpuBackend | None = None) -> list[AppliedClock]:
    """``eerld --reset-clocks``: reset every GPU of the node and empty the ledger."""
    gpu_backend = backend if backend is not None else create_backend(config)
    try:
        config.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        arbiter = ClockArbiter(gpu_backend, Ledger(config.state_dir))
        try:
            return arbiter.reset_everything()
        finally:
            arbiter.close()
    finally:
        gpu_backend.close()


def serve(server: Server) -> int:
    """Run until SIGTERM or SIGINT, then stop gracefully (every GPU reset); return the exit code 0."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal", signal=signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.start()
        while not stop.wait(1.0):
            pass
    finally:
        server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0
