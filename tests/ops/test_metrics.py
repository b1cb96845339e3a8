"""The Prometheus metrics: names, units, labels, the scrape-time collector and the HTTP server."""

from __future__ import annotations

import gzip
import re
import socket
import threading
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import pytest
from eerl.phases import PhaseKind
from prometheus_client import generate_latest, make_wsgi_app
from prometheus_client.parser import text_string_to_metric_families

from eerld.errors import ConfigError
from eerld.metrics import (
    DEFAULT_METRICS_ADDRESS,
    EerlMetrics,
    MetricsServer,
    MetricsSnapshot,
    PodSample,
    parse_address,
    start_metrics_server,
)
from tests.ops.fakes import FakeMetricsSource

PATIENCE_S = 30.0
"""How long a test waits for something that must happen (never asserted as a duration)."""


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


def exchange(port: int, request: bytes, host: str = "127.0.0.1") -> bytes:
    """Send ``request`` on a fresh connection; everything the server sends until it closes."""
    with socket.create_connection((host, port), timeout=PATIENCE_S) as sock:
        sock.sendall(request)
        return read_to_close(sock)


def read_to_close(sock: socket.socket) -> bytes:
    """Read until the server closes the connection (b"" for a close without an answer)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    return data


def is_closed_by_server(sock: socket.socket) -> bool:
    """True when the server has closed ``sock`` (an orderly close or a reset), without waiting."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True
    finally:
        sock.setblocking(True)


def undated(answer: bytes) -> bytes:
    return re.sub(rb"\r\nDate: [^\r]*", b"", answer)


class _QuietReference(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


def reference_answer(server: MetricsServer, request: bytes) -> bytes:
    """What the library's wsgiref server answers for the same registry: the behaviour to keep."""
    reference = make_server(
        "127.0.0.1", 0, make_wsgi_app(server.metrics.registry), handler_class=_QuietReference
    )
    try:
        thread = threading.Thread(target=reference.handle_request)
        thread.start()
        answer = exchange(int(reference.server_address[1]), request)
        thread.join()
    finally:
        reference.server_close()
    return answer


@dataclass
class BlockingSource:
    """A source whose reads hang until released, as a GPU read can on a wedged driver."""

    entered: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def metrics_snapshot(self) -> MetricsSnapshot:
        self.entered.set()
        self.released.wait(PATIENCE_S)
        return FakeMetricsSource().metrics_snapshot()


@contextmanager
def serving(source: Any, **limits: Any) -> Iterator[MetricsServer]:
    server = start_metrics_server(source, "127.0.0.1:0", **limits)
    try:
        yield server
    finally:
        if isinstance(source, BlockingSource):
            source.released.set()
        server.close()


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
        """Session metrics are labelled by job, rank and phase, never by the secret session id; the energy
        per valid token is absent (not 0) for generation, which credits no valid tokens."""
        text = scrape(metrics_server)
        got = samples(text)
        (labels, value), *others = got["eerl_session_energy_per_valid_token_joules"]
        assert others == []
        assert labels == {
            "job_id": "job-42",
            "rank": "0",
            "gpus": "0",
            "phase": "training",
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

    def test_every_series_carries_the_node_name(self, metrics_server: MetricsServer) -> None:
        """Every sample of every family, the in-process RPC and phase metrics included, has ``Hostname``, so
        that a dashboard's node filter selects each family (it did not on eerl_sessions and the counters)."""
        metrics_server.metrics.observe_rpc("BeginPhase", "OK", 0.002)
        metrics_server.metrics.observe_phase_event("begin", 0.002)
        metrics_server.metrics.observe_phase(PhaseKind.TRAINING, 3.0, 10, 1.0)
        metrics_server.metrics.observe_directive("accepted", PhaseKind.TRAINING)
        got = samples(scrape(metrics_server))
        unlabelled = {
            name for name, series in got.items() for labels, _ in series if "Hostname" not in labels
        }
        assert unlabelled == set()
        hostnames = {labels["Hostname"] for series in got.values() for labels, _ in series}
        assert hostnames == {"node-1"}
        for name in (
            "eerl_sessions",
            "eerl_rpc_requests_total",
            "eerl_phase_event_duration_seconds_bucket",
            "eerl_phase_energy_joules_total",
            "eerl_job_directives_total",
            "eerl_daemon_start_time_seconds",
        ):
            assert name in got

    def test_session_gpus_map_jobs_to_dcgm_gpu_labels(self, metrics_server: MetricsServer) -> None:
        """eerl_session_gpu_info names each GPU a session holds with dcgm-exporter's labels, the key for
        joining a job with DCGM_FI_* series (``on (Hostname, UUID)``)."""
        got = samples(scrape(metrics_server))
        ((labels, value),) = got["eerl_session_gpu_info"]
        assert value == 1.0
        assert labels == {
            "job_id": "job-42",
            "rank": "0",
            "gpus": "0",
            "gpu": "0",
            "UUID": "GPU-00000000-0000-0000-0000-000000000000",
            "pci_bus_id": "00000000:18:00.0",
            "device": "nvidia0",
            "modelName": "NVIDIA H100 80GB HBM3",
            "Hostname": "node-1",
        }

    def test_build_info_names_version_and_backend(self, metrics_server: MetricsServer) -> None:
        """eerl_build_info is 1 and carries the version, backend and controller."""
        labels, value = samples(scrape(metrics_server))["eerl_build_info"][0]
        assert value == 1.0
        assert (labels["version"], labels["backend"], labels["controller"]) == ("0.1.0", "sim", "eerl")

    def test_hostname_override_replaces_the_daemons(self, fake_source: FakeMetricsSource) -> None:
        """In Kubernetes the node name replaces the pod's host name in the Hostname label."""
        server = start_metrics_server(fake_source, "127.0.0.1:0", hostname="gpu-node-7")
        try:
            server.metrics.observe_rpc("Status", "OK", 0.001)
            got = samples(scrape(server))
        finally:
            server.close()
        assert {labels["Hostname"] for series in got.values() for labels, _ in series} == {"gpu-node-7"}

    def test_a_failing_source_fails_soft(
        self, fake_source: FakeMetricsSource, metrics_server: MetricsServer
    ) -> None:
        """When the daemon cannot be read the scrape still answers, and counts the failure."""
        scrape(metrics_server)
        metrics_server.metrics.observe_rpc("Status", "OK", 0.001)
        fake_source.fail = True
        got = samples(scrape(metrics_server))
        assert got["eerl_metrics_collect_errors_total"] == [({"Hostname": "node-1"}, 1.0)]
        assert "eerl_gpu_power_watts" not in got
        # The in-process metrics still answer, under the node name the last good read gave.
        assert got["eerl_rpc_requests_total"] == [
            ({"Hostname": "node-1", "method": "Status", "code": "OK"}, 1.0)
        ]

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

    def test_attribution_labels_appear_only_where_known(self, fake_source: FakeMetricsSource) -> None:
        """A session with an HPC job and a pod on its GPU gets hpc_job/namespace/pod/container on its
        series; one without gets none of them (no empty labels), and GPU series never get them."""
        snapshot = fake_source.metrics_snapshot()
        attributed = replace(snapshot.sessions[0], hpc_job="4711")
        plain = replace(snapshot.sessions[0], job_id="job-7", gpu_indices=(1,))
        pods = {snapshot.gpus[0].uuid: PodSample("rl", "trainer-0", "policy")}
        metrics = EerlMetrics(StaticSource(replace(snapshot, sessions=(attributed, plain), pods=pods)))
        got = samples(generate_latest(metrics.registry).decode())
        want = {"hpc_job": "4711", "namespace": "rl", "pod": "trainer-0", "container": "policy"}
        for name in ("eerl_session_info", "eerl_session_gpu_info", "eerl_session_energy_joules_total"):
            by_job = {labels["job_id"]: labels for labels, _ in got[name]}
            assert {k: by_job["job-42"][k] for k in want} == want
            assert not set(by_job["job-7"]) & set(want)
        state = [labels for labels, _ in got["eerl_session_controller_state"] if labels["job_id"] == "job-42"]
        assert state
        assert all(labels["pod"] == "trainer-0" for labels in state)
        assert all("pod" not in labels for labels, _ in got["eerl_gpu_power_watts"])

    def test_clock_event_reasons_are_absent_until_read(self, fake_source: FakeMetricsSource) -> None:
        """The fake source reads no reasons for GPU 0 and power_cap for GPU 1 (bit 0x4)."""
        snapshot = fake_source.metrics_snapshot()
        gpus = (
            replace(snapshot.gpus[0], clock_event_reasons=None),
            replace(snapshot.gpus[1], clock_event_reasons=4),
        )
        metrics = EerlMetrics(StaticSource(replace(snapshot, gpus=gpus)))
        got = samples(generate_latest(metrics.registry).decode())
        assert [(labels["gpu"], v) for labels, v in got["eerl_gpu_clock_event_reasons"]] == [("1", 4.0)]
        active = [labels["clock_event"] for labels, v in got["eerl_gpu_clock_event_reason"] if v == 1.0]
        assert active == ["power_cap"]


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

    def test_job_directives_are_counted_by_verdict_and_kind(self, metrics_server: MetricsServer) -> None:
        """observe_directive counts every job-mode phase by its directive's verdict and phase kind."""
        metrics_server.metrics.observe_directive("accepted", PhaseKind.GENERATION)
        metrics_server.metrics.observe_directive("accepted", PhaseKind.GENERATION)
        metrics_server.metrics.observe_directive("off_grid", PhaseKind.TRAINING)
        got = samples(scrape(metrics_server))
        counts = {
            (labels["verdict"], labels["kind"]): value for labels, value in got["eerl_job_directives_total"]
        }
        assert counts == {("accepted", "generation"): 2.0, ("off_grid", "training"): 1.0}

    def test_phase_events_fill_the_latency_histogram(self, fake_source: FakeMetricsSource) -> None:
        """observe_phase_event lands in the bucket of its latency."""
        metrics = EerlMetrics(fake_source)
        metrics.observe_phase_event("begin", 0.004)
        value = metrics.registry.get_sample_value(
            "eerl_phase_event_duration_seconds_bucket",
            {"event": "begin", "le": "0.005", "Hostname": "node-1"},
        )
        below = metrics.registry.get_sample_value(
            "eerl_phase_event_duration_seconds_bucket",
            {"event": "begin", "le": "0.0025", "Hostname": "node-1"},
        )
        assert (value, below) == (1.0, 0.0)

    def test_two_daemons_keep_separate_registries(self, fake_source: FakeMetricsSource) -> None:
        """Nothing is module-global: one daemon's RPCs do not show in another's metrics."""
        first, second = EerlMetrics(fake_source), EerlMetrics(fake_source)
        first.observe_rpc("Status", "OK", 0.001)
        labels = {"method": "Status", "code": "OK", "Hostname": "node-1"}
        assert first.registry.get_sample_value("eerl_rpc_requests_total", labels) == 1.0
        assert second.registry.get_sample_value("eerl_rpc_requests_total", labels) is None


GET = b"GET /metrics HTTP/1.1\r\nHost: node\r\nConnection: close\r\n\r\n"


class TestServer:
    @pytest.mark.parametrize(
        "request_bytes",
        [
            GET,
            b"GET /metrics HTTP/1.0\r\n\r\n",
            b"GET /metrics HTTP/1.0\n\n",
            b"GET /anything?name[]=eerl_sessions HTTP/1.1\r\nHost: node\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text; version=1.0.0\r\n\r\n",
            b"GET /favicon.ico HTTP/1.1\r\n\r\n",
            b"HEAD /metrics HTTP/1.1\r\n\r\n",
            b"OPTIONS /metrics HTTP/1.1\r\n\r\n",
            b"POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
            b"NONSENSE\r\n\r\n",
            b"GET / HTTP/9.9\r\n\r\n",
        ],
        ids=["get", "http1.0", "bare-lf", "other-path", "openmetrics", "favicon", "head", "options", "post",
             "garbage", "bad-version"],
    )  # fmt: skip
    def test_answers_are_the_library_servers_byte_for_byte(self, request_bytes: bytes) -> None:
        """Status line, headers and body are what the wsgiref server answered, but for the Date header."""
        with serving(StaticSource(FakeMetricsSource().metrics_snapshot())) as server:
            ours = exchange(server.port, request_bytes)
            theirs = reference_answer(server, request_bytes)
        assert undated(ours) == undated(theirs)

    def test_a_scrape_that_accepts_gzip_gets_gzip(self) -> None:
        """Accept-Encoding: gzip gets a gzip body that unpacks to the plain exposition."""
        with serving(StaticSource(FakeMetricsSource().metrics_snapshot())) as server:
            zipped = exchange(server.port, GET.replace(b"\r\n\r\n", b"\r\nAccept-Encoding: gzip\r\n\r\n"))
            plain = exchange(server.port, GET)
        head, _, body = zipped.partition(b"\r\n\r\n")
        assert b"\r\nContent-Encoding: gzip" in head
        assert gzip.decompress(body) == plain.partition(b"\r\n\r\n")[2]

    def test_ipv6_is_served(self) -> None:
        """An IPv6 address ([::1]:0) is bound and scraped like an IPv4 one."""
        if not socket.has_ipv6:
            pytest.skip("no IPv6")
        try:
            server = start_metrics_server(FakeMetricsSource(), "[::1]:0")
        except ConfigError as e:
            pytest.skip(f"::1 cannot be bound here: {e}")
        try:
            answer = exchange(server.port, GET, host="::1")
        finally:
            server.close()
        assert answer.startswith(b"HTTP/1.0 200 OK\r\n")

    def test_a_slow_loris_is_closed_at_the_request_deadline(self) -> None:
        """A client trickling its headers a byte at a time is closed unanswered at the request deadline."""
        trickle, received, sent = b"X-Trickle: y\r\n", b"", 0
        with (
            serving(FakeMetricsSource(), request_timeout_s=0.3) as server,
            socket.create_connection((server.host, server.port), timeout=PATIENCE_S) as sock,
        ):
            sock.setblocking(False)
            while sent < 10_000:
                try:
                    if not (chunk := sock.recv(4096)):
                        break
                    received += chunk
                except BlockingIOError:
                    pass
                except ConnectionResetError:
                    break
                try:
                    sock.send(trickle[sent % len(trickle) :][:1])
                except (BrokenPipeError, ConnectionResetError):
                    break
                sent += 1
                threading.Event().wait(0.01)
        assert sent < 10_000, "the trickling connection was never closed"
        assert received == b""

    def test_a_connection_is_closed_at_the_total_deadline_while_its_answer_hangs(self) -> None:
        """When reading the daemon hangs, the scrape's connection is still closed at the total deadline."""
        with serving(BlockingSource(), connection_timeout_s=0.3) as server:
            assert exchange(server.port, GET) == b""

    def test_headers_beyond_the_bound_are_answered_431(self) -> None:
        """A request line plus headers over max_request_bytes is answered 431 and closed."""
        with serving(FakeMetricsSource(), max_request_bytes=1024) as server:
            answer = exchange(server.port, b"GET /metrics HTTP/1.1\r\nX-Pad: " + b"a" * 2000 + b"\r\n\r\n")
            fits = exchange(server.port, GET)
        assert answer.startswith(b"HTTP/1.0 431 ")
        assert fits.startswith(b"HTTP/1.0 200 OK\r\n")

    def test_a_request_body_is_never_waited_for(self) -> None:
        """A request announcing a gigabyte body is answered from its headers alone."""
        with serving(FakeMetricsSource()) as server:
            answer = exchange(server.port, b"POST /metrics HTTP/1.1\r\nContent-Length: 1000000000\r\n\r\n")
        assert answer.startswith(b"HTTP/1.0 405 Method Not Allowed\r\n")

    def test_one_connection_beyond_the_cap_closes_the_oldest_idle_one(self) -> None:
        """At the cap, a new connection closes the oldest that has sent nothing; the others stay open."""
        with serving(FakeMetricsSource(), max_connections=2) as server:
            address = (server.host, server.port)
            with socket.create_connection(address) as oldest, socket.create_connection(address) as younger:
                assert exchange(server.port, GET).startswith(b"HTTP/1.0 200 OK\r\n")
                assert read_to_close(oldest) == b""
                assert not is_closed_by_server(younger)

    def test_when_every_slot_is_being_answered_a_newcomer_gets_503(self) -> None:
        """With the one slot answering a hung scrape, the next connection is answered 503 at once."""
        source = BlockingSource()
        with (
            serving(source, max_connections=1) as server,
            socket.create_connection((server.host, server.port), timeout=PATIENCE_S) as hung,
        ):
            hung.sendall(GET)
            assert source.entered.wait(PATIENCE_S)
            with socket.create_connection((server.host, server.port), timeout=PATIENCE_S) as newcomer:
                answer = read_to_close(newcomer)
        assert answer.startswith(b"HTTP/1.0 503 Service Unavailable\r\n")

    def test_close_closes_open_connections_and_stops_every_thread(self) -> None:
        """close() with an idle and a hung connection closes both, frees the port and ends its threads."""
        source, before = BlockingSource(), set(threading.enumerate())
        server = start_metrics_server(source, "127.0.0.1:0")
        address = (server.host, server.port)
        with (
            socket.create_connection(address, timeout=PATIENCE_S) as idle,
            socket.create_connection(address, timeout=PATIENCE_S) as hung,
        ):
            hung.sendall(GET)
            assert source.entered.wait(PATIENCE_S)
            server.close()
            source.released.set()
            assert (read_to_close(idle), read_to_close(hung)) == (b"", b"")
        with pytest.raises(ConnectionRefusedError):
            socket.create_connection(address, timeout=PATIENCE_S).close()
        alive = [t for t in threading.enumerate() if t not in before and t.name.startswith("eerl-metrics")]
        for thread in alive:
            thread.join(PATIENCE_S)
        assert not [t.name for t in alive if t.is_alive()]

    @pytest.mark.parametrize(
        "limit", ["max_connections", "request_timeout_s", "connection_timeout_s", "max_request_bytes"]
    )
    def test_limits_must_be_positive(self, limit: str) -> None:
        """A zero limit is a ConfigError naming it."""
        limits: dict[str, Any] = {limit: 0}
        with pytest.raises(ConfigError, match=limit):
            start_metrics_server(FakeMetricsSource(), "127.0.0.1:0", **limits)


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
