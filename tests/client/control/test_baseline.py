"""The baseline: fitting the predictor on default-governor phases, and re-baselining after a step."""

from __future__ import annotations

from eerl.control.baseline import (
    baseline_complete,
    learn_default,
    rebaseline_step,
    schedule_rebaseline,
    track_default_scale,
)
from eerl.control.state import new_track
from eerl.phases import PhaseKind

from tests.client.control.parts import CONFIG, GRID, default_phase, fitted_track, workload


class TestBaseline:
    def test_the_baseline_is_complete_after_its_default_phases(self) -> None:
        """Three default phases are not enough to explore; the fourth is."""
        track = new_track(PhaseKind.TRAINING, CONFIG.predictor_window, GRID.curve_bandwidth_mhz)
        for i in range(3):
            learn_default(track.baseline, default_phase(PhaseKind.TRAINING, i), relearning=True)
            assert not baseline_complete(track.baseline, CONFIG)
        learn_default(track.baseline, default_phase(PhaseKind.TRAINING, 3), relearning=True)
        assert baseline_complete(track.baseline, CONFIG)
        assert track.baseline.last_default_iteration == 3

    def test_the_typical_default_cost_follows_new_phases_by_a_fifth(self) -> None:
        """The first prediction sets the budget's weight; later ones move it a fifth of the way."""
        track = fitted_track(duration_s=10.0)
        assert track.baseline.default_duration_s == 10.0
        prediction = track.baseline.predictor.predict(workload(tokens=2_000_000))
        assert prediction is not None
        track_default_scale(track.baseline, workload(tokens=2_000_000))
        assert track.baseline.default_duration_s == 10.0 + 0.2 * (prediction.duration_s - 10.0)

    def test_an_outlier_is_learned_only_while_relearning(self) -> None:
        """A default phase three times too slow leaves a fitted predictor alone, unless it relearns."""
        track = fitted_track(phases=6)
        outlier = default_phase(PhaseKind.TRAINING, 6, duration_s=30.0)
        learn_default(track.baseline, outlier, relearning=False)
        assert track.baseline.predictor.count == 6
        learn_default(track.baseline, outlier, relearning=True)
        assert track.baseline.predictor.count == 7

    def test_a_rebaseline_counts_down_then_forgets_the_old_regime(self) -> None:
        """After its last phase a re-baseline drops the samples far from the new workload, and says so."""
        track = fitted_track(phases=6)
        schedule_rebaseline(track.baseline, 2)
        shrunk = workload(tokens=200_000)
        for i, last in ((6, False), (7, True)):
            phase = default_phase(PhaseKind.TRAINING, i, shrunk, duration_s=2.0)
            learn_default(track.baseline, phase, relearning=True)
            assert rebaseline_step(track.baseline, shrunk, CONFIG) is last
        assert track.baseline.rebaseline_left == 0
        assert track.baseline.predictor.count == 2

    def test_a_rebaseline_for_the_same_work_keeps_only_its_own_phases(self) -> None:
        """When the same work got cheaper (ratios or control phases said so), features cannot tell the
        regimes apart: after the re-baseline only its own phases are left, and it predicts the new cost."""
        track = fitted_track(phases=6, duration_s=10.0)
        schedule_rebaseline(track.baseline, CONFIG.rebaseline_phases, same_work=True)
        for i in range(CONFIG.rebaseline_phases):
            phase = default_phase(PhaseKind.TRAINING, 6 + i, duration_s=7.0, energy_j=5_000.0)
            learn_default(track.baseline, phase, relearning=True)
            rebaseline_step(track.baseline, phase.workload, CONFIG)
        predictor = track.baseline.predictor
        assert predictor.count == CONFIG.rebaseline_phases
        prediction = predictor.predict(workload())
        assert prediction is not None
        assert abs(prediction.duration_s - 7.0) < 1e-6
        assert abs(prediction.energy_j - 5_000.0) < 1e-3
        assert not track.baseline.rebaseline_same_work

    def test_a_rebaseline_after_a_workload_step_keeps_the_old_phases_of_alike_work(self) -> None:
        """After a step in the work, old phases whose workload is like the new one still count."""
        track = fitted_track(phases=6, duration_s=10.0)
        schedule_rebaseline(track.baseline, 1)
        phase = default_phase(PhaseKind.TRAINING, 6, duration_s=10.0)
        learn_default(track.baseline, phase, relearning=True)
        assert rebaseline_step(track.baseline, phase.workload, CONFIG)
        assert track.baseline.predictor.count == 7
