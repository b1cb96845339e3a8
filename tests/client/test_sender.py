"""The session's pump and the daemon's sender (eerl._pump, eerl._sender) against the in-memory daemon: what is
sent, when a session is reopened, and what is left at the daemon after close. Fast: no socket, no daemon."""

from __future__ import annotations

import time
from collections.abc import Iterator

import eerl
import pytest
from eerl import ClientConfig, Session, Workload
from eerl.link import Code
from eerl.testing import MemoryDaemon
from eerl.v1 import eerl_pb2

from .conftest import fast, wait_until

PATIENCE_S = 10.0


@pytest.fixture
def daemon() -> MemoryDaemon:
    return MemoryDaemon()


def config(**overrides: object) -> ClientConfig:
    base = ClientConfig(transport="uds", socket_path="/nonexistent/eerld.sock", **overrides)  # type: ignore[arg-type]
    return fast(base, reconnect_initial_s=0.005, reconnect_max_s=0.02)


@pytest.fixture
def session(daemon: MemoryDaemon) -> Iterator[Session]:
    with eerl.connect(gpus=[0], config=config(), link=daemon.connect) as opened:
        assert opened.wait_until_connected(PATIENCE_S)
        yield opened


def _phases(daemon: MemoryDaemon) -> list[tuple[str, int]]:
    return [
        (call.name, call.request.iteration)
        for call in daemon.rpcs()
        if call.name in ("BeginPhase", "EndPhase")
    ]


class TestWhatIsSent:
    def test_a_phase_is_one_begin_and_one_end_with_its_workload(
        self, daemon: MemoryDaemon, session: Session
    ) -> None:
        with session.phase("generation", iteration=4) as p:
            p.report(tokens=100, sequences=2)
        assert session.flush(PATIENCE_S)
        assert _phases(daemon) == [("BeginPhase", 4), ("EndPhase", 4)]
        (end,) = daemon.rpcs("EndPhase")
        assert end.request.workload.tokens == 100
        assert session.answer(p, begin=True) is not None
        answer = session.answer(p, begin=False)
        assert answer is not None
        assert answer.energy_j == 150.0
        stats = session.stats()
        assert (stats.sent_events, stats.failed_events, stats.opens) == (2, 0, 1)

    def test_one_session_is_one_connection(self, daemon: MemoryDaemon, session: Session) -> None:
        for i in range(5):
            with session.phase("training", iteration=i):
                pass
        assert session.flush(PATIENCE_S)
        assert daemon.links_opened == 1

    def test_the_other_sockets_give_their_tickets_before_the_open(self, daemon: MemoryDaemon) -> None:
        cfg = config(ticket_socket_paths=("/run/a.sock", "/run/b.sock"))
        with eerl.connect(gpus=[0], config=cfg, link=daemon.connect) as opened:
            assert opened.wait_until_connected(PATIENCE_S)
        names = [(call.name, call.socket_path) for call in daemon.rpcs()][:3]
        assert names == [
            ("IssueClaimTicket", "/run/a.sock"),
            ("IssueClaimTicket", "/run/b.sock"),
            ("OpenSession", None),
        ]
        (opening,) = daemon.rpcs("OpenSession")
        assert list(opening.request.claim_tickets) == ["ticket:/run/a.sock", "ticket:/run/b.sock"]

    def test_close_flushes_then_closes_the_session_at_the_daemon(self, daemon: MemoryDaemon) -> None:
        with eerl.connect(gpus=[0], config=config(), link=daemon.connect) as opened:
            assert opened.wait_until_connected(PATIENCE_S)
            with opened.phase("generation"):
                pass
        assert _phases(daemon) == [("BeginPhase", 0), ("EndPhase", 0)]
        assert daemon.rpcs("CloseSession")
        assert daemon.sessions == []

    def test_a_begin_past_its_deadline_still_lets_its_end_follow(
        self, daemon: MemoryDaemon, session: Session
    ) -> None:
        daemon.fail("BeginPhase", Code.DEADLINE_EXCEEDED)
        with session.phase("generation", iteration=0):
            pass
        assert session.flush(PATIENCE_S)
        assert _phases(daemon) == [("BeginPhase", 0), ("EndPhase", 0)]
        assert session.stats().failed_events == 2  # this daemon had not begun it: the end is refused too


class TestReopening:
    def test_a_daemon_that_forgot_the_session_gets_a_new_one_and_no_stale_end(
        self, daemon: MemoryDaemon, session: Session
    ) -> None:
        with session.phase("generation", iteration=0):
            assert session.flush(PATIENCE_S)
            daemon.restart()  # NOT_FOUND for the old session from now on
            assert wait_until(lambda: len(daemon.sessions) == 1)  # reopened at once
        assert session.flush(PATIENCE_S)
        with session.phase("generation", iteration=1):
            pass
        assert session.flush(PATIENCE_S)
        assert _phases(daemon) == [("BeginPhase", 0), ("BeginPhase", 1), ("EndPhase", 1)]
        stats = session.stats()
        assert stats.opens == 2
        assert stats.stale_events == 1

    def test_not_found_on_an_event_reopens_at_once(self, daemon: MemoryDaemon, session: Session) -> None:
        daemon.fail("BeginPhase", Code.NOT_FOUND)
        with session.phase("generation", iteration=0):
            pass
        assert wait_until(lambda: session.stats().opens == 2)
        assert len(daemon.sessions) == 1

    def test_a_lost_connection_reconnects(self, daemon: MemoryDaemon, session: Session) -> None:
        daemon.fail("EndPhase", Code.UNAVAILABLE)
        with session.phase("generation", iteration=0):
            pass
        assert wait_until(lambda: session.stats().opens == 2)
        assert daemon.links_opened == 2  # the old link closed, a new one for the new session
        assert len(daemon.sessions) == 1

    def test_three_refused_events_in_a_row_reset_the_session(
        self, daemon: MemoryDaemon, session: Session
    ) -> None:
        daemon.fail("BeginPhase", Code.INVALID_ARGUMENT, times=3)
        for i in range(3):
            with session.phase("generation", iteration=i):
                pass
        assert wait_until(lambda: session.stats().resets == 1 and session.stats().opens == 2)

    def test_one_refused_event_keeps_the_session(self, daemon: MemoryDaemon, session: Session) -> None:
        daemon.fail("BeginPhase", Code.INVALID_ARGUMENT)
        with session.phase("generation", iteration=0):
            pass
        with session.phase("generation", iteration=1):
            pass
        assert session.flush(PATIENCE_S)
        assert session.stats().opens == 1

    def test_a_daemon_that_is_down_is_retried_and_events_of_that_time_go_stale(
        self, daemon: MemoryDaemon
    ) -> None:
        daemon.down = True
        cfg = config(stale_after_s=0.01)
        with eerl.connect(gpus=[0], config=cfg, link=daemon.connect) as opened:
            with opened.phase("generation", iteration=0):
                pass
            assert wait_until(lambda: opened.stats().connect_failures >= 2)
            assert not opened.wait_until_connected(0.05)
            time.sleep(0.05)
            daemon.down = False
            assert opened.wait_until_connected(PATIENCE_S)
            assert opened.flush(PATIENCE_S)
            assert _phases(daemon) == []
            assert opened.stats().stale_events == 2


class TestTheSessionsLife:
    def test_the_session_is_bound_to_its_attach_stream(self, daemon: MemoryDaemon, session: Session) -> None:
        assert wait_until(lambda: session.stats().attached)
        assert daemon.rpcs("Heartbeat") == []

    def test_the_end_of_the_stream_reopens_the_session(self, daemon: MemoryDaemon, session: Session) -> None:
        assert wait_until(lambda: session.stats().attached)
        daemon.restart()
        assert wait_until(lambda: session.stats().opens == 2)

    def test_without_attach_the_sender_heartbeats(self) -> None:
        daemon = MemoryDaemon(offer_attach=False, lease_ttl_s=0.06)
        with eerl.connect(gpus=[0], config=config(), link=daemon.connect) as opened:
            assert opened.wait_until_connected(PATIENCE_S)
            assert wait_until(lambda: len(daemon.rpcs("Heartbeat")) >= 2)
            assert not opened.stats().attached
            assert len(daemon.rpcs("Attach")) == 1  # asked once per sender, not at every open

    def test_a_phase_hints_reach_the_begin(self, daemon: MemoryDaemon, session: Session) -> None:
        with session.phase("generation", iteration=2, hints=Workload(sequences=8)):
            pass
        assert session.flush(PATIENCE_S)
        (begin,) = daemon.rpcs("BeginPhase")
        assert isinstance(begin.request, eerl_pb2.BeginPhaseRequest)
        assert begin.request.hints.sequences == 8
