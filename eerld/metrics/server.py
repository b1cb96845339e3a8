"""A running ``/metrics`` endpoint: the collector of :mod:`eerld.metrics.collector` behind the bounded HTTP
server of :mod:`eerld.metrics.http`, subscribed to the daemon's events when it serves the daemon."""

from __future__ import annotations

import os
from dataclasses import dataclass

from prometheus_client import make_wsgi_app

from eerld.daemon.views import Unsubscribe
from eerld.errors import ConfigError
from eerld.metrics.collector import EerlMetrics, MetricsSource
from eerld.metrics.http import (
    DEFAULT_METRICS_ADDRESS,
    METRICS_CONNECTION_TIMEOUT_S,
    METRICS_MAX_CONNECTIONS,
    METRICS_MAX_REQUEST_BYTES,
    METRICS_REQUEST_TIMEOUT_S,
    BoundedHttpServer,
    Limits,
    parse_address,
)
from eerld.metrics.source import DaemonMetricsSource, MetricsDaemon, subscribe
from eerld.pods.owners import GpuOwners

__all__ = ["MetricsServer", "start_metrics_server"]


@dataclass
class MetricsServer:
    """A running ``/metrics`` endpoint; :meth:`close` stops it. The observation hooks are on ``metrics``."""

    metrics: EerlMetrics
    host: str
    port: int
    _server: BoundedHttpServer
    _unsubscribe: Unsubscribe | None = None

    def close(self) -> None:
        """Stop serving, end the subscription to the daemon and release the port; idempotent."""
        unsubscribe, self._unsubscribe = self._unsubscribe, None
        if unsubscribe is not None:
            unsubscribe()
        self._server.close()


def start_metrics_server(
    source: MetricsSource | MetricsDaemon,
    address: str = DEFAULT_METRICS_ADDRESS,
    *,
    hostname: str | None = None,
    pods: GpuOwners | None = None,
    max_connections: int = METRICS_MAX_CONNECTIONS,
    request_timeout_s: float = METRICS_REQUEST_TIMEOUT_S,
    connection_timeout_s: float = METRICS_CONNECTION_TIMEOUT_S,
    max_request_bytes: int = METRICS_MAX_REQUEST_BYTES,
) -> MetricsServer:
    """Serve ``/metrics`` for ``source`` on ``address`` in background threads.

    ``source`` is a :class:`MetricsSource`, or the eerld daemon (:class:`MetricsDaemon`), which is read
    through its read model's ``status()`` and whose RPC and phase events then feed the in-process metrics
    through :meth:`~eerld.daemon.events.Events.subscribe` until :meth:`MetricsServer.close`. ``hostname``
    overrides the ``Hostname`` label; when None, ``$NODE_NAME`` does (set from the downward API in
    Kubernetes, where the host name is the pod's), else the daemon's host name. ``pods`` (the kubelet's
    pod-resources API, for the daemon only) adds the ``namespace``, ``pod`` and ``container`` of each
    session's GPUs.

    What a connection may cost is bounded: at most ``max_connections`` are open at once (one more closes
    the oldest that has not yet sent its request, or is refused with 503 when every one is being answered);
    each has ``request_timeout_s`` from being accepted to send its request line and headers, at most
    ``max_request_bytes`` of them (no body is read), and ``connection_timeout_s`` in all. A connection
    costs a file descriptor and a buffer, never a thread. Raises :class:`ConfigError` when the address is
    malformed or cannot be bound, or a limit is not positive.
    """
    limits = Limits(max_connections, request_timeout_s, connection_timeout_s, max_request_bytes)
    daemon: MetricsDaemon | None = None
    scraped: MetricsSource
    if isinstance(source, MetricsSource):
        scraped = source
    else:
        daemon, scraped = source, DaemonMetricsSource(source, pods=pods)
    metrics = EerlMetrics(scraped, hostname=hostname or os.environ.get("NODE_NAME") or None)
    host, port = parse_address(address)
    try:
        server = BoundedHttpServer(host, port, make_wsgi_app(metrics.registry), limits)
    except OSError as e:
        raise ConfigError(f"--metrics-address: cannot listen on {address}: {e.strerror or e}") from e
    server.start()
    handle = MetricsServer(metrics=metrics, host=host, port=server.port, _server=server)
    if daemon is not None:
        handle._unsubscribe = subscribe(daemon, metrics)
    return handle
