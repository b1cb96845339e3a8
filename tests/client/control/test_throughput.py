"""The run's throughput so far: what it banks, how the plan may spend it, and what never moves it."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest
from eerl.control.throughput import RunThroughput
from eerl.phases import PhaseKind

TRAINING = PhaseKind.TRAINING


def _spend(run: RunThroughput, planned: float = 0.95, max_spend: float = 0.01) -> float:
    return run.spend(planned, iteration_default_s=10.0, horizon=50, max_spend=max_spend)


class TestRunThroughput:
    def test_default_phases_bank_what_the_plan_may_spend_over_the_horizon(self) -> None:
        """One 10 s default phase at a 0.95 plan banks 10/0.95 - 10 s; spread over 50 iterations of 10 s
        each, the plan may aim at 500 / (500/0.95 + 0.526) instead."""
        run = RunThroughput()
        run.add_default(10.0, between_s=0.0)
        banked = 10.0 / 0.95 - 10.0
        assert _spend(run) == pytest.approx(500.0 / (500.0 / 0.95 + banked) - 0.95)
        assert -0.002 < _spend(run) < 0.0

    def test_a_wait_for_an_async_peer_is_time_taken_against_no_default(self) -> None:
        """A peer that ran past this pool's phase made the iteration longer: the time counts as taken, and
        what the default phase banked is gone (a wait before any phase of the session counts nothing)."""
        run = RunThroughput()
        run.add_wait(5.0)
        assert run.actual_s == 0.0
        run.add_default(10.0, between_s=0.0)
        run.add_wait(10.0 / 0.95 - 10.0)
        assert _spend(run) == pytest.approx(0.0, abs=1e-12)
        assert run.actual_s == pytest.approx(10.0 / 0.95)

    def test_the_spend_is_bounded(self) -> None:
        """However much was banked, the plan aims at most ``max_spend`` below its threshold."""
        run = RunThroughput()
        for _ in range(500):
            run.add_default(10.0, between_s=0.0)
        assert _spend(run, max_spend=0.01) == pytest.approx(-0.01)

    def test_without_a_repay_a_session_behind_its_plan_never_raises_it(self) -> None:
        """With no repay allowed, the plan spends surplus and never repays a deficit."""
        run = RunThroughput()
        run.add_locked(TRAINING, 1305, predicted_s=10.0, duration_s=13.0, between_s=0.0)
        assert _spend(run) == 0.0

    def test_a_locked_phase_at_the_plan_banks_nothing(self) -> None:
        """Phases that take exactly the planned time leave nothing to spend."""
        run = RunThroughput()
        for _ in range(5):
            run.add_locked(TRAINING, 1305, predicted_s=10.0, duration_s=10.0 / 0.95, between_s=0.0)
        assert _spend(run) == pytest.approx(0.0, abs=1e-12)

    @pytest.mark.parametrize("factor", [0.3, 5.0, 20.0])
    def test_one_phase_far_off_moves_nothing(self, factor: float) -> None:
        """A locked phase counts at the median ratio of its clock's last few phases: one committed phase
        far off, fast or slow, leaves the spend where it was."""
        steady, with_outlier = RunThroughput(), RunThroughput()
        for run in (steady, with_outlier):
            run.add_default(10.0, between_s=0.0)
            for _ in range(4):
                run.add_locked(TRAINING, 1305, predicted_s=10.0, duration_s=10.4, between_s=0.0)
        steady.add_locked(TRAINING, 1305, predicted_s=10.0, duration_s=10.4, between_s=0.0)
        with_outlier.add_locked(TRAINING, 1305, predicted_s=10.0, duration_s=10.4 * factor, between_s=0.0)
        assert _spend(with_outlier) == pytest.approx(_spend(steady))
        assert _spend(steady) < 0.0

    def test_the_work_between_the_phases_counts_on_both_sides(self) -> None:
        """Between work runs at the default whatever the clocks: it banks its share of the threshold."""
        without, with_between = RunThroughput(), RunThroughput()
        without.add_default(10.0, between_s=0.0)
        with_between.add_default(10.0, between_s=5.0)
        assert _spend(with_between) < _spend(without) < 0.0

    def test_a_regime_left_keeps_the_judgement_of_its_own_predictor(self) -> None:
        """A kind's locked phases are judged on its newest predictor; once it leaves their regime they keep
        the judgement of the regime's own, not the next regime's (whose model of another workload
        judged a long regime's phases 10 % fast), and what they banked stays to spend."""
        features = np.array([1000.0, 0.0, 0.0])
        run = RunThroughput()
        for _ in range(10):
            run.add_locked(TRAINING, 1305, 10.0, 10.2, between_s=0.0, features=features)

        def own(kind: PhaseKind, count: int, feature_sum: npt.NDArray[np.float64]) -> float:
            return 10.4 * count  # the regime's newest predictor: its default is a little slower

        def next_regimes(kind: PhaseKind, count: int, feature_sum: npt.NDArray[np.float64]) -> float:
            return 11.5 * count

        run.settle(TRAINING, own)
        assert run.banked_s(1.0, next_regimes) == pytest.approx(10 * 10.4 - 10 * 10.2)
        assert run.banked_s(1.0) == pytest.approx(10 * 10.4 - 10 * 10.2)

    def test_the_phases_that_showed_a_step_are_judged_by_the_regime_they_landed_in(self) -> None:
        """Two phases at the old regime's clock on the next regime's work count at their own time while the
        step is unconfirmed; once the kind leaves, they go with it to the new regime, whose predictor judges
        them (a 12 s phase whose default takes 11 s owes 1 s), while the old regime's phases keep its own
        judgement. Counted at their own time for good, the run believed itself 0.4 % faster than it was
        on regimes alternating every 15 iterations."""
        short, long = np.array([1000.0, 0.0, 0.0]), np.array([2000.0, 0.0, 0.0])
        run = RunThroughput()
        for _ in range(4):
            run.add_locked(TRAINING, 1305, 10.0, 10.0, between_s=0.0, features=short)
        run.add_stepped(TRAINING, 12.0, between_s=0.0, features=long)
        run.add_stepped(TRAINING, 12.0, between_s=0.0, features=long)
        assert run.banked_s(1.0) == pytest.approx(0.0)

        def old_regime(kind: PhaseKind, count: int, feature_sum: npt.NDArray[np.float64]) -> float:
            return 10.0 * count

        def new_regime(kind: PhaseKind, count: int, feature_sum: npt.NDArray[np.float64]) -> float:
            assert feature_sum.tolist() == (long * count).tolist()
            return 11.0 * count

        run.settle(TRAINING, old_regime)
        assert run.banked_s(1.0, new_regime) == pytest.approx(2 * 11.0 - 2 * 12.0)

    def test_the_phases_after_a_change_in_cost_go_to_the_new_yardstick_at_their_own_level(self) -> None:
        """The same work got 20 % cheaper at iteration 10, before the monitor saw it: the old predictor
        (10 s) judges the four phases from then on (8 s each) 20 % fast, and the median of their clock's
        recent phases counted the first of them at the old ratio. Settled with ``carry_since``, the phases
        before keep the old judgement, the four go to the new yardstick (8 s: neither banked nor owed)
        and are counted at their own time."""
        features = np.array([1000.0, 0.0, 0.0])
        run = RunThroughput()
        for iteration in range(10):
            run.add_locked(TRAINING, 1305, 10.0, 10.5, between_s=0.0, features=features, iteration=iteration)
        for iteration in range(10, 14):
            run.add_locked(TRAINING, 1305, 10.0, 8.4, between_s=0.0, features=features, iteration=iteration)

        def old_cost(kind: PhaseKind, count: int, feature_sum: npt.NDArray[np.float64]) -> float:
            return 10.0 * count

        def new_cost(kind: PhaseKind, count: int, feature_sum: npt.NDArray[np.float64]) -> float:
            return 8.0 * count

        settled_on_old = RunThroughput()
        for iteration in range(14):
            settled_on_old.add_locked(
                TRAINING, 1305, 10.0, 10.5 if iteration < 10 else 8.4, 0.0, features=features
            )
        settled_on_old.settle(TRAINING, old_cost)
        run.settle(TRAINING, old_cost, carry_since=10)
        truth = 10 * 10.0 + 4 * 8.0 - (10 * 10.5 + 4 * 8.4)  # the default's time minus the time taken
        assert run.banked_s(1.0, new_cost) == pytest.approx(truth)
        assert settled_on_old.banked_s(1.0, new_cost) > truth + 3.5  # believed 3.8 s ahead of the truth

    def test_phases_carried_past_a_change_count_at_the_time_they_took(self) -> None:
        """The predictor moved with the change too (it learns from locked phases): the four phases after it
        were predicted 15.7, 15.7, 9.6 and 10.1 s for 8.3-8.8 s of work. Carried to the new yardstick (8 s)
        they count at the time they took, so the run is judged 0.55 s a phase behind, as it was; counted
        at their median ratio times those predictions they took 1.5 s more than they did (on
        ``kv-fp8-verl-h100`` the run then judged itself at 0.949 where it had delivered 0.954, and repaid
        what it did not owe)."""
        features = np.array([1000.0, 0.0, 0.0])
        run = RunThroughput()
        for iteration in range(10):
            run.add_locked(TRAINING, 1305, 10.0, 10.0, between_s=0.0, features=features, iteration=iteration)
        carried = [(15.7, 8.3), (15.7, 8.4), (9.6, 8.8), (10.1, 8.7)]
        for iteration, (predicted_s, duration_s) in enumerate(carried, start=10):
            run.add_locked(
                TRAINING, 1305, predicted_s, duration_s, between_s=0.0, features=features, iteration=iteration
            )

        def old_cost(kind: PhaseKind, count: int, feature_sum: npt.NDArray[np.float64]) -> float:
            return 10.0 * count

        def new_cost(kind: PhaseKind, count: int, feature_sum: npt.NDArray[np.float64]) -> float:
            return 8.0 * count

        run.settle(TRAINING, old_cost, carry_since=10)
        truth = 4 * 8.0 - sum(duration for _, duration in carried)
        assert run.banked_s(1.0, new_cost) == pytest.approx(truth)

    def test_a_step_not_confirmed_leaves_its_phase_to_the_regime_it_ran_in(self) -> None:
        """One phase far off that the next does not confirm was this regime's after all: the next locked
        phase gives it back to the regime, whose predictor judges it, and a later step does not take it."""
        features = np.array([1000.0, 0.0, 0.0])
        run = RunThroughput()
        run.add_stepped(TRAINING, 12.0, between_s=0.0, features=features * 2)
        run.add_locked(TRAINING, 1305, 10.0, 10.0, between_s=0.0, features=features)

        def regime(kind: PhaseKind, count: int, feature_sum: npt.NDArray[np.float64]) -> float:
            return float(feature_sum[0]) / 100.0  # 20 s for the far-off phase, 10 s for the other

        run.settle(TRAINING, regime)
        assert run.banked_s(1.0) == pytest.approx(20.0 + 10.0 - 22.0)

    def test_a_session_behind_its_plan_repays_within_its_bound(self) -> None:
        """What the run owes, the next iterations repay: the plan aims above its threshold, at most
        ``max_repay``; a small debt over the horizon raises it by what makes the run end at the plan."""
        run = RunThroughput()
        run.add_locked(TRAINING, 1305, predicted_s=10.0, duration_s=10.6, between_s=0.0)
        owed = 10.0 / 0.95 - 10.6
        raised = run.spend(0.95, iteration_default_s=10.0, horizon=50, max_spend=0.01, max_repay=0.005)
        assert raised == pytest.approx(500.0 / (500.0 / 0.95 + owed) - 0.95)
        assert 0.0 < raised < 0.005
        run.add_locked(TRAINING, 1305, predicted_s=10.0, duration_s=200.0, between_s=0.0)
        assert run.spend(0.95, iteration_default_s=10.0, horizon=50, max_spend=0.01, max_repay=0.005) == 0.005

    def test_a_newer_yardstick_judges_the_locked_phases_again(self) -> None:
        """Locked phases judged on a predictor 2 % slow looked ahead of the plan; judged again on the newest
        predictor (which says the default takes 2 % less), the run is behind it, and the bank says so."""
        run = RunThroughput()
        for _ in range(10):
            run.add_locked(
                TRAINING, 1305, predicted_s=10.2, duration_s=10.2 / 0.95, between_s=0.0, features=np.ones(3)
            )
        assert run.banked_s(0.95) == pytest.approx(0.0, abs=1e-9)

        def newest(kind: PhaseKind, count: int, feature_sum: npt.NDArray[np.float64]) -> float:
            assert kind is TRAINING
            assert feature_sum.tolist() == [10.0, 10.0, 10.0]
            return 10.0 * count

        assert run.banked_s(0.95, newest) == pytest.approx((100.0 - 102.0) / 0.95)
        assert _spend(run) == pytest.approx(0.0, abs=1e-12)
        assert run.spend(0.95, 10.0, 50, 0.01, yardstick=newest, max_repay=0.005) > 0.0
