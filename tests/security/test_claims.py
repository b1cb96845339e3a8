"""Who may claim which GPU: grants, per-GPU sockets and claim tickets, attacked by unprivileged users.

The attacks: a member of the worker socket's group claims and down-clocks a neighbour's GPUs (claims used
to be first-come); a user of one grant claims GPUs of another grant, connects to another user's socket,
forges or reuses a claim ticket, or joins a job's async peers by claiming its job id. The kernel decides
who may connect to which socket (file owner and mode); the daemon decides what a socket may claim.
"""

from __future__ import annotations

import stat
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from eerl.control.base import ControllerSettings
from eerl.control.simple import OffController
from eerl.phases import ExecutionMode, GpuRole
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.grants import MULTI_TENANT_REFUSAL
from eerld.sessions import HeldSession, SessionRegistry, SessionSpec
from eerld.testing import DaemonHandle, FakeGpuBackend, ManualClock, running_daemon
from tests.security.conftest import NOBODY_UID, SOCKET_GROUP, call, run_as, socket_group_gid

VICTIM_UID = 4242
"""A second unprivileged user (no passwd entry is needed to run as a uid)."""
GRANTS = "grants"


def open_call(*gpus: int, job_id: str = "job-a", tickets: tuple[str, ...] = (), **extra: object) -> dict:
    request: dict[str, object] = {"jobId": job_id, "gpus": [{"index": i} for i in gpus]}
    if tickets:
        request["claimTickets"] = list(tickets)
    request.update(extra)
    return call("PhaseService", "OpenSession", request)


def grant(handle: DaemonHandle, name: str, gpus: list[int], uid: int, **extra: object) -> pb.GrantResponse:
    with grpc.insecure_channel(f"unix:{handle.admin_socket_path}") as channel:
        request = pb.GrantRequest(name=name, gpus=[pb.GpuRef(index=i) for i in gpus], uid=uid, **extra)
        reply: pb.GrantResponse = pb_grpc.AdminServiceStub(channel).Grant(request, timeout=10)
        return reply


def holders(handle: DaemonHandle) -> dict[int, str]:
    return {g.info.index: g.job_id for g in handle.daemon.reads.gpu_status() if g.job_id is not None}


@pytest.fixture
def multi(reachable_dir: Path) -> DaemonHandle:
    """A multi-tenant daemon whose shared socket the attacker's group may reach, grants in a 0711 dir."""
    clock = ManualClock()
    fake = FakeGpuBackend(4, clock=clock)
    with running_daemon(
        reachable_dir, backend=fake, clock=clock, reaper=False, tenancy="multi", socket_group=SOCKET_GROUP
    ) as handle:
        yield handle


class TestTheSharedSocket:
    def test_on_a_multi_tenant_node_it_admits_no_claim_and_says_why(self, multi: DaemonHandle) -> None:
        outcome = run_as(f"unix:{multi.socket_path}", [open_call(0)], groups=[socket_group_gid()])[0]
        assert (outcome.code, outcome.details) == ("PERMISSION_DENIED", MULTI_TENANT_REFUSAL)
        assert holders(multi) == {}
        assert multi.backend.locked() == {}  # type: ignore[attr-defined]

    def test_on_a_multi_tenant_node_it_issues_no_claim_ticket(self, multi: DaemonHandle) -> None:
        outcome = run_as(
            f"unix:{multi.socket_path}",
            [call("PhaseService", "IssueClaimTicket")],
            groups=[socket_group_gid()],
        )[0]
        assert outcome.code == "PERMISSION_DENIED"

    def test_in_single_tenant_mode_it_may_claim_every_gpu(self, reachable_dir: Path) -> None:
        with running_daemon(
            reachable_dir, reaper=False, tenancy="single", socket_group=SOCKET_GROUP
        ) as handle:
            outcome = run_as(f"unix:{handle.socket_path}", [open_call(0, 3)], groups=[socket_group_gid()])[0]
            held = holders(handle)
        assert outcome.code == "OK"
        assert held == {0: "job-a", 3: "job-a"}


class TestGrants:
    def test_a_grant_socket_belongs_to_its_user_alone(self, multi: DaemonHandle) -> None:
        reply = grant(multi, "victim", [0, 1], VICTIM_UID)
        path = Path(reply.grant.socket_path)
        st = path.stat()
        as_attacker = run_as(f"unix:{path}", [open_call(0)], groups=[socket_group_gid()])[0]
        as_victim = run_as(f"unix:{path}", [open_call(0, 1)], uid=VICTIM_UID, gid=VICTIM_UID)[0]
        assert (st.st_uid, stat.S_IMODE(st.st_mode), stat.S_IMODE(path.parent.stat().st_mode)) == (
            VICTIM_UID,
            0o600,
            0o711,
        )
        assert as_attacker.code == "UNAVAILABLE"  # the kernel refused the connection
        assert as_victim.code == "OK"
        assert holders(multi) == {0: "job-a", 1: "job-a"}

    def test_a_grant_claims_only_its_gpus_and_none_means_all_of_them(self, multi: DaemonHandle) -> None:
        attacker = grant(multi, "attacker", [2], NOBODY_UID)
        target = f"unix:{attacker.grant.socket_path}"
        outcomes = run_as(target, [open_call(0), open_call(2, 3), open_call(job_id="mine")])
        assert [o.code for o in outcomes] == ["PERMISSION_DENIED", "PERMISSION_DENIED", "OK"]
        assert "GPU 0 is not granted to this socket (attacker); it may claim GPU(s) 2" in outcomes[0].details
        assert holders(multi) == {2: "mine"}

    def test_a_grant_for_a_job_admits_only_that_job_id(self, multi: DaemonHandle) -> None:
        reply = grant(multi, "", [1], NOBODY_UID, job_id="42")
        outcomes = run_as(f"unix:{reply.grant.socket_path}", [open_call(job_id="43"), open_call(job_id="42")])
        assert reply.grant.name == "job-42"
        assert [o.code for o in outcomes] == ["PERMISSION_DENIED", "OK"]

    def test_revoking_a_grant_closes_its_sessions_resets_its_gpus_and_removes_its_socket(
        self, multi: DaemonHandle
    ) -> None:
        reply = grant(multi, "job", [0], NOBODY_UID)
        path = Path(reply.grant.socket_path)
        sid = run_as(f"unix:{path}", [open_call(0)])[0].response["sessionId"]
        with grpc.insecure_channel(f"unix:{path}") as channel:
            pb_grpc.PhaseServiceStub(channel).BeginPhase(
                pb.BeginPhaseRequest(session_id=sid, kind=pb.PHASE_KIND_GENERATION, iteration=0), timeout=10
            )
        locked_before = multi.backend.locked()  # type: ignore[attr-defined]
        with grpc.insecure_channel(f"unix:{multi.admin_socket_path}") as channel:
            revoked = pb_grpc.AdminServiceStub(channel).Revoke(pb.RevokeRequest(name="job"), timeout=10)
        assert locked_before == {0: 1200}
        assert list(revoked.closed_session_ids) == [sid]
        assert multi.backend.locked() == {}  # type: ignore[attr-defined]
        assert not path.exists()
        assert holders(multi) == {}

    def test_an_expired_grant_is_revoked_by_the_reaper(self, reachable_dir: Path) -> None:
        wall = [1_000_000.0]
        with running_daemon(
            reachable_dir, reaper=False, tenancy="multi", wall_clock=lambda: wall[0]
        ) as handle:
            reply = grant(handle, "short", [0], NOBODY_UID, duration_s=60)
            run_as(f"unix:{reply.grant.socket_path}", [open_call()])
            wall[0] += 61
            handle.daemon.tick()
            names = [g.grant.name for g in handle.daemon.reads.grants()]
            held = holders(handle)
        assert names == ["shared"]
        assert held == {}
        assert not Path(reply.grant.socket_path).exists()

    def test_grants_survive_a_restart_with_their_owner_and_mode(self, reachable_dir: Path) -> None:
        with running_daemon(reachable_dir, reaper=False, tenancy="multi") as handle:
            path = Path(grant(handle, "keep", [3], VICTIM_UID).grant.socket_path)
        assert not path.exists()  # a stopped daemon serves nothing
        with running_daemon(reachable_dir, reaper=False, tenancy="multi") as handle:
            st = path.stat()
            outcome = run_as(f"unix:{path}", [open_call()], uid=VICTIM_UID, gid=VICTIM_UID)[0]
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (VICTIM_UID, 0o600)
        assert outcome.code == "OK"

    def test_overlapping_grants_conflict_unless_replaced(self, multi: DaemonHandle) -> None:
        grant(multi, "old", [0, 1], VICTIM_UID)
        with pytest.raises(grpc.RpcError) as refused:
            grant(multi, "new", [1], NOBODY_UID)
        replaced = grant(multi, "new", [1], NOBODY_UID, replace=True)
        assert refused.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert list(replaced.revoked) == ["old"]
        assert [g.grant.name for g in multi.daemon.reads.grants()] == ["shared", "new"]


@contextmanager
def mounted(sockets: list[Path], directory: Path) -> Iterator[list[Path]]:
    """Bind-mount the sockets' GPU directories into ``directory``, as a CDI spec does for a container."""
    directory.mkdir(mode=0o755)
    targets = [directory / p.parent.name for p in sockets]
    done: list[Path] = []
    try:
        for source, target in zip(sockets, targets, strict=True):
            target.mkdir()
            subprocess.run(["mount", "--bind", str(source.parent), str(target)], check=True)
            done.append(target)
        yield [t / p.name for t, p in zip(targets, sockets, strict=True)]
    finally:
        for target in done:
            subprocess.run(["umount", str(target)], check=False)


class TestPerGpuSockets:
    def test_only_a_container_given_the_gpu_reaches_its_socket_and_tickets_add_gpus_once(
        self, reachable_dir: Path
    ) -> None:
        """Sockets 0666 in a 0700 directory: reachable only where mounted (GPUs 0 and 1 here, not 2)."""
        with running_daemon(
            reachable_dir, reaper=False, tenancy="multi", gpu_socket_dir=reachable_dir / "gpus"
        ) as handle:
            sockets = [Path(g.grant.socket_path) for g in handle.daemon.reads.grants()[1:]]
            modes = [stat.S_IMODE(p.stat().st_mode) for p in sockets]
            dir_mode = stat.S_IMODE(sockets[0].parent.parent.stat().st_mode)
            unmounted = run_as(f"unix:{sockets[2]}", [open_call(2)])[0]
            gpu_dirs = [stat.S_IMODE(p.parent.stat().st_mode) for p in sockets]
            with mounted(sockets[:2], reachable_dir / "container") as (gpu0, gpu1):
                ticket = run_as(f"unix:{gpu1}", [call("PhaseService", "IssueClaimTicket")])[0]
                token = ticket.response["ticket"]
                first = f"unix:{gpu0}"
                refused = run_as(first, [open_call(0, 1), open_call(0, 1, tickets=("forged" + token[6:],))])
                used = run_as(
                    first, [open_call(tickets=(token,)), open_call(0, job_id="b", tickets=(token,))]
                )
            held = holders(handle)
        assert modes == [0o666] * 4
        assert dir_mode == 0o700
        assert gpu_dirs == [0o711] * 4
        assert unmounted.code == "UNAVAILABLE"
        assert [g["index"] for g in ticket.response["gpus"]] == [1]
        assert [o.code for o in refused] == ["PERMISSION_DENIED", "PERMISSION_DENIED"]
        assert [o.code for o in used] == ["OK", "PERMISSION_DENIED"]  # a ticket works once
        assert held == {0: "job-a", 1: "job-a"}

    def test_a_mounted_gpu_directory_reaches_the_socket_of_a_restarted_daemon(
        self, reachable_dir: Path
    ) -> None:
        """A container keeps its mount across an eerld restart: the new socket appears in the mounted dir."""
        gpu_dir = reachable_dir / "gpus"
        with running_daemon(reachable_dir, reaper=False, tenancy="multi", gpu_socket_dir=gpu_dir) as handle:
            socket = Path(handle.daemon.reads.grants()[1].grant.socket_path)
        with mounted([socket], reachable_dir / "container") as (in_container,):
            stopped = in_container.exists()
            with running_daemon(reachable_dir, reaper=False, tenancy="multi", gpu_socket_dir=gpu_dir):
                outcome = run_as(f"unix:{in_container}", [open_call(0)])[0]
        assert not stopped  # a stopped daemon removes its sockets
        assert outcome.code == "OK"


def session(name: str, role: GpuRole, gpu: int, authority: frozenset[int]) -> HeldSession:
    spec = SessionSpec("job", 0, 0, (), ExecutionMode.ASYNC, role, None, None)
    settings = ControllerSettings(supported_sm_clocks_mhz=(), kinds=role.kinds(), mode=spec.mode)
    return HeldSession(
        name, spec, (gpu,), OffController(settings), supported_sm_clocks_mhz=(), throughput_threshold=0.95,
        lease_ttl_s=10, opened_at_unix_s=0, now_s=0, grant=name, authority=authority,
        granted_by=frozenset({name}),
    )  # fmt: skip


def test_async_peers_share_a_job_id_and_authority_not_a_job_id_alone() -> None:
    """A session of another tenant that claims the job's id is no peer: it shares no authority."""
    registry = SessionRegistry()
    generation = session("a", GpuRole.GENERATION, 0, frozenset({0, 1}))
    training = session("b", GpuRole.TRAINING, 1, frozenset({0, 1}))
    impostor = session("c", GpuRole.TRAINING, 2, frozenset({2}))
    for s in (generation, training, impostor):
        registry.add(s)
    assert registry.peers(generation) == [training]
    assert registry.peers(impostor) == []
