"""The records of a kind's track: what it derives from them (savings, whether it searches or relearns)."""

from __future__ import annotations

from eerl.control.state import KindTrack, Ledger
from eerl.phases import ControllerState, savings_fraction

from tests.client.control.parts import fitted_track


class TestLedger:
    def test_no_phase_no_savings(self) -> None:
        """Before any phase the savings fraction is zero, not a division by zero."""
        assert Ledger().savings_fraction == 0.0

    def test_default_phases_count_in_the_total_and_save_nothing(self) -> None:
        """A trial saving 20% among as much energy on the default governor shows 10% savings."""
        ledger = Ledger()
        ledger.add_default(100.0)
        ledger.add_trial(100.0, 80.0)
        assert ledger.savings_fraction == 0.1

    def test_only_missed_trials_are_exploration_cost(self) -> None:
        """A missed trial's whole energy is exploration cost; a trial saving energy adds none."""
        ledger = Ledger()
        ledger.add_trial(100.0, 80.0)
        ledger.add_missed_trial(90.0)
        assert ledger.exploration_cost_j == 90.0


class TestKindTrack:
    def test_searching_means_exploring_or_retuning(self) -> None:
        """Exploring and re-tuning search; baseline and committed do not."""
        track: KindTrack = fitted_track()
        expected = {
            ControllerState.BASELINE: False,
            ControllerState.EXPLORING: True,
            ControllerState.COMMITTED: False,
            ControllerState.RETUNING: True,
        }
        for state, searching in expected.items():
            track.state = state
            assert track.searching is searching

    def test_a_pending_rebaseline_relearns_whatever_the_state(self) -> None:
        """A kind relearns in its first baseline and while default phases of a re-baseline remain."""
        track = fitted_track(state=ControllerState.RETUNING)
        assert not track.relearning
        track.baseline.rebaseline_left = 1
        assert track.relearning
        track.baseline.rebaseline_left = 0
        track.state = ControllerState.BASELINE
        assert track.relearning


class TestSavingsFraction:
    def test_saved_over_baseline_and_zero_without_one(self) -> None:
        """The one savings rule: saved / baseline; 0 before there is a baseline."""
        assert savings_fraction(25.0, 100.0) == 0.25
        assert savings_fraction(-5.0, 100.0) == -0.05
        assert savings_fraction(5.0, 0.0) == 0.0
