"""The search: the next trial, the candidates and their bounds, and the coarse descent's stop rules."""

from __future__ import annotations

import numpy as np
from eerl.control.budget import Allocation
from eerl.control.config import EerlConfig
from eerl.control.curve import Trial
from eerl.control.search import (
    after_coarse_trial,
    after_local_trial,
    candidate_clocks,
    coarse_pending,
    effective_floor_mhz,
    next_trial,
    restart_descent,
    slide_window_down,
    start_local,
    start_model_local,
)
from eerl.control.state import SearchState
from eerl.phases import ControllerState
from hypothesis import given
from hypothesis import strategies as st

from tests.client.control.parts import CONFIG, GRID, allocation, fitted_track


def _coarse(
    search: SearchState,
    clock_mhz: int,
    time_ratio: float,
    energy_ratio: float,
    *,
    first: bool = False,
    config: EerlConfig = CONFIG,
) -> str | None:
    return after_coarse_trial(
        search,
        GRID,
        clock_mhz,
        time_ratio,
        energy_ratio,
        time_cap=1.1,
        noise=0.01,
        first=first,
        config=config,
    )


def _no_plan() -> Allocation:
    raise AssertionError("the plan is not asked while coarse trials remain")


class TestSearch:
    def test_coarse_trials_come_first_and_say_which_kind_they_are(self) -> None:
        """An exploring kind runs its next coarse trial, a re-tuning one its next local trial."""
        track = fitted_track()
        track.search.coarse = [1530, 1335]
        assert next_trial(track, _no_plan, GRID) == (1530, "coarse trial")
        track.state = ControllerState.RETUNING
        assert next_trial(track, _no_plan, GRID) == (1530, "local trial")

    def test_after_the_coarse_trials_the_plan_names_the_clock(self) -> None:
        """With the coarse trials done, the kind tries the clock the allocation gives it."""
        track = fitted_track()
        track.search.coarse = [1335]
        track.search.coarse_stopped = True
        assert not coarse_pending(track.search)
        clock, reason = next_trial(track, lambda: allocation(0.951, 0.8, training=1440), GRID)
        assert (clock, reason) == (1440, "fine trial (plan: throughput 0.951)")

    def test_a_retune_whose_plan_is_its_lowest_trial_slides_its_window_down(self) -> None:
        """Nothing is known below the lowest trial: the window re-centres there and the fine step below
        it is tried next, before the plan is asked again (a step at a time: a trial a whole window's
        half-width below can be far too slow at a high threshold)."""
        track = fitted_track(state=ControllerState.RETUNING)
        start_local(track.search, GRID, 1530, 10)
        track.search.coarse = []
        track.search.coarse_stopped = True
        for tried in (1395, 1530, 1665):
            track.curve.add(Trial(tried, np.ones(4), 11.0, 7_000.0, 11))
        clock, reason = next_trial(track, lambda: allocation(0.951, 0.8, training=1395), GRID)
        assert (clock, reason) == (1350, "local trial (the plan chose 1395 MHz, the lowest tried)")
        assert track.search.window == GRID.window_around(1395)
        assert coarse_pending(track.search)

    def test_the_window_stays_where_the_plan_is_not_its_lowest_trial(self) -> None:
        """A plan above the lowest trial, an exploring kind (no window) or a floor in the way: no slide."""
        search = SearchState(window=GRID.window_around(1530))
        assert not slide_window_down(search, GRID, 1440, (1395, 1665))
        assert not slide_window_down(search, GRID, None, (1395, 1665))
        assert not slide_window_down(SearchState(), GRID, 1395, (1395, 1665))
        floored = SearchState(window=GRID.window_around(1530), floor_mhz=1351)
        assert not slide_window_down(floored, GRID, 1395, (1395, 1665))
        assert floored.window == GRID.window_around(1530)
        assert not slide_window_down(search, GRID, GRID.fine_mhz[0], (GRID.fine_mhz[0], 1665))

    def test_candidates_span_the_lowest_trial_up_to_the_top(self) -> None:
        """Without a window the fine candidates run from the lowest clock tried to the top clock."""
        candidates = candidate_clocks(SearchState(), GRID, (1035, 1305), None, 0)
        assert candidates == [c for c in GRID.fine_mhz if c >= 1035]

    def test_a_floor_raises_the_lowest_candidate(self) -> None:
        """Below a failed trial's floor nothing is offered."""
        candidates = candidate_clocks(SearchState(), GRID, (1035, 1305), None, 1201)
        assert candidates[0] == 1215
        assert candidates[-1] == GRID.max_mhz

    def test_no_trial_no_candidates(self) -> None:
        """Before the first trial the model has nothing to estimate from."""
        assert candidate_clocks(SearchState(), GRID, None, None, 0) == []

    def test_a_window_keeps_a_retune_local_and_the_commit_reachable(self) -> None:
        """Inside a re-tune's window only its fine candidates are offered, plus the committed clock."""
        search = SearchState(window=(1174, 1435))
        assert candidate_clocks(search, GRID, (900, 1980), 1300, 0) == [1215, 1260, 1300, 1305, 1350, 1395]

    def test_a_floor_above_the_window_offers_the_next_window_above_the_floor(self) -> None:
        """A failed trial that pushed the floor past the window moves the search one window up."""
        search = SearchState(window=(1174, 1435))
        assert candidate_clocks(search, GRID, (900, 1980), None, 1500) == [1530, 1575, 1620]

    def test_a_floor_binds_while_searching_and_expires_a_control_interval_after_it(self) -> None:
        """A committed kind's floor lasts a control interval (60 phases), a searching kind's for good."""
        search = SearchState(floor_mhz=1216, floor_iteration=100)
        assert effective_floor_mhz(search, searching=False, iteration=159, config=CONFIG) == 1216
        assert effective_floor_mhz(search, searching=False, iteration=160, config=CONFIG) == 0
        assert effective_floor_mhz(search, searching=True, iteration=500, config=CONFIG) == 1216

    def test_the_descent_goes_on_while_trials_fit_the_budget_and_save(self) -> None:
        """A trial within the budget and at a new energy minimum ticks itself off and says nothing."""
        search = SearchState(coarse=[1335, 1185])
        assert _coarse(search, 1335, 1.02, 0.8) is None
        assert search.coarse == [1185]
        assert not search.coarse_stopped
        assert search.min_energy_ratio == 0.8

    def test_a_trial_too_slow_for_the_budget_stops_the_descent(self) -> None:
        """Beyond the time cap plus two noise widths, the descent stops in that direction."""
        search = SearchState(coarse=[1185, 1035])
        reason = _coarse(search, 1185, 1.13, 0.7)
        assert reason == "coarse descent stops: time ratio 1.130 over the budget"
        assert search.coarse_stopped

    def test_a_trial_within_two_noise_widths_of_the_cap_does_not_stop_it(self) -> None:
        """A time ratio just over the cap but within the noise is no evidence of being too slow."""
        search = SearchState(coarse=[1185, 1035])
        assert _coarse(search, 1185, 1.115, 0.7) is None
        assert not search.coarse_stopped

    def test_without_the_repeat_a_trial_past_the_energy_minimum_stops_the_descent(self) -> None:
        """With ``recheck_energy_stop`` off, an energy ratio more than the margin above the lowest so far
        ends the descent at once."""
        search = SearchState(coarse=[1035, 915], min_energy_ratio=0.80)
        reason = _coarse(search, 1035, 1.05, 0.815, config=EerlConfig(recheck_energy_stop=False))
        assert reason == "coarse descent stops: past the energy minimum (0.815)"
        assert search.coarse_stopped

    def test_a_trial_past_the_minimum_stops_it_once_its_repeat_agrees(self) -> None:
        """The clock runs again, and when the lower of the two readings is still past the minimum the
        descent ends."""
        search = SearchState(coarse=[1035, 915], min_energy_ratio=0.80)
        assert _coarse(search, 1035, 1.05, 0.83) is None
        assert search.coarse == [1035, 915]
        assert not search.coarse_stopped
        reason = _coarse(search, 1035, 1.05, 0.815)
        assert reason == "coarse descent stops: past the energy minimum (0.815)"
        assert search.coarse_stopped

    def test_a_repeat_back_at_the_minimum_lets_the_descent_go_on(self) -> None:
        """One phase's energy far off (a straggling node's wait, a young predictor) does not stop the
        descent: its repeat is back below the margin and the next rung follows."""
        search = SearchState(coarse=[1335, 1185], min_energy_ratio=0.88)
        assert _coarse(search, 1335, 1.03, 0.95) is None
        assert _coarse(search, 1335, 1.03, 0.84) is None
        assert (search.coarse, search.coarse_stopped, search.min_energy_ratio) == ([1185], False, 0.84)
        # The next reading past the minimum gets its own repeat again.
        assert _coarse(search, 1185, 1.05, 0.9) is None
        assert search.coarse == [1185]

    def test_a_first_trial_too_slow_turns_the_descent_upward(self) -> None:
        """When already the first trial is too slow, the coarse trials climb from it instead."""
        search = SearchState(coarse=GRID.coarse_schedule())
        assert _coarse(search, 1530, 2.0, 0.9, first=True) is None
        assert search.coarse == GRID.coarse_upward(1530)
        assert not search.coarse_stopped

    def test_the_last_coarse_trial_ends_the_descent(self) -> None:
        """With no coarse trial left, the fine search takes over."""
        search = SearchState(coarse=[375])
        assert _coarse(search, 375, 1.0, 0.7) is None
        assert search.coarse_stopped

    def test_a_local_trial_ticks_off_its_clock_and_the_last_one_ends_the_list(self) -> None:
        """A re-tune's centre and edge trials run once each."""
        search = SearchState(coarse=[1305, 1440])
        after_local_trial(search, 1305)
        assert search.coarse == [1440]
        assert coarse_pending(search)
        after_local_trial(search, 1440)
        assert not coarse_pending(search)

    def test_a_local_search_tries_the_centre_and_the_window_edges_first(self) -> None:
        """Starting a local re-tune clears the floor and counts trials from its epoch."""
        search = SearchState(floor_mhz=1400, trials_in_search=9, coarse_stopped=True)
        start_local(search, GRID, 1305, 50)
        assert search == SearchState(
            coarse=[1305, 1170, 1440], window=(1170, 1440), epoch_iteration=50, min_energy_ratio=np.inf
        )

    def test_a_model_only_local_search_has_no_coarse_trials(self) -> None:
        """The refine's re-tune goes straight to the model over its window; without a centre, no window."""
        search = SearchState(coarse=[1305], floor_mhz=1400)
        start_model_local(search, GRID, 1305, 40)
        assert (search.window, search.coarse, search.coarse_stopped, search.floor_mhz) == (
            (1170, 1440),
            [],
            True,
            0,
        )
        start_model_local(search, GRID, None, 40)
        assert search.window is None

    def test_restarting_the_descent_explores_from_the_top_again(self) -> None:
        """A kind with nothing to be local around runs the whole coarse descent again."""
        search = SearchState(window=(1174, 1435), floor_mhz=1400, coarse_stopped=True, min_energy_ratio=0.7)
        restart_descent(search, GRID, 80)
        assert search.coarse == GRID.coarse_schedule()
        assert (search.window, search.floor_mhz, search.coarse_stopped) == (None, 0, False)
        assert search.min_energy_ratio == np.inf

    @given(
        low=st.sampled_from(GRID.fine_mhz),
        floor=st.integers(0, 2100),
        center=st.one_of(st.none(), st.sampled_from(GRID.fine_mhz)),
        committed=st.one_of(st.none(), st.integers(345, 1980)),
    )
    def test_candidates_are_ascending_fine_clocks_at_or_above_the_floor(
        self, low: int, floor: int, center: int | None, committed: int | None
    ) -> None:
        """Whatever the trials, floor, window and commit: ascending, supported, never below the floor."""
        search = SearchState(window=None if center is None else GRID.window_around(center))
        candidates = candidate_clocks(search, GRID, (low, GRID.max_mhz), committed, floor)
        assert candidates == sorted(set(candidates))
        assert set(candidates) <= {*GRID.fine_mhz, committed}
        assert all(c >= max(low, floor) for c in candidates)
        if center is None and max(low, floor) <= GRID.max_mhz:
            assert candidates[-1] == GRID.max_mhz

    @given(
        time_ratio=st.floats(0.9, 3.0),
        energy_ratio=st.floats(0.5, 1.2),
        first=st.booleans(),
        start=st.integers(0, len(GRID.coarse_schedule()) - 1),
    )
    def test_a_coarse_trial_stops_with_a_reason_or_leaves_supported_trials(
        self, time_ratio: float, energy_ratio: float, first: bool, start: int
    ) -> None:
        """After any coarse trial: a stop reason means stopped, and the trials left are supported clocks."""
        search = SearchState(coarse=GRID.coarse_schedule()[start:])
        reason = _coarse(search, search.coarse[0], time_ratio, energy_ratio, first=first)
        if reason is not None:
            assert search.coarse_stopped
        assert set(search.coarse) <= set(GRID.clocks_mhz)
        assert search.coarse_stopped or search.coarse
