"""perf.phase_latency at a small count: the harness that measures #3's latency target keeps working, for
eerld as shipped and for a daemon variant, with the server-side handler times it reports."""

from __future__ import annotations

from pathlib import Path

import pytest

from perf import phase_latency
from soak.daemon import stop_process


@pytest.mark.parametrize("backend", ["sim", "noop", "spin"])
def test_the_harness_measures_eerld_beside_the_floor_with_server_side_times(backend: str) -> None:
    result = phase_latency.latency(1, 30, backend, 2, handler_times=True)
    assert result["round_trips_per_run"] == 30
    assert len(result["ratio_p50_runs"]) == len(result["ratio_p99_runs"]) == 2
    for key in ("eerld_p50_ms", "floor_p50_ms", "BeginPhase_handler_p50_ms", "EndPhase_handler_p50_ms"):
        assert isinstance(result[key], float)
        assert result[key] > 0
    assert result["BeginPhase_handler_p50_ms"] <= result["eerld_p50_ms"]
    # every RPC the server served is recorded, the session's set-up included
    assert result["OpenSession_handler_p50_ms"] > 0


def test_percentiles_are_taken_over_the_round_trips_of_all_runs_pooled() -> None:
    # two runs of 100 round trips; the second has a burst of slow ones on eerld: pooled, p99 is the
    # burst's and p50 is not, while each run's own ratios stay listed
    steady = ([0.001] * 100, [0.001] * 100)
    burst = ([0.001] * 50 + [0.003] * 50, [0.001] * 100)
    figures = phase_latency.pooled_figures([steady, burst])
    assert figures["eerld_p99_ms"] == pytest.approx(3.0)
    assert figures["eerld_p50_ms"] == pytest.approx(1.0)
    assert figures["floor_p99_ms"] == pytest.approx(1.0)
    assert figures["ratio_p99"] == pytest.approx(3.0)
    assert figures["ratio_p50"] == pytest.approx(1.0)
    assert figures["ratio_p50_runs"] == [1.0, 3.0]
    assert figures["ratio_p99_runs"] == [1.0, 3.0]


def test_a_client_process_that_dies_stops_the_run_instead_of_leaving_the_others_at_the_barrier(
    tmp_path: Path,
) -> None:
    # eerld has one GPU: the client for GPU 1 fails to open its session and exits 1, the client for GPU 0
    # opens its own and waits at the barrier for it; the run must stop, name the one failure, kill the other
    echo = phase_latency.start_echo(tmp_path / "echo.sock")
    try:
        daemon = phase_latency.start_eerld(tmp_path, 1)
        try:
            with pytest.raises(RuntimeError, match=r"^1 client process\(es\) failed, exit codes \[1\]$"):
                phase_latency.run_interleaved(tmp_path / "echo.sock", tmp_path / "w.sock", 2, 2, 1)
        finally:
            stop_process(daemon)
    finally:
        stop_process(echo)
