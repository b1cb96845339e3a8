"""A session never wedges: bad reports are cleaned, lost or refused events resync, the sender survives."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

import eerl
import grpc
import numpy as np
import pytest
from eerl import ClientConfig, PhaseKind, Workload
from eerl import _pump as pump_module
from eerl._sender import Sender
from eerl.testing import FakeDaemon

from .conftest import fast

PATIENCE_S = 30.0
"""How long to wait for what must happen (generous: the machine is shared and noisy)."""


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "eerl" and r.levelno >= logging.WARNING]


def _events(fake: FakeDaemon, session_id: str | None = None) -> list[tuple[bool, PhaseKind, int]]:
    return [(p.begin, p.kind, p.iteration) for p in fake.phases if session_id in (None, p.session_id)]


class TestWhatIsSent:
    def test_a_report_of_any_type_never_raises_and_sends_whole_numbers_only(
        self, fake: FakeDaemon, config: ClientConfig, caplog: pytest.LogCaptureFixture
    ) -> None:
        with eerl.connect(gpus=[0], config=config) as session:
            with session.phase("training") as p:
                p.report(np.int64(50), 20.0, "3", None, math.nan)  # type: ignore[arg-type]
                p.report(tokens=[1])  # type: ignore[arg-type]
            assert session.flush(PATIENCE_S)
            stats = session.stats()
        assert fake.phases[-1].workload == Workload(tokens=50, valid_tokens=20)
        assert stats.dropped_values == 4
        (warning,) = _warnings(caplog)
        assert "sequences of type str" in warning
        assert "not a whole number" in warning

    def test_bad_counts_are_clamped_or_dropped_with_one_warning_per_kind(
        self, fake: FakeDaemon, config: ClientConfig, caplog: pytest.LogCaptureFixture
    ) -> None:
        with eerl.connect(gpus=[0], config=config) as session:
            for i in range(2):
                with session.phase("generation", iteration=i) as p:
                    p.report(tokens=-5, sequences=10**10)
                with session.phase("training", iteration=i) as p:
                    p.report(tokens=10, valid_tokens=25)
            assert session.flush(PATIENCE_S)
            stats = session.stats()
        assert [p.workload for p in fake.phases if not p.begin] == [
            Workload(),
            Workload(tokens=10, valid_tokens=10),
        ] * 2
        assert (stats.clamped_values, stats.dropped_values, stats.failed_events) == (4, 2, 0)
        assert len(_warnings(caplog)) == 3
        assert (
            "tokens=-5 in the generation phase of iteration 0: negative, clamped to 0" in _warnings(caplog)[0]
        )

    def test_hints_are_checked_like_reports(self, fake: FakeDaemon, config: ClientConfig) -> None:
        with eerl.connect(gpus=[0], config=config) as session:
            with session.phase("generation", hints=Workload(sequences=-1, prompt_tokens=64)):
                pass
            assert session.flush(PATIENCE_S)
        assert fake.phases[0].workload == Workload(prompt_tokens=64)

    def test_a_phase_whose_iteration_is_out_of_range_is_not_sent_and_the_next_one_is(
        self, fake: FakeDaemon, config: ClientConfig, caplog: pytest.LogCaptureFixture
    ) -> None:
        with eerl.connect(gpus=[0], config=config) as session:
            for bad in (-1, 10**13, "seven"):
                with session.phase("generation", iteration=bad):  # type: ignore[arg-type]
                    pass
            with session.phase("generation", iteration=np.int64(4)):  # type: ignore[arg-type]
                pass
            with session.phase("generation"):
                pass
            assert session.flush(PATIENCE_S)
            stats = session.stats()
        assert _events(fake) == [(b, PhaseKind.GENERATION, i) for i in (4, 5) for b in (True, False)]
        assert stats.invalid_events == 6
        (warning,) = _warnings(caplog)
        assert "iteration=-1 in a generation phase" in warning


class TestResync:
    def test_a_refused_end_does_not_stop_the_next_begin_and_the_resync_is_counted(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        fake.refuse("EndPhase", grpc.StatusCode.FAILED_PRECONDITION, times=1)
        with eerl.connect(gpus=[0], config=config) as session:
            for kind in ("generation", "training"):
                with session.phase(kind, iteration=0):
                    pass
            assert session.flush(PATIENCE_S)
            stats = session.stats()
        assert _events(fake) == [
            (True, PhaseKind.GENERATION, 0),
            (True, PhaseKind.TRAINING, 0),
            (False, PhaseKind.TRAINING, 0),
        ]
        assert (stats.failed_events, stats.resyncs, stats.resets, stats.opens) == (1, 1, 0, 1)
        assert stats.connected

    def test_two_refused_events_then_a_good_one_keep_the_session(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        fake.refuse("BeginPhase", grpc.StatusCode.FAILED_PRECONDITION, times=2)
        with eerl.connect(gpus=[0], config=config) as session:
            for i in range(3):
                with session.phase("training", iteration=i):
                    pass
            assert session.flush(PATIENCE_S)
            stats = session.stats()
        assert _events(fake) == [(True, PhaseKind.TRAINING, 2), (False, PhaseKind.TRAINING, 2)]
        assert (stats.failed_events, stats.stale_events, stats.resets, stats.opens) == (2, 2, 0, 1)

    def test_three_refused_events_in_a_row_drop_the_session_and_the_next_phase_runs_on_a_new_one(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        fake.refuse("BeginPhase", grpc.StatusCode.FAILED_PRECONDITION, "a phase is running")
        with eerl.connect(gpus=[0], config=config) as session:
            assert session.wait_until_connected(PATIENCE_S)
            assert fake.wait_for(lambda f: f.sessions[0].attached, PATIENCE_S)
            first = session.session_id
            for i in range(3):
                with session.phase("training", iteration=i):
                    pass
            assert session.flush(PATIENCE_S)
            fake.heal()
            assert session.wait_until_connected(PATIENCE_S)
            with session.phase("training", iteration=3):
                pass
            assert session.flush(PATIENCE_S)
            stats = session.stats()
        assert (stats.resets, stats.opens) == (1, 2)
        assert stats.session_id != first
        assert _events(fake, stats.session_id) == [
            (True, PhaseKind.TRAINING, 3),
            (False, PhaseKind.TRAINING, 3),
        ]
        assert fake.wait_for(lambda f: first not in f.live_sessions())  # its stream was cancelled

    def test_three_events_past_their_deadline_in_a_row_drop_the_session(
        self, fake: FakeDaemon, config: ClientConfig
    ) -> None:
        for method in ("BeginPhase", "EndPhase"):
            fake.delay(method, 1.0)
        config = fast(config, rpc_timeout_s=0.1, stale_after_s=30.0)
        with eerl.connect(gpus=[0], config=config) as session:
            assert session.wait_until_connected(PATIENCE_S)
            for i in range(2):
                with session.phase("generation", iteration=i):
                    pass
            assert session.flush(PATIENCE_S)
            stats = session.stats()
        assert stats.failed_events == 3  # begin 0, end 0 (its begin most likely arrived), begin 1
        assert (stats.resets, stats.opens) == (1, 2)


class TestTheSenderSurvives:
    def test_an_unexpected_error_in_one_event_drops_that_event_and_nothing_else(
        self,
        fake: FakeDaemon,
        config: ClientConfig,
        monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        real = pump_module.check_workload
        calls: list[int] = []

        def fails_first(workload: Workload) -> Any:
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("a bug")
            return real(workload)

        monkeypatch.setattr(pump_module, "check_workload", fails_first)
        with eerl.connect(gpus=[0], config=config) as session:
            for i in range(3):
                with session.phase("generation", iteration=i) as p:
                    p.report(tokens=i + 1)
            assert session.flush(PATIENCE_S)
            stats = session.stats()
        assert [p.workload.tokens for p in fake.phases if not p.begin] == [2, 3]
        assert (stats.sender_errors, stats.resyncs, stats.connected) == (1, 1, True)
        (warning,) = _warnings(caplog)
        assert "unexpected error" in warning

    def test_a_sender_that_dies_ends_its_daemon_session_and_the_job_runs_on(
        self,
        fake: FakeDaemon,
        config: ClientConfig,
        monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        with eerl.connect(gpus=[0], config=config) as session:
            assert session.wait_until_connected(PATIENCE_S)
            assert fake.wait_for(lambda f: f.sessions[0].attached, PATIENCE_S)

            def bug(self: Sender) -> None:
                raise RuntimeError("a bug outside the per-event guard")

            monkeypatch.setattr(Sender, "_pop", bug)
            with session.phase("generation") as p:
                p.report(tokens=1)
            assert fake.wait_for(lambda f: f.live_sessions() == [], PATIENCE_S)
            assert session.flush(PATIENCE_S)  # nothing waits for a thread that is gone
            with session.phase("training") as p:
                p.report(tokens=2)
            assert not session.stats().connected
        assert any("eerl is off" in w for w in _warnings(caplog))

    def test_a_dying_sender_without_a_stream_closes_its_session_at_the_daemon(
        self, sock_dir: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        with (
            FakeDaemon(sock_dir / "eerld.sock", attach=False) as fake,
            eerl.connect(gpus=[0], config=fast(fake.config)) as session,
        ):
            assert session.wait_until_connected(PATIENCE_S)

            def bug(self: Sender) -> None:
                raise RuntimeError("a bug outside the per-event guard")

            monkeypatch.setattr(Sender, "_pop", bug)
            with session.phase("generation"):
                pass
            assert fake.wait_for(lambda f: f.sessions[0].closed, PATIENCE_S)  # not left to its lease
