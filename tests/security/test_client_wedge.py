"""A session must never wedge: whatever a job reports and however long the daemon stalls, the next phase is
metered and clocked correctly, and a client that is gone returns its GPUs.

The attacks of issue 15 (item 4), each against the real daemon over its real Unix worker socket (fake GPUs):
a daemon that stalls for 3 s on a clock lock (an NVML call that hangs) in the middle of a run, and one that
stalls until the client gives up; a job that reports negative token counts, more valid tokens than tokens,
and 10**13 tokens; a sender thread that dies of a bug. In the field they wedged the session for the rest of
the job (every later event refused while the client said "connected", phases at the other phase's clock),
killed the sender with the session still open, or left the GPUs locked behind a dead sender.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import eerl
import pytest
from eerl import ClientConfig, Session
from eerl._sender import Sender

from eerld.daemon import PhaseRecord
from eerld.testing import DaemonHandle, FakeGpuBackend, running_daemon

PATIENCE_S = 30.0
"""How long to wait for what must happen (generous: the machine is shared and noisy)."""
CLOCK_MHZ = {"generation": 1200, "training": 1500}
"""The fixed controller's clocks (running_daemon's default)."""


def _wait(predicate: Callable[[], bool], timeout_s: float = PATIENCE_S) -> bool:
    deadline_s = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline_s:
            return False
        time.sleep(0.01)
    return True


@contextmanager
def _daemon(directory: Path, fake: FakeGpuBackend) -> Iterator[tuple[DaemonHandle, list[PhaseRecord]]]:
    # No clock-change limit: these phases follow each other far faster than any RL job's (each one locks
    # and its end releases), and what they test is the session, not the limit.
    with running_daemon(directory, backend=fake, max_clock_changes_per_s=0.0) as handle:
        records: list[PhaseRecord] = []
        handle.daemon.events.subscribe(on_phase=records.append)
        yield handle, records


def _config(handle: DaemonHandle) -> ClientConfig:
    # The default RPC deadline (2 s): the stall must outlast it, as it did in the field.
    return dataclasses.replace(
        ClientConfig.uds(handle.socket_path), reconnect_initial_s=0.05, reconnect_max_s=0.5
    )


def _run_phase(
    session: Session, fake: FakeGpuBackend, kind: str, iteration: int, *, tokens: int, valid_tokens: int = 0
) -> None:
    """One phase that checks, while it runs, that the GPU holds this phase's clock."""
    with session.phase(kind, iteration=iteration) as phase:
        held = _wait(lambda: fake.locked() == {0: CLOCK_MHZ[kind]})
        assert held, f"{kind} {iteration} ran at {fake.locked()} (stats: {session.stats()})"
        phase.report(tokens=tokens, valid_tokens=valid_tokens)


def _run_iteration(session: Session, fake: FakeGpuBackend, iteration: int) -> None:
    _run_phase(session, fake, "generation", iteration, tokens=100 + iteration)
    _run_phase(session, fake, "training", iteration, tokens=150 + iteration, valid_tokens=100 + iteration)


def _metered(records: list[PhaseRecord]) -> list[tuple[str, int, int, int]]:
    return [(r.kind.value, r.iteration, r.tokens, r.valid_tokens) for r in records]


def _expected(iterations: range) -> list[tuple[str, int, int, int]]:
    out = []
    for i in iterations:
        out += [("generation", i, 100 + i, 0), ("training", i, 150 + i, 100 + i)]
    return out


def _eerl_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "eerl" and r.levelno >= logging.WARNING]


def test_after_a_3_s_daemon_stall_on_a_clock_lock_the_next_phases_are_metered_and_clocked(
    sock_dir: Path,
) -> None:
    fake = FakeGpuBackend(1)
    with (
        _daemon(sock_dir, fake) as (handle, records),
        eerl.connect(gpus=[0], job_id="stall", config=_config(handle)) as session,
    ):
        assert session.wait_until_connected(PATIENCE_S)
        _run_iteration(session, fake, 0)
        release = threading.Event()
        fake.hang(0, release)
        stall = threading.Timer(3.0, release.set)
        stall.start()
        try:
            with session.phase("generation", iteration=1) as phase:  # its clock lock hangs for 3 s
                phase.report(tokens=101)
            with session.phase("training", iteration=1) as phase:
                phase.report(tokens=151, valid_tokens=101)
            assert release.wait(PATIENCE_S)
        finally:
            release.set()
            stall.cancel()
        for i in range(2, 6):
            _run_iteration(session, fake, i)
        assert session.flush(PATIENCE_S)
        stats = session.stats()
        sessions = handle.daemon.reads.sessions()
        # The daemon's own totals for the session now open, and the client's word, agree.
        assert stats.connected
        assert [s.session_id for s in sessions] == [stats.session_id]
        totals = {p.kind.value: p.phases for p in sessions[0].phases}
    after_stall = [m for m in _metered(records) if m[1] >= 2]
    assert after_stall == _expected(range(2, 6))
    assert totals["generation"] >= 4
    assert totals["training"] >= 4


def test_a_stall_that_outlasts_three_deadlines_drops_the_session_and_the_next_phases_run_on_a_fresh_one(
    sock_dir: Path,
) -> None:
    fake = FakeGpuBackend(1)
    with _daemon(sock_dir, fake) as (handle, records):
        config = dataclasses.replace(_config(handle), rpc_timeout_s=1.0, stale_after_s=10.0)
        with eerl.connect(gpus=[0], job_id="long-stall", config=config) as session:
            assert session.wait_until_connected(PATIENCE_S)
            _run_iteration(session, fake, 0)
            first = session.session_id
            release = threading.Event()
            fake.hang(0, release)  # stuck until the client has given the session up
            try:
                for kind in ("generation", "training"):
                    with session.phase(kind, iteration=1) as phase:
                        phase.report(tokens=1)
                admitted = _wait(lambda: not session.stats().connected)
            finally:
                release.set()
            assert admitted, (
                f"still 'connected' after three events ran past their deadline: {session.stats()}"
            )
            assert session.wait_until_connected(PATIENCE_S)
            for i in range(2, 4):
                _run_iteration(session, fake, i)
            assert session.flush(PATIENCE_S)
            stats = session.stats()
            sessions = handle.daemon.reads.sessions()
    assert (stats.resets, stats.opens) == (1, 2)
    assert stats.session_id != first
    assert [s.session_id for s in sessions] == [stats.session_id]
    assert [m for m in _metered(records) if m[1] >= 2] == _expected(range(2, 4))


def test_invalid_reports_are_sanitised_with_one_warning_per_kind_and_never_wedge_the_session(
    sock_dir: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="eerl")
    fake = FakeGpuBackend(1)
    with (
        _daemon(sock_dir, fake) as (handle, records),
        eerl.connect(gpus=[0], job_id="bad-reports", config=_config(handle)) as session,
    ):
        assert session.wait_until_connected(PATIENCE_S)
        _run_iteration(session, fake, 0)
        for first in (1, 4):  # every problem twice: still one warning per kind
            _run_phase(session, fake, "generation", first, tokens=-5)
            _run_phase(session, fake, "training", first, tokens=10, valid_tokens=20)
            _run_phase(session, fake, "generation", first + 1, tokens=10**13)
            _run_phase(session, fake, "training", first + 1, tokens=-1, valid_tokens=-1)
            _run_phase(session, fake, "generation", first + 2, tokens=7)
            _run_phase(session, fake, "training", first + 2, tokens=10**13, valid_tokens=3)
        for i in range(7, 9):
            _run_iteration(session, fake, i)
        assert session.flush(PATIENCE_S)
        stats = session.stats()
        assert stats.connected
        assert handle.daemon.reads.sessions()[0].session_id == stats.session_id
    sanitised = [
        ("generation", 1, 0, 0),  # negative: clamped to 0
        ("training", 1, 10, 10),  # valid_tokens > tokens: clamped to tokens
        ("generation", 2, 0, 0),  # above the daemon's limit: dropped
        ("training", 2, 0, 0),
        ("generation", 3, 7, 0),
        ("training", 3, 0, 0),  # tokens dropped, so valid_tokens clamped to 0
    ]
    again = [(kind, i + 3, tokens, valid) for kind, i, tokens, valid in sanitised]
    assert _metered(records) == [*_expected(range(1)), *sanitised, *again, *_expected(range(7, 9))]
    warnings = _eerl_warnings(caplog)
    assert len(warnings) == 3, warnings
    assert any("negative" in w for w in warnings)
    assert any("valid_tokens" in w and "tokens" in w for w in warnings)
    assert any("limit" in w for w in warnings)
    # Per round: clamped -5, valid 20, -1 and -1, valid 3; dropped 10**13 twice.
    assert (stats.clamped_values, stats.dropped_values) == (2 * 5, 2 * 2)


def test_a_sender_thread_that_dies_of_a_bug_closes_its_daemon_session_and_the_gpu_is_reset(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    fake = FakeGpuBackend(1)
    with (
        _daemon(sock_dir, fake) as (handle, _records),
        eerl.connect(gpus=[0], job_id="dying-sender", config=_config(handle)) as session,
    ):
        assert session.wait_until_connected(PATIENCE_S)
        _run_iteration(session, fake, 0)
        with session.phase("training", iteration=1):
            assert _wait(lambda: fake.locked() == {0: 1500})

            def bug(self: Sender) -> None:
                raise RuntimeError("injected bug outside the per-event guard")

            monkeypatch.setattr(Sender, "_pop", bug)
        reset = _wait(lambda: fake.locked() == {} and handle.daemon.reads.sessions() == ())
        assert reset, f"locks {fake.locked()}, sessions {handle.daemon.reads.sessions()}"
        assert not session.stats().connected
        with session.phase("generation", iteration=2):  # the job runs on, eerl off
            pass
    assert any("eerl is off" in w for w in _eerl_warnings(caplog))
