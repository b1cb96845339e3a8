"""Refine and re-tune: the refine's rule and pace, and the answers to drift and control-phase misses."""

from __future__ import annotations

import pytest
from eerl.control.monitor import RatioDrift, WorkloadDrift, WorkloadStep
from eerl.control.plan import Planner
from eerl.control.retune import (
    RefineMove,
    judge_refine_outcome,
    refine,
    refine_interval,
    refine_move,
    respond_to_control_miss,
    respond_to_drift,
    start_retune,
    take_refine_turn,
)
from eerl.control.slack import PeerSlack
from eerl.control.state import KindTrack, MonitorState, RefinePace
from eerl.phases import ControllerState, PhaseKind
from hypothesis import given
from hypothesis import strategies as st

from tests.client.control.parts import CONFIG, GRID, add_trials, allocation, default_phase, fitted_track

COMMITTED = {PhaseKind.GENERATION: 1035, PhaseKind.TRAINING: 1485}


def _move(current_throughput: float, gain: float, **best: int | None) -> RefineMove | None:
    clocks = {k.value: c for k, c in COMMITTED.items()} | best
    return refine_move(
        allocation(current_throughput, 0.8, **{k.value: c for k, c in COMMITTED.items()}),
        allocation(0.95, 0.8 - gain, **clocks),
        COMMITTED,
        target=0.95,
        planned_threshold=0.95,
        config=CONFIG,
    )


def _committed_with_a_cheaper_neighbour(last_default_iteration: int) -> KindTrack:
    """Committed at 1305 MHz (10% saved, much throughput to spare); trials at 1350 MHz save 20%."""
    track = fitted_track(PhaseKind.TRAINING, ControllerState.COMMITTED)
    track.committed_mhz = 1305
    add_trials(track, 1305, time_ratio=1.0, energy_ratio=0.9, count=6, iteration=80)
    add_trials(track, 1350, time_ratio=1.0, energy_ratio=0.8, count=6, iteration=86)
    track.baseline.last_default_iteration = last_default_iteration
    return track


class TestRefineRule:
    def test_a_commit_below_the_threshold_moves_the_kinds_whose_best_clock_differs(self) -> None:
        """Short by more than 0.005, the commit moves even without an energy gain; only generation moves."""
        move = _move(0.94, 0.0, generation=1080)
        assert move is not None
        assert move.moving == (PhaseKind.GENERATION,)
        assert move.short
        assert move.reason.startswith("refine: the committed allocation is below the threshold")

    def test_surplus_and_a_clear_gain_move_a_commit_for_energy(self) -> None:
        """Throughput beyond the planned threshold plus 0.003 and a 1% gain move the commit."""
        move = _move(0.97, 0.01, training=1440)
        assert move is not None
        assert not move.short
        assert "1.0% more energy than a neighbour" in move.reason

    def test_without_surplus_energy_alone_moves_nothing(self) -> None:
        """Within 0.003 of the threshold, a neighbour saving 5% more does not move the commit (it would
        flap)."""
        assert _move(0.952, 0.05, training=1440) is None

    def test_a_small_gain_moves_nothing(self) -> None:
        """With surplus, a gain below 0.4% is not worth a re-tune."""
        assert _move(0.97, 0.003, training=1440) is None

    @given(throughput=st.floats(0.5, 1.0), gain=st.floats(-0.5, 0.5))
    def test_nothing_moves_when_the_best_allocation_is_the_commit(
        self, throughput: float, gain: float
    ) -> None:
        """Whatever the ratios, a best allocation on the committed clocks moves no kind."""
        assert _move(throughput, gain) is None


def _turn_after(pace: RefinePace, threshold: float, asked: list[int]) -> int:
    """Committed phases until the refine's turn while the plan asks ``threshold`` (each ask noted)."""
    monitor = MonitorState(since_refine=0)
    phases = 0

    def planned() -> float:
        asked.append(monitor.since_refine)
        return threshold

    while phases < 1000:
        phases += 1
        monitor.since_refine += 1
        if take_refine_turn(monitor, pace, CONFIG, planned):
            return phases
    return phases


class TestRefinePace:
    def test_the_refine_takes_its_turn_every_interval(self) -> None:
        """After 20 committed phases the refine runs and the count restarts."""
        monitor, pace = MonitorState(since_refine=19), RefinePace()
        assert not take_refine_turn(monitor, pace, CONFIG, lambda: 0.95)
        monitor.since_refine = 20
        assert take_refine_turn(monitor, pace, CONFIG, lambda: 0.95)
        assert monitor.since_refine == 0

    def test_a_backed_off_refine_comes_at_the_plain_interval_once_the_plan_outgrows_the_commit(self) -> None:
        """Backed off fourfold, a commit that expected 0.978 waits 80 phases while the plan asks 0.980; once
        the run owes and the plan asks 0.985 (more than ``refine_surplus`` above it), 20 phases."""
        pace = RefinePace(backoff=4, committed_throughput=0.978)
        asked: list[int] = []

        assert _turn_after(pace, 0.980, asked) == 80
        assert asked == [20, 40, 60]  # once per plain interval, not per phase
        assert _turn_after(pace, 0.985, asked) == 20
        pace.committed_throughput = None  # nothing committed yet: the backed-off interval holds
        assert _turn_after(pace, 0.985, asked) == 80

    def test_an_energy_move_that_gains_nothing_doubles_the_interval_up_to_the_cap(self) -> None:
        """Each re-tune for energy that commits no better doubles the interval, at most eight times."""
        pace = RefinePace()
        for expected in (2, 4, 8, 8):
            pace.from_energy = 0.8
            judge_refine_outcome(pace, allocation(0.95, 0.799), CONFIG)
            assert pace.backoff == expected
            assert pace.from_energy is None
        assert refine_interval(pace, CONFIG) == 160

    def test_an_energy_move_that_gains_resets_the_pace(self) -> None:
        """A re-tune that commits clearly cheaper brings the interval back to normal."""
        pace = RefinePace(backoff=4, from_energy=0.8)
        judge_refine_outcome(pace, allocation(0.95, 0.79), CONFIG)
        assert pace.backoff == 1

    def test_a_commit_not_started_by_an_energy_move_leaves_the_pace(self) -> None:
        """Commits of a search or of a short commit's move are not the refine's outcome."""
        pace = RefinePace(backoff=4)
        judge_refine_outcome(pace, allocation(0.95, 0.9), CONFIG)
        assert pace.backoff == 4


class TestRefine:
    def test_a_cheaper_neighbour_moves_the_commit_into_a_local_retune(self) -> None:
        """With surplus and a clearly cheaper neighbour, the kind re-tunes around its clock on the model."""
        track, pace = _committed_with_a_cheaper_neighbour(last_default_iteration=95), RefinePace()
        planner = Planner(0.95, CONFIG, GRID, PeerSlack(active=False))
        reason = refine([track], planner, pace, GRID, iteration=100, config=CONFIG)
        assert reason is not None
        assert reason.startswith("refine: the committed allocation is ")
        assert track.state is ControllerState.RETUNING
        assert (track.search.window, track.search.coarse, track.search.coarse_stopped) == (
            (1170, 1440),
            [],
            True,
        )
        assert track.search.epoch_iteration == 100 - 3 * CONFIG.refine_interval_phases
        assert pace.from_energy is not None

    def test_a_stale_baseline_asks_for_a_control_phase_before_moving(self) -> None:
        """A last default phase older than a refine interval: control phase first, refine right after."""
        track = _committed_with_a_cheaper_neighbour(last_default_iteration=50)
        planner = Planner(0.95, CONFIG, GRID, PeerSlack(active=False))
        assert refine([track], planner, RefinePace(), GRID, iteration=100, config=CONFIG) is None
        assert track.state is ControllerState.COMMITTED
        assert track.monitor.since_control == CONFIG.control_interval_phases
        assert track.monitor.since_refine == CONFIG.refine_interval_phases - 2

    def test_nothing_is_refined_while_a_kind_still_searches(self) -> None:
        """The allocation is re-checked only when every kind holds its commit."""
        track = _committed_with_a_cheaper_neighbour(last_default_iteration=95)
        searching = fitted_track(PhaseKind.GENERATION, ControllerState.EXPLORING)
        planner = Planner(0.95, CONFIG, GRID, PeerSlack(active=False))
        assert refine([searching, track], planner, RefinePace(), GRID, iteration=100, config=CONFIG) is None
        assert track.state is ControllerState.COMMITTED


class TestResponses:
    def test_gradual_drift_asks_for_a_refine_right_after_the_control_phase(self) -> None:
        """The kind stays committed; the refine comes next phase, at the normal pace."""
        track, pace = fitted_track(state=ControllerState.COMMITTED), RefinePace(backoff=8)
        reason = respond_to_drift(track, WorkloadDrift(0), pace, CONFIG, 0)
        assert reason == "workload left its band: control phase, then re-check the allocation"
        assert track.state is ControllerState.COMMITTED
        assert track.monitor.since_refine == CONFIG.refine_interval_phases - 1
        assert pace.backoff == 1

    @pytest.mark.parametrize("drift", [WorkloadStep(0, 1.0), RatioDrift(0.1, None)])
    def test_a_step_or_ratio_drift_rebaselines_then_retunes(self, drift: WorkloadStep | RatioDrift) -> None:
        """The kind re-tunes after three fresh default phases."""
        track = fitted_track(state=ControllerState.COMMITTED)
        assert respond_to_drift(track, drift, RefinePace(), CONFIG, 0) == drift.reason
        assert track.state is ControllerState.RETUNING
        assert track.baseline.rebaseline_left == CONFIG.rebaseline_phases

    def test_a_confirmed_control_miss_counts_as_the_first_rebaseline_phase(self) -> None:
        """The confirming phase is learned outright; two more default phases follow."""
        track = fitted_track(state=ControllerState.COMMITTED)
        reason = respond_to_control_miss(
            track, default_phase(PhaseKind.TRAINING, 9, duration_s=12.0), 0.2, CONFIG
        )
        assert reason == "two control phases off by +20.0%: re-baseline, then re-tune"
        assert track.state is ControllerState.RETUNING
        assert track.baseline.rebaseline_left == CONFIG.rebaseline_phases - 1
        assert track.baseline.predictor.count == 5

    def test_a_retune_searches_around_the_commit_with_trials_from_now_on(self) -> None:
        """After a re-baseline only the newest trials count, and the centre and edges are tried first."""
        track, pace = fitted_track(state=ControllerState.RETUNING), RefinePace(backoff=4, from_energy=0.8)
        track.committed_mhz = 1305
        add_trials(track, 1305, time_ratio=1.0, energy_ratio=0.8, count=10, iteration=0)
        start_retune(track, GRID, pace, 10)
        assert len(track.curve) == 1  # iteration 9 on
        assert track.search.coarse == [1305, 1170, 1440]
        assert track.search.epoch_iteration == 10
        assert (pace.backoff, pace.from_energy) == (1, None)

    def test_a_kind_committed_at_the_default_explores_again_from_the_top(self) -> None:
        """With no clock to be local around, the re-tune is a new coarse descent."""
        track = fitted_track(state=ControllerState.RETUNING)
        start_retune(track, GRID, RefinePace(), 10)
        assert track.state is ControllerState.EXPLORING
        assert track.search.coarse == GRID.coarse_schedule()
