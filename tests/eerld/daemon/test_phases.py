"""The phase path (:mod:`eerld.daemon.phases`) called directly on the hub over fake GPUs: BeginPhase decides
and locks, EndPhase meters, releases, accounts, feeds the controller and publishes; job mode's begin takes
the ruling on its directive."""

from __future__ import annotations

import pytest
from eerl.control.simple import create_fixed_controller
from eerl.directives import DirectivePurpose, DirectiveVerdict
from eerl.phases import ControllerState, PhaseKind, Workload
from structlog.testing import capture_logs

from eerld.daemon import Daemon, DirectiveRecord, PhaseRecord
from eerld.daemon.jobmode import ReceivedDirective
from eerld.errors import Conflict, NotFound, Unavailable
from eerld.sessions import JobModeSpec
from eerld.testing import FakeGpuBackend, ManualClock
from tests.eerld.conftest import HUB_CLOCK_MHZ, gpu_spec

GEN = PhaseKind.GENERATION
TRAIN = PhaseKind.TRAINING
WORK = Workload(tokens=100, valid_tokens=80)


class TestBegin:
    def test_begin_locks_the_controllers_clock_for_the_phase(self, hub: Daemon, fake: FakeGpuBackend):
        sid = hub.book.open_session(gpu_spec(0, 1)).session_id
        began = hub.phases.begin_phase(sid, GEN, 0, None)
        assert (began.target_sm_clock_mhz, began.state) == (HUB_CLOCK_MHZ, ControllerState.FIXED)
        assert fake.locked() == {0: HUB_CLOCK_MHZ, 1: HUB_CLOCK_MHZ}
        assert not began.resynced

    def test_a_begin_over_a_phase_that_never_ended_abandons_it_and_says_so(self, hub: Daemon):
        sid = hub.book.open_session(gpu_spec(0)).session_id
        hub.phases.begin_phase(sid, GEN, 0, None)
        with capture_logs() as logs:
            began = hub.phases.begin_phase(sid, TRAIN, 0, None)
        assert began.resynced
        assert [e["event"] for e in logs if e["log_level"] == "warning"] == ["phase_abandoned"]

    def test_a_directive_to_a_session_not_in_job_mode_is_ignored_and_logged(self, hub: Daemon):
        sid = hub.book.open_session(gpu_spec(0)).session_id
        directive = ReceivedDirective(1, 1, 0, GEN, 900, DirectivePurpose.COMMITTED)
        with capture_logs() as logs:
            began = hub.phases.begin_phase(sid, GEN, 0, None, directive)
        assert began.target_sm_clock_mhz == HUB_CLOCK_MHZ
        assert began.verdict is DirectiveVerdict.NOT_JOB_MODE
        assert "job_directive_ignored" in [e["event"] for e in logs]


class TestEnd:
    def test_end_meters_the_phase_releases_its_lock_and_accounts_it(
        self, hub: Daemon, fake: FakeGpuBackend, clock: ManualClock
    ):
        sid = hub.book.open_session(gpu_spec(0)).session_id
        hub.phases.begin_phase(sid, GEN, 0, None)
        clock.advance(2.0)
        ended = hub.phases.end_phase(sid, GEN, 0, WORK)
        assert ended.duration_s == pytest.approx(2.0)
        assert ended.energy_mj == pytest.approx(ended.mean_power_w * 2.0 * 1000.0)
        assert (ended.sm_clock_mhz, ended.state, ended.gpus) == (HUB_CLOCK_MHZ, ControllerState.FIXED, 1)
        assert fake.locked() == {}  # the lock ends with its phase
        (view,) = hub.reads.sessions()
        totals = {p.kind: p for p in view.phases}[GEN]
        assert (totals.phases, totals.valid_tokens, totals.tokens) == (1, 80, 100)

    def test_an_end_that_names_another_phase_than_the_running_one_is_a_conflict(self, hub: Daemon):
        sid = hub.book.open_session(gpu_spec(0)).session_id
        with pytest.raises(
            Conflict, match=r"no phase is running; EndPhase\(generation, 0\) has no BeginPhase"
        ):
            hub.phases.end_phase(sid, GEN, 0, WORK)
        hub.phases.begin_phase(sid, GEN, 1, None)
        with pytest.raises(Conflict, match="the running phase is generation of iteration 1, not training"):
            hub.phases.end_phase(sid, TRAIN, 1, WORK)

    def test_a_closed_session_is_not_found_and_a_stopping_daemon_unavailable(self, hub: Daemon):
        sid = hub.book.open_session(gpu_spec(0)).session_id
        hub.phases.begin_phase(sid, GEN, 0, None)
        hub.book.close_session(sid)
        with pytest.raises(NotFound, match="session_id: no open session with this id"):
            hub.phases.end_phase(sid, GEN, 0, WORK)
        hub.shutdown()
        with pytest.raises(Unavailable, match="eerld is stopping"):
            hub.phases.end_phase(sid, GEN, 0, WORK)

    def test_each_metered_phase_is_published_and_an_observer_that_raises_fails_nothing(
        self, hub: Daemon, clock: ManualClock
    ):
        records: list[PhaseRecord] = []

        def broken(_record: PhaseRecord) -> None:
            raise RuntimeError("observer bug")

        hub.events.subscribe(on_phase=broken)
        hub.events.subscribe(on_phase=records.append)
        sid = hub.book.open_session(gpu_spec(0, job_id="j")).session_id
        hub.phases.begin_phase(sid, GEN, 0, None)
        clock.advance(1.0)
        with capture_logs() as logs:
            hub.phases.end_phase(sid, GEN, 0, WORK)
        [record] = records
        assert (record.session_id, record.job_id, record.kind, record.iteration) == (sid, "j", GEN, 0)
        assert (record.tokens, record.valid_tokens, record.sm_clock_mhz) == (100, 80, HUB_CLOCK_MHZ)
        assert record.gpu_indices == (0,)
        assert "phase_observer_error" in [e["event"] for e in logs]


class TestJobMode:
    def test_an_accepted_directive_sets_the_clock_and_is_published_with_its_verdict(
        self, hub: Daemon, fake: FakeGpuBackend
    ):
        records: list[DirectiveRecord] = []
        hub.events.subscribe(on_directive=records.append)
        sid = hub.book.open_session(gpu_spec(0, job=JobModeSpec(1, 2))).session_id
        directive = ReceivedDirective(1, 1, 0, GEN, 1500, DirectivePurpose.COMMITTED)
        began = hub.phases.begin_phase(sid, GEN, 0, None, directive)
        assert (began.verdict, began.target_sm_clock_mhz, began.applied_epoch) == (
            DirectiveVerdict.ACCEPTED,
            1500,
            1,
        )
        assert fake.locked() == {0: 1500}
        assert records == [DirectiveRecord("job", 2, GEN, 0, DirectiveVerdict.ACCEPTED, 1500)]
        ended = hub.phases.end_phase(sid, GEN, 0, WORK)
        assert (ended.verdict, ended.state, ended.applied_epoch) == (
            DirectiveVerdict.ACCEPTED,
            ControllerState.COMMITTED,
            1,
        )

    def test_a_missing_directive_runs_the_phase_at_the_fallback(self, hub: Daemon, fake: FakeGpuBackend):
        sid = hub.book.open_session(gpu_spec(0, job=JobModeSpec(1, 0))).session_id
        began = hub.phases.begin_phase(sid, GEN, 0, None)
        assert (began.verdict, began.target_sm_clock_mhz) == (DirectiveVerdict.MISSING, None)
        assert fake.locked() == {}

    def test_a_directive_the_rate_limit_refuses_falls_back_to_the_default_governor(
        self, sock_dir, fake: FakeGpuBackend, clock: ManualClock
    ):
        hub = Daemon(
            fake,
            sock_dir,
            controller_name="fixed",
            controller_factory=create_fixed_controller,
            clock=clock,
            wall_clock=clock,
            max_clock_changes_per_s=1.0,
        )
        try:
            sid = hub.book.open_session(gpu_spec(0, job=JobModeSpec(1, 0))).session_id
            verdicts: list[DirectiveVerdict] = []
            for iteration in range(50):  # time stands still: the burst runs out
                mhz = 1500 if iteration % 2 else 1200
                directive = ReceivedDirective(
                    1, iteration + 1, iteration, GEN, mhz, DirectivePurpose.COMMITTED
                )
                began = hub.phases.begin_phase(sid, GEN, iteration, None, directive)
                verdicts.append(began.verdict)
                if began.verdict is not DirectiveVerdict.ACCEPTED:
                    break
                hub.phases.end_phase(sid, GEN, iteration, WORK)
            assert verdicts[-1] is DirectiveVerdict.RATE_LIMITED
            assert set(verdicts[:-1]) == {DirectiveVerdict.ACCEPTED}
            assert began.target_sm_clock_mhz is None
            assert fake.locked() == {}  # a reset is never held back
        finally:
            hub.shutdown()
