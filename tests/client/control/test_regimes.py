"""Regime memory: what is kept when a step leaves a regime, what a step back takes up, and what it costs."""

from __future__ import annotations

import numpy as np
from eerl.control.monitor import WorkloadStep
from eerl.control.regimes import KEPT_REGIMES, RegimeMemory, signatures_match
from eerl.control.retune import regime_of, switch_regime
from eerl.control.state import KindTrack
from eerl.phases import ControllerState, PhaseKind

from tests.client.control.parts import CONFIG, add_trials, default_phase, fitted_track, workload

HALF_STEP = CONFIG.step_feature_band / 2.0


def _kept(track: KindTrack, signature: float, iteration: int = 0) -> None:
    track.regimes.keep(regime_of(track, np.array([signature]), iteration), HALF_STEP)


def _committed_at(clock_mhz: int) -> KindTrack:
    track = fitted_track(PhaseKind.TRAINING, ControllerState.COMMITTED)
    add_trials(track, clock_mhz, time_ratio=1.05, energy_ratio=0.8)
    track.committed_mhz = clock_mhz
    return track


class TestSignatures:
    def test_match_is_the_same_either_way(self) -> None:
        """×1.2 up and ÷1.2 down both match within ×1.25; ×1.3 and ÷1.3 match neither way."""
        one = np.array([1000.0, 8192.0])
        for factor in (1.2, 1 / 1.2):
            assert signatures_match(one, one * factor, HALF_STEP)
        for factor in (1.3, 1 / 1.3):
            assert not signatures_match(one, one * factor, HALF_STEP)

    def test_every_watched_feature_must_match(self) -> None:
        """Same tokens but twice the longest response (a raised cap) is another regime."""
        assert not signatures_match(np.array([1000.0, 8192.0]), np.array([1000.0, 16384.0]), HALF_STEP)

    def test_a_feature_zero_on_either_side_is_moot(self) -> None:
        """A feature the job does not report (0) neither matches nor spoils a match; all zero is no match."""
        assert signatures_match(np.array([1000.0, 0.0]), np.array([1010.0, 5.0]), HALF_STEP)
        assert not signatures_match(np.array([0.0]), np.array([0.0]), HALF_STEP)

    def test_a_regime_whose_batches_spread_is_matched_within_its_spread(self) -> None:
        """One batch 40 % above a kept regime's tokens is another regime when its batches vary by 5 %, the
        same one when they vary by 20 % (2.5 spreads: ×1.5); a doubling is another regime either way."""
        kept = np.array([1.0e6])
        assert not signatures_match(kept, kept * 1.4, HALF_STEP, np.array([0.05]))
        assert signatures_match(kept, kept * 1.4, HALF_STEP, np.array([0.2]))
        assert signatures_match(kept, kept / 1.4, HALF_STEP, np.array([0.2]))
        assert not signatures_match(kept, kept * 2.0, HALF_STEP, np.array([0.2]))


class TestMemory:
    def test_keep_replaces_a_kept_regime_it_matches_and_is_bounded(self) -> None:
        """The newer knowledge of a regime replaces the older; beyond four, the least recently left goes."""
        track = _committed_at(1200)
        for signature in (1.0, 1.1, 3.0, 9.0, 27.0, 81.0):
            _kept(track, signature)
        kept = [float(r.signature[0]) for r in track.regimes.regimes]
        assert len(kept) == KEPT_REGIMES
        assert kept == [3.0, 9.0, 27.0, 81.0]

    def test_recall_takes_the_regime_out_of_the_memory(self) -> None:
        """A recalled regime leaves the memory (it is live again); nothing matches twice."""
        memory = RegimeMemory()
        track = _committed_at(1200)
        _kept(track, 1.0)
        memory.keep(track.regimes.regimes[0], HALF_STEP)
        assert memory.recall(np.array([1.1]), HALF_STEP) is not None
        assert memory.recall(np.array([1.1]), HALF_STEP) is None

    def test_a_kept_regime_is_a_copy_that_reads_through_its_own_predictor(self) -> None:
        """The live predictor goes on learning (here: a default phase twice as slow); the kept curve still
        reads its trials against the kept predictor, so its ratios are what they were when it was left."""
        track = _committed_at(1200)
        before = track.curve.measured_at(1200)
        _kept(track, 1.0)
        for _ in range(30):
            track.baseline.predictor.add(workload(), 2 * 100.0, 2 * 8000.0, force=True)
        kept = track.regimes.regimes[0]
        assert kept.curve.measured_at(1200) == before
        assert track.curve.measured_at(1200) != before


class TestSwitch:
    def test_a_step_keeps_the_regime_it_leaves_and_re_baselines_elsewhere(self) -> None:
        """A step to unknown work: nothing to take up (None), and the regime left is kept with its commit."""
        track = _committed_at(1200)
        assert switch_regime(track, WorkloadStep(0, 1.0, (2_000_000.0,)), CONFIG, 50) is None
        (kept,) = track.regimes.regimes
        assert (kept.committed_mhz, float(kept.signature[0])) == (1200, 1_000_000.0)

    def test_a_step_back_takes_the_kept_regime_up_committed_with_its_own_cadence(self) -> None:
        """Back on work within ×1.25 of a kept regime's: committed at its clock, its predictor and curve
        back, and its refine and control counts going on from where they were when the regime was left
        (not from the other regime's counts, nor from 0; no control phase at once: on jobs switching every
        15-30 iterations that was a default phase per kind and return)."""
        track = _committed_at(1200)
        track.monitor.since_refine = 13
        track.monitor.since_control = 21
        assert switch_regime(track, WorkloadStep(0, 1.0, (2_000_000.0,)), CONFIG, 50) is None
        kept_predictor = track.regimes.regimes[0].predictor
        # The kind re-baselines on the new work and commits elsewhere...
        track.state, track.committed_mhz = ControllerState.COMMITTED, 1500
        track.monitor.since_refine = 5
        track.monitor.since_control = 50
        for _ in range(4):
            track.baseline.predictor.add(workload(tokens=2_000_000), 200.0, 16_000.0, force=True)
        reason = switch_regime(track, WorkloadStep(0, -0.5, (1_050_000.0,)), CONFIG, 80)
        assert reason is not None
        assert "back to a regime seen before" in reason
        assert "1200 MHz" in reason
        assert (track.state, track.committed_mhz) == (ControllerState.COMMITTED, 1200)
        assert track.baseline.predictor is kept_predictor
        assert track.monitor.since_control == 21
        assert track.monitor.since_refine == 13
        # ...and the regime it left in turn is kept, for when the long work returns.
        assert [r.committed_mhz for r in track.regimes.regimes] == [1500]

    def test_a_step_elsewhere_does_not_take_a_kept_regime_up(self) -> None:
        """Three times the tokens is neither the regime left (×1) nor the kept one (×2)."""
        track = _committed_at(1200)
        switch_regime(track, WorkloadStep(0, 1.0, (2_000_000.0,)), CONFIG, 50)
        track.committed_mhz = 1500
        learn = default_phase(PhaseKind.TRAINING, 60, workload(tokens=2_000_000))
        track.baseline.predictor.add(learn.workload, learn.duration_s, learn.energy_j, force=True)
        assert switch_regime(track, WorkloadStep(0, 0.5, (3_000_000.0,)), CONFIG, 80) is None
