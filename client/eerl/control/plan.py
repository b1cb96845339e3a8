"""The budget across phases: each kind's options and the allocation of the iteration's slowdown over them.

:mod:`eerl.control.budget` holds the allocation itself; the :class:`Planner` feeds it. A searching kind
offers its fine candidates (:func:`eerl.control.search.candidate_clocks`) with the clock curve's estimated
ratios, a committed kind only its committed clock, every kind the default governor. The plan aims at the
threshold plus a margin for the predictor's own uncertainty, less what the session's earlier phases left
unused (:mod:`eerl.control.throughput`). One async pool alone in its session plans
against its peer's time (:mod:`eerl.control.slack`); otherwise the kinds share one sync iteration, with the
work between its phases (:mod:`eerl.control.between`).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from eerl.control.between import BetweenWork
from eerl.control.budget import Allocation, KindOptions, allocate_async, allocate_sync
from eerl.control.config import EerlConfig
from eerl.control.grid import ClockGrid
from eerl.control.predictor import BaselinePredictor
from eerl.control.search import candidate_clocks, effective_floor_mhz
from eerl.control.slack import PeerSlack
from eerl.control.state import KindTrack
from eerl.control.throughput import RunThroughput, Yardstick
from eerl.phases import ControllerState, PhaseKind

MIN_SUPPORT = 0.3
"""Kernel weight of nearby trials below which a clock's estimate is not trusted as it stands."""


def judged_by(predictor: BaselinePredictor) -> Yardstick:
    """A yardstick of one predictor (for the kind it predicts)."""

    def judged(kind: PhaseKind, count: int, feature_sum: npt.NDArray[np.float64]) -> float | None:
        return predictor.predict_sum(count, feature_sum)

    return judged


def newest_predictors(tracks: Sequence[KindTrack]) -> Yardstick:
    """The run's yardstick: each kind's newest predictor, summed over the workloads of its locked phases."""
    predictors = {t.kind: t.baseline.predictor for t in tracks}

    def judged(kind: PhaseKind, count: int, feature_sum: npt.NDArray[np.float64]) -> float | None:
        predictor = predictors.get(kind)
        return None if predictor is None else predictor.predict_sum(count, feature_sum)

    return judged


def _pool_noise(track: KindTrack) -> float:
    """How far below its peer's time a waiting pool stays: twice its phases' relative noise (1–5 %)."""
    return min(0.05, max(0.01, 2.0 * track.baseline.predictor.error_fraction))


class Planner:
    """Plans the iteration over the kinds' tracks it is given; of its own it holds the run's throughput."""

    def __init__(
        self,
        target: float,
        config: EerlConfig,
        grid: ClockGrid,
        slack: PeerSlack,
        between: BetweenWork | None = None,
    ) -> None:
        self._target = target
        self._config = config
        self._grid = grid
        self._slack = slack
        self._between = between or BetweenWork(active=False)
        self.run = RunThroughput()
        """The session's throughput so far, which the plan may spend."""

    @property
    def async_pool(self) -> bool:
        """One async pool alone in its session: it plans against its peer's time."""
        return self._slack.active

    @property
    def between_s(self) -> float:
        """The typical work between the phases of a sync iteration (0 for an async pool)."""
        return self._between.per_iteration_s()

    @property
    def target(self) -> float:
        """The throughput threshold the session asked for."""
        return self._target

    def threshold(self, tracks: Sequence[KindTrack]) -> float:
        """The threshold to plan for: the target plus a margin for the predictor's own uncertainty, less
        what the run banked (:meth:`spend`)."""
        planned = self._with_margin(tracks)
        return planned + self._spend(tracks, planned)

    def spend(self, tracks: Sequence[KindTrack]) -> float:
        """How far below its margin's threshold the plan aims now (≤ 0): the run's banked throughput."""
        return self._spend(tracks, self._with_margin(tracks))

    def target_now(self, tracks: Sequence[KindTrack]) -> float:
        """The target, less what the run banked: what a commit or a trial must meet now."""
        return self._target + self.spend(tracks)

    def _spend(self, tracks: Sequence[KindTrack], planned: float) -> float:
        iteration_s = sum(t.baseline.default_duration_s for t in tracks) + self.between_s
        return self.run.spend(
            planned,
            iteration_s,
            self._config.run_spend_horizon,
            self._config.max_run_spend,
            yardstick=newest_predictors(tracks),
            max_repay=self._config.max_run_repay,
        )

    def _with_margin(self, tracks: Sequence[KindTrack]) -> float:
        """The target plus the margin: the time-weighted standard error of the default predictions (a
        biased baseline shifts every measured ratio alike), capped at ``planning_margin``; a noiseless
        job gets none."""
        total = sum(t.baseline.default_duration_s for t in tracks)
        uncertainty = 0.0
        for track in tracks:
            predictor = track.baseline.predictor
            count = max(predictor.count, 1)
            share = track.baseline.default_duration_s / total if total > 0 else 1.0
            uncertainty += share * 1.25 * predictor.error_fraction / float(np.sqrt(count))
        margin = min(self._config.planning_margin, uncertainty)
        return min(1.0, self._target + margin)

    def plan(self, tracks: Sequence[KindTrack], iteration: int) -> Allocation:
        """The allocation of the kinds' current options (committed kinds hold their clocks)."""
        if self.async_pool:
            options = self.options(tracks[0], iteration)
            threshold = self.threshold(tracks)
            return allocate_async(options, self._peer_reference(tracks, threshold), threshold, 0.0)
        return self._sync([self.options(t, iteration) for t in tracks], tracks)

    def committed_and_best(
        self, tracks: Sequence[KindTrack], iteration: int
    ) -> tuple[Allocation, Allocation]:
        """The committed allocation, and the best one on the evidence so far (for the refine)."""
        if self.async_pool:
            threshold = self.threshold(tracks)
            peer = self._peer_reference(tracks, threshold)
            current = allocate_async(self.committed_option(tracks[0], iteration), peer, threshold, 0.0)
            free = self.options(tracks[0], iteration, free=True, extrapolate=False)
            return current, allocate_async(free, peer, threshold, 0.0)
        current = self._sync([self.committed_option(t, iteration) for t in tracks], tracks)
        best = self._sync([self.options(t, iteration, free=True, extrapolate=False) for t in tracks], tracks)
        return current, best

    def _peer_reference(self, tracks: Sequence[KindTrack], threshold: float) -> float | None:
        return self._slack.reference_s(threshold, _pool_noise(tracks[0]))

    def _sync(self, options: list[KindOptions], tracks: Sequence[KindTrack]) -> Allocation:
        return allocate_sync(options, self.threshold(tracks), self.between_s)

    def time_cap(self, track: KindTrack, tracks: Sequence[KindTrack]) -> float:
        """The largest time ratio this kind could take if every other phase ran at default."""
        default_s = track.baseline.default_duration_s
        if self.async_pool:
            return self._slack.time_cap(default_s, self._target, _pool_noise(track))
        total = sum(t.baseline.default_duration_s for t in tracks) + self.between_s
        slack = total / self._target - total
        return 1.0 + slack / max(default_s, 1e-9)

    def options(
        self, track: KindTrack, iteration: int, *, free: bool = False, extrapolate: bool = True
    ) -> KindOptions:
        """Candidate clocks for this kind with their estimated ratios (default always included).

        A committed kind offers only its clock, unless ``free`` asks what it would choose if it could move;
        ``extrapolate=False`` offers only clocks with trials nearby (a commit moves on evidence alone).
        """
        if track.state is ControllerState.COMMITTED and not free:
            return self.committed_option(track, iteration)
        floor = effective_floor_mhz(
            track.search, searching=track.searching, iteration=iteration, config=self._config
        )
        candidates = candidate_clocks(
            track.search, self._grid, track.curve.probed_range_mhz(), track.committed_mhz, floor
        )
        if candidates:
            estimate = track.curve.estimate(np.asarray(candidates, dtype=np.float64), iteration)
            supported = estimate.support >= MIN_SUPPORT
            time_ratio = np.where(supported, estimate.time_ratio, np.nan)
            energy_ratio = np.where(supported, estimate.energy_ratio, np.nan)
            if not extrapolate:
                pass  # only clocks with trials nearby: a committed allocation moves on evidence alone
            elif not supported.any():
                # Nothing close: the kernel fit's extrapolation from the nearest trials, to probe from.
                time_ratio = np.asarray(estimate.time_ratio, dtype=np.float64).copy()
                energy_ratio = np.asarray(estimate.energy_ratio, dtype=np.float64).copy()
            elif not supported.all():
                # Thinly supported clocks: interpolate towards the default (ratio 1 at the top clock), so
                # that a search pushed beyond its recent trials probes there instead of giving up.
                known = np.asarray(candidates, dtype=np.float64)[supported]
                grid = np.asarray(candidates, dtype=np.float64)
                anchor_x = np.append(known, float(self._grid.max_mhz) + 1.0)
                for values in (time_ratio, energy_ratio):
                    anchor_y = np.append(values[supported], 1.0)
                    values[~supported] = np.interp(grid[~supported], anchor_x, anchor_y)
            # Above the clock the governor picks anyway, a lock can only lose: treat as >= 1 each.
            time_ratio = np.maximum(time_ratio, 1.0)
        else:
            time_ratio = energy_ratio = np.zeros(0)
        if track.state is ControllerState.RETUNING and track.committed_mhz is not None and candidates:
            # A local re-tune moves the clock; falling back to the default is not a local move.
            time_ratio = np.concatenate(([np.nan], time_ratio))
            energy_ratio = np.concatenate(([np.nan], energy_ratio))
        else:
            time_ratio = np.concatenate(([1.0], time_ratio))
            energy_ratio = np.concatenate(([1.0], energy_ratio))
        return KindOptions(
            kind=track.kind,
            sm_clocks_mhz=(None, *candidates),
            time_ratio=time_ratio,
            energy_ratio=energy_ratio,
            default_duration_s=max(track.baseline.default_duration_s, 1e-9),
            default_energy_j=max(track.baseline.default_energy_j, 1e-9),
        )

    def committed_option(self, track: KindTrack, iteration: int) -> KindOptions:
        """A committed kind offers only its committed clock to the other kinds' allocation."""
        time_ratio, energy_ratio = np.ones(1), np.ones(1)
        if track.committed_mhz is not None:
            estimate = track.curve.estimate(np.array([float(track.committed_mhz)]), iteration)
            reference_time, reference_energy = track.committed_ratios
            time_ratio = np.nan_to_num(estimate.time_ratio, nan=reference_time)
            energy_ratio = np.nan_to_num(estimate.energy_ratio, nan=reference_energy)
        return KindOptions(
            kind=track.kind,
            sm_clocks_mhz=(track.committed_mhz,),
            time_ratio=np.maximum(time_ratio, 1.0),
            energy_ratio=energy_ratio,
            default_duration_s=max(track.baseline.default_duration_s, 1e-9),
            default_energy_j=max(track.baseline.default_energy_j, 1e-9),
        )
