"""Baseline predictor: what a phase would have cost under the default governor, given its token workload.

A candidate clock is judged on a different batch than the default phases it is compared with, so the
comparison has to be "on the same token workload": the predictor turns a workload into the duration and
energy the default governor would have needed, and a trial's ratios are measured / predicted.

The model is a small ridge regression on relative workload features (tokens, longest response, sequences),
fitted on a sliding window of default-governor phases. Its level is theirs alone; its slopes (how cost
follows the workload) also learn from the phases run at locked clocks, each clock's phases around their
own level, because four default phases cannot pin four slopes and a wrong slope biases every prediction
away from their mean workload (a block of a clock's phases that spreads far more than the typical one,
the same work changing its cost inside it, counts for little). It shrinks towards a prior slope
(training scales with tokens; generation partly), so three or four samples already give a usable model.
Its out-of-sample error (each new default phase is predicted before it is added) is tracked and reported.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import numpy.typing as npt

from eerl.control import numeric
from eerl.phases import PhaseKind, Workload

_T = TypeVar("_T")

LOCKED_BLOCK = 16
"""Consecutive locked phases that share one level per clock: under drift, a lock's ratio moves slowly."""

LOCKED_REFIT = 4
"""The slopes are refitted every this many locked phases (they move slowly; a refit costs ~0.3 ms)."""

LOCKED_WINDOW = 120
"""Locked phases kept for the slopes (the newest: under drift, how cost follows work may change too)."""

_GROUP_SPREAD_TOLERANCE = 9.0
"""A block of locked phases counts fully up to this many times the typical block's spread (variance; three
times its standard deviation): blocks of a steady job differ by sampling alone, and a block of two phases
often reads four times the typical (on `sync-gb200` 1.8 % against 0.9 %)."""

_RIDGE = 2e-3
"""Ridge strength on relative features (typical batch-to-batch variation is a few percent)."""


@dataclass(frozen=True, slots=True)
class Prediction:
    """Predicted default-governor cost of a phase."""

    duration_s: float
    energy_j: float


FEATURES: dict[PhaseKind, tuple[str, ...]] = {
    PhaseKind.GENERATION: ("tokens", "max_response_tokens", "sequences", "max_worker_kv_tokens"),
    PhaseKind.TRAINING: ("tokens", "sequences", "valid_tokens"),
}
"""Per kind, the :class:`~eerl.Workload` fields that explain a phase's cost, in the order of
:func:`workload_features`: tokens, longest response (decode steps), sequences; for generation also the
busiest worker's KV reads (the phase ends with that worker; 0 when not reported, and a feature that is 0 in
every sample drops out of the fit); for training the valid tokens."""


def feature_indices(kind: PhaseKind, *names: str) -> tuple[int, ...]:
    """Where the named features sit in :func:`workload_features` of ``kind``."""
    return tuple(FEATURES[kind].index(name) for name in names)


def workload_features(kind: PhaseKind, workload: Workload) -> npt.NDArray[np.float64]:
    """The :data:`FEATURES` of ``kind`` of a workload, as floats."""
    return np.array([getattr(workload, name) for name in FEATURES[kind]], dtype=np.float64)


_SPREAD_WIDENED = {
    PhaseKind.GENERATION: feature_indices(PhaseKind.GENERATION, "tokens", "max_worker_kv_tokens"),
    PhaseKind.TRAINING: feature_indices(PhaseKind.TRAINING, "tokens"),
}
"""The features whose band in :meth:`BaselinePredictor.forget_far` widens with their spread (they vary
from batch to batch anyway); never the longest response, whose spread a raised cap itself makes wide."""


_DECODE_READS = feature_indices(PhaseKind.GENERATION, "max_worker_kv_tokens")[0]


def _prior_slopes(kind: PhaseKind, x_mean: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Elasticities assumed before data says otherwise (``x_mean``: the default phases' mean features).

    Training cost grows with its tokens. Decoding is memory-bound and the phase waits for its busiest
    worker, so where the job reports that worker's decode reads (``max_worker_kv_tokens``) generation's
    time follows them almost one for one (elasticity 0.98–1.0 fitted on 200 default phases of three
    simulated workloads; the tokens' small share is the prefill's and the compute-bound steps'); without
    them it follows the tokens and the longest response partly."""
    if kind is PhaseKind.GENERATION:
        if x_mean[_DECODE_READS] > 0:
            return np.array([0.05, 0.0, 0.0, 0.95])
        return np.array([0.5, 0.3, 0.0, 0.0])
    return np.array([1.0, 0.0, 0.0])


class BaselinePredictor:
    """Default-governor duration and energy of one phase kind as a function of its workload."""

    def __init__(self, kind: PhaseKind, window: int = 16) -> None:
        self._kind = kind
        self._features: deque[npt.NDArray[np.float64]] = deque(maxlen=window)
        self._durations: deque[float] = deque(maxlen=window)
        self._energies: deque[float] = deque(maxlen=window)
        self._errors: deque[float] = deque(maxlen=window)
        self._errors_recorded = 0
        """Errors recorded since this predictor began (a position in their sequence, which the window does
        not bound): :meth:`drop_errors_since` finds a re-baseline's errors by it."""
        self._groups: dict[tuple[int, int], deque[tuple[npt.NDArray[np.float64], float, float]]] = {}
        """The newest :data:`LOCKED_WINDOW` locked phases (features, duration, energy) by (clock, block of
        :data:`LOCKED_BLOCK` consecutive ones), each group's oldest first."""
        self._locked_order: deque[tuple[int, int]] = deque()
        """The group of each locked phase kept, oldest first: which phase goes when the window is full."""
        self._locked_added = 0
        self._group_moments: dict[tuple[int, int], _Moments] = {}
        """Each group's contribution to the fit, kept until the group changes (only the group that
        changed is recomputed at a refit)."""
        self._defaults: tuple[npt.NDArray[np.float64], _Moments, float, float] | None = None
        """The default phases' part of the fit (mean features, terms, levels), kept until they change."""
        self._model: tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], float, float] | None = None

    @property
    def count(self) -> int:
        """Default phases in the current window."""
        return len(self._durations)

    @property
    def error_fraction(self) -> float:
        """Mean absolute relative out-of-sample error of the duration prediction (0 until measured)."""
        return float(np.mean(self._errors)) if self._errors else 0.0

    @property
    def errors_recorded(self) -> int:
        """How many out-of-sample errors this predictor has recorded (window or not): a mark for
        :meth:`drop_errors_since`."""
        return self._errors_recorded

    def drop_errors_since(self, mark: int) -> None:
        """Forget the errors recorded after ``mark`` (an :attr:`errors_recorded` read earlier).

        A re-baseline's phases are predicted by a model that still holds the old regime's samples: their
        errors measure the step, not the noise. Kept, they are the noise level of the new regime's model
        for as long as they stay in the window — on `regime-switch-h100` 74 % for one regime, where its
        phases vary by 1 %: every margin at its cap, the outlier and control-phase bands wide open.
        """
        for _ in range(min(max(self._errors_recorded - mark, 0), len(self._errors))):
            self._errors.pop()
        self._errors_recorded = min(self._errors_recorded, mark)

    def newest_feature_means(self, count: int) -> npt.NDArray[np.float64] | None:
        """Mean workload features of the ``count`` newest samples: where the baseline was last checked."""
        if not self._features:
            return None
        return np.mean(np.stack(list(self._features)[-count:]), axis=0)  # type: ignore[no-any-return]

    def feature_medians(self) -> npt.NDArray[np.float64] | None:
        """Median workload features over the window: the regime's signature (one phase of another
        workload learned into it cannot move it)."""
        if not self._features:
            return None
        return np.median(np.stack(list(self._features)), axis=0)

    def feature_spread(self, newest: int | None = None) -> npt.NDArray[np.float64] | None:
        """Relative standard deviation of each feature over the window, or its ``newest`` samples (how much
        batches vary anyway)."""
        samples = list(self._features) if newest is None else list(self._features)[-newest:]
        if len(samples) < 2:
            return None
        features = np.stack(samples)
        means = features.mean(axis=0)
        return np.where(means > 0, features.std(axis=0) / np.where(means > 0, means, 1.0), 0.0)

    def add(
        self, workload: Workload, duration_s: float, energy_j: float, *, force: bool = False
    ) -> float | None:
        """Add a default-governor phase; return its relative duration error as predicted beforehand.

        A phase far outside the model's error band (beyond both 6 typical errors and 15%) is not learned
        from unless ``force`` is set: one outlier must not bend the baseline that every trial is judged by.
        A real change in the workload shows up again and again, and the controller then re-baselines.
        """
        error: float | None = None
        before = self.predict(workload)
        if before is not None and self.count >= 3:
            error = duration_s / before.duration_s - 1.0
            energy_error = energy_j / before.energy_j - 1.0
            band = max(6.0 * self.error_fraction, 0.15)
            if not force and self.count >= 4 and max(abs(error), abs(energy_error)) > band:
                return error
            self._errors.append(abs(error))
            self._errors_recorded += 1
        self._features.append(workload_features(self._kind, workload))
        self._durations.append(duration_s)
        self._energies.append(energy_j)
        self._model = None
        self._defaults = None
        return error

    def add_locked(
        self, sm_clock_mhz: int, features: npt.NDArray[np.float64], duration_s: float, energy_j: float
    ) -> None:
        """Add a phase run at a locked clock (its :func:`workload_features`): it says how cost grows with
        the workload, not its level.

        A lock scales a phase's cost by about the same factor whatever its workload, so the phases at one
        clock share a level of their own and their spread around it is the workload's doing. The few
        default phases alone leave the model's slopes to noise (four samples, four features), and a wrong
        slope biases every prediction away from their mean workload. The slopes are refitted every
        :data:`LOCKED_REFIT` locked phases.
        """
        if len(self._locked_order) == LOCKED_WINDOW:
            oldest = self._locked_order.popleft()
            self._groups[oldest].popleft()
            if not self._groups[oldest]:
                del self._groups[oldest]
            self._group_moments.pop(oldest, None)
        key = (sm_clock_mhz, self._locked_added // LOCKED_BLOCK)
        self._groups.setdefault(key, deque()).append((features, duration_s, energy_j))
        self._locked_order.append(key)
        self._group_moments.pop(key, None)
        self._locked_added += 1
        if self._locked_added % LOCKED_REFIT == 0:
            self._model = None

    def forget_locked(self) -> None:
        """Drop the locked phases: in a new regime (a step, ratios the model cannot explain) how cost
        follows work may have changed with it."""
        self._groups.clear()
        self._locked_order.clear()
        self._group_moments.clear()
        self._model = None

    def forget_far(self, workload: Workload, band: float, recent: int) -> None:
        """Drop samples whose features differ from this workload's by more than ×(1 + ``band``) either way in
        any feature — for the tokens and the busiest worker's KV reads, by more than 2.5 of their spread over
        the ``recent`` newest samples (the new regime's own), where that is wider (they vary from batch to
        batch anyway). The ``recent`` samples themselves always stay: they are the new regime's by
        construction. (Over the whole window the spread held both regimes, and where fewer than two
        samples were near this one every sample stayed: on `short-switch-gb200` the long regime's
        training kept the short regime's samples, was kept under the short one's signature, and every
        return to it re-baselined.)

        After a step change the old regime's samples would make the regression extrapolate; samples of a
        gradual drift stay within the band and keep the fit's range. Every feature counts: a raised
        response cap doubles generation's longest response while its token count barely moves (and that
        feature's spread, which the step itself makes wide, must not widen its band).
        """
        reference = workload_features(self._kind, workload)
        spread = self.feature_spread(recent)
        bands = np.full(len(reference), band)
        if spread is not None:
            for index in _SPREAD_WIDENED[self._kind]:
                bands[index] = max(band, 2.5 * float(spread[index]))
        known = [i for i in range(len(reference)) if reference[i] > 0]
        # Either way alike: a sample at half the new workload is as far as one at twice it (log ratios;
        # math.log, the same on every CPU).
        newest = len(self._features) - recent

        def near(f: npt.NDArray[np.float64]) -> bool:
            return all(
                abs(math.log(max(float(f[i] / reference[i]), 1e-12))) <= math.log1p(bands[i]) for i in known
            )

        keep = [index >= newest or near(f) for index, f in enumerate(self._features)]
        self._keep_only(keep)

    def keep_newest(self, count: int) -> None:
        """Keep only the ``count`` newest default phases (the tracked errors stay: the noise level)."""
        self._keep_only([i >= len(self._features) - count for i in range(len(self._features))])

    def _keep_only(self, keep: list[bool]) -> None:
        """Keep the default phases marked, in order; the fit is redone at the next prediction."""
        _keep_marked(self._features, keep)
        _keep_marked(self._durations, keep)
        _keep_marked(self._energies, keep)
        self._model = None
        self._defaults = None

    def predict(self, workload: Workload) -> Prediction | None:
        """Predicted default cost of this workload; None before the first default phase."""
        if not self._durations:
            return None
        if self._model is None:
            self._model = self._fit()
        x_mean, slopes_d_e, d_mean, e_mean = self._model
        rel = np.clip(_relative(workload_features(self._kind, workload), x_mean), -0.9, 3.0)
        factor_d = max(0.05, 1.0 + numeric.dot(rel, slopes_d_e[0]))
        factor_e = max(0.05, 1.0 + numeric.dot(rel, slopes_d_e[1]))
        return Prediction(duration_s=d_mean * factor_d, energy_j=e_mean * factor_e)

    def predict_many(
        self, features: npt.NDArray[np.float64]
    ) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
        """Predicted default duration and energy for rows of :func:`workload_features` (NaN when empty)."""
        if not self._durations:
            nan = np.full(len(features), np.nan)
            return nan, nan.copy()
        if self._model is None:
            self._model = self._fit()
        x_mean, slopes, d_mean, e_mean = self._model
        rel = np.clip(_relative(features, x_mean), -0.9, 3.0)
        factor_d = np.maximum(0.05, 1.0 + numeric.dot_rows(rel, slopes[0]))
        factor_e = np.maximum(0.05, 1.0 + numeric.dot_rows(rel, slopes[1]))
        return d_mean * factor_d, e_mean * factor_e

    def predict_sum(self, count: int, feature_sum: npt.NDArray[np.float64]) -> float | None:
        """Summed predicted default duration of ``count`` phases whose :func:`workload_features` sum to
        ``feature_sum`` (the model is linear in the features; its clipping of far workloads is left out),
        None before the first default phase or where the sum makes no sense."""
        if not self._durations or count <= 0:
            return None
        if self._model is None:
            self._model = self._fit()
        x_mean, slopes, d_mean, _ = self._model
        rel_sum = np.where(x_mean > 0, feature_sum / np.where(x_mean > 0, x_mean, 1.0) - count, 0.0)
        total = d_mean * (count + numeric.dot(rel_sum, slopes[0]))
        return total if total > 0 else None

    def _fit(self) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64], float, float]:
        """Ridge fit of relative cost on relative features, shrunk towards the prior slopes.

        The level is the default phases' own; the slopes pool the default phases with the locked phases,
        each clock's phases around their own mean (a lock changes the level, not how cost follows work).
        """
        if self._defaults is None:
            features = np.stack(list(self._features))
            durations, energies = np.asarray(self._durations), np.asarray(self._energies)
            self._defaults = (
                features.mean(axis=0),
                _moments(features, durations, energies),
                float(durations.mean()),
                float(energies.mean()),
            )
        x_mean, total, level_duration, level_energy = self._defaults
        prior = _prior_slopes(self._kind, x_mean)
        groups: list[_Moments] = []
        for key, samples in self._groups.items():
            if len(samples) < 2:
                continue
            if key not in self._group_moments:
                self._group_moments[key] = _moments(
                    np.stack([f for f, _, _ in samples]),
                    np.array([d for _, d, _ in samples]),
                    np.array([e for _, _, e in samples]),
                )
            groups.append(self._group_moments[key])
        for group, weight in zip(groups, _group_weights(groups, prior), strict=True):
            total = total.plus(group.scaled(weight))
        gram = total.gram + _RIDGE * np.eye(len(x_mean))
        # Shrunk towards the prior: solve for the deviation from it, duration and energy at once.
        moments = np.stack((total.moment_duration, total.moment_energy), axis=1)
        # Solved in plain floats (numeric.solve): a LAPACK kernel's rounding must not steer a decision.
        deviation = numeric.solve(gram, moments - numeric.dot_rows(total.gram, prior)[:, None])
        slopes = prior[None, :] + deviation.T
        return x_mean, slopes, level_duration, level_energy


@dataclass(frozen=True, slots=True)
class _Moments:
    """One group's normal-equation terms: Σ relᵀrel and Σ relᵀ(relative cost), for duration and energy."""

    gram: npt.NDArray[np.float64]
    moment_duration: npt.NDArray[np.float64]
    moment_energy: npt.NDArray[np.float64]
    squares_duration: float = 0.0
    """Σ (relative duration)²: with the other terms, the spread left around any slopes."""
    count: int = 0

    def plus(self, other: _Moments) -> _Moments:
        return _Moments(
            self.gram + other.gram,
            self.moment_duration + other.moment_duration,
            self.moment_energy + other.moment_energy,
            self.squares_duration + other.squares_duration,
            self.count + other.count,
        )

    def scaled(self, weight: float) -> _Moments:
        """This group's terms counted ``weight`` times (its samples weighted alike)."""
        if weight == 1.0:
            return self
        return _Moments(
            self.gram * weight,
            self.moment_duration * weight,
            self.moment_energy * weight,
            self.squares_duration * weight,
            self.count,
        )

    def residual_spread(self, slopes: npt.NDArray[np.float64]) -> float:
        """Mean squared relative duration left once ``slopes`` explain what they can (no level: the
        group's own mean is already out)."""
        left = (
            self.squares_duration
            - 2.0 * numeric.dot(slopes, self.moment_duration)
            + numeric.dot(slopes, numeric.dot_rows(self.gram, slopes))
        )
        return max(left, 0.0) / max(self.count, 1)


def _group_weights(groups: list[_Moments], prior: npt.NDArray[np.float64]) -> list[float]:
    """How much each clock's block of locked phases counts towards the slopes: 1, or less for a block whose
    durations spread around the prior slopes far more than the typical block's.

    A block holds one level, but the cost of the same work can change inside one (a BF16 KV cache where
    it was FP8: generation 20 % dearer from one phase on). Its phases then sit on two levels, and the fit
    explains the step with whichever mix of near-collinear features happens to differ between the halves:
    on `kv-bf16-h100` seed 3 generation's elasticity to the busiest worker's KV reads went from 0.94 to
    -0.66 (tokens +0.83), every default phase was then mispredicted by ±5 % (1 % before) and the run
    spent the rest of its margin on that noise. Weighted by the typical block's spread over its own (a
    block's spread as the variance of its phases), such a block counts for little; blocks of a steady
    workload count fully, however noisy the job (the typical block is as noisy)."""
    spreads = [group.residual_spread(prior) for group in groups]
    typical = sorted(spreads)[len(spreads) // 2] if spreads else 0.0
    return [1.0 if spread <= _GROUP_SPREAD_TOLERANCE * typical else typical / spread for spread in spreads]


def _moments(
    features: npt.NDArray[np.float64], durations: npt.NDArray[np.float64], energies: npt.NDArray[np.float64]
) -> _Moments:
    """A group's terms, relative to its own means: the slopes are elasticities, whatever its level."""
    rel = _relative(features, features.mean(axis=0))
    relative_durations = durations / float(durations.mean()) - 1.0
    return _Moments(
        numeric.gram(rel),
        numeric.cross(rel, relative_durations),
        numeric.cross(rel, energies / float(energies.mean()) - 1.0),
        float((relative_durations * relative_durations).sum()),
        len(durations),
    )


def _relative(features: npt.NDArray[np.float64], mean: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    """Features relative to ``mean`` (``x / mean - 1``); 0 for a feature whose mean is 0 (never reported)."""
    return np.where(mean > 0, features / np.where(mean > 0, mean, 1.0) - 1.0, 0.0)


def _keep_marked(samples: deque[_T], keep: list[bool]) -> None:
    """Keep the entries of ``samples`` marked in ``keep``, in order (in place: its bound stays)."""
    kept = [sample for sample, k in zip(samples, keep, strict=True) if k]
    samples.clear()
    samples.extend(kept)
