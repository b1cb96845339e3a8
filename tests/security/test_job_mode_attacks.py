"""Job mode attacked by unprivileged users (issue 17): a job's directives cannot get past the daemon's checks.

A job-mode session takes its clock per phase from a directive in its own BeginPhase. The attacks, each made
as ``nobody`` over its grant's socket: a stale controller (an older incarnation) keeps sending directives or
reopens a session; a directive asks for a clock off the GPUs' grid or below the admin's floor; a job floods
the daemon with trial directives; a user of another grant fences a job it does not own by claiming its job id
with a huge incarnation. Issue 32 adds: an older plan epoch replayed (and a refused directive that would have
raised the epoch); a restarted controller's session fencing the old session's directives on the same grant;
a clock on the grid of one GPU of the session but not of the other; an admin's explicit floor; and a job with
sessions on two grants steering the other grant's GPU or a neighbour's — through its directives, by claiming
GPUs its socket was not granted, with a ticket or a made-up one, or through a session of the neighbour's job
id on its other grant. What must hold: each is refused with the right verdict, no GPU is ever set to a
refused clock (the fake backend records every lock each GPU was asked for), and the phase runs at the
fallback (the last accepted committed clock of that phase kind, else the default governor) — never at a
trial clock.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import grpc
import pytest
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.testing import FAKE_SM_CLOCKS_MHZ, DaemonHandle, FakeGpuBackend, ManualClock, running_daemon
from tests.security.conftest import NOBODY_UID, Outcome, call, run_as

VICTIM_UID = 4242
GEN = "PHASE_KIND_GENERATION"
TRIAL = "DIRECTIVE_PURPOSE_TRIAL"
COMMITTED = "DIRECTIVE_PURPOSE_COMMITTED"
TRIALS = 8
"""The trial budget of the daemon under attack (per session and window)."""
GPUS = 4
NARROW_GPU = 3
"""The GPU whose grid lacks :data:`OFF_NARROW_GRID` (the others have it)."""
OFF_NARROW_GRID = 1515


class MixedGridBackend(FakeGpuBackend):
    """The fake GPUs, one of which (:data:`NARROW_GPU`) does not support :data:`OFF_NARROW_GRID`."""

    def supported_sm_clocks_mhz(self, index: int) -> tuple[int, ...]:
        clocks = tuple(super().supported_sm_clocks_mhz(index))
        return tuple(c for c in clocks if c != OFF_NARROW_GRID) if index == NARROW_GPU else clocks


def grant_socket(handle: DaemonHandle, name: str, gpus: list[int], uid: int) -> str:
    with grpc.insecure_channel(f"unix:{handle.admin_socket_path}") as channel:
        request = pb.GrantRequest(name=name, gpus=[pb.GpuRef(index=i) for i in gpus], uid=uid)
        reply: pb.GrantResponse = pb_grpc.AdminServiceStub(channel).Grant(request, timeout=10)
    return f"unix:{reply.grant.socket_path}"


def open_job(
    job_id: str = "job-a",
    incarnation: int = 2,
    node_rank: int = 0,
    gpus: list[int] | None = None,
    tickets: list[str] | None = None,
) -> dict[str, Any]:
    job_mode = {"enabled": True, "incarnation": str(incarnation), "nodeRank": node_rank}
    request: dict[str, Any] = {"jobId": job_id, "jobMode": job_mode}
    if gpus is not None:
        request["gpus"] = [{"index": i} for i in gpus]
    if tickets is not None:
        request["claimTickets"] = tickets
    return call("PhaseService", "OpenSession", request)


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


def locks_asked(handle: DaemonHandle, index: int = 0) -> list[int]:
    backend = handle.backend
    assert isinstance(backend, FakeGpuBackend)
    return backend.lock_history(index)


def every_lock_asked(handle: DaemonHandle) -> dict[int, list[int]]:
    """Every SM clock each GPU of the node was asked to lock to, in order (GPUs never asked left out)."""
    asked = {index: locks_asked(handle, index) for index in range(GPUS)}
    return {index: clocks for index, clocks in asked.items() if clocks}


def assert_never_applied(handle: DaemonHandle, refused: set[int]) -> None:
    """No GPU of the node was ever asked for one of the ``refused`` clocks."""
    applied = {index: sorted(refused & set(clocks)) for index, clocks in every_lock_asked(handle).items()}
    assert {index: clocks for index, clocks in applied.items() if clocks} == {}


def start_node(directory: Path, **overrides: Any) -> AbstractContextManager[DaemonHandle]:
    """A multi-tenant daemon on :class:`MixedGridBackend` (trial budget :data:`TRIALS`), no rate limit."""
    clock = ManualClock()
    options: dict[str, Any] = {"job_max_trials": TRIALS, "max_clock_changes_per_s": 0.0, **overrides}
    return running_daemon(
        directory,
        backend=MixedGridBackend(GPUS, clock=clock),
        clock=clock,
        reaper=False,
        tenancy="multi",
        **options,
    )


@pytest.fixture
def node(reachable_dir: Path) -> Iterator[tuple[DaemonHandle, str]]:
    """A multi-tenant daemon (trial budget :data:`TRIALS`) and the socket of nobody's grant on GPU 0.

    No clock-change rate limit: the attacks run their phases in a burst on a clock that never moves (each
    phase a lock and its end's release), and the limit is attacked in tests/reliability/test_privilege.py.
    """
    with start_node(reachable_dir) as handle:
        yield handle, grant_socket(handle, "attacker", [0], NOBODY_UID)


def opened(target: str, *, uid: int = NOBODY_UID, **kwargs: Any) -> str:
    outcome = run_as(target, [open_job(**kwargs)], uid=uid, gid=uid)[0]
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
        assert every_lock_asked(handle) == {0: [1500, 1500, 1500]}  # each phase locks; its end releases

    def test_a_stale_incarnation_cannot_reopen_the_job(self, node: tuple[DaemonHandle, str]) -> None:
        handle, target = node
        sid = opened(target, incarnation=3)
        run_as(target, [call("PhaseService", "CloseSession", {"sessionId": sid})])
        outcome = run_as(target, [open_job(incarnation=2)])[0]
        assert outcome.code == "FAILED_PRECONDITION"
        assert "incarnation 2 is older than incarnation 3" in outcome.details
        assert handle.daemon.reads.sessions() == ()

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
        assert every_lock_asked(handle) == {0: [1500]}


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
        assert every_lock_asked(handle) == {}
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
        assert_never_applied(handle, refused)
        assert {o.response.get("targetSmClockMhz") for o in outcomes[2 * (1 + TRIALS) :: 2]} == {1500}
        assert {o.response.get("appliedEpoch") for o in outcomes[2 * (1 + TRIALS) :: 2]} == {"1"}


def revoke(handle: DaemonHandle, name: str) -> None:
    with grpc.insecure_channel(f"unix:{handle.admin_socket_path}") as channel:
        pb_grpc.AdminServiceStub(channel).Revoke(pb.RevokeRequest(name=name, reason="job over"), timeout=10)


class TestLeftoverIncarnation:
    def test_a_former_tenants_incarnation_does_not_fence_the_next_tenants_job(
        self, node: tuple[DaemonHandle, str]
    ) -> None:
        """nobody's job leaves incarnation 2**63 - 1 for job id 'trainer' on its grant; the grant is
        revoked and its name given to another user, whose job 'trainer' opens at incarnation 1."""
        handle, target = node
        sid = opened(target, job_id="trainer", incarnation=2**63 - 1)
        run_as(target, [call("PhaseService", "CloseSession", {"sessionId": sid})])
        revoke(handle, "attacker")
        victims = grant_socket(handle, "attacker", [0], VICTIM_UID)
        outcome = run_as(victims, [open_job(job_id="trainer", incarnation=1)], uid=VICTIM_UID, gid=VICTIM_UID)
        assert (outcome[0].code, outcome[0].details) == ("OK", "")


class TestStaleEpoch:
    def test_an_older_plan_epoch_is_refused_and_a_refused_newer_one_raises_nothing(
        self, node: tuple[DaemonHandle, str]
    ) -> None:
        handle, target = node
        sid = opened(target)
        calls = [
            *phase(sid, 1, directive(1, 1500, COMMITTED, epoch=5)),
            *phase(sid, 2, directive(2, 900, TRIAL, epoch=4)),  # an older plan, replayed
            *phase(sid, 3, directive(3, 1200, COMMITTED, epoch=1)),
            *phase(sid, 4, directive(4, 1500, COMMITTED, epoch=5)),  # the same plan, resent
            *phase(sid, 5, directive(5, 1501, COMMITTED, epoch=9)),  # refused: raises no epoch
            *phase(sid, 6, directive(6, 1350, COMMITTED, epoch=6)),
            *phase(sid, 7, directive(7, 1500, COMMITTED, epoch=5)),  # older than 6 now
        ]
        outcomes = run_as(target, calls)
        assert verdicts(outcomes) == [
            "DIRECTIVE_VERDICT_ACCEPTED",
            "DIRECTIVE_VERDICT_STALE_EPOCH",
            "DIRECTIVE_VERDICT_STALE_EPOCH",
            "DIRECTIVE_VERDICT_ACCEPTED",
            "DIRECTIVE_VERDICT_OFF_GRID",
            "DIRECTIVE_VERDICT_ACCEPTED",
            "DIRECTIVE_VERDICT_STALE_EPOCH",
        ]
        got = [(o.response.get("targetSmClockMhz"), o.response.get("appliedEpoch")) for o in outcomes[::2]]
        assert got == [(1500, "5")] * 5 + [(1350, "6")] * 2
        assert "epoch 4 is older than epoch 5" in outcomes[2].response["verdictDetail"]
        assert every_lock_asked(handle) == {0: [1500, 1500, 1500, 1500, 1500, 1350, 1350]}
        assert_never_applied(handle, {900, 1200, 1501})


class TestFencingAcrossSessions:
    def test_a_restarted_controllers_session_fences_the_old_sessions_directives(
        self, node: tuple[DaemonHandle, str]
    ) -> None:
        """The old controller's session (incarnation 2) stays open after the new one (3) opened another
        session of the job on the same grant: from then on its directives are stale."""
        handle, _ = node
        pair = grant_socket(handle, "pair", [1, 2], NOBODY_UID)
        old = opened(pair, incarnation=2, gpus=[1])
        first = run_as(pair, phase(old, 1, directive(1, 1500, COMMITTED, incarnation=2)))
        opened(pair, incarnation=3, gpus=[2])
        calls = [
            *phase(old, 2, directive(2, 900, TRIAL, incarnation=2)),
            *phase(old, 3, directive(3, 1200, COMMITTED, incarnation=2, epoch=2)),
        ]
        outcomes = run_as(pair, calls)
        assert verdicts(first) == ["DIRECTIVE_VERDICT_ACCEPTED"]
        assert verdicts(outcomes) == ["DIRECTIVE_VERDICT_STALE_INCARNATION"] * 2
        assert "incarnation 2 is older than incarnation 3" in outcomes[0].response["verdictDetail"]
        assert [o.response.get("targetSmClockMhz") for o in outcomes[::2]] == [1500, 1500]
        assert every_lock_asked(handle) == {1: [1500, 1500, 1500]}
        assert_never_applied(handle, {900, 1200})


class TestEnvelopeOfSeveralGpus:
    def test_a_clock_on_one_gpus_grid_but_not_the_others_is_refused_for_the_whole_session(
        self, node: tuple[DaemonHandle, str]
    ) -> None:
        handle, _ = node
        pair = grant_socket(handle, "mixed", [2, NARROW_GPU], NOBODY_UID)
        sid = opened(pair)
        calls = [
            *phase(sid, 1, directive(1, OFF_NARROW_GRID, COMMITTED)),  # on GPU 2's grid only
            *phase(sid, 2, directive(2, OFF_NARROW_GRID, TRIAL, epoch=2)),
            *phase(sid, 3, directive(3, 1500, COMMITTED, epoch=3)),
        ]
        outcomes = run_as(pair, calls)
        assert verdicts(outcomes) == [
            "DIRECTIVE_VERDICT_OFF_GRID",
            "DIRECTIVE_VERDICT_OFF_GRID",
            "DIRECTIVE_VERDICT_ACCEPTED",
        ]
        assert every_lock_asked(handle) == {2: [1500], NARROW_GPU: [1500]}
        assert_never_applied(handle, {OFF_NARROW_GRID})

    def test_an_admins_explicit_floor_holds_on_the_grid(self, reachable_dir: Path) -> None:
        floor = 1200
        below = max(c for c in FAKE_SM_CLOCKS_MHZ if c < floor)  # above the auto floor (792)
        with start_node(reachable_dir, job_clock_floor_mhz=floor) as handle:
            target = grant_socket(handle, "attacker", [0, 1], NOBODY_UID)
            sid = opened(target)
            calls = [
                *phase(sid, 1, directive(1, below, COMMITTED)),
                *phase(sid, 2, directive(2, 810, TRIAL, epoch=2)),  # on the grid, above the auto floor
                *phase(sid, 3, directive(3, floor, TRIAL, epoch=3)),
            ]
            outcomes = run_as(target, calls)
            assert verdicts(outcomes) == [
                "DIRECTIVE_VERDICT_BELOW_FLOOR",
                "DIRECTIVE_VERDICT_BELOW_FLOOR",
                "DIRECTIVE_VERDICT_ACCEPTED",
            ]
            assert f"below the floor of {floor} MHz" in outcomes[0].response["verdictDetail"]
            assert every_lock_asked(handle) == {0: [floor], 1: [floor]}
            assert_never_applied(handle, {below, 810})


@pytest.fixture
def neighbours(node: tuple[DaemonHandle, str]) -> tuple[DaemonHandle, str, str, str, str]:
    """The attacker's job on two grants of its own (GPU 0 and GPU 1) and a neighbour's job-mode session
    on GPU 2 (another user's grant) that committed 1500 MHz; GPU 3 is nobody's.

    Returns (handle, the attacker's first socket, its second socket, the neighbour's socket, the
    neighbour's session).
    """
    handle, first = node
    second = grant_socket(handle, "attacker-b", [1], NOBODY_UID)
    victims = grant_socket(handle, "victim", [2], VICTIM_UID)
    victim = opened(victims, uid=VICTIM_UID, job_id="job-v")
    committed = run_as(
        victims, phase(victim, 1, directive(1, 1500, COMMITTED)), uid=VICTIM_UID, gid=VICTIM_UID
    )
    assert verdicts(committed) == ["DIRECTIVE_VERDICT_ACCEPTED"]
    return handle, first, second, victims, victim


def victims_next_phases(victims: str, victim: str) -> list[Outcome]:
    """The neighbour's next two phases: no directive (its fallback), then a new committed clock."""
    calls = [*phase(victim, 2, None), *phase(victim, 3, directive(3, 1350, COMMITTED, epoch=2))]
    return run_as(victims, calls, uid=VICTIM_UID, gid=VICTIM_UID)


class TestReach:
    """A job's directives move its own session's GPUs and no other: not its other grant's, not a
    neighbour's, not one nobody holds."""

    def test_directives_on_one_grant_move_only_that_sessions_gpu(
        self, neighbours: tuple[DaemonHandle, str, str, str, str]
    ) -> None:
        handle, first, second, victims, victim = neighbours
        on_first = opened(first, gpus=[0])
        opened(second, gpus=[1])  # the same job, on its other grant: no directive of its own
        calls = [
            *phase(on_first, 1, directive(1, 900, TRIAL)),
            *phase(on_first, 2, directive(2, 1200, COMMITTED, epoch=2)),
        ]
        outcomes = run_as(first, calls)
        after = victims_next_phases(victims, victim)
        assert verdicts(outcomes) == ["DIRECTIVE_VERDICT_ACCEPTED"] * 2
        assert verdicts(after) == ["DIRECTIVE_VERDICT_MISSING", "DIRECTIVE_VERDICT_ACCEPTED"]
        assert [o.response.get("targetSmClockMhz") for o in after[::2]] == [1500, 1350]
        assert every_lock_asked(handle) == {0: [900, 1200], 2: [1500, 1500, 1350]}

    def test_a_socket_claims_no_gpu_it_was_not_granted_with_or_without_tickets(
        self, neighbours: tuple[DaemonHandle, str, str, str, str]
    ) -> None:
        handle, first, second, victims, _ = neighbours
        opened(first, gpus=[0])
        denied = run_as(first, [open_job(gpus=[1]), open_job(gpus=[2]), open_job(gpus=[3])])
        ticket_of_first = run_as(first, [call("PhaseService", "IssueClaimTicket")])[0]
        from_victims = run_as(victims, [call("PhaseService", "IssueClaimTicket")])[0]
        ticket = ticket_of_first.response["ticket"]
        with_tickets = run_as(
            second,
            [
                open_job(gpus=[0], tickets=[ticket]),  # GPU 0, by the first grant's ticket: held already
                open_job(gpus=[2], tickets=["x" * 32]),  # the neighbour's GPU, with a made-up ticket
            ],
        )
        assert [o.code for o in denied] == ["PERMISSION_DENIED"] * 3
        assert "GPU 2 is not granted to this socket" in denied[1].details
        assert from_victims.code == "UNAVAILABLE"  # the kernel: the neighbour's socket is not ours
        assert [o.code for o in with_tickets] == ["FAILED_PRECONDITION", "PERMISSION_DENIED"]
        assert every_lock_asked(handle) == {2: [1500]}
        assert {s.job_id for s in handle.daemon.reads.sessions()} == {"job-a", "job-v"}
        assert len(handle.daemon.reads.sessions()) == 2

    def test_the_neighbours_job_id_on_the_attackers_other_grant_steers_only_the_attackers_gpu(
        self, neighbours: tuple[DaemonHandle, str, str, str, str]
    ) -> None:
        """A session of the neighbour's job id, at a huge incarnation, on the attacker's other grant."""
        handle, _, second, victims, victim = neighbours
        imposter = opened(second, job_id="job-v", incarnation=10**12)
        calls = [
            *phase(imposter, 1, directive(1, 900, TRIAL, incarnation=10**12)),
            *phase(imposter, 2, directive(2, 1200, COMMITTED, incarnation=10**12, epoch=2)),
        ]
        outcomes = run_as(second, calls)
        after = victims_next_phases(victims, victim)
        assert verdicts(outcomes) == ["DIRECTIVE_VERDICT_ACCEPTED"] * 2
        assert verdicts(after) == ["DIRECTIVE_VERDICT_MISSING", "DIRECTIVE_VERDICT_ACCEPTED"]
        assert every_lock_asked(handle) == {1: [900, 1200], 2: [1500, 1500, 1350]}
