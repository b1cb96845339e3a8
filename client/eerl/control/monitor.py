"""The monitor: watching a committed kind, re-validating its baseline and detecting drift.

Every committed phase is judged against the predictor. Now and then a default-governor *control phase*
re-validates the predictor: a miss beyond its band must be confirmed by a second one before anything
changes. Every few committed phases, while the run has throughput to spend, a *probe* runs one phase a fine
step below the committed clock: the curve keeps fresh evidence there, and the refine can move on it; a
probe is not judged as a committed phase. Drift is judged on medians of the last few phases, so a single
outlier never flips a commit: the workload leaving its band around the newest default phase (the tokens;
for generation also the longest response) is gradual *drift*, and a *step* when the newest phases lie
far from the newest few default phases; time or energy ratios leaving theirs is drift the predictor cannot
see. The monitor only says what it saw; :mod:`eerl.control.retune` decides what to do about it.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np

from eerl.control.config import EerlConfig
from eerl.control.predictor import BaselinePredictor, feature_indices, workload_features
from eerl.control.state import MonitorState
from eerl.phases import PhaseKind, Workload

WATCHED_FEATURES: dict[PhaseKind, tuple[int, ...]] = {
    PhaseKind.GENERATION: feature_indices(PhaseKind.GENERATION, "tokens", "max_response_tokens"),
    PhaseKind.TRAINING: feature_indices(PhaseKind.TRAINING, "tokens"),
}
"""Per kind, the workload features (indices into :func:`workload_features`) whose shifts are drift."""

SHIFT_HISTORY = 32
"""Recent relative shifts kept per watched feature."""

SIGNATURE_PHASES = 3
"""A step's signature is the median of this many newest phases' watched features (all past the step:
the median of the monitor's window only leaves the band once most of it lies in the new regime).

(Tried and not kept: declaring a step as soon as this many phases in a row lie past the band. It sees a
step three phases sooner, but over seeds 1-5 of ``step-h100`` the capture median fell 0.947 -> 0.915.)"""


@dataclass(frozen=True, slots=True)
class WorkloadStep:
    """A watched feature moved far beyond its band: a new regime."""

    feature: int
    shift: float
    """The newest phase's feature against the newest default phases', relative."""
    signature: tuple[float, ...] = ()
    """Where the workload stepped to: the median of the newest phases' watched features (in the order of
    :data:`WATCHED_FEATURES`) — what :mod:`eerl.control.regimes` matches a kept regime on."""

    @property
    def reason(self) -> str:
        """The verdict's words."""
        return f"workload stepped ({self.shift:+.0%}): re-baseline, then re-tune"


@dataclass(frozen=True, slots=True)
class WorkloadDrift:
    """A watched feature left its band gradually: the predictor can follow it."""

    feature: int

    @property
    def reason(self) -> str:
        """The verdict's words."""
        return "workload left its band: control phase, then re-check the allocation"


@dataclass(frozen=True, slots=True)
class RatioDrift:
    """The committed clock's time or energy ratio left its band (None: that ratio did not)."""

    time_shift: float | None
    energy_shift: float | None
    since_iteration: int | None = None
    """The first committed phase at the new level (estimated: the window's phases nearer the new median
    than the old); its phases and the later ones ran at the new cost."""

    @property
    def reason(self) -> str:
        """The verdict's words."""
        return (
            f"ratios left their band (time {self.time_shift or 0.0:+.3f}, "
            f"energy {self.energy_shift or 0.0:+.3f}): control phase, then re-tune"
        )


Drift = WorkloadStep | WorkloadDrift | RatioDrift


def control_due(monitor: MonitorState, config: EerlConfig) -> bool:
    """Time for a control phase on the default governor."""
    return monitor.since_control >= config.control_interval_phases


def probe_due(monitor: MonitorState, config: EerlConfig) -> bool:
    """Time for a probe a fine step below the committed clock (if the run has throughput to spend)."""
    return monitor.since_probe >= config.probe_interval_phases


def judge_control_phase(
    monitor: MonitorState,
    error: float | None,
    error_fraction: float,
    *,
    at_default: bool,
    config: EerlConfig,
) -> bool:
    """Judge a committed kind's default phase; True when it confirms a miss of the predictor.

    ``error`` is the phase's relative duration error as predicted beforehand. A kind committed
    ``at_default`` runs default phases all along; only every control interval's one is a control phase.
    A miss beyond max(3 × the predictor's error, 4%) asks for a second control phase at once; a second
    miss of the same sign confirms it.
    """
    if at_default and not control_due(monitor, config):
        monitor.since_control += 1
        return False
    monitor.since_control = 0
    band = max(3.0 * error_fraction, 0.04)
    if error is None or abs(error) <= band:
        monitor.control_miss_sign = 0
        return False
    sign = 1 if error > 0 else -1
    if monitor.control_miss_sign != sign:
        # One miss may be an outlier: confirm with another control phase before acting.
        monitor.control_miss_sign = sign
        monitor.since_control = config.control_interval_phases
        return False
    monitor.control_miss_sign = 0
    return True


def watch(
    monitor: MonitorState,
    predictor: BaselinePredictor,
    kind: PhaseKind,
    workload: Workload,
    *,
    time_ratio: float,
    energy_ratio: float,
    config: EerlConfig,
    iteration: int | None = None,
) -> Drift | None:
    """Take a committed phase's ratios and workload; the drift they show, if any (medians: outliers cannot).

    The workload is judged from the newest default phase, where the baseline was last checked: under
    drift the window's mean lags behind it, and judged from the mean the workload stayed out of its band
    after every control phase, so each window of committed phases asked for another one (on
    ``drift-h100`` a control phase per kind every 11-13 iterations). A step is judged from the newest few
    default phases together, too: a control phase that fell on a new regime's first phase matches the
    phases after it, and its spread would widen the band enough to hide the step (step-h100 seed 18: a
    tripling of the training tokens went unseen for the rest of the run). When the workload moved, the
    monitor asks for a control phase and starts its shift windows afresh.
    """
    monitor.recent_time.append(time_ratio)
    monitor.recent_energy.append(energy_ratio)
    monitor.recent_iteration.append(-1 if iteration is None else iteration)
    moved = _workload_move(monitor, predictor, kind, workload, config)
    if moved is not None:
        monitor.since_control = config.control_interval_phases
        monitor.recent_shift.clear()
        monitor.recent_watched.clear()
        return moved
    window = config.monitor_window
    time_shift = median_shift(list(monitor.recent_time), window, config.drift_ratio_band)
    energy_shift = median_shift(list(monitor.recent_energy), window, config.drift_ratio_band)
    if time_shift is not None or energy_shift is not None:
        moved_values = monitor.recent_time if time_shift is not None else monitor.recent_energy
        since = _new_level_since(list(moved_values), list(monitor.recent_iteration), window)
        return RatioDrift(time_shift, energy_shift, since)
    return None


def _new_level_since(values: list[float], iterations: list[int], window: int) -> int | None:
    """The iteration of the earliest of the last ``window`` phases whose value lies nearer the window's
    median than the earlier phases' median: where a change in cost began (None: iterations unknown).

    A drift is seen only once most of the window moved, so the phases before the verdict ran at the new
    cost too; counted (not the trailing run alone), one noisy phase cannot hide the start.
    """
    recent, before = np.asarray(values[-window:]), np.asarray(values[:-window])
    new_level, old_level = float(np.median(recent)), float(np.median(before))
    nearer_new = int(np.sum(np.abs(recent - new_level) < np.abs(recent - old_level)))
    since = iterations[-max(nearer_new, 1)]
    return None if since < 0 else since


def _workload_move(
    monitor: MonitorState,
    predictor: BaselinePredictor,
    kind: PhaseKind,
    workload: Workload,
    config: EerlConfig,
) -> WorkloadStep | WorkloadDrift | None:
    """Record this phase's watched features against the newest default phase; how the workload moved.

    The watched feature furthest outside its band wins (tokens; for generation also the longest response,
    which a raised response cap moves while the token count barely does).
    """
    checked = predictor.newest_feature_means(1)
    settled = predictor.newest_feature_means(config.rebaseline_phases)
    if checked is None or settled is None:
        return None
    features = workload_features(kind, workload)
    watched = WATCHED_FEATURES[kind]
    for index in watched:
        shift = float(features[index] / checked[index] - 1.0) if checked[index] > 0 else 0.0
        monitor.recent_shift.setdefault(index, deque(maxlen=SHIFT_HISTORY)).append(shift)
    monitor.recent_watched.append(tuple(float(features[index]) for index in watched))
    spread = predictor.feature_spread()
    moved: tuple[float, int] | None = None
    for index in watched:
        recent = list(monitor.recent_shift.get(index, ()))[-config.monitor_window :]
        if len(recent) < config.monitor_window:
            continue
        median_shift_now = float(np.median(recent))
        if settled[index] > 0:
            from_settled = (1.0 + median_shift_now) * float(checked[index] / settled[index]) - 1.0
            if is_step(from_settled, config.step_feature_band):
                return WorkloadStep(index, from_settled, _signature(monitor))
        band = config.drift_feature_band
        if spread is not None:
            band = max(band, 2.5 * float(spread[index]))
        if abs(median_shift_now) > band:
            excess = abs(median_shift_now) / band
            if moved is None or excess > moved[0]:
                moved = (excess, index)
    if moved is None:
        return None
    index = moved[1]
    # Judge the size of the move on the newest phase against the newest default phases: when the window's
    # median first leaves the band after a step, half the window still holds the old regime.
    newest_shift = float(features[index] / settled[index] - 1.0) if settled[index] > 0 else 0.0
    if is_step(newest_shift, config.step_feature_band):
        return WorkloadStep(index, newest_shift, _signature(monitor))
    return WorkloadDrift(index)


def stepped_phase(
    predictor: BaselinePredictor, kind: PhaseKind, workload: Workload, config: EerlConfig
) -> WorkloadStep | None:
    """A committed kind's default-governor phase (a control phase) whose workload lies beyond the step band
    from the newest default phases: a step, seen on that one phase. Judged as a control phase instead, it
    would read as the predictor missing (a +290 % miss on a regime-switching job) and re-learn the same
    work's cost, throwing away what the kind knew of the regime it left."""
    settled = predictor.newest_feature_means(config.rebaseline_phases)
    if settled is None:
        return None
    features = workload_features(kind, workload)
    for index in WATCHED_FEATURES[kind]:
        if settled[index] <= 0:
            continue
        shift = float(features[index] / settled[index] - 1.0)
        if is_step(shift, config.step_feature_band):
            signature = tuple(float(features[i]) for i in WATCHED_FEATURES[kind])
            return WorkloadStep(index, shift, signature)
    return None


def is_step(shift: float, band: float) -> bool:
    """A relative shift beyond the step band either way: ×(1 + band) up, or ÷(1 + band) down (a halving is
    as much a step as a doubling)."""
    return abs(math.log1p(max(shift, -0.999999))) > math.log1p(band)


def _signature(monitor: MonitorState) -> tuple[float, ...]:
    """The median of the newest phases' watched features, feature by feature."""
    newest = list(monitor.recent_watched)[-SIGNATURE_PHASES:]
    return tuple(float(np.median(column)) for column in zip(*newest, strict=True))


def median_shift(values: list[float], window: int, floor: float) -> float | None:
    """The shift of the last ``window`` values' median from the earlier ones', when it is significant.

    Significant: beyond ``floor`` and beyond five robust standard errors (robust scale of the earlier
    values). Medians on both sides: a single outlier moves neither.
    """
    if len(values) < 2 * window:
        return None
    before = np.asarray(values[:-window])
    recent = np.asarray(values[-window:])
    shift = float(np.median(recent) - np.median(before))
    scale = max(1.4826 * float(np.median(np.abs(before - np.median(before)))), 0.003)
    bound = max(floor, 5.0 * 1.25 * scale * float(np.sqrt(1.0 / window + 1.0 / len(before))))
    return shift if abs(shift) > bound else None


def reset_for_commit(monitor: MonitorState) -> None:
    """A fresh commit: its control interval starts now and drift is judged on its own phases only."""
    monitor.since_control = 0
    monitor.recent_time.clear()
    monitor.recent_energy.clear()
    monitor.recent_iteration.clear()
    monitor.recent_shift.clear()
    monitor.recent_watched.clear()
