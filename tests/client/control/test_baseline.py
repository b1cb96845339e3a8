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

    def test_a_rebaseline_forgets_the_errors_it_made_across_the_step(self) -> None:
        """The re-baseline's phases were predicted with the old regime's samples: their errors (here
        100 %) are the step's. After it the noise level is what it was (1 %), not 20 times that:
        the planning margin, the outlier band and the control-phase band all read it."""
        track = new_track(PhaseKind.TRAINING, CONFIG.predictor_window, GRID.curve_bandwidth_mhz)
        for i in range(8):
            duration_s = 10.0 * (1.01 if i % 2 else 0.99)
            learn_default(
                track.baseline, default_phase(PhaseKind.TRAINING, i, duration_s=duration_s), relearning=True
            )
        noise = track.baseline.predictor.error_fraction
        assert 0.005 < noise < 0.03
        schedule_rebaseline(track.baseline, CONFIG.rebaseline_phases)
        shrunk = workload(tokens=200_000)
        for i in range(CONFIG.rebaseline_phases):
            phase = default_phase(PhaseKind.TRAINING, 8 + i, shrunk, duration_s=4.0)  # 2.0 predicted
            learn_default(track.baseline, phase, relearning=True)
            if i == 0:
                assert track.baseline.predictor.error_fraction > 5 * noise  # what used to stay
            rebaseline_step(track.baseline, shrunk, CONFIG)
        assert track.baseline.predictor.error_fraction == noise
        # The new regime's own phases are measured from here on, against its own model.
        learn_default(
            track.baseline, default_phase(PhaseKind.TRAINING, 11, shrunk, duration_s=4.04), relearning=False
        )
        assert track.baseline.predictor.error_fraction < 0.03

    def test_a_rebaseline_that_interrupts_another_forgets_both_steps_errors(self) -> None:
        """A second step before the first re-baseline ended: the errors of both go at its end."""
        track = fitted_track(phases=6, duration_s=10.0)
        before = track.baseline.predictor.errors_recorded
        schedule_rebaseline(track.baseline, CONFIG.rebaseline_phases)
        learn_default(
            track.baseline,
            default_phase(PhaseKind.TRAINING, 6, workload(tokens=200_000), duration_s=2.0),
            relearning=True,
        )
        rebaseline_step(track.baseline, workload(tokens=200_000), CONFIG)
        schedule_rebaseline(track.baseline, 1)
        tiny = workload(tokens=50_000)
        learn_default(
            track.baseline, default_phase(PhaseKind.TRAINING, 7, tiny, duration_s=0.6), relearning=True
        )
        assert rebaseline_step(track.baseline, tiny, CONFIG)
        assert track.baseline.predictor.errors_recorded == before
        assert track.baseline.predictor.error_fraction == 0.0  # identical phases before the steps
