"""Every time the API shows is wall-clock UTC: decisions of a sim backend whose clock runs 100× faster.

The phase clock of the sim backend starts near zero and runs ``speedup`` times faster than the host's; a
decision's time once was that value plus the offset between the wall and the monotonic clock, hours off
(the host's uptime). :class:`~eerld.daemon.timebase.PhaseTimebase` pairs every phase-clock reading with the
wall clock.
"""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import pytest
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc
from eerl_sim.gpu import create_sim_backend
from eerl_sim.profiles import builtin_profile

from eerld.daemon.timebase import PhaseTimebase
from eerld.testing import ManualClock, running_daemon


class Fast:
    """A phase clock at 100× a manual wall clock, from zero."""

    def __init__(self, wall: ManualClock) -> None:
        self.wall = wall
        self.start = wall()

    def __call__(self) -> float:
        return (self.wall() - self.start) * 100.0


class TestPhaseTimebase:
    def test_a_reading_it_took_maps_to_the_wall_clock_of_that_reading(self) -> None:
        """Readings at 0, 100 and 250 phase seconds map to the wall clock of each."""
        wall = ManualClock(1_764_600_000.0)
        timebase = PhaseTimebase(Fast(wall), wall)
        wall.advance(1.0)
        at_100 = timebase.now()
        wall.advance(1.5)
        at_250 = timebase.now()
        assert (at_100, at_250) == (100.0, 250.0)
        assert timebase.to_unix_s(0.0) == 1_764_600_000.0
        assert timebase.to_unix_s(at_100) == 1_764_600_001.0
        assert timebase.to_unix_s(at_250) == 1_764_600_002.5

    def test_between_and_beyond_readings_it_interpolates_with_the_clocks_rate(self) -> None:
        """A time between two readings, or after the last, follows the 100× rate (not 1×)."""
        wall = ManualClock(1_764_600_000.0)
        timebase = PhaseTimebase(Fast(wall), wall)
        wall.advance(2.0)
        timebase.now()
        assert timebase.to_unix_s(50.0) == pytest.approx(1_764_600_000.5)
        assert timebase.to_unix_s(400.0) == pytest.approx(1_764_600_004.0)

    def test_a_repeated_reading_keeps_the_first_and_a_clock_that_went_back_starts_afresh(self) -> None:
        """A stopped clock's reading keeps the wall clock it was first read at; after a clock that went back,
        only the readings from then on count (one anchor: the wall clock's rate)."""
        wall = ManualClock(1_764_600_000.0)
        phase = [10.0]
        timebase = PhaseTimebase(lambda: phase[0], wall)
        wall.advance(1.0)
        assert timebase.now() == 10.0
        assert timebase.to_unix_s(10.0) == 1_764_600_000.0
        phase[0] = 5.0
        assert timebase.now() == 5.0
        assert timebase.to_unix_s(5.0) == 1_764_600_001.0
        assert timebase.to_unix_s(10.0) == 1_764_600_006.0

    def test_the_table_stays_bounded_and_spans_the_whole_life(self) -> None:
        """After 10 000 readings at most 64 are kept; the first and the newest still map exactly."""
        wall = ManualClock(1_764_600_000.0)
        timebase = PhaseTimebase(Fast(wall), wall, max_anchors=64)
        for _ in range(10_000):
            wall.advance(0.01)
            last = timebase.now()
        assert len(timebase._phase_s) <= 65
        assert timebase.to_unix_s(0.0) == 1_764_600_000.0
        assert timebase.to_unix_s(last) == pytest.approx(1_764_600_100.0)
        assert timebase.to_unix_s(last / 2) == pytest.approx(1_764_600_050.0)


def test_decisions_on_a_sim_backend_with_speedup_are_wall_clock_times(sock_dir: Path) -> None:
    """Three phases on a sim backend at 100× speed: every decision's time lies between the wall-clock
    times before and after the phases."""
    backend = create_sim_backend(builtin_profile("h100-sxm"), 1, speedup=100.0)
    with running_daemon(sock_dir, backend=backend) as handle:
        before = time.time()
        with grpc.insecure_channel(f"unix:{handle.socket_path}") as channel:
            stub = pb_grpc.PhaseServiceStub(channel)
            opened = stub.OpenSession(pb.OpenSessionRequest(job_id="j", gpus=[pb.GpuRef(index=0)]))
            for i in range(3):
                gen = pb.PHASE_KIND_GENERATION
                stub.BeginPhase(pb.BeginPhaseRequest(session_id=opened.session_id, kind=gen, iteration=i))
                time.sleep(0.05)
                stub.EndPhase(
                    pb.EndPhaseRequest(
                        session_id=opened.session_id,
                        kind=gen,
                        iteration=i,
                        workload=pb.Workload(tokens=100, valid_tokens=90, sequences=1),
                    )
                )
        after = time.time()
        decisions = handle.daemon.reads.decisions()
    assert len(decisions) >= 3
    assert all(before - 0.01 <= d.timestamp_unix_s <= after + 0.01 for d in decisions), [
        (d.timestamp_unix_s - before) for d in decisions
    ]
