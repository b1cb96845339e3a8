"""The Prometheus metrics of eerld: a collector that reads the daemon at scrape time, plus in-process hooks.

Why a collector rather than gauges set on every event: GPU power, clocks and energy change continuously,
so they are read when Prometheus asks and never go stale; session metrics appear and disappear with their
sessions without any clean-up code. Everything lives in an own :class:`CollectorRegistry` (no global
state).

The daemon meets this module at :class:`MetricsSource`: one method returning a :class:`MetricsSnapshot`
of plain values (:mod:`eerld.metrics.source` adapts the daemon to it). The only metrics kept in process
are fed by :meth:`EerlMetrics.observe_rpc`, :meth:`EerlMetrics.observe_phase_event`,
:meth:`EerlMetrics.observe_phase` and :meth:`EerlMetrics.observe_directive`.

Every series carries ``Hostname`` (dcgm-exporter's name for the node), the in-process counters and
histograms included, so that one ``Hostname`` filter selects a node's series of every family. GPU series
carry dcgm-exporter's other labels too (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``) so that
dashboards can join them with ``DCGM_FI_*`` series, and ``eerl_session_gpu_info`` maps each open session's
job and rank to those GPU labels. Session series are labelled by ``job_id``, ``rank``, ``gpus`` and ``phase``,
never by session id: the session id is a bearer token. Where the daemon knows them, session series also carry
the labels dcgm-exporter attributes a GPU's work with: ``hpc_job`` (the scheduler's job id, from the job's
grant) and ``namespace``, ``pod``, ``container`` (the kubelet's pod-resources API); unknown, they are absent,
never empty. GPU series include the clock-event (throttle) reasons, as DCGM's bitmask and one 0/1 series per
reason under dcgm-exporter's ``clock_event`` names.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeVar, runtime_checkable

from eerl.phases import ControllerState, PhaseKind
from eerl.reports import SessionReport
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
    StateSetMetricFamily,
)
from prometheus_client.metrics import MetricWrapperBase
from prometheus_client.registry import Collector

from eerld.metrics.jobs import job_families

__all__ = [
    "CLOCK_EVENT_NAMES",
    "DaemonSample",
    "EerlCollector",
    "EerlMetrics",
    "GpuSample",
    "MetricsSnapshot",
    "MetricsSource",
    "PhaseSample",
    "PodSample",
    "SessionSample",
]

_log = logging.getLogger("eerld.metrics")

_MHZ_TO_HZ = 1_000_000.0
_HOSTNAME = "Hostname"
_GPU_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", _HOSTNAME)
# ``gpus`` keeps series unique when one job rank holds two sessions (async pools): claims are exclusive.
_PHASE_LABELS = ("job_id", "rank", "gpus", "phase", _HOSTNAME)

# Phase events take milliseconds (a clock lock is ~1-10 ms on hardware); RPCs up to seconds.
_PHASE_EVENT_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
_RPC_BUCKETS_S = (0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

CLOCK_EVENT_NAMES: Mapping[int, str] = {
    0x001: "gpu_idle",
    0x002: "clocks_setting",
    0x004: "power_cap",
    0x008: "hw_slowdown",
    0x010: "sync_boost",
    0x020: "sw_thermal",
    0x040: "hw_thermal",
    0x080: "hw_power_brake",
    0x100: "display_clocks",
}
"""NVML's clocks-event reason bits (DCGM's ``DCGM_CLOCKS_EVENT_REASON_*``) and the ``clock_event`` label value
dcgm-exporter gives each (``DCGM_EXP_CLOCK_EVENTS_COUNT``, dcgmi's names)."""

# Job attribution, on session series where known (absent otherwise): dcgm-exporter's names for the
# Kubernetes owner (pod-resources API) and for the HPC job (its --hpc-job-mapping-dir).
_NAMESPACE, _POD, _CONTAINER, _HPC_JOB = "namespace", "pod", "container", "hpc_job"


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
    clock_event_reasons: int | None = None
    """NVML's clocks-event (throttle) reasons bitmask (the bits of :data:`CLOCK_EVENT_NAMES`, as in
    ``DCGM_FI_DEV_CLOCKS_EVENT_REASONS``); None when it could not be read."""


@dataclass(frozen=True, slots=True)
class PodSample:
    """The Kubernetes container a GPU is allocated to (kubelet pod-resources API)."""

    namespace: str
    pod: str
    container: str


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
    hpc_job: str = ""
    """The scheduler's job id where the daemon knows it (the session came through the grant a Slurm prolog
    or an admin made for that job); empty otherwise (a job id a client declares is only ``job_id``)."""


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
    pods: Mapping[str, PodSample] = field(default_factory=dict)
    """GPU UUID -> the Kubernetes container it is allocated to (empty off Kubernetes)."""
    finished: tuple[SessionReport, ...] = ()
    """The reports of the finished sessions the daemon keeps (:mod:`eerld.metrics.jobs`)."""


@runtime_checkable
class MetricsSource(Protocol):
    """What the metrics need from the daemon: one consistent snapshot, taken at scrape time."""

    def metrics_snapshot(self) -> MetricsSnapshot:
        """Read the GPUs and sessions now. May raise an :class:`eerld.errors.DaemonError`."""
        ...


class EerlCollector(Collector):
    """Turns a :class:`MetricsSnapshot` into metric families at scrape time.

    ``local`` holds the in-process counters and histograms (:class:`EerlMetrics`'s); they are exported
    through this collector with the node's ``Hostname`` added to every sample, so that every series of
    the daemon carries the same node label.
    """

    def __init__(
        self,
        source: MetricsSource,
        *,
        hostname: str | None = None,
        local: CollectorRegistry | None = None,
    ) -> None:
        """``hostname`` overrides the daemon's for the ``Hostname`` label (in Kubernetes: the node name)."""
        self._source = source
        self._hostname = hostname
        self._local = local
        self._collect_errors = 0
        self._last_hostname: str | None = None
        self._lock = threading.Lock()

    def describe(self) -> Iterable[Metric]:
        """Nothing up front: describing would call the daemon at registration time."""
        return ()

    def collect(self) -> Iterable[Metric]:
        """Read the source once and yield every family; a failing read yields only the error counter and
        the in-process families."""
        try:
            snapshot = self._source.metrics_snapshot()
        except Exception:
            _log.exception("metrics: reading the daemon failed")
            snapshot = None
        with self._lock:
            if snapshot is None:
                self._collect_errors += 1
            elif not self._hostname:
                self._last_hostname = snapshot.daemon.hostname
            hostname = self._hostname or self._last_hostname or socket.gethostname()
            collect_errors = float(self._collect_errors)
        errors = CounterMetricFamily(
            "eerl_metrics_collect_errors",
            "Scrapes during which reading the daemon failed.",
            labels=(_HOSTNAME,),
        )
        errors.add_metric([hostname], collect_errors)
        yield errors
        if snapshot is not None:
            yield from _daemon_families(snapshot.daemon, hostname)
            yield from _gpu_families(snapshot.gpus, hostname)
            yield from _session_families(snapshot, hostname)
            yield from job_families(snapshot.finished, hostname)
        if self._local is not None:
            for family in self._local.collect():
                yield _with_label(family, _HOSTNAME, hostname)


def _with_label(family: Metric, name: str, value: str) -> Metric:
    """``family`` with the label ``name="value"`` added to every sample."""
    labelled = Metric(family.name, family.documentation, family.type, family.unit)
    labelled.samples = [sample._replace(labels={**sample.labels, name: value}) for sample in family.samples]
    return labelled


def _daemon_families(daemon: DaemonSample, hostname: str) -> Iterator[Metric]:
    build = InfoMetricFamily("eerl_build", "eerld version, GPU backend and controller in use.")
    build.add_metric(
        [],
        {
            "version": daemon.version,
            "backend": daemon.backend,
            "controller": daemon.controller,
            _HOSTNAME: hostname,
        },
    )
    yield build
    start = GaugeMetricFamily(
        "eerl_daemon_start_time_seconds",
        "When eerld started, seconds since the Unix epoch.",
        labels=(_HOSTNAME,),
    )
    start.add_metric([hostname], daemon.started_at_unix_s)
    yield start
    dry_run = GaugeMetricFamily(
        "eerl_daemon_dry_run", "1 when eerld decides clocks but never applies them.", labels=(_HOSTNAME,)
    )
    dry_run.add_metric([hostname], 1.0 if daemon.dry_run else 0.0)
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
    reasons = GaugeMetricFamily(
        "eerl_gpu_clock_event_reasons",
        "NVML clocks-event (throttle) reasons bitmask, as DCGM_FI_DEV_CLOCKS_EVENT_REASONS.",
        labels=_GPU_LABELS,
    )
    reason = GaugeMetricFamily(
        "eerl_gpu_clock_event_reason",
        "1 while the clock_event reason (dcgm-exporter's names) holds the clock down, else 0.",
        labels=(*_GPU_LABELS, "clock_event"),
    )
    for gpu in gpus:
        labels = _gpu_label_values(gpu, hostname)
        energy.add_metric(labels, gpu.energy_j)
        power.add_metric(labels, gpu.power_w)
        power_limit.add_metric(labels, gpu.power_limit_w)
        sm_clock.add_metric(labels, gpu.sm_clock_mhz * _MHZ_TO_HZ)
        if gpu.locked_sm_clock_mhz is not None:
            locked_clock.add_metric(labels, gpu.locked_sm_clock_mhz * _MHZ_TO_HZ)
        locked.add_metric(labels, 0.0 if gpu.locked_sm_clock_mhz is None else 1.0)
        pinned.add_metric(labels, 1.0 if gpu.admin_pinned else 0.0)
        degraded.add_metric(labels, 1.0 if gpu.degraded_reason else 0.0)
        if gpu.clock_event_reasons is not None:
            reasons.add_metric(labels, float(gpu.clock_event_reasons))
            for bit, name in CLOCK_EVENT_NAMES.items():
                reason.add_metric([*labels, name], 1.0 if gpu.clock_event_reasons & bit else 0.0)
    yield from (energy, power, power_limit, sm_clock, locked_clock, locked, pinned, degraded, reasons, reason)


def _gpu_label_values(gpu: GpuSample, hostname: str) -> list[str]:
    """The values of :data:`_GPU_LABELS` for ``gpu``, as dcgm-exporter writes them."""
    return [str(gpu.index), gpu.uuid, gpu.pci_bus_id, f"nvidia{gpu.index}", gpu.name, hostname]


def _job_labels(session: SessionSample, pod: PodSample | None) -> dict[str, str]:
    """The job labels operators join on, only those known: the session's HPC job and ``pod``'s
    namespace, pod and container."""
    labels = {_HPC_JOB: session.hpc_job} if session.hpc_job else {}
    if pod is not None:
        for key, value in ((_NAMESPACE, pod.namespace), (_POD, pod.pod), (_CONTAINER, pod.container)):
            if value:
                labels[key] = value
    return labels


def _session_pod(
    session: SessionSample, gpus: Mapping[int, GpuSample], pods: Mapping[str, PodSample]
) -> PodSample | None:
    """The Kubernetes container of the session's lowest-index GPU that has one (a session's GPUs are one
    container's)."""
    for index in sorted(session.gpu_indices):
        gpu = gpus.get(index)
        pod = pods.get(gpu.uuid) if gpu is not None else None
        if pod is not None:
            return pod
    return None


def _tag(family: Metric, start: int, extra: Mapping[str, str]) -> None:
    """Give the samples ``family`` got since it had ``start`` the ``extra`` labels too.

    Attribution labels are added only where known, so that a node off Kubernetes and Slurm exports no
    empty ``pod=""`` (Prometheus drops empty labels anyway; the exposition stays as it was).
    """
    if extra:
        for i in range(start, len(family.samples)):
            family.samples[i] = family.samples[i]._replace(labels={**family.samples[i].labels, **extra})


def _session_families(snapshot: MetricsSnapshot, hostname: str) -> Iterator[Metric]:
    sessions = snapshot.sessions
    open_sessions = GaugeMetricFamily("eerl_sessions", "Open sessions.", labels=(_HOSTNAME,))
    open_sessions.add_metric([hostname], float(len(sessions)))
    yield open_sessions

    by_index = {gpu.index: gpu for gpu in snapshot.gpus}
    session_gpus = InfoMetricFamily(
        "eerl_session_gpu",
        "A GPU an open session holds, with dcgm-exporter's GPU labels (join DCGM_FI_* on Hostname, UUID), "
        "and its job's hpc_job and Kubernetes namespace, pod and container where known.",
        labels=("job_id", "rank", "gpus", *_GPU_LABELS),
    )

    info = InfoMetricFamily(
        "eerl_session",
        "An open session and its execution mode.",
        labels=("job_id", "rank", "gpus", _HOSTNAME),
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
        extra = _job_labels(session, _session_pod(session, by_index, snapshot.pods))
        start = len(info.samples)
        info.add_metric([session.job_id, str(session.rank), gpus, hostname], {"mode": session.mode})
        _tag(info, start, extra)
        for index in session.gpu_indices:
            gpu = by_index.get(index)
            if gpu is not None:
                start = len(session_gpus.samples)
                session_gpus.add_metric(
                    [session.job_id, str(session.rank), gpus, *_gpu_label_values(gpu, hostname)], {}
                )
                _tag(session_gpus, start, _job_labels(session, snapshot.pods.get(gpu.uuid)))
        for phase in session.phases:
            labels = [session.job_id, str(session.rank), gpus, phase.kind.value, hostname]
            values: Mapping[str, float | None] = {
                "eerl_session_phases": float(phase.phases),
                "eerl_session_energy_joules": phase.energy_j,
                "eerl_session_valid_tokens": float(phase.valid_tokens),
                # absent, not 0, for a phase that credits no valid tokens (generation): no such ratio
                "eerl_session_energy_per_valid_token_joules": (
                    phase.energy_per_valid_token_j if phase.valid_tokens else None
                ),
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
                    family = per_phase[name]
                    start = len(family.samples)
                    family.add_metric(labels, value)
                    _tag(family, start, extra)
            start = len(state.samples)
            state.add_metric(labels, {s.value: s is phase.state for s in ControllerState})
            _tag(state, start, extra)
    yield info
    yield session_gpus
    yield from per_phase.values()
    yield state


_M = TypeVar("_M", bound=MetricWrapperBase)


class _Children(dict[tuple[str, ...], _M], Generic[_M]):
    """A labelled metric's children by label values, each looked up through ``labels()`` once: that call
    checks its arguments and takes the metric's lock every time, and the hooks run on the phase-event path.
    A child appears on first use only, as with ``labels()`` (no zero series before the first event)."""

    def __init__(self, metric: _M) -> None:
        super().__init__()
        self._metric = metric

    def __missing__(self, key: tuple[str, ...]) -> _M:
        child = self[key] = self._metric.labels(*key)  # two threads racing get the same child
        return child


@dataclass
class EerlMetrics:
    """The registry of one daemon: the scrape-time collector plus the in-process RPC metrics.

    Create one per daemon (tests create many); nothing here is module-global. The in-process metrics live
    in a registry of their own and are exported through the collector, which adds the node's ``Hostname``.
    """

    source: MetricsSource
    hostname: str | None = None
    registry: CollectorRegistry = field(default_factory=lambda: CollectorRegistry(auto_describe=False))

    def __post_init__(self) -> None:
        local = CollectorRegistry(auto_describe=False)
        self.registry.register(EerlCollector(self.source, hostname=self.hostname, local=local))

        def counter(name: str, documentation: str, *labelnames: str) -> _Children[Counter]:
            return _Children(Counter(name, documentation, labelnames=labelnames, registry=local))

        def histogram(
            name: str, documentation: str, buckets: tuple[float, ...], *labelnames: str
        ) -> _Children[Histogram]:
            return _Children(
                Histogram(name, documentation, labelnames=labelnames, buckets=buckets, registry=local)
            )

        self._rpcs = counter(
            "eerl_rpc_requests", "RPCs handled, by method and gRPC status code.", "method", "code"
        )
        self._rpc_duration = histogram(
            "eerl_rpc_duration_seconds",
            "Time eerld took to handle an RPC, by method.",
            _RPC_BUCKETS_S,
            "method",
        )
        self._phase_event_duration = histogram(
            "eerl_phase_event_duration_seconds",
            "Time from receiving a phase event to having applied its decision (begin) or metered it (end).",
            _PHASE_EVENT_BUCKETS_S,
            "event",
        )
        # Node totals per phase kind: no job label, so closed sessions keep counting and the
        # cardinality stays fixed; rate(energy) / rate(valid tokens) is the node's J per valid token.
        self._phases = counter("eerl_phases", "Phases metered on this node.", "phase")
        self._phase_energy = counter(
            "eerl_phase_energy_joules", "Energy of the phases metered on this node.", "phase"
        )
        self._phase_valid_tokens = counter(
            "eerl_phase_valid_tokens",
            "Valid training tokens credited to the phases metered on this node.",
            "phase",
        )
        # Job mode: every directive's verdict (a bounded set) by phase kind, node-wide like the totals.
        self._directives = counter(
            "eerl_job_directives",
            "Job-mode phases by the verdict on their directive (anything but accepted ran at the fallback).",
            "verdict",
            "kind",
        )
        self._phase_duration = counter(
            "eerl_phase_duration_seconds", "Wall time of the phases metered on this node.", "phase"
        )

    def observe_rpc(self, method: str, code: str, duration_s: float) -> None:
        """Count one handled RPC, e.g. ``observe_rpc("BeginPhase", "OK", 0.003)``.

        ``method`` is the short RPC name and ``code`` the gRPC status code's name (``"OK"``,
        ``"INVALID_ARGUMENT"`` …); both are bounded sets, so the label cardinality stays small.
        """
        self._rpcs[method, code].inc()
        self._rpc_duration[(method,)].observe(max(duration_s, 0.0))

    def observe_phase_event(self, event: str, duration_s: float) -> None:
        """Record the latency of one phase event: ``event`` is ``"begin"`` or ``"end"``."""
        self._phase_event_duration[(event,)].observe(max(duration_s, 0.0))

    def observe_directive(self, verdict: str, kind: PhaseKind) -> None:
        """Count one job-mode BeginPhase by its directive's verdict (``"accepted"``, ``"off_grid"`` …)."""
        self._directives[verdict, kind.value].inc()

    def observe_phase(self, kind: PhaseKind, energy_j: float, valid_tokens: int, duration_s: float) -> None:
        """Add one metered phase to the node's totals (which outlive the session that ran it)."""
        phase = (kind.value,)
        self._phases[phase].inc()
        self._phase_energy[phase].inc(max(energy_j, 0.0))
        self._phase_valid_tokens[phase].inc(max(valid_tokens, 0))
        self._phase_duration[phase].inc(max(duration_s, 0.0))
