"""Privilege: who can reach what. Sockets by file mode and group, sessions by token, TCP by client
certificate, the hardware by a per-GPU clock-change rate limit."""

from __future__ import annotations

import grp
import io
import socket
import subprocess
from pathlib import Path

import grpc
import pytest
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.clocks.ratelimit import ClockChangeLimiter
from eerld.config import Config, load_config
from eerld.errors import ConfigError
from eerld.testing import FakeGpuBackend, ManualClock, running_daemon

NOBODY_UID = 65534
NOGROUP_GID = 65534
SOCKET_GROUP = "daemon"
SYSTEM_PYTHON = "/usr/bin/python3"
"""A Python that the unprivileged user may execute (the venv's lives under /root)."""
CONNECT = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ns.connect(sys.argv[1])\nprint('connected')"
GEN, TRAIN = pb.PHASE_KIND_GENERATION, pb.PHASE_KIND_TRAINING
WORK = pb.Workload(tokens=2, valid_tokens=1, sequences=1)


def connect_as_nobody(path: Path, *, extra_groups: list[int]) -> subprocess.CompletedProcess[str]:
    """Connect to a Unix socket from a process running as ``nobody`` (we run as root, so we can drop)."""
    return subprocess.run(
        [SYSTEM_PYTHON, "-c", CONNECT, str(path)],
        user=NOBODY_UID,
        group=NOGROUP_GID,
        extra_groups=extra_groups,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


@pytest.fixture
def daemon_dir(sock_dir: Path) -> Path:
    """A socket directory anyone may traverse, so that only the sockets' own modes decide."""
    sock_dir.chmod(0o755)
    return sock_dir


class TestSockets:
    def test_a_user_outside_the_worker_sockets_group_cannot_connect_and_one_inside_can(
        self, daemon_dir: Path
    ) -> None:
        group_gid = grp.getgrnam(SOCKET_GROUP).gr_gid
        with running_daemon(daemon_dir, reaper=False, socket_group=SOCKET_GROUP) as handle:
            assert handle.socket_path.stat().st_mode & 0o777 == 0o660
            outside = connect_as_nobody(handle.socket_path, extra_groups=[])
            inside = connect_as_nobody(handle.socket_path, extra_groups=[group_gid])
        assert "PermissionError" in outside.stderr
        assert inside.stdout.strip() == "connected"

    def test_the_admin_socket_refuses_a_member_of_the_worker_group(self, daemon_dir: Path) -> None:
        group_gid = grp.getgrnam(SOCKET_GROUP).gr_gid
        with running_daemon(daemon_dir, reaper=False, socket_group=SOCKET_GROUP) as handle:
            assert handle.admin_socket_path.stat().st_mode & 0o777 == 0o600
            result = connect_as_nobody(handle.admin_socket_path, extra_groups=[group_gid])
        assert "PermissionError" in result.stderr

    def test_the_worker_socket_serves_no_admin_rpc(self, sock_dir: Path) -> None:
        with (
            running_daemon(sock_dir, reaper=False) as handle,
            grpc.insecure_channel(f"unix:{handle.socket_path}") as channel,
        ):
            admin_on_worker = pb_grpc.AdminServiceStub(channel)
            codes = []
            for call, request in (
                (admin_on_worker.Status, pb.StatusRequest()),
                (admin_on_worker.Pin, pb.PinRequest(all=True, sm_clock_mhz=600, reason="x")),
                (admin_on_worker.ResetAll, pb.ResetAllRequest()),
                (admin_on_worker.ListSessions, pb.ListSessionsRequest()),
            ):
                with pytest.raises(grpc.RpcError) as raised:
                    call(request, timeout=10)
                codes.append(raised.value.code())
            locked = handle.backend.locked()  # type: ignore[attr-defined]
        assert codes == [grpc.StatusCode.UNIMPLEMENTED] * 4
        assert locked == {}


class TestSessionTokens:
    def test_another_sessions_token_or_a_guessed_one_cannot_touch_a_session(self, sock_dir: Path) -> None:
        clock = ManualClock()
        fake = FakeGpuBackend(4, clock=clock)
        with (
            running_daemon(sock_dir, backend=fake, clock=clock, reaper=False) as handle,
            grpc.insecure_channel(f"unix:{handle.socket_path}") as channel,
        ):
            stub = pb_grpc.PhaseServiceStub(channel)
            a = stub.OpenSession(pb.OpenSessionRequest(job_id="a", gpus=[pb.GpuRef(index=0)])).session_id
            b = stub.OpenSession(pb.OpenSessionRequest(job_id="b", gpus=[pb.GpuRef(index=1)])).session_id
            stub.BeginPhase(pb.BeginPhaseRequest(session_id=a, kind=GEN, iteration=0))
            guessed = a[:-1] + ("x" if a[-1] != "x" else "y")
            stub.CloseSession(pb.CloseSessionRequest(session_id=b))
            codes = []
            for token in (guessed, b):
                for call, request in (
                    (
                        stub.EndPhase,
                        pb.EndPhaseRequest(session_id=token, kind=GEN, iteration=0, workload=WORK),
                    ),
                    (stub.BeginPhase, pb.BeginPhaseRequest(session_id=token, kind=TRAIN, iteration=1)),
                    (stub.CloseSession, pb.CloseSessionRequest(session_id=token)),
                ):
                    with pytest.raises(grpc.RpcError) as raised:
                        call(request, timeout=10)
                    codes.append(raised.value.code())
            holders = [s.session_id for s in handle.daemon.reads.sessions()]
            current = handle.daemon.reads.sessions()[0].current_phase
            locked = fake.locked()
        assert len(a) >= 22  # at least 128 bits of randomness in URL-safe base64
        assert codes == [grpc.StatusCode.NOT_FOUND] * 6
        assert holders == [a]
        assert current is not None
        assert current.value == "generation"
        assert locked == {0: 1200}


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_pki(d: Path) -> None:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=ca",
            "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"))  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", str(d / f"{name}.key"), "-out", str(d / f"{name}.csr"))  # fmt: skip
        openssl("x509", "-req", "-in", str(d / f"{name}.csr"), "-CA", str(d / "ca.pem"),
                "-CAkey", str(d / "ca.key"), "-CAcreateserial", "-days", "1",
                "-extfile", str(d / "san.ext"), "-out", str(d / f"{name}.pem"))  # fmt: skip


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_tcp_refuses_a_client_without_a_certificate_and_a_plaintext_client(sock_dir: Path) -> None:
    make_pki(sock_dir)
    address = f"127.0.0.1:{free_port()}"
    ca = (sock_dir / "ca.pem").read_bytes()
    request = pb.OpenSessionRequest(job_id="tcp", gpus=[pb.GpuRef(index=0)])
    codes = []
    with running_daemon(
        sock_dir,
        reaper=False,
        listen=address,
        tls_cert=sock_dir / "server.pem",
        tls_key=sock_dir / "server.key",
        tls_client_ca=sock_dir / "ca.pem",
    ) as handle:
        for channel in (
            grpc.secure_channel(address, grpc.ssl_channel_credentials(ca)),
            grpc.insecure_channel(address),
        ):
            with channel, pytest.raises(grpc.RpcError) as raised:
                pb_grpc.PhaseServiceStub(channel).OpenSession(request, timeout=10)
            codes.append(raised.value.code())
        sessions = handle.daemon.reads.sessions()
    assert codes == [grpc.StatusCode.UNAVAILABLE] * 2
    assert sessions == ()


class TestClockChangeRateLimit:
    def test_a_client_flipping_phases_in_a_tight_loop_gets_at_most_the_burst_then_the_rate(
        self, sock_dir: Path
    ) -> None:
        clock = ManualClock()
        fake = FakeGpuBackend(2, clock=clock)
        with (
            running_daemon(sock_dir, backend=fake, clock=clock, reaper=False) as handle,
            grpc.insecure_channel(f"unix:{handle.socket_path}") as channel,
        ):
            stub = pb_grpc.PhaseServiceStub(channel)
            sid = stub.OpenSession(pb.OpenSessionRequest(job_id="t", gpus=[pb.GpuRef(index=0)])).session_id

            def flip(phases: int, first: int) -> None:
                for i in range(first, first + phases):
                    kind = GEN if i % 2 == 0 else TRAIN
                    stub.BeginPhase(pb.BeginPhaseRequest(session_id=sid, kind=kind, iteration=i))
                    stub.EndPhase(pb.EndPhaseRequest(session_id=sid, kind=kind, iteration=i, workload=WORK))

            # Each phase takes two changes: its lock and its end's release (a release is never held back).
            flip(100, 0)  # no time passes: only the burst gets through (20 changes: 10 locks)
            burst_changes = fake.lock_calls()
            clock.advance(1.0)
            flip(100, 100)  # one second later: ten more changes (5 locks)
            after_one_second = fake.lock_calls() - burst_changes
            stub.CloseSession(pb.CloseSessionRequest(session_id=sid))  # the reset is never limited
            locked_after_close = fake.locked()
        assert burst_changes == 10
        assert after_one_second == 5
        assert locked_after_close == {}

    def test_an_admin_pin_on_a_gpu_whose_budget_is_spent_is_refused_until_it_refills(
        self, sock_dir: Path
    ) -> None:
        clock = ManualClock()
        fake = FakeGpuBackend(1, clock=clock)
        with (
            running_daemon(sock_dir, backend=fake, clock=clock, reaper=False) as handle,
            grpc.insecure_channel(f"unix:{handle.socket_path}") as worker,
            grpc.insecure_channel(f"unix:{handle.admin_socket_path}") as admin,
        ):
            stub = pb_grpc.PhaseServiceStub(worker)
            sid = stub.OpenSession(pb.OpenSessionRequest(job_id="t", gpus=[pb.GpuRef(index=0)])).session_id
            for i in range(60):
                kind = GEN if i % 2 == 0 else TRAIN
                stub.BeginPhase(pb.BeginPhaseRequest(session_id=sid, kind=kind, iteration=i))
                stub.EndPhase(pb.EndPhaseRequest(session_id=sid, kind=kind, iteration=i, workload=WORK))
            pin = pb.PinRequest(gpus=[pb.GpuRef(index=0)], sm_clock_mhz=900, reason="maintenance")
            with pytest.raises(grpc.RpcError) as refused:
                pb_grpc.AdminServiceStub(admin).Pin(pin, timeout=10)
            locked_refused = fake.locked()
            pins_refused = handle.daemon.reads.gpu_status()[0].pin
            clock.advance(0.2)
            pb_grpc.AdminServiceStub(admin).Pin(pin, timeout=10)
            locked = fake.locked()
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "retry" in refused.value.details()
        assert (locked_refused, pins_refused) == ({}, None)  # the last phase's lock ended with it
        assert locked == {0: 900}

    def test_resets_take_from_the_budget_so_an_open_lock_close_loop_cannot_thrash_a_gpu(
        self, sock_dir: Path
    ) -> None:
        """Releases are never held back, but they count: locks wait for what the resets spent."""
        clock = ManualClock()
        fake = FakeGpuBackend(1, clock=clock)
        with (
            running_daemon(
                sock_dir, backend=fake, clock=clock, reaper=False, max_clock_changes_per_s=1.0
            ) as handle,
            grpc.insecure_channel(f"unix:{handle.socket_path}") as channel,
        ):
            stub = pb_grpc.PhaseServiceStub(channel)
            for _ in range(40):  # one cycle a second: within the socket's session rate
                clock.advance(1.0)
                sid = stub.OpenSession(
                    pb.OpenSessionRequest(job_id="t", gpus=[pb.GpuRef(index=0)])
                ).session_id
                stub.BeginPhase(pb.BeginPhaseRequest(session_id=sid, kind=GEN, iteration=0))
                stub.CloseSession(pb.CloseSessionRequest(session_id=sid))
            locks, resets = fake.lock_calls(), fake.gpus[0].reset_calls
            locked = fake.locked()
        assert resets >= 40  # every release reset the GPU
        # Without the resets' tokens all 40 locks would pass; with them, once the burst (20 changes) is
        # spent, the one change a second goes to the releases, which are never held back.
        assert locks <= 22
        assert locked == {}


def test_the_rate_limit_is_a_token_bucket_per_gpu_that_refills_with_time() -> None:
    limiter = ClockChangeLimiter(rate_per_s=10.0, burst=20)
    burst = sum(limiter.allow(0, 0.0) for _ in range(50))
    other_gpu = sum(limiter.allow(1, 0.0) for _ in range(50))
    later = sum(limiter.allow(0, 0.5) for _ in range(50))
    assert (burst, other_gpu, later, limiter.denied) == (20, 20, 5, 30 + 30 + 45)
    assert all(ClockChangeLimiter(rate_per_s=0).allow(0, 0.0) for _ in range(1000))


def test_the_rate_limit_is_set_by_a_flag_zero_turns_it_off_and_a_negative_value_is_refused() -> None:
    assert load_config(["--max-clock-changes-per-s", "2.5"]).max_clock_changes_per_s == 2.5
    assert Config().max_clock_changes_per_s == 10.0
    with pytest.raises(ConfigError, match="--max-clock-changes-per-s"):
        load_config(["--max-clock-changes-per-s", "-1"])


def test_with_the_limit_off_every_phase_change_reaches_the_gpu(sock_dir: Path) -> None:
    clock = ManualClock()
    fake = FakeGpuBackend(1, clock=clock)
    with (
        running_daemon(
            sock_dir, backend=fake, clock=clock, reaper=False, max_clock_changes_per_s=0.0
        ) as handle,
        grpc.insecure_channel(f"unix:{handle.socket_path}") as channel,
    ):
        stub = pb_grpc.PhaseServiceStub(channel)
        sid = stub.OpenSession(pb.OpenSessionRequest(job_id="t", gpus=[pb.GpuRef(index=0)])).session_id
        for i in range(50):
            kind = GEN if i % 2 == 0 else TRAIN
            stub.BeginPhase(pb.BeginPhaseRequest(session_id=sid, kind=kind, iteration=i))
            stub.EndPhase(pb.EndPhaseRequest(session_id=sid, kind=kind, iteration=i, workload=WORK))
        changes = fake.lock_calls()
    assert changes == 50


def test_eerlctl_pin_waits_for_a_spent_budget_to_refill_instead_of_failing(sock_dir: Path) -> None:
    """eerlctl retries a pin refused for the rate limit within its --timeout (the admin's word wins soon)."""
    from eerlctl.main import main as eerlctl  # noqa: PLC0415

    fake = FakeGpuBackend(1)
    with (
        running_daemon(sock_dir, backend=fake, reaper=False, max_clock_changes_per_s=2.0) as handle,
        grpc.insecure_channel(f"unix:{handle.socket_path}") as worker,
    ):
        stub = pb_grpc.PhaseServiceStub(worker)
        sid = stub.OpenSession(pb.OpenSessionRequest(job_id="t", gpus=[pb.GpuRef(index=0)])).session_id
        for i in range(40):
            kind = GEN if i % 2 == 0 else TRAIN
            stub.BeginPhase(pb.BeginPhaseRequest(session_id=sid, kind=kind, iteration=i))
            stub.EndPhase(pb.EndPhaseRequest(session_id=sid, kind=kind, iteration=i, workload=WORK))
        spent = handle.daemon._arbiter.over_rate([0])
        args = [
            "--socket",
            str(handle.admin_socket_path),
            "--timeout",
            "20",
            "pin",
            "--gpus",
            "0",
            "--sm-mhz",
            "900",
        ]
        code = eerlctl(args, out=io.StringIO(), err=io.StringIO())
        locked = fake.locked()
    assert spent == [0]
    assert code == 0
    assert locked == {0: 900}
