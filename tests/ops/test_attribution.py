"""Per-job attribution in the metrics: clock-event reasons per GPU, the HPC job of a session opened through a
job's grant, and the Kubernetes namespace/pod/container of its GPUs from the kubelet's pod-resources API
(a fake kubelet gRPC server on a Unix socket)."""

from __future__ import annotations

import os
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from eerl.phases import ExecutionMode, GpuRole, PhaseKind, Workload
from eerl.v1 import eerl_pb2, eerl_pb2_grpc
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from eerld.api.podresources import KubeletPodResources
from eerld.api.podresources import api_pb2 as pb
from eerld.config import load_config
from eerld.daemon import Daemon, StatusView
from eerld.daemon.events import Events
from eerld.daemon.reports import ReportStore
from eerld.errors import BackendFailure, ConfigError
from eerld.gpu.base import ClockEventReasons
from eerld.grants import GrantSpec
from eerld.metrics import CLOCK_EVENT_NAMES, DaemonMetricsSource, EerlMetrics, start_metrics_server
from eerld.pods.owners import (
    DEFAULT_POD_RESOURCES_SOCKET,
    DeviceAllocation,
    GpuOwners,
    PodOwner,
    PodResourcesError,
    owners_by_uuid,
)
from eerld.sessions import GpuSelector, SessionSpec
from eerld.testing import DaemonHandle, FakeGpuBackend, ManualClock, running_daemon
from tests.kubelet import pod_resources_server

Samples = dict[str, list[tuple[dict[str, str], float]]]
GEN = PhaseKind.GENERATION


def scrape(daemon: Daemon, pods: GpuOwners | None = None) -> Samples:
    text = generate_latest(EerlMetrics(DaemonMetricsSource(daemon, pods=pods), hostname="n1").registry)
    return parse(text.decode())


def parse(text: str) -> Samples:
    out: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append((dict(sample.labels), sample.value))
    return out


def spec(job_id: str, *gpus: int) -> SessionSpec:
    selectors = tuple(GpuSelector(f"gpus[{i}]", index=g) for i, g in enumerate(gpus))
    return SessionSpec(job_id, 0, 1, selectors, ExecutionMode.SYNC, GpuRole.BOTH, None, None)


class ThrottledBackend(FakeGpuBackend):
    """Fake GPUs whose clock-event reasons the test sets per GPU."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reasons: dict[int, ClockEventReasons] = {}

    def clock_event_reasons(self, index: int) -> ClockEventReasons:
        base = super().clock_event_reasons(index)
        return self.reasons.get(index, base)


@pytest.fixture
def node(sock_dir: Path, clock: ManualClock) -> Iterator[DaemonHandle]:
    backend = ThrottledBackend(4, clock=clock)
    with running_daemon(sock_dir, backend=backend, clock=clock, reaper=False, tenancy="multi") as handle:
        yield handle


# ----------------------------------------------------------------------------------- clock-event reasons


class TestClockEventReasons:
    def test_the_bitmask_is_nvmls_and_each_reason_is_a_series(self, node: DaemonHandle) -> None:
        """eerl_gpu_clock_event_reasons is the NVML bitmask (DCGM_FI_DEV_CLOCKS_EVENT_REASONS' semantics);
        eerl_gpu_clock_event_reason has one 0/1 series per reason, named as dcgm-exporter's clock_event."""
        backend = node.backend
        assert isinstance(backend, ThrottledBackend)
        backend.reasons[1] = ClockEventReasons.SW_POWER_CAP | ClockEventReasons.HW_THERMAL_SLOWDOWN
        got = scrape(node.daemon)
        masks = {labels["gpu"]: value for labels, value in got["eerl_gpu_clock_event_reasons"]}
        assert masks == {"0": 0.0, "1": float(0x04 | 0x40), "2": 0.0, "3": 0.0}
        active = {
            (labels["gpu"], labels["clock_event"])
            for labels, value in got["eerl_gpu_clock_event_reason"]
            if value == 1.0
        }
        assert active == {("1", "power_cap"), ("1", "hw_thermal")}
        per_gpu = [labels for labels, _ in got["eerl_gpu_clock_event_reason"] if labels["gpu"] == "1"]
        assert {labels["clock_event"] for labels in per_gpu} == set(CLOCK_EVENT_NAMES.values())
        assert set(per_gpu[0]) == {
            "gpu",
            "UUID",
            "pci_bus_id",
            "device",
            "modelName",
            "Hostname",
            "clock_event",
        }

    def test_a_lock_shows_as_the_clocks_setting_reason(self, node: DaemonHandle) -> None:
        """A locked fake GPU reads back the app-clocks reason (0x2), dcgm-exporter's clocks_setting."""
        node.backend.lock_sm_clock(0, 1200)
        got = scrape(node.daemon)
        masks = {labels["gpu"]: value for labels, value in got["eerl_gpu_clock_event_reasons"]}
        assert masks["0"] == 2.0
        active = {
            labels["clock_event"]
            for labels, v in got["eerl_gpu_clock_event_reason"]
            if v and labels["gpu"] == "0"
        }
        assert active == {"clocks_setting"}

    def test_every_bit_matches_nvml_and_the_backend_enum(self) -> None:
        """The enum of the backends carries NVML's bit values, so its value is the DCGM bitmask."""
        assert ClockEventReasons.GPU_IDLE.value == 0x001
        assert ClockEventReasons.SW_POWER_CAP.value == 0x004
        assert ClockEventReasons.DISPLAY_CLOCK_SETTING.value == 0x100
        assert sorted(CLOCK_EVENT_NAMES) == [1 << i for i in range(9)]

    def test_an_unreadable_reason_is_absent_not_zero(self, node: DaemonHandle) -> None:
        """A failed read leaves the GPU without clock-event series rather than claiming none holds."""
        fake = node.backend
        assert isinstance(fake, FakeGpuBackend)
        fake.gpus[2].failures["clock_event_reasons"] = BackendFailure("boom")
        got = scrape(node.daemon)
        assert "2" not in {labels["gpu"] for labels, _ in got["eerl_gpu_clock_event_reasons"]}
        assert "2" not in {labels["gpu"] for labels, _ in got["eerl_gpu_clock_event_reason"]}


# ----------------------------------------------------------------------------------- the HPC (Slurm) job


def slurm_grant(daemon: Daemon, job_id: str, *gpus: int) -> str:
    """What the Slurm prolog does: ``eerlctl grant --gpus G --uid U --job-id $SLURM_JOB_ID --replace``."""
    selectors = tuple(GpuSelector(f"gpus[{i}]", index=g) for i, g in enumerate(gpus))
    outcome = daemon.admin.grant(
        GrantSpec(None, selectors, os.getuid(), None, job_id, 0, f"slurm prolog job {job_id}", True)
    )
    return outcome.grant.grant.name


class TestHpcJob:
    def test_a_session_through_a_jobs_grant_carries_hpc_job(self, node: DaemonHandle) -> None:
        """Energy and eerl_session_gpu_info of a session opened through the prolog's grant carry
        ``hpc_job`` (dcgm-exporter's label for the HPC job of a GPU) = SLURM_JOB_ID."""
        name = slurm_grant(node.daemon, "4711", 0, 1)
        assert name == "job-4711"
        sid = node.daemon.book.open_session(spec("4711", 0, 1), grant=name).session_id
        node.daemon.phases.begin_phase(sid, GEN, 1, None)
        node.daemon.phases.end_phase(sid, GEN, 1, Workload(tokens=100, valid_tokens=100))
        got = scrape(node.daemon)
        gpu_info = got["eerl_session_gpu_info"]
        assert {labels["hpc_job"] for labels, _ in gpu_info} == {"4711"}
        assert {labels["UUID"] for labels, _ in gpu_info} == {g.uuid for g in node.backend.inventory()[:2]}
        energy = got["eerl_session_energy_joules_total"]
        assert energy
        assert all(labels["hpc_job"] == "4711" and labels["job_id"] == "4711" for labels, _ in energy)
        assert all(labels.get("hpc_job") == "4711" for labels, _ in got["eerl_session_info"])

    def test_a_session_on_the_shared_socket_has_no_hpc_job(self, sock_dir: Path, clock: ManualClock) -> None:
        """A job id a client declares (SLURM_JOB_ID read by the client) is only ``job_id``: nothing the
        daemon checked, so no ``hpc_job``."""
        with running_daemon(sock_dir, clock=clock, reaper=False) as handle:  # tenancy single
            handle.daemon.book.open_session(spec("4711", 0))
            got = scrape(handle.daemon)
        for name in ("eerl_session_gpu_info", "eerl_session_info"):
            assert got[name]
            assert all("hpc_job" not in labels for labels, _ in got[name])


# ----------------------------------------------------------------------------------- Kubernetes


@dataclass
class FakeKubelet:
    """``v1.PodResourcesLister/List`` on a Unix socket, answering ``pods``."""

    socket_path: Path
    pods: list[pb.PodResources] = field(default_factory=list)
    calls: int = 0
    delay_s: float = 0.0
    server: grpc.Server | None = None

    def list(self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext) -> Any:
        self.calls += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        return pb.ListPodResourcesResponse(pod_resources=self.pods)


@contextmanager
def fake_kubelet(socket_path: Path) -> Iterator[FakeKubelet]:
    kubelet = FakeKubelet(socket_path)
    with pod_resources_server(socket_path, kubelet.list) as server:
        kubelet.server = server
        yield kubelet


def pod(namespace: str, name: str, container: str, resource: str, *device_ids: str) -> pb.PodResources:
    devices = pb.ContainerDevices(resource_name=resource, device_ids=list(device_ids))
    return pb.PodResources(
        name=name, namespace=namespace, containers=[pb.ContainerResources(name=container, devices=[devices])]
    )


class TestKubernetes:
    def test_session_series_carry_the_pod_of_their_gpus(self, node: DaemonHandle, sock_dir: Path) -> None:
        """A fake kubelet allocates GPUs 0 and 1 to rl/trainer-0/policy: the session on them gets
        dcgm-exporter's ``namespace``, ``pod`` and ``container`` on its energy series and per-GPU info."""
        inventory = node.backend.inventory()
        with fake_kubelet(sock_dir / "kubelet.sock") as kubelet:
            kubelet.pods = [
                pod("rl", "trainer-0", "policy", "nvidia.com/gpu", inventory[0].uuid, inventory[1].uuid),
                pod("other", "web", "app", "example.com/nic", inventory[2].uuid),
            ]
            owners = GpuOwners(KubeletPodResources(kubelet.socket_path))
            name = slurm_grant(node.daemon, "rl-job", 0, 1)
            sid = node.daemon.book.open_session(spec("rl-job", 0, 1), grant=name).session_id
            node.daemon.phases.begin_phase(sid, GEN, 1, None)
            node.daemon.phases.end_phase(sid, GEN, 1, Workload(tokens=100, valid_tokens=100))
            got = scrape(node.daemon, owners)
            owners.close()
        want = {"namespace": "rl", "pod": "trainer-0", "container": "policy"}
        for labels, _ in got["eerl_session_gpu_info"]:
            assert {k: labels[k] for k in want} == want
        for labels, _ in got["eerl_session_energy_joules_total"]:
            assert {k: labels[k] for k in want} == want
        # a GPU allocated to another resource's pod is not attributed; no GPU series get pod labels
        assert all("pod" not in labels for labels, _ in got["eerl_gpu_power_watts"])

    def test_index_and_replica_device_ids_resolve_to_uuids(self) -> None:
        """Device ids may be indices (deviceIDStrategy=index) or carry a time-slicing replica suffix; any
        other id (another node's GPU, a malformed one) is ignored."""
        gpus = [(0, "GPU-a"), (1, "GPU-b"), (2, "GPU-c")]
        allocations = [
            DeviceAllocation("ns", "p1", "c1", "nvidia.com/gpu", ("1",)),
            DeviceAllocation("ns", "p2", "c2", "nvidia.com/gpu.shared", ("GPU-c::3",)),
            DeviceAllocation("ns", "p3", "c3", "nvidia.com/mig-1g.10gb", ("MIG-x",)),
            DeviceAllocation("ns", "p4", "c4", "nvidia.com/gpu", ("GPU-elsewhere",)),
            # ids no device plugin writes: ignored, never a failed scrape (int() refuses both)
            DeviceAllocation("ns", "p5", "c5", "nvidia.com/gpu", ("9" * 5000, "\N{SUPERSCRIPT TWO}")),
        ]
        assert owners_by_uuid(allocations, gpus) == {
            "GPU-b": PodOwner("ns", "p1", "c1"),
            "GPU-c": PodOwner("ns", "p2", "c2"),
        }

    def test_answers_are_cached_and_refreshed(self, sock_dir: Path) -> None:
        """One List per refresh period, however many scrapes; a new allocation shows after it."""
        now = [0.0]
        with fake_kubelet(sock_dir / "kubelet.sock") as kubelet:
            kubelet.pods = [pod("a", "p", "c", "nvidia.com/gpu", "GPU-a")]
            owners = GpuOwners(KubeletPodResources(kubelet.socket_path), refresh_s=5.0, clock=lambda: now[0])
            gpus = [(0, "GPU-a")]
            assert owners.owners(gpus) == {"GPU-a": PodOwner("a", "p", "c")}
            kubelet.pods = [pod("b", "q", "d", "nvidia.com/gpu", "GPU-a")]
            now[0] = 4.0
            assert owners.owners(gpus) == {"GPU-a": PodOwner("a", "p", "c")}
            assert kubelet.calls == 1
            now[0] = 5.0
            assert owners.owners(gpus) == {"GPU-a": PodOwner("b", "q", "d")}
            assert kubelet.calls == 2
            owners.close()

    def test_a_kubelet_that_does_not_answer_keeps_the_last_answer_then_none(self, sock_dir: Path) -> None:
        """A slow kubelet costs a scrape at most the timeout; the last answer serves until max_stale_s."""
        now = [0.0]
        with fake_kubelet(sock_dir / "kubelet.sock") as kubelet:
            kubelet.pods = [pod("a", "p", "c", "nvidia.com/gpu", "GPU-a")]
            owners = GpuOwners(
                KubeletPodResources(kubelet.socket_path),
                refresh_s=1.0,
                timeout_s=0.2,
                max_stale_s=10.0,
                clock=lambda: now[0],
            )
            gpus = [(0, "GPU-a")]
            assert owners.owners(gpus)
            kubelet.delay_s = 1.0
            now[0] = 5.0
            assert owners.owners(gpus) == {"GPU-a": PodOwner("a", "p", "c")}
            assert owners.errors == 1
            now[0] = 11.0
            assert owners.owners(gpus) == {}
            assert owners.errors == 2
            owners.close()

    def test_a_missing_socket_is_an_error_unless_auto(self, sock_dir: Path) -> None:
        """An explicit socket that is missing fails the list (and is logged); ``auto`` lists nothing."""
        missing = sock_dir / "none.sock"
        assert KubeletPodResources(missing, optional=True).list_allocations(0.2) == ()
        with pytest.raises(PodResourcesError, match=r"none\.sock"):
            KubeletPodResources(missing).list_allocations(0.2)

    def test_the_flag_is_auto_by_default_and_takes_off_or_a_path(self) -> None:
        """--pod-resources-socket: auto (the kubelet's default path where it exists), off, or a path."""
        default = load_config([])
        assert (default.pod_resources_socket, default.pod_resources_optional) == (
            DEFAULT_POD_RESOURCES_SOCKET,
            True,
        )
        assert load_config(["--pod-resources-socket", "off"]).pod_resources_socket is None
        explicit = load_config(["--pod-resources-socket", "/k/pr.sock"])
        assert (explicit.pod_resources_socket, explicit.pod_resources_optional) == (Path("/k/pr.sock"), False)
        with pytest.raises(ConfigError, match="absolute"):
            load_config(["--pod-resources-socket", "relative.sock"])


class TestWiring:
    def test_the_daemons_metrics_endpoint_reads_the_configured_kubelet(
        self, sock_dir: Path, clock: ManualClock
    ) -> None:
        """``--pod-resources-socket PATH`` reaches the served ``/metrics``: the server wires the kubelet
        client into the app, which hands it to the metrics endpoint (and closes it on stop)."""
        backend = FakeGpuBackend(2, clock=clock)
        uuid = backend.inventory()[0].uuid
        with fake_kubelet(sock_dir / "kubelet.sock") as kubelet:
            kubelet.pods = [pod("rl", "gen-0", "vllm", "nvidia.com/gpu", uuid)]
            with running_daemon(
                sock_dir,
                backend=backend,
                clock=clock,
                reaper=False,
                tenancy="multi",
                metrics_address="127.0.0.1:0",
                pod_resources_socket=kubelet.socket_path,
                pod_resources_optional=False,
            ) as handle:
                name = slurm_grant(handle.daemon, "99", 0)
                handle.daemon.book.open_session(spec("99", 0), grant=name)
                metrics = handle.server.app.metrics
                assert metrics is not None
                url = f"http://{metrics.host}:{metrics.port}/metrics"
                with urllib.request.urlopen(url, timeout=10) as reply:
                    text = reply.read().decode()
            assert kubelet.calls >= 1
        (line,) = [x for x in text.splitlines() if x.startswith("eerl_session_gpu_info{")]
        for part in ('namespace="rl"', 'pod="gen-0"', 'container="vllm"', 'hpc_job="99"', f'UUID="{uuid}"'):
            assert part in line


# ----------------------------------------------------------------------------------- what a scrape costs


@dataclass
class CountingReads:
    """The daemon's read model as the metrics see it, counting its ``status()`` calls."""

    daemon: Daemon
    statuses: int = 0

    def status(self) -> StatusView:
        self.statuses += 1
        return self.daemon.reads.status()


@dataclass
class CountingDaemon:
    """The daemon as the metrics see it (its read model counted, its events its own)."""

    daemon: Daemon
    reads: CountingReads = field(init=False)
    events: Events = field(init=False)
    reports: ReportStore = field(init=False)

    def __post_init__(self) -> None:
        self.reads = CountingReads(self.daemon)
        self.events = self.daemon.events
        self.reports = self.daemon.reports

    @property
    def statuses(self) -> int:
        """How many ``status()`` calls the metrics made."""
        return self.reads.statuses


@dataclass
class CountingLister:
    """A kubelet that answers ``allocations``, counting its lists."""

    allocations: tuple[DeviceAllocation, ...]
    lists: int = 0

    def list_allocations(self, timeout_s: float) -> tuple[DeviceAllocation, ...]:
        self.lists += 1
        return self.allocations

    def close(self) -> None:
        pass


class TestScrapeCost:
    def test_a_scrape_reads_the_daemon_once_and_the_kubelet_once_per_refresh(
        self, sock_dir: Path, clock: ManualClock
    ) -> None:
        """Each scrape of the served ``/metrics`` is one ``status()`` of the daemon, the in-process counters
        and the ``Hostname`` they get included; the kubelet is listed once per refresh period however many
        scrapes come; phase events over the worker socket read neither (they are counted in process)."""
        now = [0.0]
        with running_daemon(sock_dir, clock=clock, reaper=False) as handle:  # tenancy single
            uuid = handle.backend.inventory()[0].uuid
            daemon = CountingDaemon(handle.daemon)
            lister = CountingLister((DeviceAllocation("rl", "gen-0", "vllm", "nvidia.com/gpu", (uuid,)),))
            pods = GpuOwners(lister, refresh_s=5.0, clock=lambda: now[0])
            server = start_metrics_server(daemon, "127.0.0.1:0", hostname="n1", pods=pods)
            url = f"http://{server.host}:{server.port}/metrics"
            try:
                for _ in range(3):
                    urllib.request.urlopen(url, timeout=10).close()
                assert (daemon.statuses, lister.lists) == (3, 1)
                with grpc.insecure_channel(f"unix:{handle.socket_path}") as channel:
                    stub = eerl_pb2_grpc.PhaseServiceStub(channel)
                    opened = stub.OpenSession(
                        eerl_pb2.OpenSessionRequest(
                            job_id="job-1", rank=0, gpus=[eerl_pb2.GpuRef(index=0)], lease_ttl_s=300
                        ),
                        timeout=10,
                    )
                    kind = eerl_pb2.PHASE_KIND_GENERATION
                    stub.BeginPhase(
                        eerl_pb2.BeginPhaseRequest(session_id=opened.session_id, kind=kind, iteration=1),
                        timeout=10,
                    )
                    workload = eerl_pb2.Workload(tokens=100, valid_tokens=100)
                    stub.EndPhase(
                        eerl_pb2.EndPhaseRequest(
                            session_id=opened.session_id, kind=kind, iteration=1, workload=workload
                        ),
                        timeout=10,
                    )
                assert (daemon.statuses, lister.lists) == (3, 1)
                now[0] = 5.0
                with urllib.request.urlopen(url, timeout=10) as reply:
                    got = parse(reply.read().decode())
                assert (daemon.statuses, lister.lists) == (4, 2)
            finally:
                server.close()
        assert got["eerl_phases_total"] == [({"phase": "generation", "Hostname": "n1"}, 1.0)]
        rpcs = {(labels["method"], labels["Hostname"]) for labels, _ in got["eerl_rpc_requests_total"]}
        assert {("BeginPhase", "n1"), ("EndPhase", "n1")} <= rpcs
        ((labels, _),) = got["eerl_session_gpu_info"]
        assert (labels["UUID"], labels["pod"]) == (uuid, "gen-0")
