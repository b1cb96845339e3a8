"""No AdminService method is ever served outside the admin socket, in any order of calls.

The attack: a member of the worker socket's group (or a holder of a worker TLS client certificate) calls
every AdminService method on the worker socket and on the TCP listener — before any admin has used the
daemon, and again after an admin has called every admin method on the admin socket. The daemon once
served them after the first admin call (a handler cache shared by both servers' interceptor).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.testing import FakeGpuBackend, ManualClock, running_daemon
from tests.reliability.test_privilege import free_port, make_pki
from tests.security.conftest import SOCKET_GROUP, call, run_as, socket_group_gid

ADMIN_METHODS = tuple(pb.DESCRIPTOR.services_by_name["AdminService"].methods_by_name)
HARMFUL: dict[str, dict[str, Any]] = {
    "Pin": {"all": True, "smClockMhz": 600, "durationS": 31_000_000, "reason": "attack"},
    "Unpin": {"all": True},
    "ResetAll": {"all": True, "reason": "attack"},
    "Grant": {"gpus": [{"index": 0}], "uid": 65534, "reason": "attack"},
    "Revoke": {"name": "x", "reason": "attack"},
    "Drain": {"all": True, "reason": "attack"},
    "Undrain": {"all": True},
}


def admin_calls() -> list[dict[str, Any]]:
    return [call("AdminService", m, HARMFUL.get(m, {}), timeout_s=5.0) for m in ADMIN_METHODS]


def call_every_admin_method_as_admin(admin_socket: Path) -> list[str]:
    """What an admin's eerlctl would do: every admin method once, on the admin socket."""
    codes = []
    with grpc.insecure_channel(f"unix:{admin_socket}") as channel:
        stub = pb_grpc.AdminServiceStub(channel)
        for method in ADMIN_METHODS:
            request_class = getattr(pb, f"{method}Request")
            try:
                getattr(stub, method)(request_class(), timeout=5)
                codes.append("OK")
            except grpc.RpcError as e:
                codes.append(e.code().name)
    return codes


def test_the_worker_socket_and_tcp_serve_no_admin_method_before_or_after_admin_calls(
    reachable_dir: Path,
) -> None:
    make_pki(reachable_dir)
    tls = {name: (reachable_dir / f"{pem}").read_text() for name, pem in
           (("ca", "ca.pem"), ("cert", "client.pem"), ("key", "client.key"))}  # fmt: skip
    address = f"127.0.0.1:{free_port()}"
    clock = ManualClock()
    fake = FakeGpuBackend(2, clock=clock)
    group = [socket_group_gid()]
    with running_daemon(
        reachable_dir,
        backend=fake,
        clock=clock,
        reaper=False,
        socket_group=SOCKET_GROUP,
        listen=address,
        tls_cert=reachable_dir / "server.pem",
        tls_key=reachable_dir / "server.key",
        tls_client_ca=reachable_dir / "ca.pem",
    ) as handle:
        worker = f"unix:{handle.socket_path}"
        before_unix = run_as(worker, admin_calls(), groups=group)
        before_tcp = run_as(address, admin_calls(), groups=group, tls=tls)
        admin_codes = call_every_admin_method_as_admin(handle.admin_socket_path)
        after_unix = run_as(worker, admin_calls(), groups=group)
        after_tcp = run_as(address, admin_calls(), groups=group, tls=tls)
        open_one = call("PhaseService", "OpenSession", {"jobId": "j", "gpus": [{"index": 1}]})
        session = run_as(worker, [open_one], groups=group)
        pins = [g.pin for g in handle.daemon.reads.gpu_status()]
        drains = [g.drain for g in handle.daemon.reads.gpu_status()]
        locked = fake.locked()
    assert "UNIMPLEMENTED" not in admin_codes  # the admin really did reach every method
    for outcomes in (before_unix, before_tcp, after_unix, after_tcp):
        assert [o.code for o in outcomes] == ["UNIMPLEMENTED"] * len(ADMIN_METHODS)
    assert session[0].code == "OK"  # the same attacker may use the worker API it is entitled to
    assert pins == [None, None]
    assert drains == [None, None]
    assert locked == {}


JOB_UID = 4242
"""The user a grant's socket belongs to (no passwd entry is needed to run as a uid)."""


def test_no_worker_may_drain_a_gpu_or_end_an_admins_drain(reachable_dir: Path) -> None:
    """An admin drained GPU 2 of a job's grant (GPUs 1 and 2). A member of the shared socket's group and the
    job's own user on its grant socket each try to undrain it and to drain the GPUs they may reach: every
    call is UNIMPLEMENTED, GPU 2 still refuses the job's claim naming the drain, and GPU 1 is still free."""
    clock = ManualClock()
    fake = FakeGpuBackend(4, clock=clock)
    with running_daemon(
        reachable_dir, backend=fake, clock=clock, reaper=False, tenancy="multi", socket_group=SOCKET_GROUP
    ) as handle:
        with grpc.insecure_channel(f"unix:{handle.admin_socket_path}") as channel:
            admin = pb_grpc.AdminServiceStub(channel)
            granted = admin.Grant(
                pb.GrantRequest(name="job", gpus=[pb.GpuRef(index=1), pb.GpuRef(index=2)], uid=JOB_UID),
                timeout=10,
            )
            admin.Drain(pb.DrainRequest(gpus=[pb.GpuRef(index=2)], reason="fan"), timeout=10)
        undrain_all = call("AdminService", "Undrain", {"all": True}, timeout_s=5.0)
        drain_all = call("AdminService", "Drain", {"all": True, "reason": "attack"}, timeout_s=5.0)
        shared = run_as(f"unix:{handle.socket_path}", [undrain_all, drain_all], groups=[socket_group_gid()])
        own = run_as(
            f"unix:{granted.grant.socket_path}",
            [
                call("AdminService", "Undrain", {"gpus": [{"index": 2}]}, timeout_s=5.0),
                undrain_all,
                call("AdminService", "Drain", {"gpus": [{"index": 1}], "reason": "attack"}, timeout_s=5.0),
                call("PhaseService", "OpenSession", {"jobId": "j", "gpus": [{"index": 2}]}),
                call("PhaseService", "OpenSession", {"jobId": "j", "gpus": [{"index": 1}]}),
            ],
            uid=JOB_UID,
            gid=JOB_UID,
        )
        drains = {g.info.index: g.drain for g in handle.daemon.reads.gpu_status()}
    assert [o.code for o in shared] == ["UNIMPLEMENTED"] * 2
    assert [o.code for o in own[:3]] == ["UNIMPLEMENTED"] * 3
    refused, opened = own[3:]
    assert refused.code == "FAILED_PRECONDITION"
    assert "GPU 2 is drained" in refused.details
    assert "fan" in refused.details
    assert opened.code == "OK"  # the job still claims the GPU of its grant that no admin drained
    drain = drains.pop(2)
    assert drain is not None
    assert drain.reason == "fan"
    assert drains == {0: None, 1: None, 3: None}
