"""Job mode attacked by unprivileged users (issue 17): a job's directives cannot get past the daemon's checks.

A job-mode session takes its clock per phase from a directive in its own BeginPhase. The attacks, each made
as ``nobody`` over its grant's socket: a stale controller (an older incarnation) keeps sending directives or
reopens a session; a directive asks for a clock off the GPUs' grid or below the admin's floor; a job floods
the daemon with trial directives; a user of another grant fences a job it does not own by claiming its job id
with a huge incarnation. What must hold: each is refused with the right verdict, the GPU is never set to the
refused clock (the fake backend records every lock it was asked for), and the phase runs at the fallback (the
last accepted committed clock of that phase kind, else the default governor) — never at a trial clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.testing import DaemonHandle, FakeGpuBackend, ManualClock, running_daemon
from tests.security.conftest import NOBODY_UID, call, run_as

VICTIM_UID = 4242
GEN = "PHASE_KIND_GENERATION"
TRIAL = "DIRECTIVE_PURPOSE_TRIAL"
COMMITTED = "DIRECTIVE_PURPOSE_COMMITTED"
TRIALS = 8
"""The trial budget of the daemon under attack (per session and window)."""


def grant_socket(handle: DaemonHandle, name: str, gpus: list[int], uid: int) -> str:
    with grpc.insecure_channel(f"unix:{handle.admin_socket_path}") as channel:
        request = pb.GrantRequest(name=name, gpus=[pb.GpuRef(index=i) for i in gpus], uid=uid)
        reply: pb.GrantResponse = pb_grpc.AdminServiceStub(channel).Grant(request, timeout=10)
    return f"unix:{reply.grant.socket_path}"


def open_job(job_id: str = "job-a", incarnation: int = 2, node_rank: int = 0) -> dict[str, Any]:
    job_mode = {"enabled": True, "incarnation": str(incarnation), "nodeRank": node_rank}
    return call("PhaseService", "OpenSession", {"jobId": job_id, "jobMode": job_mode})


def directive(
    iteration: int, mhz: int, purpose: str, *, incarnation: int = 2, epoch: int = 1
) -> dict[str, Any]:
    return {
        "incarnation": str(incarnation),
        "epoch": str(epoch),
        "iteration": str(iteration),
        "kind": GEN,
        "smClockMhz": mhz,
        "purpose": purpose,
    }


def phase(sid: str, iteration: int, order: dict[str, Any] | None) -> list[dict[str, Any]]:
    """BeginPhase (with ``order`` as its directive) and EndPhase of one generation phase."""
    begin: dict[str, Any] = {"sessionId": sid, "kind": GEN, "iteration": str(iteration)}
    if order is not None:
        begin["directive"] = order
    end = {"sessionId": sid, "kind": GEN, "iteration": str(iteration), "workload": {"tokens": "100"}}
    return [call("PhaseService", "BeginPhase", begin), call("PhaseService", "EndPhase", end)]


def verdicts(outcomes: list[Any]) -> list[str]:
    """The verdict of every BeginPhase among ``outcomes`` (they alternate with EndPhase)."""
    assert all(o.code == "OK" for o in outcomes), [(o.code, o.details) for o in outcomes]
    return [o.response.get("verdict", "") for o in outcomes[::2]]


def locks_asked(handle: DaemonHandle) -> list[int]:
    backend = handle.backend
    assert isinstance(backend, FakeGpuBackend)
    return backend.lock_history(0)


@pytest.fixture
def node(reachable_dir: Path) -> Iterator[tuple[DaemonHandle, str]]:
    """A multi-tenant daemon (trial budget :data:`TRIALS`) and the socket of nobody's grant on GPU 0.

    No clock-change rate limit: the attacks run their phases in a burst on a clock that never moves (each
    phase a lock and its end's release), and the limit is attacked in tests/reliability/test_privilege.py.
    """
    clock = ManualClock()
    fake = FakeGpuBackend(4, clock=clock)
    with running_daemon(
        reachable_dir,
        backend=fake,
        clock=clock,
        reaper=False,
        tenancy="multi",
        job_max_trials=TRIALS,
        max_clock_changes_per_s=0.0,
    ) as handle:
        yield handle, grant_socket(handle, "attacker", [0], NOBODY_UID)


def opened(target: str, **kwargs: Any) -> str:
    outcome = run_as(target, [open_job(**kwargs)])[0]
    assert outcome.code == "OK", outcome.details
    sid: str = outcome.response["sessionId"]
    return sid


class TestFencing:
    def test_a_stale_incarnations_directives_are_refused_and_the_committed_clock_holds(
        self, node: tuple[DaemonHandle, str]
    ) -> None:
        handle, target = node
        sid = opened(target, incarnation=2)
        calls = [
            *phase(sid, 1, directive(1, 1500, COMMITTED, incarnation=2)),
            *phase(sid, 2, directive(2, 900, TRIAL, incarnation=1)),  # the old controller, still running
            *phase(sid, 3, directive(3, 1200, COMMITTED, incarnation=1)),
        ]
        outcomes = run_as(target, calls)
        assert verdicts(outcomes) == [
            "DIRECTIVE_VERDICT_ACCEPTED",
            "DIRECTIVE_VERDICT_STALE_INCARNATION",
            "DIRECTIVE_VERDICT_STALE_INCARNATION",
        ]
        assert [o.response.get("targetSmClockMhz") for o in outcomes[::2]] == [1500, 1500, 1500]
        assert set(locks_asked(handle)) == {1500}  # each phase locks; its end releases

    def test_a_stale_incarnation_cannot_reopen_the_job(self, node: tuple[DaemonHandle, str]) -> None:
        handle, target = node
        sid = opened(target, incarnation=3)
        run_as(target, [call("PhaseService", "CloseSession", {"sessionId": sid})])
        outcome = run_as(target, [open_job(incarnation=2)])[0]
        assert outcome.code == "FAILED_PRECONDITION"
        assert "incarnation 2 is older than incarnation 3" in outcome.details
        assert handle.daemon.sessions() == ()

    def test_another_grants_user_cannot_fence_a_job_by_claiming_its_id(
        self, node: tuple[DaemonHandle, str]
    ) -> None:
        handle, target = node
        other = grant_socket(handle, "other", [1], VICTIM_UID)
        fence = run_as(other, [open_job(job_id="job-a", incarnation=10**12)], uid=VICTIM_UID, gid=VICTIM_UID)
        sid = opened(target, job_id="job-a", incarnation=2)
        outcomes = run_as(target, phase(sid, 1, directive(1, 1500, COMMITTED)))
        assert fence[0].code == "OK"
        assert verdicts(outcomes) == ["DIRECTIVE_VERDICT_ACCEPTED"]
        assert locks_asked(handle) == [1500]


class TestEnvelope:
    def test_an_off_grid_or_below_floor_clock_is_refused_never_snapped(
        self, node: tuple[DaemonHandle, str]
    ) -> None:
        handle, target = node
        sid = opened(target)
        calls = [
            *phase(sid, 1, directive(1, 1501, COMMITTED)),  # the grid is 600-1980 MHz in 15 MHz steps
            *phase(sid, 2, directive(2, 600, TRIAL)),  # on the grid, below the default floor (40 % of 1980)
            *phase(sid, 3, directive(3, 1, COMMITTED)),
            *phase(sid, 4, directive(4, 100_000, TRIAL)),
        ]
        outcomes = run_as(target, calls)
        assert verdicts(outcomes) == [
            "DIRECTIVE_VERDICT_OFF_GRID",
            "DIRECTIVE_VERDICT_BELOW_FLOOR",
            "DIRECTIVE_VERDICT_OFF_GRID",
            "DIRECTIVE_VERDICT_OFF_GRID",
        ]
        assert all(o.response.get("targetSmClockMhz", 0) == 0 for o in outcomes[::2])
        assert locks_asked(handle) == []
        assert handle.backend.locked() == {}  # type: ignore[attr-defined]

    def test_a_directive_for_another_gpu_set_is_impossible_the_session_holds_its_own(
        self, node: tuple[DaemonHandle, str]
    ) -> None:
        """Authority: a directive names no GPU; it applies to the session's GPUs, which its grant allowed."""
        handle, target = node
        sid = opened(target)
        outcomes = run_as(target, phase(sid, 1, directive(1, 1500, COMMITTED)))
        assert verdicts(outcomes) == ["DIRECTIVE_VERDICT_ACCEPTED"]
        backend = handle.backend
        assert isinstance(backend, FakeGpuBackend)
        assert backend.lock_history(0) == [1500]  # for the phase; its end released it
        assert [i for i in range(4) if backend.lock_history(i)] == [0]


class TestTrialFlood:
    def test_trials_beyond_the_budget_are_refused_and_fall_back_to_the_committed_clock(
        self, node: tuple[DaemonHandle, str]
    ) -> None:
        handle, target = node
        sid = opened(target)
        calls = phase(sid, 1, directive(1, 1500, COMMITTED))
        for i in range(2, 2 + TRIALS + 12):
            calls += phase(sid, i, directive(i, 900 + 15 * i, TRIAL, epoch=i))
        outcomes = run_as(target, calls)
        got = verdicts(outcomes)
        assert got[0] == "DIRECTIVE_VERDICT_ACCEPTED"
        assert got[1 : 1 + TRIALS] == ["DIRECTIVE_VERDICT_ACCEPTED"] * TRIALS
        assert set(got[1 + TRIALS :]) == {"DIRECTIVE_VERDICT_TRIAL_BUDGET"}
        refused = {900 + 15 * i for i in range(2 + TRIALS, 2 + TRIALS + 12)}
        assert not refused & set(locks_asked(handle))
        assert {o.response.get("targetSmClockMhz") for o in outcomes[2 * (1 + TRIALS) :: 2]} == {1500}
        assert {o.response.get("appliedEpoch") for o in outcomes[2 * (1 + TRIALS) :: 2]} == {"1"}
