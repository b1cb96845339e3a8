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


def schedule_rebaseline(baseline: BaselineState, phases: int) -> None:
    """Run ``phases`` more default phases before the next re-tune (the old regime's samples then go; its
    locked phases go now)."""
    baseline.rebaseline_left = phases
    baseline.predictor.forget_locked()


def rebaseline_step(baseline: BaselineState, workload: Workload, config: EerlConfig) -> bool:
    """Count one re-baseline phase down; True when it was the last (a re-tune starts now).

    At the end the predictor forgets the samples whose features lie far from this phase's (beyond the drift
    band, or 2.5 of the window's relative spread): after a step they would make it extrapolate.
    """
    baseline.rebaseline_left -= 1
    if baseline.rebaseline_left != 0:
        return False
    baseline.predictor.forget_far(workload, config.drift_feature_band)
    return True
