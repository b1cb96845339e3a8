"""The hub (:mod:`eerld.daemon.core`) and its life cycle (:mod:`eerld.daemon.lifecycle`): start, the reaper's
tick, shutdown; no gRPC."""

from __future__ import annotations

import threading

import pytest
from eerl.phases import PhaseKind
from structlog.testing import capture_logs

from eerld.daemon import Daemon
from eerld.daemon.lifecycle import LifeCycle
from eerld.errors import Unavailable
from eerld.testing import FakeGpuBackend, ManualClock
from tests.eerld.conftest import HUB_CLOCK_MHZ, gpu_spec

WAIT_S = 10.0


class TestLifeCycle:
    def test_check_running_passes_until_stop(self) -> None:
        life = LifeCycle()
        life.check_running()
        assert not life.stopping
        life.stop()
        assert life.stopping
        with pytest.raises(Unavailable, match="eerld is stopping"):
            life.check_running()

    def test_the_reaper_ticks_until_stopped_and_a_tick_that_raises_is_logged(self) -> None:
        life = LifeCycle()
        ticks: list[int] = []
        twice = threading.Event()

        def tick() -> None:
            ticks.append(1)
            if len(ticks) >= 2:
                twice.set()
            raise RuntimeError("tick bug")

        with capture_logs() as logs:
            life.start_reaper(tick, 0.001)
            assert twice.wait(WAIT_S)
            life.stop()
        count = len(ticks)
        assert not threading.Event().wait(0.05)
        assert len(ticks) == count
        assert "reaper_error" in [e["event"] for e in logs]


class TestTick:
    def test_a_tick_ends_expired_leases_and_pins(self, hub: Daemon, fake: FakeGpuBackend, clock: ManualClock):
        hub.book.open_session(gpu_spec(0, lease_ttl_s=2.0))
        hub.admin.pin(None, 990, 0, 5.0, "maint")
        assert fake.locked() == dict.fromkeys(range(4), 990)
        clock.advance(2.0)
        hub.tick()
        assert hub.book.claims() == ()
        assert fake.locked() == dict.fromkeys(range(4), 990)
        clock.advance(3.0)
        hub.tick()
        assert fake.locked() == {}


class TestShutdown:
    def test_shutdown_refuses_new_calls_closes_every_session_and_resets_every_gpu(
        self, hub: Daemon, fake: FakeGpuBackend
    ):
        sid = hub.book.open_session(gpu_spec(0, 1)).session_id
        hub.phases.begin_phase(sid, PhaseKind.GENERATION, 0, None)
        assert fake.locked() == {0: HUB_CLOCK_MHZ, 1: HUB_CLOCK_MHZ}
        with capture_logs() as logs:
            results = hub.shutdown()
        assert hub.stopping
        assert sorted(r.index for r in results) == [0, 1, 2, 3]  # every GPU, whoever held it
        assert fake.locked() == {}
        assert hub.book.claims() == ()
        events = [e["event"] for e in logs]
        assert events.index("session_close") < events.index("daemon_stop")
        # every GPU is reset, but only those that held a lock say so at info (a stop used to log all)
        resets = [e for e in logs if e["event"] == "clock_reset"]
        assert sorted(e["gpu_index"] for e in resets if e["log_level"] == "info") == [0, 1]
        assert sorted(e["gpu_index"] for e in resets if e["log_level"] == "debug") == [2, 3]
        with pytest.raises(Unavailable, match="eerld is stopping"):
            hub.book.heartbeat(sid)
        with pytest.raises(Unavailable, match="eerld is stopping"):
            hub.admin.pin(None, 990, 0, 0.0, "late")

    def test_every_mutating_admin_call_checks_that_the_daemon_runs(self, hub: Daemon):
        hub.shutdown()
        calls = [
            lambda: hub.admin.unpin(None),
            lambda: hub.admin.reset(None, "r"),
            lambda: hub.admin.drain(None, 0.0, "d"),
            lambda: hub.admin.undrain(None),
            lambda: hub.admin.revoke("x", None, "r"),
            lambda: hub.admin.issue_claim_ticket("shared"),
        ]
        for call in calls:
            with pytest.raises(Unavailable, match="eerld is stopping"):
                call()
        assert hub.reads.status().sessions == ()  # reads still answer
