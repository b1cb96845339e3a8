"""The composition root: from a :class:`~eerld.config.Config`, build what eerld runs — without gRPC.

:func:`build` is the one place where the parts are put together: the GPU backend (:func:`create_backend`:
the nvml or sim backend, and every wrapper — background energy sampling on NVML, observe-only under
``--dry-run``), the clock phases are timed on (the backend's own, :meth:`~eerld.gpu.base.GpuBackend.
own_clock`, else the monotonic clock), the controller factory and the :class:`~eerld.daemon.Daemon`; and,
once serving, the metrics endpoint subscribed to the daemon (:meth:`App.start_metrics`).
:mod:`eerld.api.server` serves what this builds; ``eerld --reset-clocks`` uses :func:`create_backend`
alone.
"""

from __future__ import annotations

import importlib
import importlib.util
import time
from collections.abc import Callable
from dataclasses import dataclass

from eerl.control.registry import controller_factory
from eerl.job.admission import JobPolicy

from eerld.config import Config
from eerld.daemon import Daemon
from eerld.errors import BackendFailure, ConfigError
from eerld.gpu.base import GpuBackend
from eerld.gpu.energy_sampler import SampledEnergyBackend
from eerld.gpu.observe_only import ObserveOnlyBackend
from eerld.metrics import MetricsServer, start_metrics_server
from eerld.pods.owners import GpuOwners
from eerld.pods.watch import PodClaimWatch

__all__ = ["SIM_BACKEND_MODULE", "SIM_MISSING_ERROR", "App", "build", "create_backend", "nvml_unavailable"]

SIM_BACKEND_MODULE = "eerl_sim.gpu"
"""The sim backend: a distribution of its own (eerl-sim), loaded by this name when ``--backend sim`` runs."""
SIM_MISSING_ERROR = (
    "--backend sim: the simulator is not installed: pip install eerl-sim "
    "(from a checkout: pip install -e ./sim)"
)


def nvml_unavailable(error: Exception) -> str:
    """The one line for a node where NVML cannot start: why, and the simulator to try eerld without GPUs."""
    sim = "eerld --sim"
    if importlib.util.find_spec("eerl_sim") is None:
        sim += " (pip install eerl-sim)"
    return f"NVML is not available ({error}); to try eerld without NVIDIA GPUs, run the simulator: {sim}"


@dataclass
class App:
    """What :func:`build` made: the daemon over its backend, and the metrics endpoint once started."""

    config: Config
    backend: GpuBackend
    daemon: Daemon
    phase_clock: Callable[[], float]
    metrics: MetricsServer | None = None
    pods: GpuOwners | None = None
    """The Kubernetes owners of the GPUs, for the metrics' pod labels: the kubelet's pod-resources API,
    which :mod:`eerld.api.server` wires in (it speaks gRPC; this module does not)."""
    pod_watch: PodClaimWatch | None = None
    """Ends the sessions of GPUs that left their pod (the kubelet's pod-resources, wired in the same way)."""

    def start_metrics(self) -> None:
        """Serve ``/metrics`` on the configured address (none: no endpoint), subscribed to the daemon."""
        if self.config.metrics_address is not None and self.metrics is None:
            self.metrics = start_metrics_server(self.daemon, self.config.metrics_address, pods=self.pods)

    def start_pod_watch(self) -> None:
        """Start polling the kubelet for GPUs that left their pod (none wired in: nothing to do)."""
        if self.pod_watch is not None:
            self.pod_watch.start()

    def stop_pod_watch(self) -> None:
        """Stop the pod-resources watch; idempotent."""
        watch, self.pod_watch = self.pod_watch, None
        if watch is not None:
            watch.close()

    def close(self) -> None:
        """Stop the pod-resources watch and the metrics endpoint (ending its subscription) and release the
        backend; idempotent."""
        self.stop_pod_watch()
        metrics, self.metrics = self.metrics, None
        if metrics is not None:
            metrics.close()
        pods, self.pods = self.pods, None
        if pods is not None:
            pods.close()
        self.backend.close()


def create_backend(config: Config, *, backend: GpuBackend | None = None) -> GpuBackend:
    """The node's GPU backend as the daemon uses it: ``backend`` when given (tests, the benchmarks), else
    the one ``config`` names; with every wrapper, applied here and nowhere else.

    Only the chosen backend's module is imported (only :mod:`eerld.gpu.nvml` imports pynvml; the sim backend
    is the eerl-sim distribution's :mod:`eerl_sim.gpu`, loaded by name). On NVML the energy counters are
    sampled in the background (a counter read costs milliseconds on real GPUs: it stays off the phase
    events' path), except for ``--reset-clocks``. Under
    ``--dry-run`` every backend is observe-only: no code path can change a clock.
    """
    if backend is None:
        if config.backend == "sim":
            backend = _sim_backend(config)
        else:
            from eerld.gpu.nvml import NvmlBackend  # noqa: PLC0415 - the only path that loads pynvml

            try:
                backend = NvmlBackend(use_locked_clocks=config.clock_actuator == "lock")
            except BackendFailure as e:  # no pynvml, no libnvidia-ml, no driver: say what to try instead
                raise BackendFailure(nvml_unavailable(e)) from e
            if config.energy_sample_ms > 0 and not config.reset_clocks:
                backend = SampledEnergyBackend(backend, period_s=config.energy_sample_ms / 1000.0)
    if config.dry_run:
        backend = ObserveOnlyBackend(backend)
    return backend


def _sim_backend(config: Config) -> GpuBackend:
    """The eerl-sim backend, loaded by name (eerld never imports it otherwise: its wheel holds none of it).

    Missing: one ConfigError saying what to install. The simulator checks ``--sim-profile`` itself.
    """
    try:
        sim = importlib.import_module(SIM_BACKEND_MODULE)
    except ImportError as e:
        if isinstance(e, ModuleNotFoundError) and e.name in {"eerl_sim", SIM_BACKEND_MODULE}:
            raise ConfigError(SIM_MISSING_ERROR) from e
        raise ConfigError(f"--backend sim: the simulator cannot be loaded ({e})") from e
    backend: GpuBackend = sim.create_daemon_backend(
        config.sim_profile,
        config.sim_gpus,
        speedup=config.sim_speedup,
        state_file=config.sim_state,
        locked_clocks=config.clock_actuator != "application",
    )
    return backend


def build(
    config: Config,
    *,
    backend: GpuBackend | None = None,
    clock: Callable[[], float] = time.monotonic,
    wall_clock: Callable[[], float] = time.time,
    phase_clock: Callable[[], float] | None = None,
) -> App:
    """Build the backend and the daemon of ``config``; nothing is reset, served or started yet.

    ``backend`` replaces the configured one (it is wrapped all the same); ``phase_clock`` times phases, by
    default the backend's own clock where it has one (the simulator's accelerated time, so that durations
    agree with its energy counters), else ``clock``. On failure the backend is closed.
    """
    factory = controller_factory(config.controller)
    gpus = create_backend(config, backend=backend)
    try:
        phases = phase_clock or gpus.own_clock() or clock
        daemon = Daemon(
            gpus,
            config.state_dir,
            controller_name=config.controller,
            controller_factory=factory,
            fixed_clocks_mhz=config.fixed_clocks_mhz if config.controller == "fixed" else None,
            dry_run=config.dry_run,
            default_lease_ttl_s=config.lease_ttl_s,
            max_lease_ttl_s=config.max_lease_ttl_s,
            max_clock_changes_per_s=config.max_clock_changes_per_s,
            tenancy=config.tenancy,
            socket_path=config.socket_path,
            grant_dir=config.grant_dir,
            gpu_socket_dir=config.gpu_socket_dir,
            job_policy=JobPolicy(
                allowed=config.job_mode == "allow",
                clock_floor_mhz=config.job_clock_floor_mhz,
                max_trials=config.job_max_trials,
                trial_window_s=config.job_trial_window_s,
            ),
            clock=clock,
            wall_clock=wall_clock,
            phase_clock=phases,
        )
    except BaseException:
        gpus.close()
        raise
    return App(config, gpus, daemon, phases)
