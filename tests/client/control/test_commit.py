"""The commit: when the searching kinds hold their allocation, which kind fails it, what it resets."""

from __future__ import annotations

import pytest
from eerl.control.baseline import learn_default
from eerl.control.between import BetweenWork
from eerl.control.commit import commit_track, failing_kind, measured_enough, ready_to_plan, try_commit
from eerl.control.plan import Planner
from eerl.control.slack import PeerSlack
from eerl.control.state import KindTrack, RefinePace
from eerl.phases import ControllerState, PhaseKind

from tests.client.control.parts import CONFIG, GRID, add_trials, allocation, default_phase, fitted_track

PLANNER = Planner(0.95, CONFIG, GRID, PeerSlack(active=False))


def _searching(
    kind: PhaseKind = PhaseKind.TRAINING, state: ControllerState = ControllerState.EXPLORING
) -> KindTrack:
    track = fitted_track(kind, state)
    track.search.coarse_stopped = True
    return track


class TestCommit:
    def test_no_plan_while_coarse_trials_or_a_rebaseline_remain(self) -> None:
        """The search commits nothing before its coarse trials and default phases are done."""
        track = _searching()
        assert ready_to_plan([track])
        track.search.coarse, track.search.coarse_stopped = [1305], False
        assert not ready_to_plan([track])
        track.search.coarse_stopped = True
        track.baseline.rebaseline_left = 1
        assert not ready_to_plan([track])

    def test_an_allocated_clock_needs_its_trials_since_the_search_began(self) -> None:
        """Three trials at the allocated clock from the search's epoch on; older ones do not count."""
        track = _searching()
        plan = allocation(0.95, 0.8, training=1305)
        add_trials(track, 1305, time_ratio=1.0, energy_ratio=0.8, count=2, iteration=10)
        assert not measured_enough([track], plan, CONFIG)
        add_trials(track, 1305, time_ratio=1.0, energy_ratio=0.8, count=1, iteration=20)
        assert measured_enough([track], plan, CONFIG)
        track.search.epoch_iteration = 11
        assert not measured_enough([track], plan, CONFIG)

    def test_a_local_retune_or_an_exhausted_search_commits_on_two_trials(self) -> None:
        """Two trials suffice when re-tuning locally or after the exploration budget is spent."""
        plan = allocation(0.95, 0.8, training=1305)
        local = _searching(state=ControllerState.RETUNING)
        add_trials(local, 1305, time_ratio=1.0, energy_ratio=0.8, count=2)
        assert measured_enough([local], plan, CONFIG)
        exhausted = _searching()
        add_trials(exhausted, 1305, time_ratio=1.0, energy_ratio=0.8, count=2)
        exhausted.search.trials_in_search = CONFIG.max_exploration_phases
        assert measured_enough([exhausted], plan, CONFIG)

    def test_the_default_governor_needs_no_trials(self) -> None:
        """A kind allocated the default is measured by its baseline."""
        assert measured_enough([_searching()], allocation(1.0, 1.0, training=None), CONFIG)

    def test_the_kind_adding_the_most_time_fails_a_short_allocation(self) -> None:
        """When the trials' medians miss the threshold, the kind whose trials cost the most time fails."""
        generation, training = _searching(PhaseKind.GENERATION), _searching(PhaseKind.TRAINING)
        add_trials(generation, 1035, time_ratio=1.08, energy_ratio=0.7)
        add_trials(training, 1440, time_ratio=1.03, energy_ratio=0.9)
        plan = allocation(0.96, 0.8, generation=1035, training=1440)
        assert failing_kind(plan, [generation, training], PLANNER) is generation

    def test_an_allocation_measured_within_the_threshold_has_no_failing_kind(self) -> None:
        """Trials whose medians keep the iteration within the threshold fail nothing."""
        generation, training = _searching(PhaseKind.GENERATION), _searching(PhaseKind.TRAINING)
        add_trials(generation, 1035, time_ratio=1.04, energy_ratio=0.7)
        add_trials(training, 1440, time_ratio=1.01, energy_ratio=0.9)
        plan = allocation(0.96, 0.8, generation=1035, training=1440)
        assert failing_kind(plan, [generation, training], PLANNER) is None

    def test_committing_resets_the_monitor_and_keeps_the_measured_ratios(self) -> None:
        """A commit starts its control interval and drift windows afresh, at its clock's measured ratios."""
        track = _searching()
        add_trials(track, 1305, time_ratio=1.02, energy_ratio=0.8)
        track.search.window, track.search.trials_in_search = (1174, 1435), 7
        track.monitor.since_control = 9
        track.monitor.recent_time.append(1.1)
        commit_track(track, 1305)
        assert (track.state, track.committed_mhz) == (ControllerState.COMMITTED, 1305)
        assert track.search.window is None
        assert track.search.trials_in_search == 0
        assert (track.monitor.since_control, list(track.monitor.recent_time)) == (0, [])
        assert track.committed_ratios == pytest.approx((1.02, 0.8))

    def test_the_fine_search_commits_once_the_plans_clock_has_its_trials(self) -> None:
        """Trying the plan's clock until it has three trials that fit the threshold ends in a commit."""
        track = _searching()
        reason = None
        for attempt in range(5):
            clock = PLANNER.plan([track], 20).sm_clock_mhz[PhaseKind.TRAINING] if attempt else 1305
            assert clock is not None
            add_trials(track, clock, time_ratio=1.02, energy_ratio=0.8, iteration=10 + 3 * attempt)
            reason = try_commit([track], PLANNER, RefinePace(), 20, CONFIG)
            if reason is not None:
                break
        assert reason is not None
        assert reason.startswith("commit: expected throughput")
        assert track.state is ControllerState.COMMITTED
        assert track.committed_mhz is not None
        assert len(track.curve.trials_at(track.committed_mhz)) >= CONFIG.commit_samples

    def test_a_clock_measured_beyond_the_budget_becomes_a_floor_instead_of_a_commit(self) -> None:
        """The model may think a clock fits; if its trials since the epoch do not, the search goes above."""
        planner = Planner(0.95, CONFIG, GRID, PeerSlack(active=True))  # no slower peer: cap 1 / 0.95
        track = _searching()
        add_trials(track, 1305, time_ratio=1.0, energy_ratio=0.8, count=6, iteration=0)
        add_trials(track, 1440, time_ratio=1.0, energy_ratio=0.9, count=3, iteration=6)
        add_trials(track, 1305, time_ratio=1.2, energy_ratio=0.8, count=3, iteration=12)
        track.search.epoch_iteration = 12
        track.baseline.last_default_iteration = 19  # a fresh baseline: the clock is to blame
        assert planner.plan([track], 20).sm_clock_mhz == {PhaseKind.TRAINING: 1305}
        reason = try_commit([track], planner, RefinePace(), 20, CONFIG)
        assert reason == "trial at 1305 MHz measured below the threshold: search above it"
        assert (track.search.floor_mhz, track.search.floor_iteration) == (1306, 20)
        assert track.state is ControllerState.EXPLORING

    def test_a_miss_against_a_stale_baseline_rechecks_the_baseline_before_any_floor(self) -> None:
        """Under drift a stale yardstick makes every clock look too slow: one default phase comes first."""
        planner = Planner(0.95, CONFIG, GRID, PeerSlack(active=True))
        track = _searching()
        add_trials(track, 1305, time_ratio=1.0, energy_ratio=0.8, count=6, iteration=0)
        add_trials(track, 1440, time_ratio=1.0, energy_ratio=0.9, count=3, iteration=6)
        add_trials(track, 1305, time_ratio=1.2, energy_ratio=0.8, count=3, iteration=12)
        track.search.epoch_iteration = 12
        assert 20 - track.baseline.last_default_iteration > CONFIG.baseline_check_age
        reason = try_commit([track], planner, RefinePace(), 20, CONFIG)
        assert reason == "trial at 1305 MHz measured below the threshold: re-checking the baseline first"
        assert track.baseline.check_pending
        assert track.search.floor_mhz == 0
        learn_default(track.baseline, default_phase(track.kind, 21), relearning=False)
        assert not track.baseline.check_pending
        reason = try_commit([track], planner, RefinePace(), 21, CONFIG)
        assert reason == "trial at 1305 MHz measured below the threshold: search above it"
        assert track.search.floor_mhz == 1306

    def test_the_work_between_the_phases_is_on_both_sides_of_the_measured_iteration(self) -> None:
        """5% slower phases miss 0.95 alone; with as much work between them at the default they do not."""
        between = BetweenWork(active=True)
        planner = Planner(0.95, CONFIG, GRID, PeerSlack(active=False), between)
        track = _searching()
        add_trials(track, 1305, time_ratio=1.06, energy_ratio=0.8, count=3, iteration=12)
        track.search.epoch_iteration = 12
        plan = allocation(0.95, 0.8, training=1305)
        assert failing_kind(plan, [track], planner) is track
        for iteration in range(3):
            between.observe(iteration, track.baseline.default_duration_s)
        assert planner.between_s == pytest.approx(track.baseline.default_duration_s)
        assert failing_kind(plan, [track], planner) is None
