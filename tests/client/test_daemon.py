"""The client against the real eerld (sim GPU backend) over its Unix worker socket."""

from __future__ import annotations

import time
from collections.abc import Callable

import eerl

from eerld.control.base import PhaseKind as DaemonPhaseKind

from .conftest import SimDaemon


def _wait(predicate: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    deadline_s = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline_s:
            return False
        time.sleep(0.01)
    return True


class TestRealDaemon:
    def test_the_daemon_meters_each_phase_with_the_reported_tokens(self, sim_daemon: SimDaemon) -> None:
        with eerl.connect(gpus=[0, 1], job_id="job-real", config=sim_daemon.config) as session:
            for i in range(2):
                with session.phase("generation", iteration=i) as p:
                    p.report(tokens=100 + i, sequences=4, max_response_tokens=40, prompt_tokens=30)
                with session.phase("training", iteration=i) as p:
                    p.report(tokens=130 + i, valid_tokens=100 + i, sequences=4)
            assert session.flush(5)
        assert [(r.kind, r.iteration, r.tokens, r.valid_tokens, r.job_id) for r in sim_daemon.records] == [
            (DaemonPhaseKind.GENERATION, 0, 100, 0, "job-real"),
            (DaemonPhaseKind.TRAINING, 0, 130, 100, "job-real"),
            (DaemonPhaseKind.GENERATION, 1, 101, 0, "job-real"),
            (DaemonPhaseKind.TRAINING, 1, 131, 101, "job-real"),
        ]

    def test_a_gpu_named_by_uuid_is_the_daemons_gpu_of_that_uuid(self, sim_daemon: SimDaemon) -> None:
        uuid = sim_daemon.gpu_uuid(1)
        with eerl.connect(gpus=[uuid], config=sim_daemon.config) as session:
            assert session.wait_until_connected(5)
            assert [s.gpu_indices for s in sim_daemon.sessions()] == [(1,)]

    def test_the_session_is_bound_to_the_stream_and_ends_with_close(self, sim_daemon: SimDaemon) -> None:
        session = eerl.connect(gpus=[0], config=sim_daemon.config)
        assert session.wait_until_connected(5)
        assert _wait(lambda: [s.attached for s in sim_daemon.sessions()] == [True])
        session.close()
        assert sim_daemon.sessions() == ()

    def test_the_client_reopens_after_the_daemon_restarts(self, sim_daemon: SimDaemon) -> None:
        with eerl.connect(gpus=[0], job_id="job-restart", config=sim_daemon.config) as session:
            with session.phase("generation", iteration=0) as p:
                p.report(tokens=5)
            assert session.flush(5)
            with session.phase("training", iteration=0) as p:
                sim_daemon.stop()
                sim_daemon.start()
                assert _wait(lambda: len(sim_daemon.sessions()) == 1)
                p.report(tokens=9, valid_tokens=5)
            with session.phase("generation", iteration=1) as p:
                p.report(tokens=6)
            assert session.flush(5)
            assert session.stats().opens == 2
        assert [(r.kind, r.iteration, r.tokens) for r in sim_daemon.records] == [
            (DaemonPhaseKind.GENERATION, 0, 5),
            (DaemonPhaseKind.GENERATION, 1, 6),
        ]
