"""Clock control through the daemon and its gRPC services (the arbiter as eerld uses it): pin > session >
default, dry-run, degraded GPUs, the ledger and persisted pins. The arbiter built directly is tested in
tests/eerld/clocks/test_arbiter.py."""

from __future__ import annotations

import json
import stat
import threading

import grpc
import pytest
from eerl.control.simple import create_fixed_controller
from eerl.phases import ExecutionMode, GpuRole, PhaseKind
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.daemon import Daemon
from eerld.errors import GpuLost, NoPermission
from eerld.sessions import GpuSelector, SessionSpec
from eerld.testing import FakeGpuBackend, ManualClock
from tests.eerld.conftest import GEN, TRAIN, begin, end, open_session


def pin(admin, *gpus: int, sm_clock_mhz: int = 900, **kwargs) -> pb.PinResponse:
    return admin.Pin(
        pb.PinRequest(
            gpus=[pb.GpuRef(index=i) for i in gpus], sm_clock_mhz=sm_clock_mhz, reason="test", **kwargs
        )
    )


def status_of(admin, index: int) -> pb.GpuStatus:
    return admin.Status(pb.StatusRequest()).gpus[index]


class TestPins:
    def test_an_admin_pin_beats_the_session_and_unpin_gives_control_back(self, phase, admin, fake):
        session = open_session(phase, 0)
        begin(phase, session.session_id, GEN, 0)
        assert fake.locked() == {0: 1200}
        response = pin(admin, 0)
        assert fake.locked() == {0: 900}
        assert response.clocks[0].source == pb.CLOCK_SOURCE_ADMIN_PIN
        end(phase, session.session_id, GEN, 0)
        during = begin(phase, session.session_id, TRAIN, 0)
        assert fake.locked() == {0: 900}
        assert during.clocks[0].source == pb.CLOCK_SOURCE_ADMIN_PIN
        assert during.state == pb.CONTROLLER_STATE_PINNED  # the phase began pinned: eerld decided it
        admin.Unpin(pb.UnpinRequest(gpus=[pb.GpuRef(index=0)]))
        assert fake.locked() == {}  # the rest of that phase: the default governor (its begin asked for none)
        end(phase, session.session_id, TRAIN, 0)
        after = begin(phase, session.session_id, GEN, 1)  # the next phase: the session's controller again
        assert after.state == pb.CONTROLLER_STATE_FIXED
        assert fake.locked() == {0: 1200}
        assert status_of(admin, 0).source == pb.CLOCK_SOURCE_SESSION

    def test_unpinning_a_gpu_without_a_session_returns_it_to_the_default_governor(self, admin, fake):
        pin(admin, 3)
        assert status_of(admin, 3).owner.pin.sm_clock_mhz == 900
        admin.Unpin(pb.UnpinRequest(all=True))
        assert fake.locked() == {}
        assert status_of(admin, 3).source == pb.CLOCK_SOURCE_DEFAULT

    def test_a_pin_expires_after_its_duration(self, start_daemon, fake):
        wall = ManualClock(start_s=1.8e9)
        with (
            start_daemon(wall_clock=wall) as handle,
            grpc.insecure_channel(f"unix:{handle.admin_socket_path}") as ch,
        ):
            pin(pb_grpc.AdminServiceStub(ch), 1, duration_s=60.0)
            wall.advance(59.0)
            handle.daemon.tick()
            assert fake.locked() == {1: 900}
            wall.advance(2.0)
            handle.daemon.tick()
            assert fake.locked() == {}

    def test_pins_survive_a_restart_and_session_locks_do_not(self, start_daemon, fake, sock_dir):
        with start_daemon() as handle, grpc.insecure_channel(f"unix:{handle.admin_socket_path}") as ch:
            pin(pb_grpc.AdminServiceStub(ch), 2, sm_clock_mhz=1005)
        fake.force_lock(0, 1800)
        ledger = sock_dir / "state" / "ledger.json"
        ledger.write_text(
            json.dumps({"version": 1, "locked": [{"index": 0, "uuid": "", "owner": "session"}]})
        )
        with start_daemon() as handle, grpc.insecure_channel(f"unix:{handle.admin_socket_path}") as ch:
            assert fake.locked() == {2: 1005}
            gpu = pb_grpc.AdminServiceStub(ch).Status(pb.StatusRequest()).gpus[2]
            assert gpu.owner.pin.reason == "test"
            assert gpu.source == pb.CLOCK_SOURCE_ADMIN_PIN

    def test_reset_all_closes_the_holding_session_and_removes_pins(self, phase, admin, fake):
        session = open_session(phase, 0, 1)
        begin(phase, session.session_id, GEN, 0)
        pin(admin, 2)
        response = admin.ResetAll(pb.ResetAllRequest(all=True, reason="maintenance"))
        assert list(response.closed_session_ids) == [session.session_id]
        assert fake.locked() == {}
        with pytest.raises(grpc.RpcError) as e:
            end(phase, session.session_id, GEN, 0)
        assert e.value.code() is grpc.StatusCode.NOT_FOUND


class TestDryRun:
    def test_dry_run_decides_and_meters_but_never_locks_and_status_shows_what_would_be_locked(
        self, start_daemon, fake: FakeGpuBackend, clock: ManualClock
    ):
        with (
            start_daemon(dry_run=True) as handle,
            grpc.insecure_channel(f"unix:{handle.socket_path}") as ch,
            grpc.insecure_channel(f"unix:{handle.admin_socket_path}") as admin_channel,
        ):
            stub = pb_grpc.PhaseServiceStub(ch)
            session = open_session(stub, 0)
            began = begin(stub, session.session_id, GEN, 0)
            clock.advance(2.0)
            admin = pb_grpc.AdminServiceStub(admin_channel)
            pin(admin, 1)
            status = admin.Status(pb.StatusRequest())  # during the phase: its lock would hold
            ended = end(stub, session.session_id, GEN, 0)
        assert fake.lock_calls() == 0
        assert fake.locked() == {}
        assert began.clocks[0].dry_run
        assert began.target_sm_clock_mhz == 1200
        assert ended.energy_mj > 0
        assert status.daemon.dry_run
        assert status.gpus[0].would_lock_sm_clock_mhz == 1200
        assert not status.gpus[0].HasField("locked_sm_clock_mhz")
        assert status.gpus[1].would_lock_sm_clock_mhz == 900

    def test_dry_run_leaves_a_lock_the_ledger_names_and_keeps_the_ledger(
        self, start_daemon, fake: FakeGpuBackend, sock_dir
    ):
        """A dry-run daemon never resets, even a lock a crashed daemon left: that is a real daemon's job."""
        fake.force_lock(0, 1800)
        ledger = sock_dir / "state" / "ledger.json"
        ledger.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        entry = {"index": 0, "uuid": "", "owner": "session"}
        ledger.write_text(json.dumps({"version": 1, "locked": [entry]}))
        with start_daemon(dry_run=True):
            assert fake.locked() == {0: 1800}
        assert fake.locked() == {0: 1800}
        assert json.loads(ledger.read_text())["locked"][0]["index"] == 0

    def test_a_dry_run_daemon_refuses_a_clock_change_at_the_backend_even_on_the_reset_path(
        self, start_daemon, fake: FakeGpuBackend
    ):
        fake.force_lock(1, 1500)
        with start_daemon(dry_run=True) as handle:
            results = handle.daemon.reset_clocks()
        assert fake.locked() == {1: 1500}
        assert fake.lock_calls() == 0
        assert all("dry-run" in r.degraded_reason for r in results)


class TestLockEndsWithItsPhase:
    def test_each_phase_locks_once_and_its_end_returns_the_gpu_to_default(self, phase, fake: FakeGpuBackend):
        """The work between phases runs at the default governor, not at the last phase's lock."""
        session = open_session(phase, 0)
        for iteration in range(3):
            begin(phase, session.session_id, GEN, iteration)
            assert fake.locked() == {0: 1200}
            end(phase, session.session_id, GEN, iteration)
            assert fake.locked() == {}
        assert fake.lock_calls() == 3

    def test_a_begin_whose_clock_already_holds_makes_no_lock_call(self, phase, fake: FakeGpuBackend):
        """A lost EndPhase: the next BeginPhase abandons the phase and finds its clock in place."""
        session = open_session(phase, 0)
        begin(phase, session.session_id, GEN, 0)
        begin(phase, session.session_id, GEN, 1)
        assert fake.lock_calls() == 1


class TestDegraded:
    def test_a_failing_gpu_is_degraded_with_its_reason_while_the_others_are_served(
        self, phase, admin, fake: FakeGpuBackend
    ):
        fake.fail(1, "lock_sm_clock", GpuLost("fell off the bus", gpu_index=1))
        session = open_session(phase, 0, 1, 2)
        response = begin(phase, session.session_id, GEN, 0)
        assert fake.locked() == {0: 1200, 2: 1200}
        reasons = {c.index: c.degraded_reason for c in response.clocks}
        assert reasons[0] == reasons[2] == ""
        assert "GpuLost" in reasons[1]
        assert "fell off the bus" in status_of(admin, 1).degraded_reason

    def test_a_degraded_gpu_is_retried_with_back_off_until_it_recovers(
        self, daemon, phase, admin, fake: FakeGpuBackend, clock: ManualClock
    ):
        fake.fail(0, "lock_sm_clock", NoPermission("not root", gpu_index=0))
        session = open_session(phase, 0)
        begin(phase, session.session_id, GEN, 0)
        fake.heal(0)
        daemon.daemon.tick()
        assert fake.locked() == {}
        clock.advance(1.0)
        daemon.daemon.tick()
        assert fake.locked() == {0: 1200}
        assert status_of(admin, 0).degraded_reason == ""

    def test_a_gpu_whose_lock_failed_stays_in_the_ledger_so_a_restart_resets_it(
        self, phase, fake: FakeGpuBackend, sock_dir
    ):
        fake.fail(0, "lock_sm_clock", GpuLost("gone", gpu_index=0))
        session = open_session(phase, 0)
        begin(phase, session.session_id, GEN, 0)
        ledger = json.loads((sock_dir / "state" / "ledger.json").read_text())
        assert [e["index"] for e in ledger["locked"]] == [0]


class TestLedger:
    def test_every_lock_is_in_the_ledger_before_it_holds_and_leaves_it_after_the_reset(
        self, phase, fake: FakeGpuBackend, sock_dir
    ):
        path = sock_dir / "state" / "ledger.json"
        session = open_session(phase, 0, 3)
        begin(phase, session.session_id, GEN, 0)
        assert sorted(e["index"] for e in json.loads(path.read_text())["locked"]) == [0, 3]
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        phase.CloseSession(pb.CloseSessionRequest(session_id=session.session_id))
        assert json.loads(path.read_text())["locked"] == []

    def test_at_start_every_gpu_the_ledger_names_is_reset(self, start_daemon, fake: FakeGpuBackend, sock_dir):
        state = sock_dir / "state"
        state.mkdir()
        (state / "ledger.json").write_text(
            json.dumps({"version": 1, "locked": [{"index": 1, "uuid": "x", "owner": "session"}]})
        )
        fake.force_lock(1, 1005)
        with start_daemon():
            assert fake.locked() == {}


class TestStuckGpu:
    def test_a_gpu_whose_driver_hangs_does_not_hold_up_the_other_gpus_of_the_decision(self, sock_dir):
        clock = ManualClock()
        fake = FakeGpuBackend(3, clock=clock)
        release = threading.Event()
        fake.hang(1, release)
        daemon = Daemon(
            fake,
            sock_dir,
            controller_name="fixed",
            controller_factory=create_fixed_controller,
            fixed_clocks_mhz={PhaseKind.GENERATION: 1200},
            clock=clock,
            apply_timeout_s=0.2,
        )
        spec = SessionSpec(
            "j", 0, 0, tuple(GpuSelector(f"gpus[{i}]", index=i) for i in range(3)), ExecutionMode.SYNC,
            GpuRole.BOTH, None, None,
        )  # fmt: skip
        session_id = daemon.book.open_session(spec).session_id
        began = daemon.phases.begin_phase(session_id, PhaseKind.GENERATION, 0, None)
        try:
            assert fake.locked() == {0: 1200, 2: 1200}
            assert {c.index: bool(c.degraded_reason) for c in began.clocks} == {0: False, 1: True, 2: False}
        finally:
            release.set()
            daemon.shutdown()
