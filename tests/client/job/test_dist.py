"""eerl.dist.DistJob: 4 CPU ranks on 2 simulated nodes (gloo, init_method file://), a daemon per node."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
import torch.multiprocessing as torch_mp
from eerl.dist import _leaders

from eerld.testing import DaemonHandle, running_daemon
from tests.client.job._dist_worker import run_rank
from tests.conftest import short_socket_dir

WORLD = 4


@pytest.fixture
def daemons() -> Iterator[list[DaemonHandle]]:
    with ExitStack() as stack:
        handles = []
        for _ in range(2):
            directory = stack.enter_context(short_socket_dir())
            handles.append(stack.enter_context(running_daemon(directory, controller="off", fixed_clocks="")))
        yield handles


def run_job(
    daemons: list[DaemonHandle], tmp_path: Path, stall_rank: int = -1, shift_rank: int = -1
) -> list[dict[str, Any]]:
    sockets = [str(d.socket_path) for d in daemons]
    torch_mp.spawn(
        run_rank,
        args=(WORLD, str(tmp_path / "init"), sockets, str(tmp_path), stall_rank, shift_rank),
        nprocs=WORLD,
        join=True,
    )
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(WORLD)]


@pytest.mark.slow
def test_rank_0_decides_and_each_node_leader_applies(daemons: list[DaemonHandle], tmp_path: Path) -> None:
    results = run_job(daemons, tmp_path)
    assert [r["leader"] for r in results] == [True, False, True, False]
    assert [r["node_rank"] for r in results] == [0, None, 1, None]
    assert all(r["nodes"] == 2 for r in results)
    assert [r["has_controller"] for r in results] == [True, False, False, False]
    leaders = [results[0], results[2]]
    for a, b in zip(leaders[0]["phases"], leaders[1]["phases"], strict=True):
        assert a["verdict"] == b["verdict"] == "accepted"
        assert a["clock"] == b["clock"] == (1200 if a["kind"] == "generation" else 1500)
    # The controller counted the nodes (2), not the ranks (4).
    assert all(p.get("accepted") for p in results[0]["phases"])
    for daemon in daemons:
        assert daemon.backend.locked() == {}  # closed: back at default
        assert not daemon.daemon.reads.sessions()


def run_job_that_turns_control_off(
    daemons: list[DaemonHandle], tmp_path: Path, **faults: int
) -> list[dict[str, Any]]:
    """:func:`run_job` with ``faults`` (``stall_rank``, ``shift_rank``), and what every such job shows: all
    six phases ran on every rank, job-level control ended off everywhere, the GPUs are back at default."""
    results = run_job(daemons, tmp_path, **faults)
    assert all(len(r["phases"]) == 6 for r in results)
    assert not any(r["enabled"] for r in results)
    for daemon in daemons:
        assert daemon.backend.locked() == {}
    return results


@pytest.mark.slow
def test_a_stalled_rank_turns_job_control_off_and_the_job_goes_on(
    daemons: list[DaemonHandle], tmp_path: Path
) -> None:
    results = run_job_that_turns_control_off(daemons, tmp_path, stall_rank=3)
    # On every rank the first side-group collective that timed out (in iteration 1, the stalled one) turned
    # control off for good: no later phase touched the side group, so no rank paid another timeout.
    for r in results:
        enabled = [p["enabled"] for p in r["phases"]]
        assert enabled[:2] == [True, True], r["rank"]
        assert enabled[4:] == [False, False], r["rank"]
        assert enabled == sorted(enabled, reverse=True), r["rank"]


@pytest.mark.slow
def test_ranks_whose_phases_do_not_line_up_turn_job_control_off(
    daemons: list[DaemonHandle], tmp_path: Path
) -> None:
    results = run_job_that_turns_control_off(daemons, tmp_path, shift_rank=2)
    # The shifted rank saw rank 0's directive for another phase than its own at its first begin, and said so;
    # the others, no longer paired, timed out on the side group.
    assert "do not line up" in results[2]["disabled_reason"]
    assert results[2]["phases"][0]["enabled"] is False
    assert all("side gloo group" in r["disabled_reason"] for r in (results[0], results[1], results[3]))


def test_node_leaders_are_local_rank_0_else_the_first_rank_of_each_host() -> None:
    assert _leaders([("a", 0, "j", 1), ("a", 1, "j", 1), ("b", 0, "j", 1), ("b", 1, "j", 1)]) == [0, 2]
    assert _leaders([("a", None, "j", 1), ("b", None, "j", 1), ("a", None, "j", 1)]) == [0, 1]
