"""The Prometheus metrics: names, units, labels and the scrape-time collector."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass, replace

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from eerld.errors import ConfigError
from eerld.metrics import (
    DEFAULT_METRICS_ADDRESS,
    EerlMetrics,
    MetricsServer,
    MetricsSnapshot,
    parse_address,
    start_metrics_server,
)
from tests.ops.fakes import FakeMetricsSource


@dataclass
class StaticSource:
    snapshot: MetricsSnapshot

    def metrics_snapshot(self) -> MetricsSnapshot:
        return self.snapshot


DCGM_LABELS = {"gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname"}


def scrape(server: MetricsServer) -> str:
    with urllib.request.urlopen(f"http://{server.host}:{server.port}/metrics", timeout=10) as reply:
        body: bytes = reply.read()
    return body.decode()


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    out: dict[str, list[tuple[dict[str, str], float]]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


class TestCollector:
    def test_gpu_series_carry_dcgm_exporter_labels(self, metrics_server: MetricsServer) -> None:
        """Every per-GPU series has dcgm-exporter's labels so that dashboards can join on them."""
        got = samples(scrape(metrics_server))
        for name in ("eerl_gpu_energy_joules_total", "eerl_gpu_power_watts", "eerl_gpu_sm_clock_hertz"):
            for labels, _ in got[name]:
                assert set(labels) == DCGM_LABELS
        first = got["eerl_gpu_power_watts"][0][0]
        assert first["gpu"] == "0"
        assert first["device"] == "nvidia0"
        assert first["Hostname"] == "node-1"
        assert first["modelName"] == "NVIDIA H100 80GB HBM3"

    def test_clocks_are_reported_in_hertz(self, metrics_server: MetricsServer) -> None:
        """Clocks use the base unit: 1410 MHz is exported as 1.41e9 Hz."""
        got = samples(scrape(metrics_server))
        assert got["eerl_gpu_sm_clock_hertz"][0][1] == pytest.approx(1.41e9)
        assert got["eerl_gpu_locked_sm_clock_hertz"][0][1] == pytest.approx(1.41e9)

    def test_locked_clock_is_absent_for_the_default_governor(self, metrics_server: MetricsServer) -> None:
        """A GPU without a lock has eerl_gpu_locked 0 and no locked-clock series."""
        got = samples(scrape(metrics_server))
        locked = {labels["gpu"]: value for labels, value in got["eerl_gpu_locked"]}
        assert locked == {"0": 1.0, "1": 1.0, "2": 0.0}
        assert {labels["gpu"] for labels, _ in got["eerl_gpu_locked_sm_clock_hertz"]} == {"0", "1"}

    def test_flags_mark_pins_and_degraded_gpus(self, metrics_server: MetricsServer) -> None:
        """The admin-pin and degraded flags are 1 exactly on the pinned and on the degraded GPU."""
        got = samples(scrape(metrics_server))
        pinned = {labels["gpu"]: value for labels, value in got["eerl_gpu_admin_pinned"]}
        degraded = {labels["gpu"]: value for labels, value in got["eerl_gpu_degraded"]}
        assert pinned == {"0": 0.0, "1": 1.0, "2": 0.0}
        assert degraded == {"0": 0.0, "1": 0.0, "2": 1.0}

    def test_energy_is_read_at_scrape_time(self, metrics_server: MetricsServer) -> None:
        """Two scrapes read the source twice, so the energy counter grows between them."""
        first = samples(scrape(metrics_server))["eerl_gpu_energy_joules_total"][0][1]
        second = samples(scrape(metrics_server))["eerl_gpu_energy_joules_total"][0][1]
        assert second > first

    def test_session_series_are_per_job_rank_and_phase(self, metrics_server: MetricsServer) -> None:
        """Session metrics are labelled by job, rank and phase, never by the secret session id."""
        text = scrape(metrics_server)
        got = samples(text)
        labels, value = got["eerl_session_energy_per_valid_token_joules"][0]
        assert labels == {
            "job_id": "job-42",
            "rank": "0",
            "gpus": "0",
            "phase": "generation",
            "Hostname": "node-1",
        }
        assert value == pytest.approx(0.03)
        assert "s-0123456789abcdef" not in text

    def test_default_governor_phase_has_no_chosen_clock(self, metrics_server: MetricsServer) -> None:
        """Only the phase with a chosen lock has an eerl_session_sm_clock_hertz series."""
        got = samples(scrape(metrics_server))
        assert [labels["phase"] for labels, _ in got["eerl_session_sm_clock_hertz"]] == ["generation"]

    def test_controller_state_is_a_state_set(self, metrics_server: MetricsServer) -> None:
        """Exactly one state per phase is 1: committed for generation, baseline for training."""
        got = samples(scrape(metrics_server))
        active = {
            (labels["phase"], labels["eerl_session_controller_state"])
            for labels, value in got["eerl_session_controller_state"]
            if value == 1.0
        }
        assert active == {("generation", "committed"), ("training", "baseline")}

    def test_savings_and_exploration_cost_are_exported(self, metrics_server: MetricsServer) -> None:
        """The savings estimate is a ratio and the exploration cost is in joules."""
        got = samples(scrape(metrics_server))
        assert got["eerl_session_estimated_savings_ratio"][0][1] == pytest.approx(0.12)
        assert got["eerl_session_exploration_cost_joules"][0][1] == pytest.approx(40.0)

    def test_build_info_names_version_and_backend(self, metrics_server: MetricsServer) -> None:
        """eerl_build_info is 1 and carries the version, backend and controller."""
        labels, value = samples(scrape(metrics_server))["eerl_build_info"][0]
        assert value == 1.0
        assert (labels["version"], labels["backend"], labels["controller"]) == ("0.1.0", "sim", "eerl")

    def test_hostname_override_replaces_the_daemons(self, fake_source: FakeMetricsSource) -> None:
        """In Kubernetes the node name replaces the pod's host name in the Hostname label."""
        server = start_metrics_server(fake_source, "127.0.0.1:0", hostname="gpu-node-7")
        try:
            got = samples(scrape(server))
        finally:
            server.close()
        assert {labels["Hostname"] for labels, _ in got["eerl_gpu_power_watts"]} == {"gpu-node-7"}

    def test_a_failing_source_fails_soft(
        self, fake_source: FakeMetricsSource, metrics_server: MetricsServer
    ) -> None:
        """When the daemon cannot be read the scrape still answers, and counts the failure."""
        fake_source.fail = True
        got = samples(scrape(metrics_server))
        assert got["eerl_metrics_collect_errors_total"][0][1] == 1.0
        assert "eerl_gpu_power_watts" not in got

    def test_two_sessions_of_one_rank_keep_distinct_series(self, fake_source: FakeMetricsSource) -> None:
        """An async job rank with a generation and a training session (other GPUs) gets two series."""
        snapshot = fake_source.metrics_snapshot()
        other = replace(snapshot.sessions[0], gpu_indices=(1,))
        doubled = replace(snapshot, sessions=(snapshot.sessions[0], other))
        metrics = EerlMetrics(StaticSource(doubled))
        text = generate_latest(metrics.registry).decode()
        got = samples(text)
        series = [tuple(sorted(labels.items())) for labels, _ in got["eerl_session_phases_total"]]
        assert len(series) == len(set(series)) == 4


class TestHooks:
    def test_rpcs_are_counted_by_method_and_code(self, metrics_server: MetricsServer) -> None:
        """observe_rpc counts per method and status code and feeds the latency histogram."""
        metrics_server.metrics.observe_rpc("BeginPhase", "OK", 0.002)
        metrics_server.metrics.observe_rpc("BeginPhase", "OK", 0.003)
        metrics_server.metrics.observe_rpc("Pin", "INVALID_ARGUMENT", 0.001)
        got = samples(scrape(metrics_server))
        counts = {
            (labels["method"], labels["code"]): value for labels, value in got["eerl_rpc_requests_total"]
        }
        assert counts == {("BeginPhase", "OK"): 2.0, ("Pin", "INVALID_ARGUMENT"): 1.0}
        durations = {labels["method"]: value for labels, value in got["eerl_rpc_duration_seconds_count"]}
        assert durations == {"BeginPhase": 2.0, "Pin": 1.0}

    def test_phase_events_fill_the_latency_histogram(self, fake_source: FakeMetricsSource) -> None:
        """observe_phase_event lands in the bucket of its latency."""
        metrics = EerlMetrics(fake_source)
        metrics.observe_phase_event("begin", 0.004)
        value = metrics.registry.get_sample_value(
            "eerl_phase_event_duration_seconds_bucket", {"event": "begin", "le": "0.005"}
        )
        below = metrics.registry.get_sample_value(
            "eerl_phase_event_duration_seconds_bucket", {"event": "begin", "le": "0.0025"}
        )
        assert (value, below) == (1.0, 0.0)

    def test_two_daemons_keep_separate_registries(self, fake_source: FakeMetricsSource) -> None:
        """Nothing is module-global: one daemon's RPCs do not show in another's metrics."""
        first, second = EerlMetrics(fake_source), EerlMetrics(fake_source)
        first.observe_rpc("Status", "OK", 0.001)
        labels = {"method": "Status", "code": "OK"}
        assert first.registry.get_sample_value("eerl_rpc_requests_total", labels) == 1.0
        assert second.registry.get_sample_value("eerl_rpc_requests_total", labels) is None


class TestAddress:
    def test_the_default_binds_loopback_on_an_unclaimed_port(self) -> None:
        """127.0.0.1:9478: not every interface, and neither dcgm-exporter's 9400 nor node-exporter's 9100."""
        assert parse_address(DEFAULT_METRICS_ADDRESS) == ("127.0.0.1", 9478)

    def test_ipv6_addresses_are_unbracketed(self) -> None:
        """[::1]:9478 binds ::1."""
        assert parse_address("[::1]:9478") == ("::1", 9478)

    @pytest.mark.parametrize("address", ["9478", "localhost", ":9478", "host:http", "host:70000"])
    def test_malformed_addresses_are_config_errors(self, address: str) -> None:
        """A malformed --metrics-address is rejected with a message naming the flag."""
        with pytest.raises(ConfigError, match="--metrics-address"):
            parse_address(address)

    def test_a_busy_port_is_a_config_error(self, metrics_server: MetricsServer) -> None:
        """Binding a port that is already in use fails with ConfigError, not a bare OSError."""
        with pytest.raises(ConfigError, match="cannot listen"):
            start_metrics_server(FakeMetricsSource(), f"127.0.0.1:{metrics_server.port}")
