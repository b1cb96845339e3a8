"""Fixtures of the operations tests: a fake metrics source and its server, promtool."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest
from eerl.phases import PhaseKind
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from eerld.metrics import EerlMetrics, MetricsServer, start_metrics_server
from tests.ops.fakes import FakeMetricsSource


@pytest.fixture
def fake_source() -> FakeMetricsSource:
    """A node with two GPUs (GPU 0 locked by a session, GPU 1 pinned by an admin) and one session."""
    return FakeMetricsSource()


@pytest.fixture
def metrics_server(fake_source: FakeMetricsSource) -> Iterator[MetricsServer]:
    """``/metrics`` over the fake source on a free loopback port."""
    server = start_metrics_server(fake_source, "127.0.0.1:0")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def exposition() -> str:
    """The full text exposition with every family populated (the fake source plus one of each event)."""
    metrics = EerlMetrics(FakeMetricsSource())
    metrics.observe_rpc("BeginPhase", "OK", 0.002)
    metrics.observe_phase_event("begin", 0.002)
    metrics.observe_phase(PhaseKind.GENERATION, energy_j=100.0, valid_tokens=1000, duration_s=2.0)
    return generate_latest(metrics.registry).decode()


@pytest.fixture
def exported_names(exposition: str) -> set[str]:
    """Every sample name eerld exports (``_total``, ``_bucket``, ``_info`` … included)."""
    return {s.name for family in text_string_to_metric_families(exposition) for s in family.samples}


def require_tool(name: str, package: str) -> str:
    """The tool's path; FAIL (never skip) when missing, saying how to install it."""
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} is missing: run scripts/ensure_prometheus.sh (installs Debian's {package})")
    return path


@pytest.fixture
def promtool() -> str:
    """Path of promtool (Debian package prometheus)."""
    return require_tool("promtool", "prometheus")
