"""The response of one phase kind to its SM clock: time and energy ratios against the predicted default.

Every trial phase gives one point (clock, measured/predicted duration, measured/predicted energy). The
trial keeps its raw measurement and workload, and its ratios are recomputed with the current predictor
each time, so that every default phase added later sharpens all past trials too. Single
points are noisy (the predictor's error is a percent or two), so the curve is a kernel-weighted local-linear
fit over neighbouring clocks: samples at nearby clocks share their information, and a robust (Huber)
re-weighting keeps a single outlier phase from moving the estimate much. Older samples fade with age so
that the curve follows a drifting workload. Given the top clock (``EerlConfig.physics_curve``, on by
default), once four clocks have trials the energy is the physics-shaped fit of
:mod:`eerl.control.physics` to those same weighted trials (every clock's estimate then rests on all of
them, and the voltage knee stays a kink), and the time the slower of that fit's and the local one's.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from eerl.control import numeric, physics

FloatArray = npt.NDArray[np.float64]

_LN2 = 0.6931471805599453


@dataclass(frozen=True, slots=True)
class Trial:
    """One phase run at a locked clock: its workload features and what it cost."""

    sm_clock_mhz: int
    features: FloatArray
    duration_s: float
    energy_j: float
    iteration: int


Baseline = Callable[[FloatArray], tuple[FloatArray, FloatArray]]
"""Predicted default (duration, energy) for rows of workload features."""


@dataclass(frozen=True, slots=True)
class CurveEstimate:
    """Estimated ratios at a set of clocks, with how much data supports each estimate."""

    sm_clocks_mhz: FloatArray
    time_ratio: FloatArray
    energy_ratio: FloatArray
    support: FloatArray


class ClockCurve:
    """Time and energy ratio versus clock for one phase kind, from trials."""

    def __init__(
        self,
        baseline: Baseline,
        bandwidth_mhz: float,
        half_life_iterations: float = 120.0,
        capacity: int = 240,
        per_clock: int = 30,
        *,
        top_mhz: float | None = None,
    ) -> None:
        self._baseline = baseline
        self._top_mhz = top_mhz
        self._shape: tuple[bytes, physics.PhysicsFit | None] | None = None
        """The latest physics fit and the bytes of what it was fitted to: a plan reads the curve several
        times over the same trials."""
        self._bandwidth_mhz = bandwidth_mhz
        self._half_life = half_life_iterations
        self._per_clock = per_clock
        self._trials: deque[Trial] = deque(maxlen=capacity)

    def __len__(self) -> int:
        return len(self._trials)

    def add(self, trial: Trial) -> None:
        """Record a trial; beyond ``per_clock`` trials at its clock, the oldest one there goes.

        A committed kind adds a trial at one clock every phase: with one bound for all clocks they would
        evict the search's trials at the other clocks, and with them the curve's shape around the commit.
        """
        same = [t for t in self._trials if t.sm_clock_mhz == trial.sm_clock_mhz]
        if len(same) >= self._per_clock:
            self._trials.remove(same[0])
        self._trials.append(trial)

    def discount(self, keep_after_iteration: int) -> None:
        """Drop trials from before an iteration (the workload changed under them)."""
        kept = [t for t in self._trials if t.iteration >= keep_after_iteration]
        self._trials.clear()
        self._trials.extend(kept)

    def trials_at(self, sm_clock_mhz: int, since_iteration: int = -1) -> list[Trial]:
        """Trials run at exactly this clock (optionally only recent ones)."""
        return [t for t in self._trials if t.sm_clock_mhz == sm_clock_mhz and t.iteration >= since_iteration]

    def ratios(self, trials: list[Trial]) -> tuple[FloatArray, FloatArray]:
        """Time and energy ratios of trials against the current predicted default of their workloads."""
        if not trials:
            return np.zeros(0), np.zeros(0)
        duration, energy = self._baseline(np.stack([t.features for t in trials]))
        times = np.array([t.duration_s for t in trials]) / duration
        energies = np.array([t.energy_j for t in trials]) / energy
        return times, energies

    def measured_at(self, sm_clock_mhz: int, since_iteration: int = -1) -> tuple[float, float, int] | None:
        """Robust mean (median beyond two samples) of the trials at exactly this clock."""
        trials = self.trials_at(sm_clock_mhz, since_iteration)
        if not trials:
            return None
        times, energies = self.ratios(trials)
        if len(trials) >= 3:
            return float(np.median(times)), float(np.median(energies)), len(trials)
        return float(times.mean()), float(energies.mean()), len(trials)

    def probed_range_mhz(self) -> tuple[int, int] | None:
        """Lowest and highest clock tried so far."""
        if not self._trials:
            return None
        clocks = [t.sm_clock_mhz for t in self._trials]
        return min(clocks), max(clocks)

    def estimate(self, sm_clocks_mhz: FloatArray, now_iteration: int) -> CurveEstimate:
        """Local-linear, robust, age-weighted estimate of both ratios at each requested clock."""
        grid = np.asarray(sm_clocks_mhz, dtype=np.float64)
        if not self._trials:
            nan = np.full(grid.shape, np.nan)
            return CurveEstimate(grid, nan, nan.copy(), np.zeros(grid.shape))
        trials = list(self._trials)
        clocks = np.array([t.sm_clock_mhz for t in trials], dtype=np.float64)
        times, energies = self.ratios(trials)
        ages = now_iteration - np.array([t.iteration for t in trials], dtype=np.float64)
        age_weight = numeric.exp(np.maximum(ages, 0.0) * (-_LN2 / self._half_life))  # halves per half-life
        base = _weights(grid, clocks, self._bandwidth_mhz, age_weight)
        # The fit at a trial depends only on its clock: fit once per distinct clock (a committed clock
        # holds most trials) and spread the result back to the trials.
        distinct, back = np.unique(clocks, return_inverse=True)
        own = _weights(distinct, clocks, self._bandwidth_mhz, age_weight)
        # Start from the residuals to each clock's own median (where it has three trials or more), so that
        # an outlier cannot drag the first fit; then iterate the robust fit a few times.
        robust_t = _huber_weights(times - _per_clock_median(clocks, times))
        robust_e = _huber_weights(energies - _per_clock_median(clocks, energies))
        for _ in range(3):
            at_t = _local_linear(distinct, clocks, times, own * robust_t[None, :])[back]
            at_e = _local_linear(distinct, clocks, energies, own * robust_e[None, :])[back]
            robust_t = _huber_weights(times - at_t)
            robust_e = _huber_weights(energies - at_e)
        support = base.sum(axis=1)
        shape = self._physics(
            distinct,
            back,
            times,
            energies,
            time_weight=age_weight * robust_t,
            energy_weight=age_weight * robust_e,
        )
        fit_t = _local_linear(grid, clocks, times, base * robust_t[None, :])
        if shape is not None:
            # Time is the promise's side: of the shape's reading and the local fit's, the slower. Where the
            # trials beside a clock say it is slower than the shape does, a plan on the shape would spend
            # throughput the run does not have (eight sets, runs under their threshold: seeds 1-5 13 -> 22
            # with the shape's time alone, 10 with the slower of the two; seeds 6-10 15 -> 28, 20).
            time_ratio = np.maximum(shape.time_ratio(grid), fit_t)
            return CurveEstimate(grid, time_ratio, shape.energy_ratio(grid), support)
        fit_e = _local_linear(grid, clocks, energies, base * robust_e[None, :])
        return CurveEstimate(grid, fit_t, fit_e, support)

    def _physics(
        self,
        distinct: FloatArray,
        back: npt.NDArray[np.intp],
        times: FloatArray,
        energies: FloatArray,
        *,
        time_weight: FloatArray,
        energy_weight: FloatArray,
    ) -> physics.PhysicsFit | None:
        """The physics-shaped fit to each clock's weighted mean ratios (None before four clocks have trials,
        or without the top clock to scale the shape by)."""
        if self._top_mhz is None or len(distinct) < physics.MIN_CLOCKS:
            return None
        count = len(distinct)
        sum_wt: FloatArray = np.bincount(back, weights=time_weight, minlength=count).astype(np.float64)
        sum_we: FloatArray = np.bincount(back, weights=energy_weight, minlength=count).astype(np.float64)
        mean_t = np.bincount(back, weights=time_weight * times, minlength=count) / np.maximum(sum_wt, 1e-300)
        mean_e = np.bincount(back, weights=energy_weight * energies, minlength=count) / np.maximum(
            sum_we, 1e-300
        )
        key = b"".join(x.tobytes() for x in (distinct, mean_t, sum_wt, mean_e, sum_we))
        if self._shape is None or self._shape[0] != key:
            self._shape = (key, physics.fit(distinct, mean_t, sum_wt, mean_e, sum_we, top_mhz=self._top_mhz))
        return self._shape[1]


def _weights(
    points: FloatArray, clocks: FloatArray, bandwidth_mhz: float, age_weight: FloatArray
) -> FloatArray:
    """Gaussian kernel of each point (rows) to each trial clock (columns), times the trials' age weights."""
    z = (points[:, None] - clocks[None, :]) / bandwidth_mhz
    kernel = numeric.exp(-0.5 * z * z)
    return kernel * age_weight[None, :]


def _per_clock_median(clocks: FloatArray, values: FloatArray) -> FloatArray:
    """Each value's reference: the median at its clock with three or more trials, else the value itself."""
    reference = values.copy()
    for clock in np.unique(clocks):
        at = clocks == clock
        if at.sum() >= 3:
            reference[at] = np.median(values[at])
    return reference


def _huber_weights(residuals: FloatArray) -> FloatArray:
    """Huber weights with a robust scale: beyond 2.5 sigma a point counts less, beyond 6 sigma not at all."""
    scale = 1.4826 * float(np.median(np.abs(residuals - np.median(residuals))))
    scale = max(scale, 0.005)  # ratios are never known better than half a percent
    limit = 2.5 * scale
    magnitude = np.abs(residuals)
    weights = np.where(magnitude <= limit, 1.0, limit / np.maximum(magnitude, 1e-12))
    return np.where(magnitude > 6.0 * scale, 0.0, weights)  # far outliers: no say at all


def _local_linear(
    grid: FloatArray, clocks: FloatArray, values: FloatArray, weights: FloatArray
) -> FloatArray:
    """Weighted local-linear regression of values on clock, evaluated at each grid point."""
    sw = weights.sum(axis=1)
    safe = np.maximum(sw, 1e-300)
    mean_x = numeric.dot_rows(weights, clocks) / safe
    mean_y = numeric.dot_rows(weights, values) / safe
    dx = clocks[None, :] - mean_x[:, None]
    var_x = (weights * dx * dx).sum(axis=1)
    cov = (weights * dx * (values[None, :] - mean_y[:, None])).sum(axis=1)
    # Regularised slope: where the neighbourhood spans little clock range, fall back to the local mean.
    slope = cov / (var_x + 1e-9 + 0.05 * sw * 50.0**2)
    return mean_y + slope * (grid - mean_x)  # type: ignore[no-any-return]
