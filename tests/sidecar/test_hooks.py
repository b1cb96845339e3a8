"""The Python client through a sidecar (``EERL_SIDECAR``): the framework hooks' own tests pass unchanged with
a sidecar process between the client and the (fake) daemon; the client stays fail-open without one; and
:meth:`eerl.Session.answer`, the daemon's answers that the sidecar reports."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import eerl
import pytest
from eerl import ClientConfig, PhaseKind
from eerl.phases import ControllerState
from eerl.testing import FakeDaemon

from tests.client import test_integrations, test_trl_hook
from tests.sidecar.conftest import (
    GENERATION_MHZ,
    TRAINING_MHZ,
    SidecarProcess,
    SimEerld,
    sidecar_for,
    wait_until,
)


def fast(config: ClientConfig) -> ClientConfig:
    return dataclasses.replace(
        config, reconnect_initial_s=0.02, reconnect_max_s=0.1, rpc_timeout_s=2.0, close_timeout_s=2.0
    )


@pytest.fixture
def fake(sock_dir: Path) -> Iterator[FakeDaemon]:
    with FakeDaemon(sock_dir / "eerld.sock") as daemon:
        yield daemon


@pytest.fixture
def sidecar(fake: FakeDaemon, start_sidecar: Callable[..., SidecarProcess]) -> SidecarProcess:
    """A sidecar whose daemon is ``fake``."""
    process = sidecar_for(start_sidecar, fake.socket_path, "hooked", gpus="0")
    wait_until("the sidecar's session", lambda: process.status()["connected"])
    return process


@pytest.fixture
def config(sidecar: SidecarProcess) -> ClientConfig:
    """What the hooks' tests connect with: the sidecar, not the daemon's socket."""
    return fast(ClientConfig.sidecar(sidecar.url))


class TestTrlHookThroughTheSidecar(test_trl_hook.TestTrlHook):
    """tests/client/test_trl_hook.py, each test through a sidecar."""


class TestVerlThroughTheSidecar(test_integrations.TestVerl):
    """tests/client/test_integrations.py (verl), each test through a sidecar."""


class TestOpenRlhfThroughTheSidecar(test_integrations.TestOpenRlhf):
    """tests/client/test_integrations.py (OpenRLHF), each test through a sidecar."""


class TestSidecarClient:
    def test_eerl_sidecar_in_the_environment_makes_connect_use_it(
        self, fake: FakeDaemon, sidecar: SidecarProcess, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("EERL_SIDECAR", sidecar.url)
        monkeypatch.setenv("EERL_SOCKET", "/nonexistent/eerld.sock")  # the sidecar wins
        with eerl.connect() as session:  # no GPUs named: the sidecar's are the session's
            assert session.enabled
            assert session.wait_until_connected(10)
            with session.phase("generation", iteration=4) as phase:
                phase.report(tokens=7, sequences=1)
            assert session.flush(5)
            begun, ended = session.answer(phase, begin=True), session.answer(phase, begin=False)
            assert begun is not None
            assert begun.begin
            assert begun.sm_clock_mhz == 0
            assert ended is not None
            assert not ended.begin
            stats = session.stats()
            assert stats.connected
            assert stats.attached
            assert stats.sent_events == 2
            assert stats.session_id == sidecar.status()["session"]
        assert [(p.begin, p.kind, p.iteration, p.workload.tokens) for p in fake.phases] == [
            (True, PhaseKind.GENERATION, 4, 0),
            (False, PhaseKind.GENERATION, 4, 7),
        ]

    def test_values_the_daemon_would_refuse_are_clamped_before_the_sidecar_sees_them(
        self, fake: FakeDaemon, config: ClientConfig, sidecar: SidecarProcess
    ) -> None:
        with eerl.connect(config=config) as session:
            with session.phase("training", iteration=1) as phase:
                phase.report(tokens=-3, valid_tokens=5, sequences=2)
            with session.phase("training", iteration=-1):  # never sent
                pass
            assert session.flush(5)
            stats = session.stats()
        assert (stats.clamped_values, stats.invalid_events, stats.failed_events) == (
            2,
            2,
            0,
        )  # as the direct client counts
        assert sidecar.status()["refused_requests"] == 0
        ended = [p.workload for p in fake.phases if not p.begin]
        assert [(w.tokens, w.valid_tokens, w.sequences) for w in ended] == [(0, 0, 2)]

    def test_without_a_sidecar_phases_cost_little_and_the_job_goes_on(
        self, sock_dir: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        config = fast(ClientConfig.sidecar(f"unix:{sock_dir / 'none.sock'}"))
        caplog.set_level(logging.WARNING, logger="eerl")
        with eerl.connect(config=config) as session:
            for i in range(50):
                with session.phase("generation", iteration=i, wait_for_clock_s=1.0) as phase:
                    phase.report(tokens=1)
            assert session.flush(2)
            assert not session.wait_until_connected(0.1)
            stats = session.stats()
        assert not stats.connected
        assert stats.sent_events == 0
        # Every begin and end was handled at once, none queued or lost: a begin either failed to reach the
        # sidecar or was dropped inside the back-off, and no end follows a begin the sidecar never took.
        assert (stats.queued_events, stats.dropped_events) == (0, 0)
        assert stats.failed_events + stats.stale_events == 100
        assert stats.failed_events <= stats.connect_failures  # each a failed attempt to reach it
        assert stats.connect_failures >= 1
        assert sum("cannot reach the sidecar" in r.getMessage() for r in caplog.records) == 1

    def test_a_restarted_sidecar_is_found_again(
        self, fake: FakeDaemon, start_sidecar: Callable[..., SidecarProcess], sock_dir: Path
    ) -> None:
        path = sock_dir / "sidecar.sock"

        def start() -> SidecarProcess:
            return sidecar_for(start_sidecar, fake.socket_path, "again", gpus="0", listen=f"unix:{path}")

        first = start()
        with eerl.connect(config=fast(ClientConfig.sidecar(first.url))) as session:
            assert session.wait_until_connected(10)
            with session.phase("generation", iteration=0):
                pass
            assert session.flush(5)
            first.kill()
            with session.phase("generation", iteration=1):  # lost: nobody listens
                pass
            assert session.flush(5)
            start()
            assert session.wait_until_connected(10)
            with session.phase("generation", iteration=2):
                pass
            assert session.flush(5)
            assert session.stats().opens == 2
        iterations = [p.iteration for p in fake.phases if p.begin]
        assert iterations == [0, 2]


class TestAnswers:
    """:meth:`eerl.Session.answer`: the daemon's answers to the session's own events (the direct client)."""

    def test_the_clock_applied_and_the_phase_metered(self, eerld_sim: SimEerld) -> None:
        config = fast(ClientConfig.uds(eerld_sim.socket_path))
        with eerl.connect(gpus=[0, 1], job_id="answers", config=config) as session:
            assert session.wait_until_connected(10)
            with session.phase("generation", iteration=0, wait_for_clock_s=5) as generation:
                begun = session.answer(generation, begin=True)
                time.sleep(0.2)
                generation.report(tokens=10)
            with session.phase("training", iteration=0, wait_for_clock_s=5) as training:
                pass
            assert session.flush(5)
            ended = session.answer(generation, begin=False)
            trained = session.answer(training, begin=True)
        assert begun is not None
        assert begun.begin
        assert begun.sm_clock_mhz == GENERATION_MHZ
        assert begun.state is ControllerState.FIXED
        assert [(c.index, c.sm_clock_mhz, c.source) for c in begun.clocks] == [
            (0, GENERATION_MHZ, "session"),
            (1, GENERATION_MHZ, "session"),
        ]
        assert ended is not None
        assert not ended.begin
        assert ended.duration_s >= 0.2
        assert ended.gpus == 2
        assert ended.energy_j >= 0
        assert ended.sm_clock_mhz == GENERATION_MHZ
        assert trained is not None
        assert trained.sm_clock_mhz == TRAINING_MHZ  # each phase its own clock, not the last one's

    def test_no_answer_without_a_daemon_or_for_a_disabled_session(self, sock_dir: Path) -> None:
        config = fast(ClientConfig.uds(sock_dir / "none.sock"))
        with eerl.connect(gpus=[0], config=config) as session:
            with session.phase("generation") as phase:
                pass
            assert session.answer(phase, begin=True) is None
            assert session.answer(phase, begin=False) is None
        disabled = eerl.connect(gpus=[0], config=ClientConfig.disabled_config())
        with disabled.phase("generation") as phase:
            pass
        assert disabled.answer(phase, begin=True) is None

    def test_only_the_last_64_are_kept(self, fake: FakeDaemon) -> None:
        with eerl.connect(gpus=[0], config=fast(fake.config)) as session:
            phases = []
            for i in range(40):
                with session.phase("generation", iteration=i) as phase:
                    phases.append(phase)
            assert session.flush(5)
            kept = [session.answer(p, begin=b) is not None for p in phases for b in (True, False)]
        assert kept == [False] * 16 + [True] * 64
