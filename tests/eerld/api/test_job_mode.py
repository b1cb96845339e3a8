"""Job mode in the daemon (issue 17): the checks on a job-level controller's directives and the fallback.

Most tests drive :class:`~eerld.daemon.Daemon` in process over a fake backend and a manual clock; the last
class goes over the real worker and admin sockets for what the wire adds (decoding an unknown kind or purpose,
the new reply fields, GpuInfo's grid, SessionInfo's job mode).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from eerl.control.simple import create_fixed_controller
from eerl.directives import Directive, DirectivePurpose, DirectiveVerdict
from eerl.job.admission import AUTO_FLOOR_FRACTION, JobPolicy, ReceivedDirective
from eerl.phases import ControllerState, ExecutionMode, GpuRole, PhaseKind, Workload
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerlctl.render import decisions_table, sessions_table
from eerlctl.replies import decision_dict, session_dict
from eerld.clocks.arbiter import ClockSource
from eerld.config import Config, load_config
from eerld.daemon import Daemon, DirectiveRecord
from eerld.daemon.jobmode import IncarnationBook
from eerld.errors import ConfigError, Conflict
from eerld.metrics import EerlMetrics
from eerld.metrics.source import DaemonMetricsSource, subscribe
from eerld.sessions import GpuSelector, JobModeSpec, SessionSpec
from eerld.testing import FAKE_MAX_SM_MHZ, FAKE_SM_CLOCKS_MHZ, FakeGpuBackend, ManualClock

GEN, TRAIN = PhaseKind.GENERATION, PhaseKind.TRAINING
V = DirectiveVerdict
TRIAL, COMMITTED, CONTROL = DirectivePurpose.TRIAL, DirectivePurpose.COMMITTED, DirectivePurpose.CONTROL
AUTO_FLOOR = math.ceil(AUTO_FLOOR_FRACTION * FAKE_MAX_SM_MHZ)
WORK = Workload(tokens=100, valid_tokens=50)


class Node:
    """An in-process daemon over fake GPUs with the fixed controller (1200/1500 MHz for non-job sessions)."""

    def __init__(
        self, state_dir: Path, clock: ManualClock, policy: JobPolicy | None = None, **kw: Any
    ) -> None:
        self.clock = clock
        self.fake = FakeGpuBackend(4, clock=clock)
        self.daemon = Daemon(
            self.fake,
            state_dir,
            controller_name="fixed",
            controller_factory=create_fixed_controller,
            fixed_clocks_mhz={GEN: 1200, TRAIN: 1500},
            clock=clock,
            job_policy=policy,
            **kw,
        )
        self.daemon.start()

    def open(self, *gpus: int, job_id: str = "job", incarnation: int | None = 1, node_rank: int = 0) -> str:
        job = JobModeSpec(incarnation, node_rank) if incarnation is not None else None
        spec = SessionSpec(
            job_id,
            0,
            0,
            tuple(GpuSelector(f"gpus[{i}]", index=g) for i, g in enumerate(gpus or (0,))),
            ExecutionMode.SYNC,
            GpuRole.BOTH,
            None,
            None,
            job=job,
        )
        return self.daemon.book.open_session(spec).session_id

    def phase(
        self,
        sid: str,
        iteration: int,
        mhz: int | None,
        purpose: DirectivePurpose | None = COMMITTED,
        *,
        kind: PhaseKind = GEN,
        epoch: int = 1,
        incarnation: int = 1,
        for_iteration: int | None = None,
        for_kind: PhaseKind | str | None = "same",
        send: bool = True,
        duration_s: float = 1.0,
    ) -> tuple[Any, Any]:
        """BeginPhase with a directive (``send=False``: none) and EndPhase; both answers."""
        got = ReceivedDirective(
            incarnation,
            epoch,
            iteration if for_iteration is None else for_iteration,
            kind if for_kind == "same" else for_kind,  # type: ignore[arg-type]
            mhz,
            purpose,
        )
        began = self.daemon.phases.begin_phase(sid, kind, iteration, None, got if send else None)
        self.clock.advance(duration_s)
        ended = self.daemon.phases.end_phase(sid, kind, iteration, WORK)
        return began, ended

    def locks(self, index: int = 0) -> list[int]:
        return self.fake.lock_history(index)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def node(tmp_path: Path, clock: ManualClock) -> Iterator[Node]:
    n = Node(tmp_path / "state", clock)
    yield n
    n.daemon.shutdown()


@pytest.fixture
def make_node(tmp_path: Path, clock: ManualClock) -> Iterator[Any]:
    nodes: list[Node] = []

    def make(policy: JobPolicy | None = None, **kw: Any) -> Node:
        n = Node(tmp_path / f"state{len(nodes)}", clock, policy, **kw)
        nodes.append(n)
        return n

    yield make
    for n in nodes:
        n.daemon.shutdown()


def verdict(began: Any) -> DirectiveVerdict:
    v: DirectiveVerdict = began.verdict
    return v


class TestOpening:
    def test_deny_refuses_job_mode_with_a_clear_message_and_claims_nothing(self, make_node: Any) -> None:
        n = make_node(JobPolicy(allowed=False))
        with pytest.raises(Conflict, match=r"does not allow job mode \(--job-mode deny\)"):
            n.open(0)
        assert n.daemon.reads.sessions() == ()
        n.open(0, incarnation=None)  # an ordinary session still opens

    def test_a_job_mode_sessions_own_controller_is_off(self, node: Node) -> None:
        """The fixed controller would lock 1200 MHz; a job-mode session with no directive runs at default."""
        sid = node.open(0)
        began, ended = node.phase(sid, 0, None, send=False)
        assert (verdict(began), began.target_sm_clock_mhz, began.state) == (
            V.MISSING,
            None,
            ControllerState.OFF,
        )
        assert node.fake.locked() == {}
        assert (ended.sm_clock_mhz, ended.verdict, ended.gpus) == (None, V.MISSING, 1)
        assert ended.energy_mj > 0  # metered all the same

    def test_an_older_incarnation_cannot_open_a_newer_one_can(self, node: Node) -> None:
        first = node.open(0, incarnation=3)
        node.daemon.book.close_session(first)
        with pytest.raises(Conflict, match="incarnation 2 is older than incarnation 3"):
            node.open(0, incarnation=2)
        node.daemon.book.close_session(node.open(0, incarnation=3))
        node.open(0, incarnation=4)

    def test_a_session_whose_tenancy_ended_takes_its_incarnations_with_it(self, node: Node) -> None:
        """A GPU that left its pod ends its session (the pod watcher): the next tenant of the socket may
        open the same job id at any incarnation."""
        sid = node.open(0, incarnation=2**63 - 1)
        assert node.daemon.book.end_session(sid, "GPU 0 left pod rl/pod1")
        node.daemon.book.close_session(node.open(0, incarnation=1))

    def test_incarnations_are_kept_per_job(self, node: Node) -> None:
        """(Per worker socket too: tests/security/test_job_mode_attacks.py, over real grant sockets.)"""
        node.open(0, job_id="a", incarnation=9)
        node.open(1, job_id="b", incarnation=1)
        with pytest.raises(Conflict):
            node.open(2, job_id="a", incarnation=8)

    def test_the_session_view_shows_job_mode(self, node: Node) -> None:
        sid = node.open(1, incarnation=7, node_rank=3)
        plain = node.open(2, incarnation=None)
        views = {v.session_id: v for v in node.daemon.reads.sessions()}
        assert views[sid].job == JobModeSpec(7, 3)
        assert views[plain].job is None


class TestVerdicts:
    def test_an_accepted_directive_sets_the_clock_and_reports_its_epoch(self, node: Node) -> None:
        sid = node.open(0, 1)
        began, ended = node.phase(sid, 0, 1500, COMMITTED, epoch=4)
        assert (verdict(began), began.verdict_detail, began.applied_epoch) == (V.ACCEPTED, "", 4)
        assert [(c.sm_clock_mhz, c.source) for c in began.clocks] == [(1500, ClockSource.SESSION)] * 2
        assert (ended.sm_clock_mhz, ended.applied_epoch, ended.verdict, ended.gpus) == (
            1500,
            4,
            V.ACCEPTED,
            2,
        )
        assert began.state is ControllerState.COMMITTED

    def test_states_follow_the_purpose(self, node: Node) -> None:
        sid = node.open(0)
        states = [
            node.phase(sid, i, mhz, purpose)[0].state
            for i, (mhz, purpose) in enumerate([(1500, TRIAL), (1200, COMMITTED), (None, CONTROL)])
        ]
        assert states == [ControllerState.EXPLORING, ControllerState.COMMITTED, ControllerState.BASELINE]

    def test_missing(self, node: Node) -> None:
        sid = node.open(0)
        began, _ = node.phase(sid, 0, None, send=False)
        assert verdict(began) is V.MISSING
        assert "no directive" in began.verdict_detail

    def test_stale_incarnation_after_a_newer_one_was_accepted(self, node: Node) -> None:
        sid = node.open(0, incarnation=1)
        node.phase(sid, 0, 1500, incarnation=2)  # a restarted controller takes over the session
        began, _ = node.phase(sid, 1, 1200, incarnation=1)
        assert verdict(began) is V.STALE_INCARNATION
        assert "incarnation 1 is older than incarnation 2" in began.verdict_detail
        with pytest.raises(Conflict):
            node.open(1, incarnation=1)

    def test_a_refused_directive_of_a_newer_incarnation_does_not_fence(self, node: Node) -> None:
        sid = node.open(0, incarnation=1)
        assert verdict(node.phase(sid, 0, 1501, incarnation=5)[0]) is V.OFF_GRID
        assert verdict(node.phase(sid, 1, 1500, incarnation=1)[0]) is V.ACCEPTED

    def test_stale_epoch_per_phase_kind_the_same_epoch_again_is_fine(self, node: Node) -> None:
        sid = node.open(0)
        node.phase(sid, 0, 1500, epoch=5)
        assert verdict(node.phase(sid, 0, 1200, kind=TRAIN, epoch=1)[0]) is V.ACCEPTED  # another kind
        assert verdict(node.phase(sid, 1, 1500, epoch=5)[0]) is V.ACCEPTED  # the same plan, resent
        began, _ = node.phase(sid, 2, 1200, epoch=4)
        assert verdict(began) is V.STALE_EPOCH
        assert "epoch 4 is older than epoch 5" in began.verdict_detail
        assert verdict(node.phase(sid, 3, 1200, epoch=1, incarnation=2)[0]) is V.ACCEPTED  # a new incarnation

    @pytest.mark.parametrize(("for_iteration", "for_kind"), [(7, "same"), (None, TRAIN), (None, None)])
    def test_wrong_phase(self, node: Node, for_iteration: int | None, for_kind: Any) -> None:
        sid = node.open(0)
        began, _ = node.phase(sid, 3, 1500, for_iteration=for_iteration, for_kind=for_kind)
        assert verdict(began) is V.WRONG_PHASE
        assert "not generation of iteration 3" in began.verdict_detail

    def test_bad_purpose(self, node: Node) -> None:
        sid = node.open(0)
        assert verdict(node.phase(sid, 0, 1500, None)[0]) is V.BAD_PURPOSE

    @pytest.mark.parametrize("mhz", [1501, 1, 599, 1995, 100_000])
    def test_off_grid_is_refused_never_snapped(self, node: Node, mhz: int) -> None:
        sid = node.open(0)
        began, _ = node.phase(sid, 0, mhz)
        assert (verdict(began), began.target_sm_clock_mhz) == (V.OFF_GRID, None)
        assert node.locks() == []

    def test_off_grid_means_every_gpu_of_the_session(
        self, make_node: Any, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        original = FakeGpuBackend.supported_sm_clocks_mhz

        def fewer(self: FakeGpuBackend, index: int) -> tuple[int, ...]:
            clocks = tuple(original(self, index))
            return tuple(c for c in clocks if c != 1515) if index == 1 else clocks

        monkeypatch.setattr(FakeGpuBackend, "supported_sm_clocks_mhz", fewer)
        n = make_node()
        assert verdict(n.phase(n.open(0), 0, 1515)[0]) is V.ACCEPTED
        assert verdict(n.phase(n.open(1, 2), 0, 1515)[0]) is V.OFF_GRID

    def test_the_default_governor_is_always_on_the_grid_and_above_the_floor(self, make_node: Any) -> None:
        n = make_node(JobPolicy(clock_floor_mhz=1900))
        assert verdict(n.phase(n.open(0), 0, None, CONTROL)[0]) is V.ACCEPTED

    def test_below_the_auto_floor(self, node: Node) -> None:
        sid = node.open(0)
        below = max(c for c in FAKE_SM_CLOCKS_MHZ if c < AUTO_FLOOR)
        above = min(c for c in FAKE_SM_CLOCKS_MHZ if c >= AUTO_FLOOR)
        began, _ = node.phase(sid, 0, below, TRIAL)
        assert (verdict(began), began.verdict_detail) == (
            V.BELOW_FLOOR,
            f"{below} MHz is below the floor of {AUTO_FLOOR} MHz",
        )
        assert verdict(node.phase(sid, 1, above, TRIAL)[0]) is V.ACCEPTED
        assert node.locks() == [above]

    def test_an_explicit_floor_and_no_floor(self, make_node: Any) -> None:
        high = make_node(JobPolicy(clock_floor_mhz=1200))
        assert verdict(high.phase(high.open(0), 0, 1185)[0]) is V.BELOW_FLOOR
        none = make_node(JobPolicy(clock_floor_mhz=0))
        assert verdict(none.phase(none.open(0), 0, 600)[0]) is V.ACCEPTED

    def test_the_first_failing_check_is_the_verdict(self, node: Node) -> None:
        sid = node.open(0, incarnation=2)
        node.phase(sid, 0, 1500, incarnation=2, epoch=3)
        checks: list[tuple[dict[str, Any], DirectiveVerdict]] = [
            ({"incarnation": 1, "epoch": 1, "for_iteration": 99}, V.STALE_INCARNATION),
            ({"incarnation": 2, "epoch": 1, "for_iteration": 99}, V.STALE_EPOCH),
            ({"incarnation": 2, "epoch": 3, "for_iteration": 99, "purpose": None}, V.WRONG_PHASE),
        ]
        for i, (kw, expected) in enumerate(checks, start=1):
            kw.setdefault("purpose", COMMITTED)
            began, _ = node.phase(sid, i, 1, **kw)  # 1 MHz: off the grid, below the floor as well
            assert verdict(began) is expected
        began, _ = node.phase(sid, 9, 1, None, incarnation=2, epoch=3)
        assert verdict(began) is V.BAD_PURPOSE
        began, _ = node.phase(sid, 10, 1, TRIAL, incarnation=2, epoch=3)
        assert verdict(began) is V.OFF_GRID

    def test_a_session_not_in_job_mode_ignores_a_directive(self, node: Node) -> None:
        sid = node.open(0, incarnation=None)
        began, ended = node.phase(sid, 0, 1800, TRIAL)
        assert (verdict(began), began.target_sm_clock_mhz) == (V.NOT_JOB_MODE, 1200)  # the fixed controller's
        assert (ended.verdict, ended.sm_clock_mhz, ended.applied_epoch) == (V.NOT_JOB_MODE, 1200, 0)
        assert node.locks() == [1200]


class TestTrialBudget:
    def test_trials_beyond_the_budget_are_refused_and_the_window_refills(self, make_node: Any) -> None:
        n = make_node(JobPolicy(max_trials=3, trial_window_s=600.0))
        sid = n.open(0)

        def trials(start: int, count: int) -> list[DirectiveVerdict]:
            return [
                verdict(n.phase(sid, i, 1200 + 15 * i, TRIAL, epoch=i, duration_s=0.0)[0])
                for i in range(start, start + count)
            ]

        assert trials(0, 5) == [V.ACCEPTED] * 3 + [V.TRIAL_BUDGET] * 2
        assert n.locks() == [1200, 1215, 1230]  # the refused trials never reached the GPU
        n.clock.advance(599.9)
        assert trials(5, 1) == [V.TRIAL_BUDGET]
        n.clock.advance(0.1)  # the window moved past the three trials
        assert trials(6, 4) == [V.ACCEPTED] * 3 + [V.TRIAL_BUDGET]

    def test_committed_and_control_directives_and_default_trials_are_not_budgeted(
        self, make_node: Any
    ) -> None:
        n = make_node(JobPolicy(max_trials=1))
        sid = n.open(0)
        got = [
            verdict(n.phase(sid, i, mhz, purpose)[0])
            for i, (mhz, purpose) in enumerate(
                [
                    (1200, TRIAL),
                    (1500, COMMITTED),
                    (None, CONTROL),
                    (None, TRIAL),
                    (1350, COMMITTED),
                    (1215, TRIAL),
                ]
            )
        ]
        assert got == [V.ACCEPTED] * 5 + [V.TRIAL_BUDGET]

    def test_the_budget_is_per_session(self, make_node: Any) -> None:
        n = make_node(JobPolicy(max_trials=1))
        a, b = n.open(0, job_id="a"), n.open(1, job_id="b")
        assert verdict(n.phase(a, 0, 1200, TRIAL)[0]) is V.ACCEPTED
        assert verdict(n.phase(b, 0, 1200, TRIAL)[0]) is V.ACCEPTED
        assert verdict(n.phase(a, 1, 1215, TRIAL)[0]) is V.TRIAL_BUDGET


class TestFallback:
    def test_the_last_accepted_committed_clock_of_that_kind(self, node: Node) -> None:
        sid = node.open(0)
        node.phase(sid, 0, 1500, COMMITTED, epoch=2)
        node.phase(sid, 0, 1200, COMMITTED, kind=TRAIN, epoch=2)
        node.phase(sid, 1, 1350, COMMITTED, epoch=3)
        began, ended = node.phase(sid, 2, None, send=False)
        assert (began.target_sm_clock_mhz, began.applied_epoch, began.state) == (
            1350,
            3,
            ControllerState.COMMITTED,
        )
        assert (ended.sm_clock_mhz, ended.applied_epoch, ended.verdict) == (1350, 3, V.MISSING)
        began, _ = node.phase(sid, 2, 1501, kind=TRAIN, epoch=2)
        assert (verdict(began), began.target_sm_clock_mhz, began.applied_epoch) == (V.OFF_GRID, 1200, 2)

    def test_else_the_default_governor(self, node: Node) -> None:
        sid = node.open(0)
        began, _ = node.phase(sid, 0, 1501)
        assert (began.target_sm_clock_mhz, began.applied_epoch, began.state) == (None, 0, ControllerState.OFF)
        assert node.fake.locked() == {}

    def test_never_a_trial(self, node: Node) -> None:
        sid = node.open(0)
        began, _ = node.phase(sid, 0, 1200, TRIAL, epoch=1)
        assert began.clocks[0].requested_sm_clock_mhz == 1200
        assert node.locks() == [1200]
        began, _ = node.phase(sid, 1, None, send=False)
        assert began.target_sm_clock_mhz is None
        assert began.clocks[0].requested_sm_clock_mhz is None
        assert node.locks() == [1200]
        node.phase(sid, 2, 1500, COMMITTED, epoch=2)
        node.phase(sid, 3, 1215, TRIAL, epoch=3)
        began, _ = node.phase(sid, 4, 1215, TRIAL, epoch=2)  # stale
        assert (verdict(began), began.target_sm_clock_mhz) == (V.STALE_EPOCH, 1500)
        assert node.locks()[-1] == 1500

    def test_a_committed_default_makes_the_fallback_the_default(self, node: Node) -> None:
        sid = node.open(0)
        node.phase(sid, 0, 1500, COMMITTED, epoch=1)
        node.phase(sid, 1, None, COMMITTED, epoch=2)
        began, _ = node.phase(sid, 2, None, send=False)
        assert (began.target_sm_clock_mhz, began.applied_epoch) == (None, 0)


class TestRateLimit:
    def drain(self, n: Node, sid: str, start: int, phases: int) -> int:
        """Alternate committed clocks for ``phases`` phases that take no time (the rate limit's bucket does
        not refill; each phase takes two tokens, its lock and its end's release); the next iteration."""
        for i in range(start, start + phases):
            began, _ = n.phase(sid, i, 1500 if i % 2 else 1515, COMMITTED, epoch=i, duration_s=0.0)
            assert verdict(began) is V.ACCEPTED
        return start + phases

    def test_a_change_the_rate_limit_refuses_falls_back_to_the_default(self, node: Node) -> None:
        """The lock ended with the last phase, so the committed clock would be a change as well."""
        sid = node.open(0)
        nxt = self.drain(node, sid, 1, 10)  # the burst: 10 locks and 10 releases
        began, _ = node.phase(sid, nxt, 1350, COMMITTED, epoch=nxt, duration_s=0.0)
        assert (verdict(began), began.target_sm_clock_mhz, began.applied_epoch) == (V.RATE_LIMITED, None, 0)
        assert "rate limit refuses 1350 MHz" in began.verdict_detail
        assert 1350 not in node.locks()
        assert node.fake.locked() == {}
        node.clock.advance(1.0)  # ten changes a second come back
        assert verdict(node.phase(sid, nxt + 1, 1350, COMMITTED, epoch=nxt + 1)[0]) is V.ACCEPTED

    def test_a_refused_change_never_leaves_a_trial_clock(self, node: Node) -> None:
        sid = node.open(0)
        node.phase(sid, 0, 1500, COMMITTED, epoch=1, duration_s=0.0)
        for i in range(1, 10):  # the rest of the burst, on trials
            began, _ = node.phase(sid, i, 1200 if i % 2 else 1215, TRIAL, epoch=1 + i, duration_s=0.0)
            assert verdict(began) is V.ACCEPTED
        assert node.locks()[-1] in (1200, 1215)  # the last trial locked; no token left
        began, _ = node.phase(sid, 21, 1350, COMMITTED, epoch=30, duration_s=0.0)
        assert (verdict(began), began.target_sm_clock_mhz, began.applied_epoch) == (V.RATE_LIMITED, None, 0)
        assert node.fake.locked() == {}  # a reset is never held back

    def test_pins_win_and_no_change_is_limited_under_a_pin(self, node: Node) -> None:
        sid = node.open(0)
        node.daemon.admin.pin([GpuSelector("gpus[0]", index=0)], 990, 0, 0.0, "maintenance")
        for i in range(30):
            began, ended = node.phase(sid, i, 1500 if i % 2 else 1515, COMMITTED, epoch=i, duration_s=0.0)
            assert verdict(began) is V.ACCEPTED
            assert [(c.sm_clock_mhz, c.source) for c in began.clocks] == [(990, ClockSource.ADMIN_PIN)]
            assert ended.sm_clock_mhz == 990  # what held, not what was asked
        assert set(node.locks()) == {990}


class TestRecords:
    def test_decisions_carry_the_directive_and_the_verdict_before_and_after_close(self, node: Node) -> None:
        sid = node.open(0)
        node.phase(sid, 0, 1500, COMMITTED, epoch=2)
        node.phase(sid, 1, 1501, TRIAL, epoch=3)
        node.phase(sid, 2, None, send=False)

        def seen() -> list[tuple[int, DirectiveVerdict | None, int | None, int | None]]:
            return [
                (
                    v.decision.iteration,
                    v.verdict,
                    v.decision.sm_clock_mhz,
                    v.directive.epoch if v.directive else None,
                )
                for v in node.daemon.reads.decisions(sid)
            ]

        expected = [(0, V.ACCEPTED, 1500, 2), (1, V.OFF_GRID, 1500, 3), (2, V.MISSING, 1500, None)]
        assert seen() == expected
        views = node.daemon.reads.decisions(sid)
        assert views[0].directive == ReceivedDirective(1, 2, 0, GEN, 1500, COMMITTED)
        assert "accepted: committed 1500 MHz (incarnation 1, epoch 2)" in views[0].decision.reason
        assert "refused (off_grid" in views[1].decision.reason
        node.daemon.book.close_session(sid)
        assert seen() == expected

    def test_decisions_of_a_plain_session_have_no_verdict(self, node: Node) -> None:
        sid = node.open(0, incarnation=None)
        node.phase(sid, 0, 1500)
        assert [(v.verdict, v.directive) for v in node.daemon.reads.decisions(sid)] == [(None, None)]

    def test_every_verdict_is_published_and_counted_in_metrics(self, node: Node) -> None:
        records: list[DirectiveRecord] = []
        node.daemon.events.subscribe(on_directive=records.append)
        metrics = EerlMetrics(DaemonMetricsSource(node.daemon), hostname="node-a")
        unsubscribe = subscribe(node.daemon, metrics)
        sid = node.open(0, node_rank=2)
        node.phase(sid, 0, 1500)
        node.phase(sid, 1, 1501)
        node.phase(sid, 2, 1515)
        node.phase(sid, 2, 1200, kind=TRAIN)
        assert [(r.node_rank, r.verdict, r.sm_clock_mhz) for r in records] == [
            (2, V.ACCEPTED, 1500),
            (2, V.OFF_GRID, 1500),
            (2, V.ACCEPTED, 1515),
            (2, V.ACCEPTED, 1200),
        ]

        def count(v: str, kind: str) -> float | None:
            return metrics.registry.get_sample_value(
                "eerl_job_directives_total", {"verdict": v, "kind": kind, "Hostname": "node-a"}
            )

        assert (
            count("accepted", "generation"),
            count("off_grid", "generation"),
            count("accepted", "training"),
        ) == (
            2.0,
            1.0,
            1.0,
        )
        unsubscribe()
        assert node.daemon.events.directive_subscribers == 1  # the test's own

    def test_gpu_infos_carry_the_supported_grid(self, node: Node) -> None:
        assert node.daemon.reads.gpu_status()[0].info.supported_sm_clocks_mhz == FAKE_SM_CLOCKS_MHZ


class TestPolicy:
    def test_the_auto_floor_is_a_fraction_of_the_top_clock(self) -> None:
        assert JobPolicy().floor_mhz((300, 1000, 1980)) == AUTO_FLOOR == 792
        assert JobPolicy(clock_floor_mhz=900).floor_mhz((300, 1980)) == 900
        assert JobPolicy().floor_mhz(()) == 0

    def test_the_incarnation_book_is_bounded(self) -> None:
        book = IncarnationBook(capacity=2)
        book.accept(("s", "a"), 5)
        book.accept(("s", "b"), 1)
        book.accept(("s", "a"), 4)  # never goes back; a is now the most recently used
        book.accept(("s", "c"), 1)
        assert (book.newest(("s", "a")), book.newest(("s", "b")), book.newest(("s", "c"))) == (5, None, 1)

    def test_the_jobs_of_one_socket_never_push_out_another_sockets(self) -> None:
        """A user of another grant who opens job after job cannot unfence a job by having it dropped."""
        book = IncarnationBook(capacity=2)
        book.accept(("victim", "job-a"), 7)
        for n in range(100):
            book.accept(("attacker", f"job-{n}"), 1)
        assert book.newest(("victim", "job-a")) == 7
        assert (book.newest(("attacker", "job-0")), book.newest(("attacker", "job-99"))) == (None, 1)

    def test_received_directive_of_a_directive(self) -> None:
        d = Directive(2, 3, 4, GEN, None, CONTROL)
        assert ReceivedDirective.of(d) == ReceivedDirective(2, 3, 4, GEN, None, CONTROL)


class TestConfig:
    def test_defaults(self) -> None:
        config = Config()
        assert (
            config.job_mode,
            config.job_clock_floor_mhz,
            config.job_max_trials,
            config.job_trial_window_s,
        ) == (
            "allow",
            None,
            64,
            600.0,
        )

    def test_flags(self) -> None:
        config = load_config(
            [
                "--job-mode",
                "deny",
                "--job-clock-floor-mhz",
                "900",
                "--job-max-trials",
                "10",
                "--job-trial-window-s",
                "60",
            ]
        )
        assert (
            config.job_mode,
            config.job_clock_floor_mhz,
            config.job_max_trials,
            config.job_trial_window_s,
        ) == (
            "deny",
            900,
            10,
            60.0,
        )
        assert load_config(["--job-clock-floor-mhz", "auto"]).job_clock_floor_mhz is None

    def test_config_file_keys(self, tmp_path: Path) -> None:
        path = tmp_path / "eerld.toml"
        path.write_text(
            'job_mode = "deny"\njob_clock_floor_mhz = 1000\njob_max_trials = 5\njob_trial_window_s = 30\n'
        )
        path.chmod(0o644)
        config = load_config(["--config", str(path)])
        assert (
            config.job_mode,
            config.job_clock_floor_mhz,
            config.job_max_trials,
            config.job_trial_window_s,
        ) == (
            "deny",
            1000,
            5,
            30.0,
        )

    @pytest.mark.parametrize(
        ("flag", "value", "message"),
        [
            ("--job-mode", "maybe", "--job-mode: expected one of allow, deny"),
            ("--job-clock-floor-mhz", "-1", "--job-clock-floor-mhz: must be between 0 and 10000"),
            ("--job-clock-floor-mhz", "low", "--job-clock-floor-mhz: expected an integer"),
            ("--job-max-trials", "-1", "--job-max-trials: must be between 0 and 100000"),
            ("--job-trial-window-s", "0", "--job-trial-window-s: must be a finite number between 1"),
        ],
    )
    def test_bad_values_are_config_errors(self, flag: str, value: str, message: str) -> None:
        with pytest.raises(ConfigError, match=message):
            load_config([flag, value])


class TestOverTheSockets:
    """What the wire adds; the conftest's daemon (``running_daemon``, fixed controller, manual clock)."""

    def open(self, phase: pb_grpc.PhaseServiceStub, **job: Any) -> pb.OpenSessionResponse:
        request = pb.OpenSessionRequest(
            job_id="wire",
            gpus=[pb.GpuRef(index=0), pb.GpuRef(index=1)],
            job_mode=pb.JobMode(enabled=True, **job),
        )
        reply: pb.OpenSessionResponse = phase.OpenSession(request)
        return reply

    def test_open_session_lists_each_gpus_grid_from_the_floor_up_in_job_mode(
        self, phase: pb_grpc.PhaseServiceStub
    ) -> None:
        reply = self.open(phase, incarnation=1)
        plain = phase.OpenSession(pb.OpenSessionRequest(job_id="plain", gpus=[pb.GpuRef(index=2)]))
        allowed = [c for c in FAKE_SM_CLOCKS_MHZ if c >= AUTO_FLOOR]
        assert [list(g.supported_sm_clocks_mhz) for g in reply.gpus] == [allowed] * 2
        assert list(plain.gpus[0].supported_sm_clocks_mhz) == list(FAKE_SM_CLOCKS_MHZ)
        assert reply.gpus[0].min_sm_clock_mhz == FAKE_SM_CLOCKS_MHZ[0]  # the hardware's, as ever

    def test_a_phase_on_the_wire(self, phase: pb_grpc.PhaseServiceStub) -> None:
        sid = self.open(phase, incarnation=2, node_rank=1).session_id
        order = pb.Directive(
            incarnation=2,
            epoch=5,
            iteration=0,
            kind=pb.PHASE_KIND_GENERATION,
            sm_clock_mhz=1500,
            purpose=pb.DIRECTIVE_PURPOSE_TRIAL,
        )
        began = phase.BeginPhase(
            pb.BeginPhaseRequest(session_id=sid, kind=pb.PHASE_KIND_GENERATION, iteration=0, directive=order)
        )
        ended = phase.EndPhase(
            pb.EndPhaseRequest(
                session_id=sid, kind=pb.PHASE_KIND_GENERATION, iteration=0, workload=pb.Workload(tokens=10)
            )
        )
        assert (began.verdict, began.verdict_detail, began.applied_epoch, began.target_sm_clock_mhz) == (
            pb.DIRECTIVE_VERDICT_ACCEPTED,
            "",
            5,
            1500,
        )
        assert (ended.sm_clock_mhz, ended.applied_epoch, ended.verdict, ended.gpus) == (
            1500,
            5,
            pb.DIRECTIVE_VERDICT_ACCEPTED,
            2,
        )

    @pytest.mark.parametrize(
        ("kind", "purpose", "expected"),
        [
            (pb.PHASE_KIND_GENERATION, pb.DIRECTIVE_PURPOSE_UNSPECIFIED, pb.DIRECTIVE_VERDICT_BAD_PURPOSE),
            (pb.PHASE_KIND_GENERATION, 99, pb.DIRECTIVE_VERDICT_BAD_PURPOSE),
            (pb.PHASE_KIND_UNSPECIFIED, pb.DIRECTIVE_PURPOSE_COMMITTED, pb.DIRECTIVE_VERDICT_WRONG_PHASE),
            (77, pb.DIRECTIVE_PURPOSE_COMMITTED, pb.DIRECTIVE_VERDICT_WRONG_PHASE),
        ],
    )
    def test_an_unknown_kind_or_purpose_is_a_verdict_not_an_error(
        self, phase: pb_grpc.PhaseServiceStub, kind: int, purpose: int, expected: int
    ) -> None:
        sid = self.open(phase, incarnation=1).session_id
        order = pb.Directive(incarnation=1, epoch=1, iteration=0, sm_clock_mhz=1500)
        order.kind = kind  # type: ignore[assignment]
        order.purpose = purpose  # type: ignore[assignment]
        began = phase.BeginPhase(
            pb.BeginPhaseRequest(session_id=sid, kind=pb.PHASE_KIND_GENERATION, iteration=0, directive=order)
        )
        assert (began.verdict, began.target_sm_clock_mhz) == (expected, 0)

    def test_absurd_numbers_are_invalid_arguments(self, phase: pb_grpc.PhaseServiceStub) -> None:
        sid = self.open(phase, incarnation=1).session_id
        order = pb.Directive(incarnation=1, epoch=1, iteration=10**13, kind=pb.PHASE_KIND_GENERATION)
        with pytest.raises(grpc.RpcError) as e:
            phase.BeginPhase(
                pb.BeginPhaseRequest(
                    session_id=sid, kind=pb.PHASE_KIND_GENERATION, iteration=0, directive=order
                )
            )
        assert e.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        assert "directive.iteration" in (e.value.details() or "")

    def test_a_plain_session_gets_not_job_mode(self, phase: pb_grpc.PhaseServiceStub) -> None:
        sid = phase.OpenSession(pb.OpenSessionRequest(job_id="plain", gpus=[pb.GpuRef(index=2)])).session_id
        began = phase.BeginPhase(
            pb.BeginPhaseRequest(session_id=sid, kind=pb.PHASE_KIND_GENERATION, iteration=0)
        )
        assert (began.verdict, began.target_sm_clock_mhz) == (pb.DIRECTIVE_VERDICT_NOT_JOB_MODE, 1200)

    def test_sessions_decisions_and_status_on_the_admin_socket(
        self, phase: pb_grpc.PhaseServiceStub, admin: pb_grpc.AdminServiceStub
    ) -> None:
        sid = self.open(phase, incarnation=4, node_rank=2).session_id
        order = pb.Directive(
            incarnation=4,
            epoch=1,
            iteration=0,
            kind=pb.PHASE_KIND_GENERATION,
            sm_clock_mhz=1501,
            purpose=pb.DIRECTIVE_PURPOSE_TRIAL,
        )
        phase.BeginPhase(
            pb.BeginPhaseRequest(session_id=sid, kind=pb.PHASE_KIND_GENERATION, iteration=0, directive=order)
        )
        sessions = admin.ListSessions(pb.ListSessionsRequest()).sessions
        decisions = admin.GetDecisions(pb.GetDecisionsRequest(session_id=sid)).decisions
        status = admin.Status(pb.StatusRequest())
        assert [(s.job_mode.enabled, s.job_mode.incarnation, s.job_mode.node_rank) for s in sessions] == [
            (True, 4, 2)
        ]
        assert [(d.verdict, d.directive.sm_clock_mhz, d.directive.epoch) for d in decisions] == [
            (pb.DIRECTIVE_VERDICT_OFF_GRID, 1501, 1)
        ]
        assert list(status.gpus[0].info.supported_sm_clocks_mhz) == list(FAKE_SM_CLOCKS_MHZ)


class TestEerlctl:
    """eerlctl's JSON and tables show job mode and the verdicts (eerlctl/replies.py, eerlctl/render.py)."""

    def test_sessions_show_job_mode_only_where_there_is_one(self) -> None:
        job = pb.SessionInfo(
            session_id="a" * 32, job_id="j", job_mode=pb.JobMode(enabled=True, incarnation=3)
        )
        job.job_mode.node_rank = 5
        plain = pb.SessionInfo(session_id="b" * 32, job_id="p")
        assert session_dict(job)["job_mode"] == {"incarnation": 3, "node_rank": 5}
        assert session_dict(plain)["job_mode"] is None
        table = sessions_table([session_dict(job), session_dict(plain)])
        assert "JOB MODE" in table.splitlines()[0]
        assert "incarnation 3, node 5" in table
        assert "JOB MODE" not in sessions_table([session_dict(plain)])

    def test_decisions_show_the_verdict_and_the_directive(self) -> None:
        refused = pb.Decision(
            session_id="s",
            kind=pb.PHASE_KIND_GENERATION,
            iteration=4,
            verdict=pb.DIRECTIVE_VERDICT_OFF_GRID,
            directive=pb.Directive(epoch=3, sm_clock_mhz=1501, purpose=pb.DIRECTIVE_PURPOSE_TRIAL),
            reason="job directive refused",
        )
        missing = pb.Decision(session_id="s", iteration=5, verdict=pb.DIRECTIVE_VERDICT_MISSING)
        own = pb.Decision(session_id="t", iteration=1, reason="candidate")
        rows = [decision_dict(d) for d in (refused, missing, own)]
        assert (
            rows[0]["verdict"],
            rows[0]["directive"]["sm_clock_mhz"],
            rows[0]["directive"]["purpose"],
        ) == (
            "off_grid",
            1501,
            "trial",
        )
        assert (rows[1]["verdict"], rows[1]["directive"]) == ("missing", None)
        assert (rows[2]["verdict"], rows[2]["directive"]) == (None, None)
        table = decisions_table(rows)
        assert "DIRECTIVE" in table.splitlines()[0]
        assert "off_grid: trial 1501 MHz e3" in table
        assert "DIRECTIVE" not in decisions_table(rows[2:])


def test_a_job_session_that_could_not_open_raises_no_incarnation(node: Node) -> None:
    node.open(0, job_id="other", incarnation=None)
    with pytest.raises(Conflict, match="GPU 0 is held"):
        node.open(0, incarnation=9)
    node.open(1, incarnation=1)
