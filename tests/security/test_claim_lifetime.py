"""No claim outlives its job (issue 32, item 3): a lease cap, and in Kubernetes the pod's allocation.

The attacks, each by a real process of ``nobody`` over its own socket: a job on a grant opens a session
with ``lease_ttl_s=3600`` and no Attach stream, begins a phase (the fixed controller locks its GPU) and is
SIGKILLed mid-phase; a pod's job on a per-GPU (CDI) socket keeps heartbeating after its pod has left, while
the kubelet gives the GPU to the next pod. What must hold: the GPU is back at its default clocks and
claimable within the daemon's lease cap (plus slack), whatever lease was asked for; a GPU the kubelet no
longer allocates to the pod that held it is reset and its claim freed; a kubelet that does not answer ends
nothing; a session whose GPU no pod was ever given (a host process) is left alone.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.api.podresources import api_pb2 as kpb
from eerld.testing import DaemonHandle, FakeGpuBackend, running_daemon
from soak.daemon import DaemonProcess, wait_for
from tests.kubelet import pod_resources_server
from tests.security.conftest import NOBODY_UID, NOGROUP_GID, run_as
from tests.security.test_claims import holders, mounted, open_call

LEASE_JOB = Path(__file__).with_name("lease_job.py")
AN_HOUR_S = 3600.0
SLACK_S = 30.0
"""Past the cap, how long a reset may take on a shared, noisy machine (the reaper runs every 0.2 s)."""
POLL_S = 0.2
"""The pod-resources watch's period in the Kubernetes tests (5 s in production)."""


@dataclass
class LeaseJob:
    """A running ``lease_job.py``: what OpenSession answered, and the process."""

    proc: subprocess.Popen[str]
    reply: dict[str, Any]

    def kill(self) -> None:
        """SIGKILL mid-phase: no CloseSession, no Attach stream to break."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


@contextmanager
def lease_job(target: str, job_id: str, *, heartbeat_s: float | None = None) -> Iterator[LeaseJob]:
    """``nobody`` holding a session of an hour's lease on ``target`` mid-phase; killed at the end."""
    args = [sys.executable, str(LEASE_JOB), str(NOBODY_UID), str(NOGROUP_GID), target, job_id, str(AN_HOUR_S)]
    if heartbeat_s is not None:
        args += ["--heartbeat", str(heartbeat_s)]
    proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        line = proc.stdout.readline()
        assert line, f"lease_job exited with {proc.wait()}"
        yield LeaseJob(proc, json.loads(line))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait()
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                pipe.close()


def grant_to_nobody(admin_socket: Path, name: str, gpu: int) -> str:
    """A grant of ``gpu`` to ``nobody`` made over the admin socket; its socket's target."""
    with grpc.insecure_channel(f"unix:{admin_socket}") as channel:
        request = pb.GrantRequest(name=name, gpus=[pb.GpuRef(index=gpu)], uid=NOBODY_UID)
        reply = pb_grpc.AdminServiceStub(channel).Grant(request, timeout=10)
    return f"unix:{reply.grant.socket_path}"


CAP_S = 6.0
"""The daemon's lease cap in the test below (short: the test waits it out)."""


class TestAJobKilledMidPhaseWithoutAttach:
    @pytest.mark.slow
    def test_its_gpu_is_reset_and_claimable_within_the_lease_cap_whatever_lease_it_asked_for(
        self, reachable_dir: Path
    ) -> None:
        """A real eerld (sim backend, fixed controller, multi-tenant, a lease cap of 6 s — the default,
        30 s, is `tests/eerld/api/test_lease_cap.py`'s): ``nobody`` asks for an hour, gets at most the cap,
        locks GPU 0, dies by SIGKILL; the GPU is free again within the cap."""
        extra = [
            "--tenancy=multi",
            f"--grant-dir={reachable_dir / 'grants'}",
            f"--max-lease-ttl={CAP_S:g}",
            f"--lease-ttl={CAP_S:g}",
        ]
        with DaemonProcess(reachable_dir, gpus=2, extra_args=extra) as daemon:
            target = grant_to_nobody(daemon.admin_socket_path, "job", 0)
            with lease_job(target, "job-a") as job:
                assert job.reply["code"] == "OK", job.reply
                locked_mid_phase = daemon.hardware_locks()
                job.kill()
                wait_for(
                    lambda: daemon.hardware_locks()[0] is None and not daemon.sessions(),
                    "the dead job's GPU at its default clocks and its claim freed",
                    CAP_S + SLACK_S,
                )
            after = run_as(target, [open_call(0, job_id="next-job")])[0]
            log = [json.loads(line) for line in daemon.log_path.read_text().splitlines() if line[:1] == "{"]
        assert locked_mid_phase == [1200, None]
        assert job.reply["lease_ttl_s"] == CAP_S  # granted, not the hour asked
        assert after.code == "OK", after.details
        [capped] = [e for e in log if e["event"] == "lease_capped"]
        assert (capped["asked_s"], capped["granted_s"]) == (AN_HOUR_S, CAP_S)
        closes = [e["reason"] for e in log if e["event"] == "session_close" and e["job_id"] == "job-a"]
        assert closes == ["lease expired"]


# -- Kubernetes: a GPU that left its pod ---------------------------------------------------------------


@dataclass
class FakeKubelet:
    """``v1.PodResourcesLister/List`` on a Unix socket: which pod holds which GPU (by UUID), now."""

    socket_path: Path
    gpus: dict[str, tuple[str, str]] = field(default_factory=dict)
    """GPU UUID -> (namespace, pod) it is allocated to."""
    calls: int = 0
    server: grpc.Server | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def list(self, request: kpb.ListPodResourcesRequest, context: grpc.ServicerContext) -> Any:
        with self.lock:
            self.calls += 1
            pods: dict[tuple[str, str], list[str]] = {}
            for uuid, owner in self.gpus.items():
                pods.setdefault(owner, []).append(uuid)
        return kpb.ListPodResourcesResponse(
            pod_resources=[
                kpb.PodResources(
                    namespace=namespace,
                    name=name,
                    containers=[
                        kpb.ContainerResources(
                            name="trainer",
                            devices=[kpb.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=uuids)],
                        )
                    ],
                )
                for (namespace, name), uuids in pods.items()
            ]
        )

    def allocate(self, uuid: str, owner: tuple[str, str] | None) -> None:
        with self.lock:
            if owner is None:
                self.gpus.pop(uuid, None)
            else:
                self.gpus[uuid] = owner

    def listings(self) -> int:
        with self.lock:
            return self.calls

    def wait_for_listings(self, more: int) -> None:
        """Until ``more`` further listings were asked for: the watch has seen what the kubelet says now."""
        target = self.listings() + more
        wait_for(lambda: self.listings() >= target, f"{more} more pod-resources listings", 60)


@contextmanager
def kubernetes_node(directory: Path) -> Iterator[tuple[DaemonHandle, FakeGpuBackend, FakeKubelet]]:
    """eerld as the DaemonSet runs it (multi-tenant, per-GPU sockets, grants) beside a fake kubelet."""
    kubelet = FakeKubelet(directory / "kubelet.sock")
    fake = FakeGpuBackend(2)
    with pod_resources_server(kubelet.socket_path, kubelet.list) as server:
        kubelet.server = server
        with running_daemon(
            directory,
            backend=fake,
            tenancy="multi",
            gpu_socket_dir=directory / "gpus",
            pod_resources_socket=kubelet.socket_path,
            pod_resources_optional=False,
            pod_resources_poll_s=POLL_S,
        ) as handle:
            yield handle, fake, kubelet


def gpu_socket(handle: DaemonHandle, index: int) -> Path:
    (socket,) = [
        Path(g.grant.socket_path)
        for g in handle.daemon.reads.grants()
        if g.grant.name != "shared" and [i.index for i in g.gpus] == [index]
    ]
    return socket


class TestAGpuThatLeftItsPod:
    def test_is_reset_and_its_claim_freed_so_that_the_next_pod_claims_it(self, reachable_dir: Path) -> None:
        """pod1's job (``nobody``, GPU 0's CDI socket, an hour's lease, heartbeating: it outlives its pod)
        locks GPU 0; the kubelet gives GPU 0 to pod2; pod2's job, on the same socket, claims it."""
        with kubernetes_node(reachable_dir) as (handle, fake, kubelet):
            uuid = fake.inventory()[0].uuid
            kubelet.allocate(uuid, ("rl", "pod1"))
            with (
                mounted([gpu_socket(handle, 0)], reachable_dir / "container") as (in_container,),
                lease_job(f"unix:{in_container}", "pod1-uid", heartbeat_s=1.0) as pod1,
            ):
                assert pod1.reply["code"] == "OK", pod1.reply
                locked_in_pod1 = fake.locked()
                kubelet.wait_for_listings(2)  # the watch saw GPU 0 in pod1 after the open
                kubelet.allocate(uuid, ("rl", "pod2"))
                wait_for(
                    lambda: fake.locked() == {} and holders(handle) == {},
                    "GPU 0 reset and its claim freed once it left pod1",
                    60,
                )
                pod1_still_running = pod1.proc.poll() is None
                pod2 = run_as(f"unix:{in_container}", [open_call(job_id="pod2-uid")])[0]
                held = holders(handle)
        assert locked_in_pod1 == {0: 1200}
        assert pod1_still_running  # the job did not end: its pod's allocation did
        assert pod2.code == "OK", pod2.details
        assert held == {0: "pod2-uid"}

    def test_a_gpu_no_pod_holds_any_more_is_reset_too(self, reachable_dir: Path) -> None:
        """The kubelet drops the allocation (pod1 deleted, no pod2 yet)."""
        with kubernetes_node(reachable_dir) as (handle, fake, kubelet):
            uuid = fake.inventory()[0].uuid
            kubelet.allocate(uuid, ("rl", "pod1"))
            with (
                mounted([gpu_socket(handle, 0)], reachable_dir / "container") as (in_container,),
                lease_job(f"unix:{in_container}", "pod1-uid", heartbeat_s=1.0) as pod1,
            ):
                assert pod1.reply["code"] == "OK", pod1.reply
                kubelet.wait_for_listings(2)
                kubelet.allocate(uuid, None)
                wait_for(lambda: fake.locked() == {} and holders(handle) == {}, "GPU 0 reset", 60)

    def test_a_kubelet_that_stops_answering_ends_nothing(self, reachable_dir: Path) -> None:
        """Fail-open: the kubelet goes away (and comes back with the same allocation): pod1 keeps GPU 0."""
        with kubernetes_node(reachable_dir) as (handle, fake, kubelet):
            uuid = fake.inventory()[0].uuid
            kubelet.allocate(uuid, ("rl", "pod1"))
            with (
                mounted([gpu_socket(handle, 0)], reachable_dir / "container") as (in_container,),
                lease_job(f"unix:{in_container}", "pod1-uid", heartbeat_s=1.0) as pod1,
            ):
                assert pod1.reply["code"] == "OK", pod1.reply
                kubelet.wait_for_listings(2)
                watch = handle.server.app.pod_watch
                assert watch is not None
                assert kubelet.server is not None
                kubelet.server.stop(0)
                unanswered = watch.unanswered
                wait_for(lambda: watch.unanswered >= unanswered + 5, "five listings the kubelet missed", 60)
                held_while_away = holders(handle)
                locked_while_away = fake.locked()
        assert held_while_away == {0: "pod1-uid"}
        assert locked_while_away == {0: 1200}

    def test_a_session_whose_gpu_no_pod_was_ever_given_is_left_alone(self, reachable_dir: Path) -> None:
        """A host process (a grant, no pod) on GPU 1, while the kubelet moves GPU 0 between pods."""
        with kubernetes_node(reachable_dir) as (handle, fake, kubelet):
            uuid0 = fake.inventory()[0].uuid
            kubelet.allocate(uuid0, ("rl", "pod1"))
            target = grant_to_nobody(handle.admin_socket_path, "host", 1)
            with lease_job(target, "host-job", heartbeat_s=1.0) as host:
                assert host.reply["code"] == "OK", host.reply
                kubelet.wait_for_listings(2)
                kubelet.allocate(uuid0, ("rl", "pod2"))
                kubelet.wait_for_listings(5)
                kubelet.allocate(uuid0, None)
                kubelet.wait_for_listings(5)
                held = holders(handle)
                locked = fake.locked()
        assert held == {1: "host-job"}
        assert locked == {1: 1200}
