"""The baseline: learning what a phase costs under the default governor.

Every default-governor phase (the first few of a kind, the control phases of a commit, a re-baseline after
a workload step) is fed to the kind's :class:`~eerl.control.predictor.BaselinePredictor`, and the typical
default cost of a phase follows its predictions (the weights of the iteration budget). A re-baseline is a
countdown of default phases; when it ends, the old regime's far samples are forgotten and a re-tune starts.
"""

from __future__ import annotations

from eerl.control.base import PhaseObservation
from eerl.control.config import EerlConfig
from eerl.control.state import BaselineState
from eerl.phases import Workload

SCALE_SMOOTHING = 0.2
"""How fast the typical default cost follows the predictions of new phases."""


def learn_default(baseline: BaselineState, obs: PhaseObservation, *, relearning: bool) -> float | None:
    """Add a default-governor phase; its relative duration error as predicted beforehand (None: too early).

    While ``relearning`` (first baseline, re-baseline) every phase is learned, outliers included.
    """
    baseline.last_default_iteration = obs.iteration
    baseline.check_pending = False  # the yardstick was just re-checked
    error = baseline.predictor.add(obs.workload, obs.duration_s, obs.energy_j, force=relearning)
    track_default_scale(baseline, obs.workload)
    return error


def track_default_scale(baseline: BaselineState, workload: Workload) -> None:
    """Follow the typical default cost of this kind (the weights of the budget allocation)."""
    prediction = baseline.predictor.predict(workload)
    if prediction is None:
        return
    if baseline.default_duration_s == 0.0:
        baseline.default_duration_s, baseline.default_energy_j = prediction.duration_s, prediction.energy_j
        return
    alpha = SCALE_SMOOTHING
    baseline.default_duration_s += alpha * (prediction.duration_s - baseline.default_duration_s)
    baseline.default_energy_j += alpha * (prediction.energy_j - baseline.default_energy_j)


def baseline_complete(baseline: BaselineState, config: EerlConfig) -> bool:
    """Enough default phases to start exploring."""
    return baseline.predictor.count >= config.baseline_phases


def schedule_rebaseline(
    baseline: BaselineState, phases: int, *, same_work: bool = False, changed_since: int | None = None
) -> None:
    """Run ``phases`` more default phases before the next re-tune (the old regime's samples then go; its
    locked phases go now). ``same_work``: the cost of the same work changed, not the work itself;
    ``changed_since``: from which iteration on, as far as the phases tell (those phases go with the new).

    The errors its phases are predicted with go at its end too (they measure the step); a re-baseline
    that interrupts another keeps the first one's mark."""
    if baseline.rebaseline_left == 0 or baseline.rebaseline_errors_mark is None:
        baseline.rebaseline_errors_mark = baseline.predictor.errors_recorded
    baseline.rebaseline_left = baseline.rebaseline_length = phases
    baseline.rebaseline_same_work = same_work
    baseline.changed_since_iteration = changed_since if same_work else None
    baseline.predictor.forget_locked()


def rebaseline_step(baseline: BaselineState, workload: Workload, config: EerlConfig) -> bool:
    """Count one re-baseline phase down; True when it was the last (a re-tune starts now).

    At the end the predictor forgets the old regime. After a workload step that is the samples whose
    features lie far from this phase's (beyond the drift band, or 2.5 of the window's relative spread): they
    would make it extrapolate. When the same work changed its cost (ratios left their band, control phases
    missed), features cannot tell the regimes apart: only the re-baseline's own phases stay — kept, the
    old ones would outvote them, and every ratio would stay judged against the old cost. Either way the
    errors made predicting the re-baseline's phases go: they were the step's, not the new regime's noise.
    """
    baseline.rebaseline_left -= 1
    if baseline.rebaseline_left != 0:
        return False
    if baseline.rebaseline_same_work:
        baseline.predictor.keep_newest(config.rebaseline_phases)
        baseline.rebaseline_same_work = False
    else:
        baseline.predictor.forget_far(workload, config.drift_feature_band, baseline.rebaseline_length)
    if baseline.rebaseline_errors_mark is not None:
        baseline.predictor.drop_errors_since(baseline.rebaseline_errors_mark)
        baseline.rebaseline_errors_mark = None
    return True
