"""Prometheus metrics for eerld, one module per job:

- :mod:`~eerld.metrics.collector`: the samples, the :class:`MetricsSource` protocol, the scrape-time
  collector and the registry of one daemon (:class:`EerlMetrics`);
- :mod:`~eerld.metrics.source`: the daemon as a source (:class:`DaemonMetricsSource`) and the subscription
  to its RPC and phase events;
- :mod:`~eerld.metrics.http`: the bounded HTTP server (a connection costs a descriptor, never a thread);
- :mod:`~eerld.metrics.server`: :func:`start_metrics_server`, the three together.
"""

from eerld.metrics.collector import (
    CLOCK_EVENT_NAMES,
    DaemonSample,
    EerlCollector,
    EerlMetrics,
    GpuSample,
    MetricsSnapshot,
    MetricsSource,
    PhaseSample,
    PodSample,
    SessionSample,
)
from eerld.metrics.http import (
    DEFAULT_METRICS_ADDRESS,
    DEFAULT_METRICS_PORT,
    METRICS_CONNECTION_TIMEOUT_S,
    METRICS_MAX_CONNECTIONS,
    METRICS_MAX_REQUEST_BYTES,
    METRICS_REQUEST_TIMEOUT_S,
    parse_address,
)
from eerld.metrics.server import MetricsServer, start_metrics_server
from eerld.metrics.source import DaemonMetricsSource, MetricsDaemon, hpc_job_of, snapshot_from_status

__all__ = [
    "CLOCK_EVENT_NAMES",
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
    "MetricsDaemon",
    "MetricsServer",
    "MetricsSnapshot",
    "MetricsSource",
    "PhaseSample",
    "PodSample",
    "SessionSample",
    "hpc_job_of",
    "parse_address",
    "snapshot_from_status",
    "start_metrics_server",
]
