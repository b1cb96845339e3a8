"""Refine and re-tune: moving a committed allocation when the evidence or the workload says so.

* The *refine* re-checks the committed allocation every refine interval against all trials so far
  (committed phases keep adding trials at the committed clocks, so its estimate sharpens): when it now
  looks below the threshold, or leaves clear throughput unused while a neighbouring allocation saves
  clearly more, the kinds that would move re-tune locally, with the model alone (their trials are kept).
  A re-tune started for energy alone that commits no better than where it started doubles the interval
  (up to ``max_refine_backoff``): on a stationary job the estimates would otherwise keep trading places.
* The *responses* to what the monitor saw: gradual workload drift re-checks the allocation after a control
  phase; a step, ratio drift or a confirmed control-phase miss re-baselines and then re-tunes around the
  committed clock with fresh trials (:func:`start_retune`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from eerl.control.base import PhaseObservation
from eerl.control.baseline import schedule_rebaseline
from eerl.control.budget import Allocation
from eerl.control.config import EerlConfig
from eerl.control.grid import ClockGrid
from eerl.control.monitor import (
    WATCHED_FEATURES,
    Drift,
    RatioDrift,
    WorkloadDrift,
    WorkloadStep,
    reset_for_commit,
)
from eerl.control.plan import Planner
from eerl.control.regimes import Regime, snapshot_regime
from eerl.control.search import restart_descent, resume_model_search, settle, start_local, start_model_local
from eerl.control.state import KindTrack, MonitorState, RefinePace
from eerl.phases import ControllerState, PhaseKind

SHORT_TOLERANCE = 0.005
"""A committed allocation this far below the threshold must move (at most: see :func:`refine_move`)."""


@dataclass(frozen=True, slots=True)
class RefineMove:
    """The refine's verdict: these kinds move, because the commit is short or a neighbour saves more."""

    moving: tuple[PhaseKind, ...]
    short: bool
    """Below the threshold (else: moving for energy)."""
    gain: float
    """Energy ratio the best allocation saves over the committed one."""

    @property
    def reason(self) -> str:
        """The verdict's words."""
        why = "below the threshold" if self.short else f"{self.gain:.1%} more energy than a neighbour"
        return f"refine: the committed allocation is {why} by all trials so far; re-tune locally"


def refine_interval(pace: RefinePace, config: EerlConfig) -> int:
    """Committed phases between two refines."""
    return config.refine_interval_phases * pace.backoff


def take_refine_turn(
    monitor: MonitorState, pace: RefinePace, config: EerlConfig, planned_threshold: Callable[[], float]
) -> bool:
    """True (and the count restarts) when the committed phases since the last refine fill the interval.

    The backed-off interval holds only while the commit still covers the plan: the run's ledger raises the
    planned threshold when the run owes (slow trials, a yardstick later default phases corrected), and a
    commit that expected less than that by more than ``refine_surplus`` is re-checked every plain interval
    (``planned_threshold`` is asked once per plain interval, not per phase).
    """
    base = config.refine_interval_phases
    interval = refine_interval(pace, config)
    if base <= monitor.since_refine < interval and monitor.since_refine % base == 0:
        expected = pace.committed_throughput
        if expected is not None and expected < planned_threshold() - config.refine_surplus:
            interval = base
    if monitor.since_refine >= interval:
        monitor.since_refine = 0
        return True
    return False


def refine_move(
    current: Allocation,
    best: Allocation,
    committed_mhz: Mapping[PhaseKind, int | None],
    *,
    target: float,
    planned_threshold: float,
    config: EerlConfig,
) -> RefineMove | None:
    """The refine's rule: move when the commit is short, or has surplus and a neighbour saves clearly more.

    Energy alone moves a commit only when it leaves clear throughput unused (else it would flap). Short
    means below the threshold by more than the predictor's own uncertainty (the planning margin, at most
    ``SHORT_TOLERANCE``): on a noiseless job any shortfall moves the commit.
    """
    tolerance = min(SHORT_TOLERANCE, max(planned_threshold - target, 0.0))
    short = current.throughput_ratio < target - tolerance
    gain = current.energy_ratio - best.energy_ratio
    moving = tuple(k for k, clock in committed_mhz.items() if best.sm_clock_mhz.get(k) != clock)
    surplus = current.throughput_ratio > planned_threshold + config.refine_surplus
    if not moving or not (short or (surplus and gain > config.switch_gain_with_surplus)):
        return None
    return RefineMove(moving, short, gain)


def refine(
    tracks: Sequence[KindTrack],
    planner: Planner,
    pace: RefinePace,
    grid: ClockGrid,
    *,
    iteration: int,
    config: EerlConfig,
) -> str | None:
    """Re-check a committed allocation with everything measured since, and move it locally if needed.

    Judged against a fresh baseline only: a kind whose last default phase is older than a refine interval
    asks for a control phase first (and a refine right after it).
    """
    if any(t.state is not ControllerState.COMMITTED for t in tracks):
        return None
    current, best = planner.committed_and_best(tracks, iteration)
    move = refine_move(
        current,
        best,
        {t.kind: t.committed_mhz for t in tracks},
        target=planner.target_now(tracks),
        planned_threshold=planner.threshold(tracks),
        config=config,
    )
    if move is None:
        return None
    stale = [
        t for t in tracks if iteration - t.baseline.last_default_iteration > config.refine_interval_phases
    ]
    if stale:
        # Judge against a fresh baseline first: a stale predictor under drift skews every ratio.
        for track in stale:
            track.monitor.since_control = config.control_interval_phases
            track.monitor.since_refine = config.refine_interval_phases - 2
        return None
    for track in tracks:
        if track.kind in move.moving:
            track.state = ControllerState.RETUNING
            epoch = iteration - config.refine_interval_phases * 3
            start_model_local(track.search, grid, track.committed_mhz, epoch)
    # Only an energy-driven move is judged by its outcome; a commit below the threshold must move.
    pace.from_energy = None if move.short else current.energy_ratio
    return move.reason


def judge_refine_outcome(pace: RefinePace, plan: Allocation, config: EerlConfig) -> None:
    """At a commit: back off the refine when the re-tune it started commits no better than it left."""
    if pace.from_energy is None:
        return
    if plan.energy_ratio > pace.from_energy - config.switch_gain_with_surplus:
        pace.backoff = min(2 * pace.backoff, config.max_refine_backoff)
    else:
        pace.backoff = 1
    pace.from_energy = None


def respond_to_drift(
    track: KindTrack, drift: Drift, pace: RefinePace, config: EerlConfig, iteration: int
) -> str:
    """Act on the monitor's drift verdict; the reason.

    Gradual drift: the predictor follows the workload and the clock curve (ratios against the predicted
    default) stays valid, so the monitor's control phase refreshes the baseline and the refine re-checks
    the allocation right after it, at the normal pace. A step: the regime being left is kept
    (:mod:`eerl.control.regimes`); a step back to a kept regime takes it up again, any other step
    re-baselines, then re-tunes. Ratio drift: re-baseline, then re-tune.
    """
    if isinstance(drift, WorkloadDrift):
        pace.backoff = 1
        track.monitor.since_refine = config.refine_interval_phases - 1
        return drift.reason
    if isinstance(drift, WorkloadStep):
        returned = switch_regime(track, drift, config, iteration)
        if returned is not None:
            return returned
    # A new regime, or ratios the predictor cannot explain: the old default phases would mislead it.
    track.state = ControllerState.RETUNING
    schedule_rebaseline(
        track.baseline,
        config.rebaseline_phases,
        same_work=not isinstance(drift, WorkloadStep),
        changed_since=drift.since_iteration if isinstance(drift, RatioDrift) else None,
    )
    return drift.reason


def switch_regime(track: KindTrack, step: WorkloadStep, config: EerlConfig, iteration: int) -> str | None:
    """Keep the regime a step leaves; take up the kept one it lands on, if any (its reason; else None).

    Two signatures within half the step band on every watched feature are one regime.
    """
    band = config.step_feature_band / 2.0
    returning = track.regimes.recall(np.asarray(step.signature), band) if step.signature else None
    typical = track.baseline.predictor.feature_medians()
    if typical is not None:
        track.regimes.keep(regime_of(track, typical[list(WATCHED_FEATURES[track.kind])], iteration), band)
    if returning is None:
        return None
    take_up_regime(track, returning, config)
    if returning.search_epoch is not None:
        return f"workload stepped ({step.shift:+.0%}) back to a regime seen before: its search taken up again"
    where = "the default governor" if returning.committed_mhz is None else f"{returning.committed_mhz} MHz"
    return (
        f"workload stepped ({step.shift:+.0%}) back to a regime seen before: its commit at {where} again, "
        "its control phases going on from its own count"
    )


def regime_of(track: KindTrack, signature: npt.NDArray[np.float64], iteration: int) -> Regime:
    """What ``track`` knows now, kept under ``signature`` (a copy: the track goes on learning)."""
    spread = track.baseline.predictor.feature_spread()
    return snapshot_regime(
        signature,
        track.baseline.predictor,
        track.curve,
        default_duration_s=track.baseline.default_duration_s,
        default_energy_j=track.baseline.default_energy_j,
        committed_mhz=track.committed_mhz,
        committed_ratios=track.committed_ratios,
        iteration=iteration,
        search_epoch=track.search.epoch_iteration if track.searching else None,
        signature_spread=None if spread is None else spread[list(WATCHED_FEATURES[track.kind])],
        since_refine=track.monitor.since_refine,
        since_control=track.monitor.since_control,
    )


def take_up_regime(track: KindTrack, regime: Regime, config: EerlConfig) -> None:
    """Commit ``track`` as it was in ``regime``, its control and refine cadence going on from there."""
    baseline = track.baseline
    baseline.predictor = regime.predictor
    baseline.default_duration_s = regime.default_duration_s
    baseline.default_energy_j = regime.default_energy_j
    baseline.rebaseline_left = 0
    baseline.rebaseline_same_work = False
    baseline.rebaseline_errors_mark = None
    baseline.check_pending = False
    track.curve = regime.curve
    track.committed_mhz = regime.committed_mhz
    track.committed_ratios = regime.committed_ratios
    if regime.search_epoch is not None:
        # Left mid-search: its search goes on over the trials it had (taken up as a commit at the default
        # governor, a regime of a job switching every 15 iterations ran at the default for 40).
        track.state = (
            ControllerState.RETUNING if regime.committed_mhz is not None else ControllerState.EXPLORING
        )
        resume_model_search(track.search, regime.search_epoch)
        baseline.check_pending = True
        return
    track.state = ControllerState.COMMITTED
    settle(track.search)
    reset_for_commit(track.monitor)
    # The refine and the control phases go on with the regime's own counts: not the other regime's (on
    # which it re-tuned three phases after the return, to repay what the other regime's re-tune had
    # cost), nor 0 (with blocks shorter than a refine interval, a regime taken up again never refined:
    # `short-switch-gb200`). A control phase at once on every return cost a default phase per kind and
    # return: on the `switch`, `cadence` and `after` sets 3-7 % of all phases.
    track.monitor.since_refine = regime.since_refine
    track.monitor.since_control = regime.since_control


def respond_to_control_miss(track: KindTrack, obs: PhaseObservation, error: float, config: EerlConfig) -> str:
    """Two control phases missed the predictor alike: this one counts as the first re-baseline phase."""
    schedule_rebaseline(track.baseline, config.rebaseline_phases - 1, same_work=True)
    track.state = ControllerState.RETUNING
    track.baseline.predictor.add(obs.workload, obs.duration_s, obs.energy_j, force=True)
    return f"two control phases off by {error:+.1%}: re-baseline, then re-tune"


def start_retune(track: KindTrack, grid: ClockGrid, pace: RefinePace, iteration: int) -> None:
    """After a re-baseline: search again around the committed clock, with trials from now on only.

    A kind committed at the default has nothing to be local around: it explores again from the top. The
    changed workload resets the refine's pace (the next refines judge fresh estimates).
    """
    track.state = ControllerState.RETUNING
    track.curve.discount(keep_after_iteration=iteration - 1)
    pace.backoff = 1
    pace.from_energy = None
    if track.committed_mhz is None:
        track.state = ControllerState.EXPLORING
        restart_descent(track.search, grid, iteration)
        return
    start_local(track.search, grid, track.committed_mhz, iteration)


def retune_partners(
    tracks: Sequence[KindTrack], changed: KindTrack, grid: ClockGrid, iteration: int, config: EerlConfig
) -> None:
    """After ``changed`` re-baselined on a change in what the same work costs, the kinds committed beside
    it re-tune too, on the trials they have.

    The allocation is one budget over the kinds: when one kind's cost changes, its share of the iteration
    and what each kind's slowdown buys change with it. Re-tuned alone, the changed kind had to fit around
    a commit chosen for the old shares: on `kv-fp8-verl-h100` seed 5 generation got 30 % cheaper while
    training stayed committed at a time ratio of 0.845, and generation's search climbed to the top clock to
    make up for it (capture 0.57; 0.90 with its partner re-tuned). The partners search their window with the
    model alone, their trials of the last three refine intervals counting (as a refine does).

    Only after a same-work change: after a workload step the same move cost more than it gained (at 0.98
    `drift-h100` and `step-h100` lost 0.1 of capture on several seeds, the partner's trials at the default
    governor while the stepped kind re-searched; the refine moves the partner soon after anyway)."""
    for track in tracks:
        if track is changed or track.state is not ControllerState.COMMITTED:
            continue
        track.state = ControllerState.RETUNING
        start_model_local(
            track.search, grid, track.committed_mhz, iteration - config.refine_interval_phases * 3
        )
