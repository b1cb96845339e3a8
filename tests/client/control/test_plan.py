"""The budget across phases: each kind's options, the planned threshold and the time caps."""

from __future__ import annotations

import numpy as np
import pytest
from eerl.control.baseline import learn_default
from eerl.control.plan import Planner
from eerl.control.slack import PeerSlack
from eerl.control.state import KindTrack
from eerl.phases import ControllerState, PhaseKind

from tests.client.control.parts import CONFIG, GRID, add_trials, default_phase, fitted_track


def _planner(*, pool: bool = False) -> Planner:
    return Planner(0.95, CONFIG, GRID, PeerSlack(active=pool))


def _explored(kind: PhaseKind = PhaseKind.TRAINING, duration_s: float = 10.0) -> KindTrack:
    """A searching kind with three trials at 1305 MHz: 2% slower, 20% less energy."""
    track = fitted_track(kind, duration_s=duration_s)
    add_trials(track, 1305, time_ratio=1.02, energy_ratio=0.8)
    return track


class TestPlanner:
    def test_a_noiseless_predictor_plans_for_the_target_itself(self) -> None:
        """A predictor with no error adds no margin to the threshold."""
        tracks = [_explored(PhaseKind.GENERATION), _explored(PhaseKind.TRAINING)]
        assert _planner().threshold(tracks) == 0.95

    def test_the_margin_for_the_predictors_error_is_capped(self) -> None:
        """A predictor off by about 10% raises the planned threshold by the cap (0.006), no more."""
        track = fitted_track()
        for i, duration_s in enumerate((11.0, 9.0, 11.0, 9.0)):
            learn_default(
                track.baseline,
                default_phase(PhaseKind.TRAINING, 4 + i, duration_s=duration_s),
                relearning=True,
            )
        assert track.baseline.predictor.error_fraction > 0.05
        assert _planner().threshold([track]) == pytest.approx(0.956)

    def test_the_runs_banked_throughput_lowers_the_plan_and_the_target_alike(self) -> None:
        """Default phases that ran at full speed bank throughput: the plan and the target a trial must
        meet drop by the same spend, at most ``max_run_spend``."""
        tracks = [_explored(PhaseKind.GENERATION), _explored(PhaseKind.TRAINING)]
        planner = _planner()
        for _ in range(200):
            planner.run.add_default(10.0, between_s=0.0)
        assert planner.spend(tracks) == pytest.approx(-CONFIG.max_run_spend)
        assert planner.threshold(tracks) == pytest.approx(0.95 - CONFIG.max_run_spend)
        assert planner.target_now(tracks) == pytest.approx(0.95 - CONFIG.max_run_spend)
        assert planner.target == 0.95

    def test_options_offer_the_default_first_then_the_fine_candidates(self) -> None:
        """A searching kind offers the default (ratio 1) and the fine clocks from its lowest trial up."""
        options = _planner().options(_explored(), 20)
        assert options.sm_clocks_mhz == (None, *[c for c in GRID.fine_mhz if c >= 1305])
        assert (options.time_ratio[0], options.energy_ratio[0]) == (1.0, 1.0)
        assert options.time_ratio[1] == pytest.approx(1.02)
        assert options.energy_ratio[1] == pytest.approx(0.8)
        assert np.all(options.time_ratio >= 1.0)

    def test_without_trials_nearby_estimates_fall_back_towards_the_default(self) -> None:
        """Far above its trials a clock's ratios interpolate towards 1 at the top clock."""
        options = _planner().options(_explored(), 20)
        assert options.energy_ratio[-1] == pytest.approx(1.0, abs=0.01)
        assert not np.isnan(options.energy_ratio).any()

    def test_on_evidence_alone_unsupported_clocks_are_no_option(self) -> None:
        """Without extrapolation, clocks with no trials nearby have no estimate (NaN)."""
        options = _planner().options(_explored(), 20, extrapolate=False)
        assert np.isnan(options.energy_ratio[-1])

    def test_a_committed_kind_offers_only_its_clock(self) -> None:
        """Committed, a kind holds its clock in the others' allocation, at its estimated ratios."""
        track = _explored()
        track.state, track.committed_mhz = ControllerState.COMMITTED, 1305
        options = _planner().options(track, 20)
        assert options.sm_clocks_mhz == (1305,)
        assert options.energy_ratio[0] == pytest.approx(0.8)
        assert _planner().options(track, 20, free=True).sm_clocks_mhz[0] is None

    def test_a_local_retune_cannot_fall_back_to_the_default(self) -> None:
        """Re-tuning around a committed clock, the default governor is no option."""
        track = _explored()
        track.state, track.committed_mhz = ControllerState.RETUNING, 1305
        assert np.isnan(_planner().options(track, 20).time_ratio[0])

    def test_the_plan_locks_where_the_trials_save_within_the_threshold(self) -> None:
        """Trials 2% slower and 20% cheaper make the plan lock near them, within the threshold."""
        plan = _planner().plan([_explored()], 20)
        clock = plan.sm_clock_mhz[PhaseKind.TRAINING]
        assert clock is not None
        assert 1305 <= clock <= 1305 + 3 * GRID.fine_step_mhz
        assert plan.throughput_ratio >= 0.95
        assert plan.energy_ratio == pytest.approx(0.8, abs=0.01)

    def test_a_plan_that_only_slows_down_keeps_the_default(self) -> None:
        """Trials that are slower and save nothing leave the kind on the default governor."""
        track = fitted_track()
        add_trials(track, 1305, time_ratio=1.02, energy_ratio=1.05)
        assert _planner().plan([track], 20).sm_clock_mhz == {PhaseKind.TRAINING: None}

    def test_in_sync_a_kind_may_take_the_whole_iterations_slack(self) -> None:
        """The time cap lets one kind spend the slowdown of both kinds' default time."""
        short, long = _explored(PhaseKind.GENERATION, 10.0), _explored(PhaseKind.TRAINING, 30.0)
        cap = _planner().time_cap(short, [short, long])
        assert cap == pytest.approx(1.0 + (40.0 / 0.95 - 40.0) / 10.0)

    def test_an_async_pool_plans_against_its_peers_time(self) -> None:
        """A pool whose peer takes twice as long may slow down to the peer's time, less its own noise."""
        planner = Planner(0.95, CONFIG, GRID, slack := PeerSlack(active=True))
        slack.observe_peer(20.0)
        track = _explored()
        noise = min(0.05, max(0.01, 2.0 * track.baseline.predictor.error_fraction))
        assert planner.async_pool
        assert planner.time_cap(track, [track]) == pytest.approx(20.0 * (1.0 - noise) / 10.0)
