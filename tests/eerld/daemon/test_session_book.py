"""The session book (:mod:`eerld.daemon.book`) called directly on the hub over fake GPUs: open and claim,
attach and notify, renew and expire, close (GPUs reset before the session is forgotten), and a tenancy's
end forgetting its job incarnations."""

from __future__ import annotations

import pytest
from eerl.phases import PhaseKind, Workload

from eerld.daemon import Daemon
from eerld.errors import Conflict, NotFound, Unavailable
from eerld.sessions import JobModeSpec
from eerld.testing import FakeGpuBackend, ManualClock
from tests.eerld.conftest import HUB_CLOCK_MHZ, gpu_spec

GEN = PhaseKind.GENERATION


class TestOpen:
    def test_a_session_claims_its_gpus_exclusively_and_a_second_claim_names_the_holder(self, hub: Daemon):
        opened = hub.book.open_session(gpu_spec(0, 1, job_id="first"))
        assert [g.index for g in opened.gpus] == [0, 1]
        assert hub.book.holder(1) is not None
        with pytest.raises(Conflict, match=r"GPU 1 is held by job 'first' rank 0"):
            hub.book.open_session(gpu_spec(1, job_id="second"))
        assert [c.session_id for c in hub.book.claims()] == [opened.session_id]

    def test_a_drained_gpu_refuses_a_claim_with_the_drain_in_words_until_undrained(self, hub: Daemon):
        hub.admin.drain(None, 0.0, "maint")
        with pytest.raises(Conflict, match=r"gpus: GPU 0 is drained until undrained: maint; no session may"):
            hub.book.open_session(gpu_spec(0))
        hub.admin.undrain(None)
        assert hub.book.open_session(gpu_spec(0)).session_id

    def test_a_stopping_daemon_refuses_to_open(self, hub: Daemon):
        hub.shutdown()
        with pytest.raises(Unavailable, match="eerld is stopping"):
            hub.book.open_session(gpu_spec(0))

    def test_an_older_incarnation_of_a_job_is_refused_once_a_newer_one_opened(self, hub: Daemon):
        hub.book.open_session(gpu_spec(0, job=JobModeSpec(2, 0)))
        with pytest.raises(
            Conflict, match=r"job_mode.incarnation: incarnation 1 is older than incarnation 2"
        ):
            hub.book.open_session(gpu_spec(1, job=JobModeSpec(1, 0)))

    def test_a_refused_open_raises_no_incarnation(self, hub: Daemon):
        hub.book.open_session(gpu_spec(0, job_id="other"))
        with pytest.raises(Conflict):
            hub.book.open_session(gpu_spec(0, job=JobModeSpec(5, 0)))  # GPU 0 is held
        hub.book.open_session(gpu_spec(1, job=JobModeSpec(4, 0)))  # 5 was never accepted


class TestAttach:
    def test_attach_binds_once_and_notify_reaches_the_attached_client_of_the_holding_session(
        self, hub: Daemon
    ):
        sid = hub.book.open_session(gpu_spec(0, 1)).session_id
        attachment = hub.book.attach(sid)
        with pytest.raises(Conflict, match="session_id: this session is already bound to a stream"):
            hub.book.attach(sid)
        hub.book.notify([0, 1, 2], "hello")  # two of its GPUs: told once
        messages = [attachment.events.get_nowait()[1] for _ in range(attachment.events.qsize())]
        assert messages == ["attached", "hello"]

    def test_a_detached_stream_closes_its_session_and_ends_the_attachment(self, hub: Daemon):
        sid = hub.book.open_session(gpu_spec(0)).session_id
        attachment = hub.book.attach(sid)
        hub.book.detach(attachment)
        assert attachment.ended.is_set()
        assert hub.book.holder(0) is None
        with pytest.raises(NotFound):
            hub.book.heartbeat(sid)


class TestLeases:
    def test_heartbeat_renews_and_an_unrenewed_lease_expires_at_the_reapers_tick(
        self, hub: Daemon, clock: ManualClock
    ):
        sid = hub.book.open_session(gpu_spec(0, lease_ttl_s=5.0)).session_id
        clock.advance(4.0)
        assert hub.book.heartbeat(sid) == pytest.approx(5.0)
        clock.advance(4.0)
        hub.book.expire_leases()
        assert hub.book.holder(0) is not None
        clock.advance(1.0)
        hub.book.expire_leases()
        assert hub.book.holder(0) is None


class TestClose:
    def test_a_session_closed_mid_phase_has_its_gpus_reset_before_it_is_forgotten(
        self, hub: Daemon, fake: FakeGpuBackend, monkeypatch: pytest.MonkeyPatch
    ):
        sid = hub.book.open_session(gpu_spec(0)).session_id
        hub.phases.begin_phase(sid, GEN, 0, None)
        assert fake.locked() == {0: HUB_CLOCK_MHZ}
        held_at_reset: list[bool] = []
        reset = fake.reset_sm_clock

        def watched(index: int) -> None:
            held_at_reset.append(hub.book.holder(index) is not None)
            reset(index)

        monkeypatch.setattr(fake, "reset_sm_clock", watched)
        hub.book.close_session(sid)
        assert held_at_reset == [True]
        assert fake.locked() == {}
        assert hub.book.holder(0) is None

    def test_closing_twice_returns_the_same_totals_and_the_decisions_stay_readable(
        self, hub: Daemon, clock: ManualClock
    ):
        sid = hub.book.open_session(gpu_spec(0)).session_id
        hub.phases.begin_phase(sid, GEN, 0, None)
        clock.advance(1.0)
        hub.phases.end_phase(sid, GEN, 0, Workload(tokens=10, valid_tokens=8))
        session = hub.book.registry.get(sid)
        first = hub.book.close(session, "test")
        assert first.valid_tokens == 8
        assert first.energy_mj > 0
        assert hub.book.close(session, "again") == first
        assert [d.decision.sm_clock_mhz for d in hub.reads.decisions(sid)] == [HUB_CLOCK_MHZ]

    def test_a_tenancys_end_closes_the_session_and_forgets_its_sockets_incarnations(self, hub: Daemon):
        sid = hub.book.open_session(gpu_spec(0, job=JobModeSpec(3, 0))).session_id
        assert hub.book.end_session(sid, "GPU 0 left pod rl/pod1")
        assert not hub.book.end_session(sid, "again")  # ended meanwhile: False
        hub.book.open_session(gpu_spec(0, job=JobModeSpec(1, 0)))  # the next tenant starts afresh

    def test_close_all_closes_every_session_without_a_reset_of_its_own(
        self, hub: Daemon, fake: FakeGpuBackend
    ):
        sid = hub.book.open_session(gpu_spec(0)).session_id
        hub.book.open_session(gpu_spec(1))
        hub.phases.begin_phase(sid, GEN, 0, None)
        hub.book.close_all("daemon stopping")
        assert hub.book.claims() == ()
        assert fake.locked() == {0: HUB_CLOCK_MHZ}  # shutdown resets every GPU at once, after this
