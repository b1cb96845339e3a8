"""Fail-open: the job never fails and never waits because the daemon is absent, slow, or dies."""

from __future__ import annotations

import logging
from pathlib import Path

import eerl
import pytest
from eerl import ClientConfig
from eerl.testing import FakeDaemon

from .conftest import fast


def _warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == "eerl" and r.levelno >= logging.WARNING]


PATIENCE_S = 30.0
"""How long to wait for what must happen (generous: the machine is shared and noisy)."""


class TestDaemonAbsent:
    def test_phases_never_raise_and_one_warning_is_logged(
        self, sock_dir: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        caplog.set_level(logging.DEBUG, logger="eerl")
        config = fast(ClientConfig.uds(sock_dir / "nobody.sock"))
        with eerl.connect(gpus=[0], config=config) as session:
            for i in range(50):
                with session.phase("generation", iteration=i) as p:
                    p.report(tokens=1)
            assert not session.wait_until_connected(0.5)
            stats = session.stats()
        assert (stats.connected, stats.session_id, stats.sent_events) == (False, None, 0)
        assert stats.connect_failures >= 2
        assert len(_warnings(caplog)) == 1
        assert "cannot open a session" in _warnings(caplog)[0].getMessage()

    def test_a_full_queue_drops_the_oldest_events_and_counts_them(self, sock_dir: Path) -> None:
        config = fast(ClientConfig.uds(sock_dir / "nobody.sock"), queue_size=8)
        with eerl.connect(gpus=[0], config=config) as session:
            for _ in range(20):
                with session.phase("training"):
                    pass
            stats = session.stats()
        assert stats.queued_events <= 8
        assert stats.dropped_events + stats.stale_events >= 32

    def test_a_daemon_that_appears_later_gets_a_clean_session_without_stale_events(
        self, sock_dir: Path
    ) -> None:
        fake = FakeDaemon(sock_dir / "eerld.sock")
        config = fast(fake.config, stale_after_s=0.5)
        with eerl.connect(gpus=[0], config=config) as session:
            with session.phase("generation", iteration=0):
                pass
            with session.phase("training", iteration=0):
                assert not session.wait_until_connected(1.0)
                fake.start()
                assert session.wait_until_connected(5)
            with session.phase("generation", iteration=1):
                pass
            assert session.flush(5)
            stale = session.stats().stale_events
        fake.stop()
        assert [(p.begin, p.iteration) for p in fake.phases] == [(True, 1), (False, 1)]
        assert stale == 4

    def test_with_eerl_disable_nothing_connects(
        self, fake: FakeDaemon, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("EERL_DISABLE", "1")
        monkeypatch.setenv("EERL_SOCKET", str(fake.socket_path))
        with eerl.connect(gpus=[0]) as session:
            with session.phase("generation") as p:
                p.report(tokens=5)
            assert not session.enabled
            assert not session.wait_until_connected(0.3)
        assert fake.sessions == []

    def test_no_gpus_named_means_off_with_a_warning(
        self, config: ClientConfig, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
        with eerl.connect(config=config) as session:
            assert not session.enabled
        assert "no GPUs named" in _warnings(caplog)[0].getMessage()

    def test_an_unreadable_environment_means_off_with_a_warning(
        self, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
    ) -> None:
        monkeypatch.setenv("EERL_ADDRESS", "node1:50051")
        with eerl.connect(gpus=[0]) as session:
            assert not session.enabled
        assert "EERL_TLS_CA" in _warnings(caplog)[0].getMessage()


class TestDaemonDies:
    def test_the_client_reconnects_and_reopens_after_a_restart(
        self, fake: FakeDaemon, config: ClientConfig, caplog: pytest.LogCaptureFixture
    ) -> None:
        with eerl.connect(gpus=[0], config=config) as session:
            with session.phase("generation", iteration=0):
                pass
            assert session.flush(PATIENCE_S)
            first = session.session_id
            with session.phase("training", iteration=0):
                assert session.flush(PATIENCE_S)  # the begin reached the first daemon before it stops
                fake.stop()
                fake.start()
                assert fake.wait_for(lambda f: len(f.live_sessions()) == 1, PATIENCE_S)
            with session.phase("generation", iteration=1) as p:
                p.report(tokens=7)
            assert session.flush(PATIENCE_S)
            second = session.session_id
            assert session.stats().opens == 2
        assert first != second
        after_restart = [(p.begin, p.kind.value, p.iteration) for p in fake.phases if p.session_id == second]
        assert after_restart == [(True, "generation", 1), (False, "generation", 1)]
        assert len(_warnings(caplog)) == 1

    def test_a_daemon_without_attach_is_kept_alive_by_heartbeats(self, sock_dir: Path) -> None:
        with FakeDaemon(sock_dir / "eerld.sock", attach=False) as fake:
            config = fast(fake.config, lease_ttl_s=0.15)
            with eerl.connect(gpus=[0], config=config) as session:
                assert session.wait_until_connected(5)
                assert fake.wait_for(lambda f: f.sessions[0].heartbeats >= 2)
                with session.phase("training") as p:
                    p.report(tokens=3)
                assert session.flush(5)
            assert [p.workload.tokens for p in fake.phases] == [0, 3]

    def test_a_slow_daemon_costs_stale_events_not_waiting(self, sock_dir: Path) -> None:
        with FakeDaemon(sock_dir / "eerld.sock", begin_delay_s=0.3) as fake:
            config = fast(fake.config, stale_after_s=0.1)
            with eerl.connect(gpus=[0], config=config) as session:
                assert session.wait_until_connected(5)
                for i in range(5):
                    with session.phase("generation", iteration=i):
                        pass
                assert session.flush(5)
                assert session.stats().stale_events >= 4
