"""Sessions over a real Unix socket: exclusive claims, tokens, phase order, lease expiry."""

from __future__ import annotations

import grpc
import pytest
from eerl.control.base import ControllerSettings, Decision, PhaseObservation
from eerl.control.simple import OffController
from eerl.phases import ControllerState, ExecutionMode, GpuRole, PhaseKind, Workload
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc
from eerl_sim.gpu import VirtualClock, create_sim_backend
from eerl_sim.profiles import builtin_profile

from eerld.app import build
from eerld.config import Config
from eerld.daemon import Daemon
from eerld.errors import BackendFailure
from eerld.sessions import GpuSelector, SessionSpec
from eerld.testing import FakeGpuBackend, ManualClock
from tests.eerld.conftest import GEN, TRAIN, begin, end, open_session


class TestClaims:
    def test_a_gpu_held_by_one_session_cannot_be_claimed_by_another_and_the_error_names_the_holder(
        self, phase
    ):
        open_session(phase, 0, 1, job_id="job-a", rank=3, world_size=4)
        with pytest.raises(grpc.RpcError) as e:
            open_session(phase, 1, 2, job_id="job-b")
        assert e.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "GPU 1" in e.value.details()
        assert "job-a" in e.value.details()
        assert "rank 3" in e.value.details()

    def test_a_failed_claim_claims_none_of_its_gpus(self, phase):
        open_session(phase, 1, job_id="job-a")
        with pytest.raises(grpc.RpcError):
            open_session(phase, 2, 1, job_id="job-b")
        open_session(phase, 2, job_id="job-c")

    def test_a_gpu_can_be_claimed_by_uuid(self, phase, fake: FakeGpuBackend):
        uuid = fake.inventory()[2].uuid
        response = phase.OpenSession(pb.OpenSessionRequest(job_id="j", gpus=[pb.GpuRef(uuid=uuid)]))
        assert [g.index for g in response.gpus] == [2]
        with pytest.raises(grpc.RpcError) as e:
            open_session(phase, 2)
        assert e.value.code() is grpc.StatusCode.FAILED_PRECONDITION

    def test_closing_a_session_frees_its_gpus_and_resets_their_clocks(self, phase, fake: FakeGpuBackend):
        session = open_session(phase, 0)
        begin(phase, session.session_id, GEN, 0)
        assert fake.locked() == {0: 1200}
        phase.CloseSession(pb.CloseSessionRequest(session_id=session.session_id))
        assert fake.locked() == {}
        open_session(phase, 0)

    def test_session_ids_are_long_random_tokens(self, phase):
        ids = {open_session(phase, i).session_id for i in range(4)}
        assert len(ids) == 4
        assert all(len(i) >= 32 for i in ids)

    def test_a_call_with_an_unknown_session_id_is_not_found(self, phase):
        with pytest.raises(grpc.RpcError) as e:
            begin(phase, "x" * 32, GEN, 0)
        assert e.value.code() is grpc.StatusCode.NOT_FOUND
        assert "session_id" in e.value.details()


class TestPhaseOrder:
    def test_begin_applies_the_phase_clock_before_returning_and_reports_it_read_back(
        self, phase, fake: FakeGpuBackend
    ):
        session = open_session(phase, 0, 1)
        response = begin(phase, session.session_id, TRAIN, 0)
        assert fake.locked() == {0: 1500, 1: 1500}
        assert [(c.index, c.sm_clock_mhz, c.source) for c in response.clocks] == [
            (0, 1500, pb.CLOCK_SOURCE_SESSION),
            (1, 1500, pb.CLOCK_SOURCE_SESSION),
        ]
        assert response.target_sm_clock_mhz == 1500
        assert response.state == pb.CONTROLLER_STATE_FIXED

    @pytest.mark.parametrize(
        ("kind", "iteration", "problem"),
        [(TRAIN, 0, "running phase"), (GEN, 1, "running phase")],
    )
    def test_an_end_that_does_not_match_the_running_phase_fails_and_changes_nothing(
        self, phase, kind, iteration, problem
    ):
        session = open_session(phase, 0)
        begin(phase, session.session_id, GEN, 0)
        with pytest.raises(grpc.RpcError) as e:
            end(phase, session.session_id, kind, iteration)
        assert e.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert problem in e.value.details()
        end(phase, session.session_id, GEN, 0)

    def test_an_end_without_a_begin_fails(self, phase):
        session = open_session(phase, 0)
        with pytest.raises(grpc.RpcError) as e:
            end(phase, session.session_id, GEN, 0)
        assert e.value.code() is grpc.StatusCode.FAILED_PRECONDITION

    def test_a_duplicate_phase_fails(self, phase):
        session = open_session(phase, 0)
        begin(phase, session.session_id, GEN, 0)
        end(phase, session.session_id, GEN, 0)
        with pytest.raises(grpc.RpcError) as e:
            begin(phase, session.session_id, GEN, 0)
        assert e.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "already metered" in e.value.details()

    def test_a_begin_while_a_phase_runs_abandons_it_unmetered_and_begins_afresh(self, phase, daemon, fake):
        session = open_session(phase, 0)
        begin(phase, session.session_id, GEN, 0)  # its EndPhase is lost
        began = begin(phase, session.session_id, TRAIN, 0)
        locked = fake.locked()
        with pytest.raises(grpc.RpcError) as late_end:
            end(phase, session.session_id, GEN, 0)
        end(phase, session.session_id, TRAIN, 0)
        totals = {p.kind.value: p.phases for p in daemon.daemon.reads.sessions()[0].phases}
        assert began.resynced
        assert locked == {0: 1500}
        assert late_end.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert totals == {"generation": 0, "training": 1}
        assert not begin(phase, session.session_id, GEN, 1).resynced

    def test_an_iteration_that_goes_backwards_fails(self, phase):
        session = open_session(phase, 0)
        begin(phase, session.session_id, GEN, 5)
        end(phase, session.session_id, GEN, 5)
        with pytest.raises(grpc.RpcError) as e:
            begin(phase, session.session_id, TRAIN, 4)
        assert e.value.code() is grpc.StatusCode.FAILED_PRECONDITION
        assert "backwards" in e.value.details()

    def test_a_session_of_the_generation_pool_cannot_run_training(self, phase):
        session = open_session(phase, 0, mode=pb.EXECUTION_MODE_ASYNC, role=pb.GPU_ROLE_GENERATION)
        with pytest.raises(grpc.RpcError) as e:
            begin(phase, session.session_id, TRAIN, 0)
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "kind" in e.value.details()


class TestLease:
    def test_a_lease_bound_session_ends_and_resets_its_gpus_once_its_ttl_passes_without_heartbeat(
        self, daemon, phase, fake: FakeGpuBackend, clock: ManualClock
    ):
        session = open_session(phase, 0, lease_ttl_s=5.0)
        begin(phase, session.session_id, GEN, 0)
        clock.advance(4.0)
        daemon.daemon.tick()
        assert fake.locked() == {0: 1200}
        clock.advance(1.5)
        daemon.daemon.tick()
        assert fake.locked() == {}
        with pytest.raises(grpc.RpcError) as e:
            phase.Heartbeat(pb.HeartbeatRequest(session_id=session.session_id))
        assert e.value.code() is grpc.StatusCode.NOT_FOUND

    def test_a_heartbeat_renews_the_lease(self, daemon, phase, fake: FakeGpuBackend, clock: ManualClock):
        session = open_session(phase, 0, lease_ttl_s=5.0)
        begin(phase, session.session_id, GEN, 0)
        for _ in range(4):
            clock.advance(3.0)
            remaining = phase.Heartbeat(pb.HeartbeatRequest(session_id=session.session_id)).lease_remaining_s
            daemon.daemon.tick()
        assert remaining == pytest.approx(5.0)
        assert fake.locked() == {0: 1200}

    def test_the_default_lease_is_ten_seconds(self, phase):
        assert open_session(phase, 0).lease_ttl_s == 10.0


class RecordingController(OffController):
    """An ``off`` controller that remembers every observation it was given."""

    def __init__(self, settings: ControllerSettings) -> None:
        super().__init__(settings)
        self.seen: list[tuple[PhaseKind, int]] = []
        self.clocks: list[int | None] = []
        self.gaps_s: list[float] = []

    def observe(self, observation: PhaseObservation, now_s: float) -> Decision | None:
        self.seen.append((observation.kind, observation.iteration))
        self.clocks.append(observation.sm_clock_mhz)
        self.gaps_s.append(observation.gap_before_s)
        return super().observe(observation, now_s)


class TestPeerPool:
    def test_in_async_mode_each_pool_also_observes_the_phases_of_the_other_pool_of_its_job(self, sock_dir):
        controllers: list[RecordingController] = []

        def factory(settings: ControllerSettings) -> RecordingController:
            controllers.append(RecordingController(settings))
            return controllers[-1]

        clock = ManualClock()
        daemon = Daemon(
            FakeGpuBackend(4, clock=clock),
            sock_dir,
            controller_name="rec",
            controller_factory=factory,
            clock=clock,
        )

        def spec(job: str, gpu: int, role: GpuRole) -> SessionSpec:
            return SessionSpec(
                job, 0, 0, (GpuSelector("gpus[0]", index=gpu),), ExecutionMode.ASYNC, role, None, None
            )

        gen = daemon.book.open_session(spec("job", 0, GpuRole.GENERATION)).session_id
        daemon.book.open_session(spec("job", 1, GpuRole.TRAINING))
        daemon.book.open_session(spec("other-job", 2, GpuRole.TRAINING))
        daemon.phases.begin_phase(gen, PhaseKind.GENERATION, 0, None)
        clock.advance(1.0)
        daemon.phases.end_phase(gen, PhaseKind.GENERATION, 0, Workload(tokens=10))
        assert [c.seen for c in controllers] == [[(PhaseKind.GENERATION, 0)], [(PhaseKind.GENERATION, 0)], []]
        daemon.shutdown()


class TestObservations:
    @pytest.mark.parametrize(("dry_run", "held"), [(False, 1200), (True, None)])
    def test_the_controller_is_told_the_clock_that_actually_held(self, sock_dir, dry_run, held):
        controllers: list[RecordingController] = []

        def factory(settings: ControllerSettings) -> RecordingController:
            controllers.append(FixedRecording(settings))
            return controllers[-1]

        clock = ManualClock()
        daemon = Daemon(
            FakeGpuBackend(1, clock=clock),
            sock_dir,
            controller_name="rec",
            controller_factory=factory,
            clock=clock,
            dry_run=dry_run,
        )
        spec = SessionSpec(
            "j", 0, 0, (GpuSelector("gpus[0]", index=0),), ExecutionMode.SYNC, GpuRole.BOTH, None, None
        )
        sid = daemon.book.open_session(spec).session_id
        daemon.phases.begin_phase(sid, PhaseKind.GENERATION, 0, None)
        daemon.phases.end_phase(sid, PhaseKind.GENERATION, 0, Workload(tokens=10))
        assert controllers[0].clocks == [held]
        daemon.shutdown()


class TestBetweenPhases:
    def test_the_work_between_phases_runs_at_default_and_the_controller_is_told_how_long_it_took(
        self, sock_dir
    ):
        """Log-probabilities, rewards and weight sync run between EndPhase and the next BeginPhase: at the
        default governor (the lock ends with its phase), and counted in the next phase's gap."""
        controllers: list[RecordingController] = []

        def factory(settings: ControllerSettings) -> RecordingController:
            controllers.append(FixedRecording(settings))
            return controllers[-1]

        clock = ManualClock()
        fake = FakeGpuBackend(1, clock=clock)
        daemon = Daemon(fake, sock_dir, controller_name="rec", controller_factory=factory, clock=clock)
        spec = SessionSpec(
            "j", 0, 0, (GpuSelector("gpus[0]", index=0),), ExecutionMode.SYNC, GpuRole.BOTH, None, None
        )
        sid = daemon.book.open_session(spec).session_id
        between: list[dict[int, int]] = []
        for iteration, gaps in enumerate(((3.0, 0.5), (2.0, 0.25))):
            for kind, gap_s in zip((PhaseKind.GENERATION, PhaseKind.TRAINING), gaps, strict=True):
                daemon.phases.begin_phase(sid, kind, iteration, None)
                clock.advance(10.0)
                daemon.phases.end_phase(sid, kind, iteration, Workload(tokens=10))
                between.append(fake.locked())
                clock.advance(gap_s)
        assert between == [{}, {}, {}, {}]
        assert controllers[0].gaps_s == [0.0, 3.0, 0.5, 2.0]  # the first phase has no gap before it
        daemon.shutdown()


class TestControllerErrors:
    def test_a_gpu_without_known_clocks_refuses_an_online_session_as_invalid_argument(
        self, start_daemon, fake: FakeGpuBackend
    ):
        """The controller's own ValidationError reaches the caller as the daemon's, naming the field."""
        fake.fail(0, "supported_sm_clocks_mhz", BackendFailure("query failed"))
        with (
            start_daemon(controller="eerl", fixed_clocks="") as daemon,
            grpc.insecure_channel(f"unix:{daemon.socket_path}") as channel,
            pytest.raises(grpc.RpcError) as e,
        ):
            open_session(pb_grpc.PhaseServiceStub(channel), 0)
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "supported_sm_clocks_mhz: must name at least one clock" in e.value.details()


class FixedRecording(RecordingController):
    """Decides 1200 MHz for every phase and records what it observes."""

    def decide(self, kind: PhaseKind, iteration: int, hints: Workload | None, now_s: float) -> Decision:
        return Decision(kind, iteration, 1200, ControllerState.FIXED, "test", now_s)


class TestPhaseTime:
    def test_phases_are_timed_on_the_sim_devices_clock_while_leases_keep_real_time(self, sock_dir):
        """With an accelerated simulator, a phase's duration is simulated seconds (like its energy)."""
        sim = create_sim_backend(builtin_profile("h100-sxm"), 1, clock=VirtualClock())
        lease_clock = ManualClock()
        daemon = Daemon(
            sim,
            sock_dir,
            controller_name="off",
            controller_factory=OffController,
            clock=lease_clock,
            phase_clock=sim.device.clock.now_s,
        )
        spec = SessionSpec(
            "j", 0, 0, (GpuSelector("gpus[0]", index=0),), ExecutionMode.SYNC, GpuRole.BOTH, None, 5.0
        )
        sid = daemon.book.open_session(spec).session_id
        daemon.phases.begin_phase(sid, PhaseKind.GENERATION, 0, None)
        sim.device.run_segments(0, [0.0], [30.0], 1.0, [1.0], [1.0])
        ended = daemon.phases.end_phase(sid, PhaseKind.GENERATION, 0, Workload(tokens=10))
        assert ended.duration_s == pytest.approx(30.0, rel=1e-3)
        assert ended.energy_mj / 1000.0 / ended.duration_s == pytest.approx(ended.mean_power_w, rel=1e-6)
        assert daemon.book.heartbeat(sid) == pytest.approx(5.0)
        daemon.shutdown()

    def test_the_server_times_phases_on_the_backends_own_clock_when_it_has_one(self, tmp_path):
        """create_server picks the sim device's clock for phases, and none for a backend without one."""
        sim = create_sim_backend(builtin_profile("h100-sxm"), 1, clock=VirtualClock())
        assert sim.own_clock() == sim.device.clock.now_s
        assert FakeGpuBackend(1).own_clock() is None
        host = ManualClock()
        on_sim = build(Config(state_dir=tmp_path / "sim", tenancy="single"), backend=sim, clock=host)
        on_fake = build(
            Config(state_dir=tmp_path / "fake", tenancy="single"), backend=FakeGpuBackend(1), clock=host
        )
        try:
            assert on_sim.phase_clock == sim.device.clock.now_s
            assert on_fake.phase_clock is host
        finally:
            on_sim.close()
            on_fake.close()
