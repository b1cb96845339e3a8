"""A real Prometheus scrapes a real eerld on the sim backend; metrics are read back through its query API.

The daemon has a finished session (job-42), an admin pin and a job that keeps running (job-7) while
Prometheus scrapes it, next to a dcgm-exporter target (the fixture page tests/ops/data/dcgm-exporter.prom,
labelled with the node's name and the simulated GPUs' UUIDs). Every panel query of the Grafana dashboard
runs through the query API as Grafana would send it, and must return series.

The set-up (scripts/ensure_prometheus.sh, run by `make test`) installs Debian's prometheus package; when
the binaries are missing these tests fail with that instruction rather than skip.
"""

from __future__ import annotations

import http.server
import io
import json
import math
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from eerl.v1 import eerl_pb2, eerl_pb2_grpc

from eerlctl.main import main as eerlctl
from soak.daemon import DaemonProcess
from tests.ops.conftest import require_tool
from tests.ops.dashboard import DCGM_FIXTURE, Query, dashboard, interpolate, queries, variables

pytestmark = pytest.mark.prometheus

NODE_NAME = "sim-node-1"
DCGM_CAMEL_CASE_LABELS = ("UUID", "modelName", "Hostname")
DEADLINE_S = 40.0
FINISHED_JOB = "job-42"
"""Ran two iterations on GPU 0 before Prometheus started; its session stays open."""
RUNNING_JOB = "job-7"
"""Runs phases on GPU 2 for as long as the daemon does."""
RUNNING_JOB_GPU = 2
PHASE_S = 0.3
"""How long each phase of the running job lasts: each phase is two clock changes (its lock and its end's
release), so phases much shorter than this would outrun eerld's rate limit (10 changes a second per GPU),
and once its bucket is spent the locks are skipped (the GPU runs at default)."""
RATE_INTERVAL = "10s"
"""$__rate_interval for the dashboard's queries: several 1 s scrapes (Grafana: 4 scrape intervals or more)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_for(what: str, check: Any, proc: subprocess.Popen[bytes], log: Path) -> Any:
    """Poll ``check()`` until it returns a truthy value; fail with the process log if it never does."""
    deadline = time.monotonic() + DEADLINE_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"{what}: process exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            result = check()
        except (OSError, grpc.RpcError, ValueError):
            result = None
        if result:
            return result
        time.sleep(0.2)
    pytest.fail(f"{what}: not within {DEADLINE_S:.0f} s:\n{log.read_text()[-3000:]}")


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class RunningJob:
    """A training loop on one GPU: BeginPhase/EndPhase of generation then training, over and over."""

    socket_path: Path
    stop: threading.Event = field(default_factory=threading.Event)
    errors: list[Exception] = field(default_factory=list)
    iterations: int = 0
    thread: threading.Thread | None = None

    def start(self) -> None:
        self.thread = threading.Thread(target=self._run, name="running-job", daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        if self.thread is not None:
            self.thread.join(timeout=15)

    def check(self) -> None:
        """Fail the test when the loop died (a dashboard over a stopped job would show stale data)."""
        assert not self.errors, f"the running job failed: {self.errors[0]!r}"
        assert self.thread is not None
        assert self.thread.is_alive(), "the running job stopped"

    def _run(self) -> None:
        try:
            with grpc.insecure_channel(f"unix:{self.socket_path}") as channel:
                stub = eerl_pb2_grpc.PhaseServiceStub(channel)
                session_id = open_session(stub, RUNNING_JOB, RUNNING_JOB_GPU)
                while not self.stop.is_set():
                    run_iteration(stub, session_id, self.iterations, lambda: self.stop.wait(PHASE_S))
                    self.iterations += 1
        except Exception as e:  # reported by check()
            self.errors.append(e)


def open_session(stub: eerl_pb2_grpc.PhaseServiceStub, job_id: str, gpu: int) -> str:
    """A sync session of rank 0 on ``gpu`` whose lease outlives the module (no heartbeats follow)."""
    opened = stub.OpenSession(
        eerl_pb2.OpenSessionRequest(
            job_id=job_id,
            rank=0,
            gpus=[eerl_pb2.GpuRef(index=gpu)],
            mode=eerl_pb2.EXECUTION_MODE_SYNC,
            lease_ttl_s=300,
        ),
        timeout=10,
    )
    session_id: str = opened.session_id
    return session_id


def run_iteration(
    stub: eerl_pb2_grpc.PhaseServiceStub,
    session_id: str,
    iteration: int,
    work: Callable[[], object] = lambda: None,
) -> None:
    """One RL iteration: a generation phase, then a training phase, each crediting 2048 valid tokens."""
    for kind in (eerl_pb2.PHASE_KIND_GENERATION, eerl_pb2.PHASE_KIND_TRAINING):
        stub.BeginPhase(
            eerl_pb2.BeginPhaseRequest(session_id=session_id, kind=kind, iteration=iteration), timeout=10
        )
        work()
        workload = eerl_pb2.Workload(tokens=4096, valid_tokens=2048, sequences=16)
        request = eerl_pb2.EndPhaseRequest(
            session_id=session_id, kind=kind, iteration=iteration, workload=workload
        )
        stub.EndPhase(request, timeout=10)


@dataclass(frozen=True)
class SimDaemon:
    eerld: DaemonProcess
    metrics_port: int
    job: RunningJob

    @property
    def socket_path(self) -> Path:
        return self.eerld.socket_path

    @property
    def admin_socket_path(self) -> Path:
        return self.eerld.admin_socket_path

    def metrics_text(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as reply:
            body: bytes = reply.read()
        return body.decode()


def admin_ok(daemon: SimDaemon, *argv: str) -> str:
    out, err = io.StringIO(), io.StringIO()
    code = eerlctl(["--socket", str(daemon.admin_socket_path), *argv], out=out, err=err)
    assert code == 0, err.getvalue()
    return out.getvalue()


@pytest.fixture(scope="module")
def sim_daemon() -> Iterator[SimDaemon]:
    """`eerld --backend sim` with three GPUs (soak's :class:`DaemonProcess`): a finished session (job-42, two
    iterations) on GPU 0, an admin pin on GPU 1 and a running job (job-7) on GPU 2."""
    directory = Path(tempfile.mkdtemp(prefix="eerl-prom-", dir="/tmp"))
    port = free_port()
    # Real time (the pin's 30 min and the sessions' 300 s leases must outlive the module), /metrics on.
    extra = ["--sim-speedup=1", f"--metrics-address=127.0.0.1:{port}"]
    eerld = DaemonProcess(directory, gpus=3, extra_args=extra)
    job = RunningJob(eerld.socket_path)
    daemon = SimDaemon(eerld, port, job)
    try:
        with pytest.MonkeyPatch.context() as env:
            env.setenv("NODE_NAME", NODE_NAME)  # the Hostname label, as the DaemonSet sets it
            eerld.start()
        assert eerld.proc is not None
        wait_for("eerld /metrics", daemon.metrics_text, eerld.proc, eerld.log_path)
        with grpc.insecure_channel(f"unix:{daemon.socket_path}") as channel:
            stub = eerl_pb2_grpc.PhaseServiceStub(channel)
            session_id = open_session(stub, FINISHED_JOB, 0)
            for iteration in range(2):
                run_iteration(stub, session_id, iteration)
        admin_ok(
            daemon, "pin", "--gpus", "1", "--sm-mhz", "1005", "--for", "30m", "--reason", "prometheus test"
        )
        job.start()
        yield daemon
    finally:
        job.close()
        eerld.stop()
        shutil.rmtree(directory, ignore_errors=True)


def dcgm_page(template: str, hostname: str, uuids: dict[str, str]) -> bytes:
    """The fixture page with its Hostname and each GPU's UUID replaced by the node's (keyed by ``gpu``)."""
    lines = []
    for line in template.splitlines():
        if line.startswith("#"):
            lines.append(line)
            continue
        gpu = re.search(r'\bgpu="(\d+)"', line)
        if gpu is None or gpu.group(1) not in uuids:
            continue  # a GPU the node does not have
        relabelled = re.sub(r'\bUUID="[^"]*"', f'UUID="{uuids[gpu.group(1)]}"', line)
        lines.append(re.sub(r'\bHostname="[^"]*"', f'Hostname="{hostname}"', relabelled))
    return ("\n".join(lines) + "\n").encode()


@pytest.fixture(scope="module")
def dcgm_exporter(sim_daemon: SimDaemon) -> Iterator[int]:
    """A dcgm-exporter stand-in for the same node: the fixture page over HTTP, with the Hostname and the
    GPU UUIDs that the daemon's Status reports. Yields its port."""
    status = json.loads(admin_ok(sim_daemon, "--json", "status"))
    uuids = {str(gpu["index"]): gpu["uuid"] for gpu in status["gpus"]}
    assert len(uuids) == 3, status
    body = dcgm_page(DCGM_FIXTURE.read_text(), NODE_NAME, uuids)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200 if self.path == "/metrics" else 404)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, name="dcgm-exporter", daemon=True)
    thread.start()
    try:
        yield int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def prometheus(
    sim_daemon: SimDaemon, dcgm_exporter: int, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A Prometheus server on a free loopback port scraping the daemon and the dcgm-exporter stand-in
    every second (as deploy/prometheus/prometheus.yml does, faster); yields its URL."""
    binary = require_tool("prometheus", "prometheus")
    directory = tmp_path_factory.mktemp("prometheus")
    config = directory / "prometheus.yml"
    config.write_text(
        "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
        "scrape_configs:\n  - job_name: eerld\n    honor_labels: true\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{sim_daemon.metrics_port}']\n"
        "  - job_name: dcgm-exporter\n"
        f"    static_configs:\n      - targets: ['127.0.0.1:{dcgm_exporter}']\n"
    )
    port = free_port()
    log = directory / "prometheus.log"
    args = [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--storage.tsdb.retention.time=1h",
    ]
    with log.open("wb") as log_file:
        proc = subprocess.Popen(args, cwd=directory, stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for("prometheus ready", lambda: urllib.request.urlopen(f"{url}/-/ready", timeout=2), proc, log)
        # Wait until a scrape has landed, so each test queries stored samples.
        wait_for("first scrapes", lambda: len(query(url, "up == 1")) == 2, proc, log)
        yield url
    finally:
        stop(proc)


def api(url: str, path: str, params: Sequence[tuple[str, str]]) -> Any:
    """GET one Prometheus HTTP API endpoint; its ``data``."""
    try:
        with urllib.request.urlopen(f"{url}{path}?{urllib.parse.urlencode(params)}", timeout=10) as reply:
            body = json.load(reply)
    except urllib.error.HTTPError as e:  # 400/422: a query Prometheus cannot parse or run
        pytest.fail(f"{path} {params}: HTTP {e.code}: {e.read().decode()}")
    assert body["status"] == "success", body
    return body["data"]


def query(url: str, promql: str, at: float | None = None) -> list[dict[str, Any]]:
    """Instant query through Prometheus's HTTP API: the result vector."""
    params = [("query", promql)] + ([] if at is None else [("time", f"{at:.3f}")])
    result: list[dict[str, Any]] = api(url, "/api/v1/query", params)["result"]
    return result


def values(url: str, promql: str) -> dict[str, float]:
    """``{gpu or phase label: value}`` of an instant query."""
    return {
        r["metric"].get("gpu") or r["metric"].get("phase") or "": float(r["value"][1])
        for r in query(url, promql)
    }


class TestPrometheusScrapesEerld:
    def test_gpu_clocks_and_locks_arrive_with_dcgm_labels(self, prometheus: str) -> None:
        """The pinned GPU 1 is locked at 1005 MHz, the running job's GPU 2 in its phases (between two of
        them, for the moment of two RPCs, it is not: hence the maximum over a minute), and the finished
        session's GPU 0 not at all: its lock ended with its last phase. The series carry the node name and
        the GPU's UUID. A scrape lands in a phase only by chance, and on a busy machine the first few may
        all fall between phases: the query is asked again until GPU 2's lock has been seen once."""
        promql = 'max_over_time(eerl_gpu_locked{job="eerld"}[1m])'
        deadline = time.monotonic() + DEADLINE_S
        while values(prometheus, promql).get("2") != 1.0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert values(prometheus, promql) == {"0": 0.0, "1": 1.0, "2": 1.0}
        assert values(prometheus, 'eerl_gpu_locked_sm_clock_hertz{gpu="1"}') == {"1": 1.005e9}
        (series,) = query(prometheus, 'eerl_gpu_admin_pinned{gpu="1"}')
        assert series["metric"]["Hostname"] == NODE_NAME
        assert series["metric"]["UUID"].startswith("GPU-")
        assert series["value"][1] == "1"

    def test_energy_counters_grow_between_scrapes(self, prometheus: str) -> None:
        """rate() of the GPU energy counter is positive: the simulated GPUs draw power."""
        promql = "rate(eerl_gpu_energy_joules_total[10s]) > 0"
        deadline = time.monotonic() + DEADLINE_S
        while len(values(prometheus, promql)) < 3 and time.monotonic() < deadline:
            time.sleep(0.5)  # rate() needs two scrapes inside the window
        assert set(values(prometheus, promql)) == {"0", "1", "2"}

    def test_session_metrics_per_phase(self, prometheus: str) -> None:
        """The session's chosen clocks per phase and its metered phases are queryable by job."""
        clocks = values(prometheus, f'eerl_session_sm_clock_hertz{{job_id="{FINISHED_JOB}"}}')
        assert clocks == {"generation": 1.2e9, "training": 1.5e9}
        assert values(prometheus, 'eerl_session_phases_total{job_id="job-42"}') == {
            "generation": 2.0,
            "training": 2.0,
        }
        states = query(prometheus, 'eerl_session_controller_state{job_id="job-42"} == 1')
        assert {r["metric"]["eerl_session_controller_state"] for r in states} == {"fixed"}

    def test_rpcs_and_phase_latency_are_counted(self, prometheus: str) -> None:
        """The RPC counter has the Pin and the phase events (job-42's four and the running job's); the
        latency histogram has both events; both carry the node name."""
        rpcs = query(prometheus, "eerl_rpc_requests_total")
        counted = {(r["metric"]["method"], r["metric"]["code"]): float(r["value"][1]) for r in rpcs}
        assert counted[("Pin", "OK")] == 1.0
        assert counted[("BeginPhase", "OK")] >= 4.0
        latency = query(prometheus, "eerl_phase_event_duration_seconds_count")
        counts = {r["metric"]["event"]: float(r["value"][1]) for r in latency}
        assert set(counts) == {"begin", "end"}
        assert min(counts.values()) >= 4.0
        assert {r["metric"]["Hostname"] for r in rpcs + latency} == {NODE_NAME}

    def test_build_info_names_the_sim_backend(self, prometheus: str) -> None:
        """eerl_build_info reports the sim backend and the fixed controller."""
        (series,) = query(prometheus, "eerl_build_info")
        assert (series["metric"]["backend"], series["metric"]["controller"]) == ("sim", "fixed")


def label_values(url: str, label: str, selector: str) -> list[str]:
    """A label's values as Grafana's label_values(selector, label) asks for them (last 6 hours)."""
    now = time.time()
    params = [("start", f"{now - 6 * 3600:.0f}"), ("end", f"{now:.0f}")]
    if selector:
        params.append(("match[]", selector))
    found: list[str] = api(url, f"/api/v1/label/{label}/values", params)
    return sorted(found)


def resolve_variables(
    url: str, selection: Mapping[str, str | None]
) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Each query variable's options, in dashboard order with the earlier selections substituted, and the
    selection: the named value, or every option where ``selection`` says None ("All")."""
    options: dict[str, list[str]] = {}
    chosen: dict[str, list[str]] = {}
    for var in variables(dashboard()):
        options[var.name] = label_values(url, var.label, interpolate(var.selector, chosen))
        pick = selection[var.name]
        chosen[var.name] = options[var.name] if pick is None else [pick]
    return options, chosen


def is_finite(series: dict[str, Any]) -> bool:
    return math.isfinite(float(series["value"][1]))


def run_panels(url: str, chosen: Mapping[str, Sequence[str]]) -> dict[Query, list[dict[str, Any]]]:
    """Every panel query as Grafana sends it for ``chosen``, all evaluated at one instant."""
    values: dict[str, str | Sequence[str]] = {**chosen, "__rate_interval": RATE_INTERVAL}
    at = time.time()
    return {q: query(url, interpolate(q.expr, values), at=at) for q in queries(dashboard())}


def wait_for_panels(
    url: str, job: RunningJob, chosen: Mapping[str, Sequence[str]]
) -> tuple[dict[Query, list[dict[str, Any]]], list[str]]:
    """Run the panels until each shows a number (a finite value in some series) or the deadline passes:
    the rate() panels need a few scrapes of the running job. Returns the last results and the panels
    without data."""
    deadline = time.monotonic() + DEADLINE_S
    while True:
        job.check()
        results = run_panels(url, chosen)
        empty = [q.name for q, series in results.items() if not any(is_finite(s) for s in series)]
        if not empty or time.monotonic() > deadline:
            return results, empty
        time.sleep(0.5)


class TestDashboardQueries:
    """The Grafana dashboard against a real Prometheus, queried the way Grafana queries it."""

    def test_variables_list_the_node_and_its_jobs(self, prometheus: str) -> None:
        """The node variable finds the node; the job variable, chained on it, finds both open jobs."""
        options, _ = resolve_variables(prometheus, {"Hostname": None, "job_id": None})
        assert options == {"Hostname": [NODE_NAME], "job_id": [FINISHED_JOB, RUNNING_JOB]}

    @pytest.mark.parametrize("job", [RUNNING_JOB, None], ids=["running-job", "all-jobs"])
    def test_every_panel_query_shows_data(
        self, prometheus: str, sim_daemon: SimDaemon, job: str | None
    ) -> None:
        """With the node and a job (or "All") selected, every panel query returns series with a number,
        and only series of the selection: Grafana would draw every panel."""
        _, chosen = resolve_variables(prometheus, {"Hostname": NODE_NAME, "job_id": job})
        results, empty = wait_for_panels(prometheus, sim_daemon.job, chosen)
        report = "\n".join(f"{len(series):3d} series  {q.name}" for q, series in results.items())
        print(f"\nHostname={chosen['Hostname']} job_id={chosen['job_id']}:\n{report}")
        assert empty == [], report
        for q, series in results.items():
            for s in series:
                labels = s["metric"]
                assert labels.get("Hostname", NODE_NAME) == NODE_NAME, (q.name, labels)
                assert labels.get("job_id", chosen["job_id"][0]) in chosen["job_id"], (q.name, labels)

    def test_dcgm_panels_show_the_running_jobs_own_gpu(self, prometheus: str, sim_daemon: SimDaemon) -> None:
        """The dcgm-exporter joins pick the GPU the running job holds (GPU 2, by UUID): its power and SM
        clock as the dcgm-exporter page has them, next to eerld's lock on the same GPU."""
        _, chosen = resolve_variables(prometheus, {"Hostname": NODE_NAME, "job_id": RUNNING_JOB})
        results, empty = wait_for_panels(prometheus, sim_daemon.job, chosen)
        assert empty == []
        by_name = {q.name: series for q, series in results.items()}
        status = json.loads(admin_ok(sim_daemon, "--json", "status"))
        uuid = next(g["uuid"] for g in status["gpus"] if g["index"] == RUNNING_JOB_GPU)

        def picked(name: str) -> list[tuple[str, str, str, float]]:
            return [
                (s["metric"]["job_id"], s["metric"]["gpu"], s["metric"]["UUID"], float(s["value"][1]))
                for s in by_name[name]
            ]

        gpu = str(RUNNING_JOB_GPU)
        assert picked("Power of the job's GPUs (dcgm-exporter) [A]") == [(RUNNING_JOB, gpu, uuid, 446.518)]
        clock = "SM clock of the job's GPUs: dcgm-exporter vs eerl's lock"
        assert picked(f"{clock} [A]") == [(RUNNING_JOB, gpu, uuid, 1.5e9)]
        ((job_id, index, lock_uuid, lock_hz),) = picked(f"{clock} [B]")
        assert (job_id, index, lock_uuid) == (RUNNING_JOB, gpu, uuid)
        assert lock_hz in (1.2e9, 1.5e9)  # the fixed controller's generation or training clock
        assert {s["metric"]["job"] for s in by_name[f"{clock} [A]"]} == {"dcgm-exporter"}

    def test_controller_state_panel_maps_to_the_state_names(
        self, prometheus: str, sim_daemon: SimDaemon
    ) -> None:
        """The state timeline's codes are the value mappings' keys: both jobs' phases read "fixed"."""
        _, chosen = resolve_variables(prometheus, {"Hostname": NODE_NAME, "job_id": None})
        results, empty = wait_for_panels(prometheus, sim_daemon.job, chosen)
        assert empty == []
        (panel,) = [p for p in dashboard()["panels"] if p["title"] == "Controller state"]
        mapping = panel["fieldConfig"]["defaults"]["mappings"][0]["options"]
        (series,) = [s for q, s in results.items() if q.panel_id == panel["id"]]
        shown = {
            (s["metric"]["job_id"], s["metric"]["phase"]): mapping[s["value"][1]]["text"] for s in series
        }
        assert shown == {
            (job, phase): "fixed"
            for job in (FINISHED_JOB, RUNNING_JOB)
            for phase in ("generation", "training")
        }


class TestExposition:
    def test_promtool_finds_nothing_but_the_dcgm_label_names(
        self, sim_daemon: SimDaemon, promtool: str
    ) -> None:
        """promtool check metrics: its only remarks are the camelCase lint, and they come from exactly the
        dcgm-exporter label names kept for joins (with those renamed, the exposition is clean)."""
        text = sim_daemon.metrics_text()
        done = subprocess.run(
            [promtool, "check", "metrics"], input=text, check=False, capture_output=True, text=True
        )
        remarks = {line for line in (done.stdout + done.stderr).splitlines() if line.strip()}
        assert remarks
        assert all(
            line.endswith("label names should be written in 'snake_case' not 'camelCase'") for line in remarks
        )
        renamed = text
        for label in DCGM_CAMEL_CASE_LABELS:
            renamed = re.sub(rf"\b{label}=", f"{label.lower()}=", renamed)
        clean = subprocess.run(
            [promtool, "check", "metrics"], input=renamed, check=False, capture_output=True, text=True
        )
        assert (clean.returncode, clean.stdout + clean.stderr) == (0, "")
