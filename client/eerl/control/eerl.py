"""The EE-RL controller: learn the default, explore the clock grid, commit, monitor and re-tune.

Per phase kind the controller goes through four states:

* BASELINE — run the default governor for a few phases and fit the baseline predictor (default duration and
  energy as a function of the token workload);
* EXPLORING — a coarse descent over the clock grid (one trial per clock, stopping in that direction as soon
  as a trial is too slow to fit the iteration's budget or has passed the energy minimum), then a fine,
  model-based search: the curve of time and energy ratio versus clock (kernel-smoothed over all trials) feeds
  the iteration-level budget allocation, and the allocated clocks are tried until each has enough samples;
* COMMITTED — hold the allocation; every observation is judged against the predictor, a default-governor
  control phase now and then keeps the predictor honest, and drift (workload features leaving their band,
  ratios leaving theirs — judged on the median of several phases, so one outlier never flips anything)
  triggers a re-tune;
* RETUNING — the same fine search, restricted to a window around the committed clock.

The allocation spends the throughput threshold over the whole iteration (see :mod:`eerl.control.budget`).
Everything here is pure: time and observations come in as arguments.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from eerl.control.base import Controller, ControllerSettings, Decision, PhaseObservation, PhaseSnapshot
from eerl.control.budget import Allocation, KindOptions, allocate_async, allocate_sync
from eerl.control.clocks import nearest_supported_mhz
from eerl.control.curve import ClockCurve, Trial
from eerl.control.predictor import BaselinePredictor, workload_features
from eerl.errors import ValidationError
from eerl.phases import ControllerState, ExecutionMode, PhaseKind, Workload


@dataclass(frozen=True, slots=True)
class EerlConfig:
    """Tuning of the controller; the defaults are what the bench figures were measured with."""

    baseline_phases: int = 4
    coarse_factor: float = 0.88
    coarse_start_fraction: float = 0.77
    """The first coarse trial, as a fraction of the top clock."""
    """Each coarse trial is this fraction of the previous clock."""
    fine_step_fraction: float = 0.022
    """Fine candidates are spaced this fraction of the maximum clock apart (snapped to the grid)."""
    commit_samples: int = 3
    max_exploration_phases: int = 24
    planning_margin: float = 0.006
    """Plan for threshold + margin, so that predictor error rarely pushes the run below the threshold."""
    energy_stop_margin: float = 0.01
    control_interval_phases: int = 60
    refine_interval_phases: int = 20
    """A committed allocation is re-checked against all trials (its own phases included) this often."""
    drift_ratio_band: float = 0.04
    drift_feature_band: float = 0.12
    step_feature_band: float = 0.5
    """A workload shift this large is a new regime: re-baseline on several default phases from scratch."""
    monitor_window: int = 10
    rebaseline_phases: int = 3
    retune_window_steps: int = 3
    refine_surplus: float = 0.006
    """A commit this far above the planned threshold may move for energy (gain > switch_gain_with_surplus)."""
    switch_gain_with_surplus: float = 0.004
    max_refine_backoff: int = 8
    """A refine that ends no better than where it started doubles the refine interval, up to this factor:
    on a stationary workload the estimates of neighbours and of the commit then stop trading places."""
    history: int = 512
    predictor_window: int = 24


@dataclass(slots=True)
class _Kind:
    """Everything the controller knows about one phase kind."""

    kind: PhaseKind
    predictor: BaselinePredictor
    curve: ClockCurve
    state: ControllerState = ControllerState.BASELINE
    committed_mhz: int | None = None
    candidate_mhz: int | None = None
    coarse: list[int] = field(default_factory=list)
    coarse_stopped: bool = False
    min_energy_ratio: float = np.inf
    floor_mhz: int = 0
    floor_iteration: int = 0
    window: tuple[int, int] | None = None
    epoch_iteration: int = 0
    phases: int = 0
    trials_in_search: int = 0
    default_duration_s: float = 0.0
    default_energy_j: float = 0.0
    rebaseline_left: int = 0
    fresh_start: bool = False
    control_miss_sign: int = 0
    since_control: int = 0
    since_refine: int = 0
    last_default_iteration: int = 0
    recent_time: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    recent_energy: deque[float] = field(default_factory=lambda: deque(maxlen=64))
    recent_shift: dict[int, deque[float]] = field(default_factory=dict)
    """Per watched workload feature (index into :func:`workload_features`), its recent relative shifts."""
    reference_time: float = 1.0
    reference_energy: float = 1.0
    exploration_cost_j: float = 0.0
    savings_j: float = 0.0
    predicted_energy_j: float = 0.0
    last_decision: Decision | None = None


class EerlController:
    """The EE-RL controller of one session (see the module docstring)."""

    def __init__(self, settings: ControllerSettings, config: EerlConfig | None = None) -> None:
        clocks = tuple(sorted(set(settings.supported_sm_clocks_mhz)))
        if not clocks:
            raise ValidationError("supported_sm_clocks_mhz", "must name at least one clock")
        if not 0.0 < settings.throughput_threshold <= 1.0:
            raise ValidationError("throughput_threshold", "must be in (0, 1]")
        self._settings = settings
        self._config = config or EerlConfig()
        self._clocks = clocks
        self._max_mhz = clocks[-1]
        self._fine = _fine_grid(clocks, self._config.fine_step_fraction * self._max_mhz)
        self._fine_step_mhz = max(1.0, self._config.fine_step_fraction * self._max_mhz)
        bandwidth = 2.2 * self._fine_step_mhz
        self._kinds: dict[PhaseKind, _Kind] = {}
        for kind in settings.kinds:
            predictor = BaselinePredictor(kind, window=self._config.predictor_window)
            self._kinds[kind] = _Kind(kind, predictor, ClockCurve(predictor.predict_many, bandwidth))
        for track in self._kinds.values():
            track.coarse = self._coarse_schedule()
        self._history: deque[Decision] = deque(maxlen=self._config.history)
        self._peer_durations: deque[float] = deque(maxlen=5)
        self._refine_backoff = 1
        self._refine_from_energy: float | None = None
        self._iteration = 0
        self._plan: Allocation | None = None

    # ------------------------------------------------------------------ interface

    def decide(self, kind: PhaseKind, iteration: int, hints: Workload | None, now_s: float) -> Decision:
        """The clock for the phase about to begin."""
        self._iteration = max(self._iteration, iteration)
        track = self._kinds.get(kind)
        if track is None:
            return Decision(kind, iteration, None, ControllerState.OFF, "kind not controlled here", now_s)
        clock, reason = self._choose(track)
        track.candidate_mhz = clock
        decision = Decision(kind, iteration, clock, track.state, reason, now_s)
        last = track.last_decision
        if last is None or (last.sm_clock_mhz, last.state, last.reason) != (clock, track.state, reason):
            self._history.append(decision)
        track.last_decision = decision
        return decision

    def observe(self, observation: PhaseObservation, now_s: float) -> Decision | None:
        """Take a metered phase into account; return a verdict when the observation changed something."""
        self._iteration = max(self._iteration, observation.iteration)
        track = self._kinds.get(observation.kind)
        if track is None:
            if observation.duration_s > 0:
                self._peer_durations.append(observation.duration_s)
            return None
        if observation.duration_s <= 0 or observation.energy_j <= 0:
            return None
        track.phases += 1
        before_state, before_clock = track.state, track.committed_mhz
        if observation.sm_clock_mhz is None:
            verdict = self._observe_default(track, observation, now_s)
        else:
            verdict = self._observe_trial(track, observation, now_s)
        if verdict is not None:
            self._history.append(verdict)
            return verdict
        if (track.state, track.committed_mhz) != (before_state, before_clock):
            change = Decision(
                track.kind, observation.iteration, track.committed_mhz, track.state, "state change", now_s
            )
            self._history.append(change)
            return change
        return None

    def snapshot(self) -> Sequence[PhaseSnapshot]:
        """Current view per phase kind."""
        views = []
        for track in self._kinds.values():
            savings = track.savings_j / track.predicted_energy_j if track.predicted_energy_j > 0 else 0.0
            clock = track.committed_mhz if track.state is ControllerState.COMMITTED else track.candidate_mhz
            views.append(
                PhaseSnapshot(
                    kind=track.kind,
                    state=track.state,
                    sm_clock_mhz=clock,
                    candidate_sm_clock_mhz=track.candidate_mhz,
                    phases=track.phases,
                    estimated_savings_fraction=savings,
                    exploration_cost_j=track.exploration_cost_j,
                    predictor_error_fraction=track.predictor.error_fraction,
                )
            )
        return views

    def state_of(self, kind: PhaseKind) -> ControllerState | None:
        """The state of ``kind``'s track (None when this session does not run that kind)."""
        track = self._kinds.get(kind)
        return track.state if track is not None else None

    def decisions(self) -> Sequence[Decision]:
        """History, oldest first (bounded)."""
        return list(self._history)

    # ------------------------------------------------------------------ choosing

    def _choose(self, track: _Kind) -> tuple[int | None, str]:
        config = self._config
        if track.state is ControllerState.BASELINE or track.rebaseline_left > 0:
            return None, "default governor: baseline for the predictor"
        if track.state is ControllerState.COMMITTED:
            if track.since_control >= config.control_interval_phases:
                return None, "default governor: control phase to re-validate the predictor"
            return track.committed_mhz, "committed"
        if track.coarse and not track.coarse_stopped:
            kind_of_trial = "coarse" if track.state is ControllerState.EXPLORING else "local"
            return track.coarse[0], f"{kind_of_trial} trial"
        plan = self._replan()
        clock = plan.sm_clock_mhz.get(track.kind)
        return clock, f"fine trial (plan: throughput {plan.throughput_ratio:.3f})"

    def _coarse_schedule(self) -> list[int]:
        """Descending coarse trials, starting a few steps below the top (where savings begin to matter)."""
        clocks: list[int] = []
        target = self._max_mhz * self._config.coarse_start_fraction
        while target >= self._clocks[0]:
            snapped = nearest_supported_mhz(self._clocks, target)
            if not clocks or snapped < clocks[-1]:
                clocks.append(snapped)
            target *= self._config.coarse_factor
        return clocks

    def _coarse_upward(self, clock_mhz: int) -> list[int]:
        """Coarse trials above a first trial that was already too slow (nearest first)."""
        clocks: list[int] = []
        target = clock_mhz / self._config.coarse_factor
        while target < self._max_mhz:
            snapped = nearest_supported_mhz(self._clocks, target)
            if snapped > (clocks[-1] if clocks else clock_mhz):
                clocks.append(snapped)
            target /= self._config.coarse_factor
        return clocks

    def _options(self, track: _Kind, *, free: bool = False, extrapolate: bool = True) -> KindOptions:
        """Candidate clocks for this kind with their estimated ratios (default always included).

        A committed kind offers only its clock, unless ``free`` asks what it would choose if it could move.
        """
        probed = track.curve.probed_range_mhz()
        candidates: list[int] = []
        if track.state is ControllerState.COMMITTED and not free:
            return self._committed_option(track)
        if probed is not None:
            low, high = probed
            # Above the highest trial, estimates interpolate towards the default (ratio 1 at the top).
            high = self._max_mhz
            low = max(low, self._floor(track))
            if track.window is not None:
                inside = (max(low, track.window[0]), min(high, track.window[1]))
                # The window keeps a re-tune local, unless a failed trial pushed the floor beyond it.
                if any(inside[0] <= c <= inside[1] for c in self._fine):
                    low, high = inside
                else:
                    # Pushed above everything tried lately: offer the next window above the floor.
                    high = int(low + self._config.retune_window_steps * self._fine_step_mhz)
            candidates = [c for c in self._fine if low <= c <= high]
            if track.committed_mhz is not None and low <= track.committed_mhz <= high:  # keep it reachable
                candidates = sorted({*candidates, track.committed_mhz})
        if candidates:
            estimate = track.curve.estimate(np.asarray(candidates, dtype=np.float64), self._iteration)
            supported = estimate.support >= 0.3
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
                anchor_x = np.append(known, float(self._max_mhz) + 1.0)
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
            default_duration_s=max(track.default_duration_s, 1e-9),
            default_energy_j=max(track.default_energy_j, 1e-9),
        )

    def _floor(self, track: _Kind) -> int:
        """The lowest clock a failed trial allows; a committed kind's floor expires with its baseline.

        The floor was judged on the baseline of its search. Kept for ever, it would bar the refine from
        moving back down once later control phases show the baseline was biased (it ratcheted a memory-bound
        generation clock upward under drift); within a control interval it keeps a commit from flapping.
        """
        searching = track.state in (ControllerState.EXPLORING, ControllerState.RETUNING)
        if searching or self._iteration - track.floor_iteration < self._config.control_interval_phases:
            return track.floor_mhz
        return 0

    def _committed_option(self, track: _Kind) -> KindOptions:
        """A committed kind offers only its committed clock to the other kinds' allocation."""
        time_ratio, energy_ratio = np.ones(1), np.ones(1)
        if track.committed_mhz is not None:
            estimate = track.curve.estimate(np.array([float(track.committed_mhz)]), self._iteration)
            time_ratio = np.nan_to_num(estimate.time_ratio, nan=track.reference_time)
            energy_ratio = np.nan_to_num(estimate.energy_ratio, nan=track.reference_energy)
        return KindOptions(
            kind=track.kind,
            sm_clocks_mhz=(track.committed_mhz,),
            time_ratio=np.maximum(time_ratio, 1.0),
            energy_ratio=energy_ratio,
            default_duration_s=max(track.default_duration_s, 1e-9),
            default_energy_j=max(track.default_energy_j, 1e-9),
        )

    def _threshold(self) -> float:
        """The threshold to plan for: the target plus a margin for the predictor's own uncertainty.

        The margin is the time-weighted standard error of the default predictions (a biased baseline
        shifts every measured ratio alike), capped at ``planning_margin``; a noiseless job gets none.
        """
        total = sum(t.default_duration_s for t in self._kinds.values())
        uncertainty = 0.0
        for track in self._kinds.values():
            count = max(track.predictor.count, 1)
            share = track.default_duration_s / total if total > 0 else 1.0
            uncertainty += share * 1.25 * track.predictor.error_fraction / float(np.sqrt(count))
        margin = min(self._config.planning_margin, uncertainty)
        return min(1.0, self._settings.throughput_threshold + margin)

    def _replan(self) -> Allocation:
        tracks = list(self._kinds.values())
        if self._settings.mode is ExecutionMode.ASYNC and len(tracks) == 1:
            peer = float(np.median(self._peer_durations)) if self._peer_durations else None
            plan = allocate_async(self._options(tracks[0]), peer, self._threshold(), idle_power_w=0.0)
        else:
            plan = allocate_sync([self._options(t) for t in tracks], self._threshold())
        self._plan = plan
        return plan

    def _time_cap(self, track: _Kind) -> float:
        """The largest time ratio this kind could take if every other phase ran at default."""
        threshold = self._settings.throughput_threshold
        if self._settings.mode is ExecutionMode.ASYNC and len(self._kinds) == 1:
            peer = float(np.median(self._peer_durations)) if self._peer_durations else 0.0
            return max(track.default_duration_s, peer) / (threshold * max(track.default_duration_s, 1e-9))
        total = sum(t.default_duration_s for t in self._kinds.values())
        slack = total / threshold - total
        return 1.0 + slack / max(track.default_duration_s, 1e-9)

    # ------------------------------------------------------------------ observing

    def _observe_default(self, track: _Kind, obs: PhaseObservation, now_s: float) -> Decision | None:
        track.last_default_iteration = obs.iteration
        relearning = track.rebaseline_left > 0 or track.state is ControllerState.BASELINE
        error = track.predictor.add(obs.workload, obs.duration_s, obs.energy_j, force=relearning)
        self._track_default_scale(track, obs.workload)
        # A phase on the default governor saves nothing by definition: its energy counts in the total
        # the savings are a fraction of, and the predictor's error on it is no saving (nor a loss).
        track.predicted_energy_j += obs.energy_j
        if track.state is ControllerState.BASELINE:
            if track.predictor.count >= self._config.baseline_phases:
                track.state = ControllerState.EXPLORING
                track.epoch_iteration = obs.iteration
            return None
        if track.rebaseline_left > 0:
            track.rebaseline_left -= 1
            if track.rebaseline_left == 0:
                if track.fresh_start:
                    spread = track.predictor.feature_spread()
                    band = self._config.drift_feature_band
                    if spread is not None:
                        band = max(band, 2.5 * float(spread[0]))
                    track.predictor.forget_far(obs.workload, band)
                self._start_retune(track, obs.iteration, fresh=track.fresh_start)
            return None
        if track.state in (ControllerState.EXPLORING, ControllerState.RETUNING):
            # The allocation chose the default governor for this kind: that is a measured choice too.
            reason = self._maybe_commit(obs.iteration)
            if reason is not None:
                return Decision(track.kind, obs.iteration, None, track.state, reason, now_s, 1.0, 1.0)
            return None
        if track.state is ControllerState.COMMITTED:
            due = track.since_control >= self._config.control_interval_phases
            if track.committed_mhz is None and not due:
                track.since_control += 1
                return None
            track.since_control = 0
            band = max(3.0 * track.predictor.error_fraction, 0.04)
            if error is None or abs(error) <= band:
                track.control_miss_sign = 0
                return None
            sign = 1 if error > 0 else -1
            if track.control_miss_sign != sign:
                # One miss may be an outlier: confirm with another control phase before acting.
                track.control_miss_sign = sign
                track.since_control = self._config.control_interval_phases
                return None
            track.control_miss_sign = 0
            track.rebaseline_left = self._config.rebaseline_phases - 1
            track.fresh_start = True
            track.state = ControllerState.RETUNING
            track.predictor.add(obs.workload, obs.duration_s, obs.energy_j, force=True)
            return Decision(
                track.kind,
                obs.iteration,
                None,
                track.state,
                f"two control phases off by {error:+.1%}: re-baseline, then re-tune",
                now_s,
            )
        return None

    def _observe_trial(self, track: _Kind, obs: PhaseObservation, now_s: float) -> Decision | None:
        prediction = track.predictor.predict(obs.workload)
        if prediction is None:
            return None
        clock = int(obs.sm_clock_mhz) if obs.sm_clock_mhz is not None else 0
        time_ratio = obs.duration_s / prediction.duration_s
        energy_ratio = obs.energy_j / prediction.energy_j
        features = workload_features(track.kind, obs.workload)
        track.curve.add(Trial(clock, features, obs.duration_s, obs.energy_j, obs.iteration))
        track.predicted_energy_j += prediction.energy_j
        track.savings_j += prediction.energy_j - obs.energy_j
        self._track_default_scale(track, obs.workload)
        searching = track.state in (ControllerState.EXPLORING, ControllerState.RETUNING)
        if searching:
            track.trials_in_search += 1
            allowed_s = prediction.duration_s / self._settings.throughput_threshold
            if obs.duration_s > allowed_s:
                track.exploration_cost_j += obs.energy_j  # the whole energy of a trial that missed
        verdict_reason: str | None = None
        if (
            searching
            and track.state is ControllerState.RETUNING
            and track.coarse
            and not track.coarse_stopped
        ):
            if track.coarse[0] == clock:
                track.coarse.pop(0)
            if not track.coarse:
                track.coarse_stopped = True
        elif track.state is ControllerState.EXPLORING and track.coarse and not track.coarse_stopped:
            if track.coarse[0] == clock:
                track.coarse.pop(0)
            track.min_energy_ratio = min(track.min_energy_ratio, energy_ratio)
            noise = max(0.01, 1.25 * track.predictor.error_fraction)
            first = track.curve.probed_range_mhz() == (clock, clock)
            if time_ratio > self._time_cap(track) + 2.0 * noise and first:
                # Too slow already at the first trial: the interesting clocks lie above it.
                upward = self._coarse_upward(clock)
                track.coarse = upward
                track.coarse_stopped = not upward
                return None
            if time_ratio > self._time_cap(track) + 2.0 * noise:
                track.coarse_stopped = True
                verdict_reason = f"coarse descent stops: time ratio {time_ratio:.3f} over the budget"
            elif energy_ratio > track.min_energy_ratio + self._config.energy_stop_margin:
                track.coarse_stopped = True
                verdict_reason = f"coarse descent stops: past the energy minimum ({energy_ratio:.3f})"
            if verdict_reason is not None or not track.coarse:
                track.coarse_stopped = True
        elif track.state in (ControllerState.EXPLORING, ControllerState.RETUNING):
            verdict_reason = self._maybe_commit(obs.iteration)
        elif track.state is ControllerState.COMMITTED:
            track.since_control += 1
            verdict_reason = self._monitor(track, obs, time_ratio, energy_ratio)
            track.since_refine += 1
            if verdict_reason is None and track.since_refine >= self._refine_interval():
                track.since_refine = 0
                verdict_reason = self._refine(obs.iteration)
        if verdict_reason is None:
            return None
        return Decision(
            track.kind,
            obs.iteration,
            track.committed_mhz if track.state is ControllerState.COMMITTED else clock,
            track.state,
            verdict_reason,
            now_s,
            throughput_ratio=1.0 / time_ratio,
            energy_ratio=energy_ratio,
        )

    def _track_default_scale(self, track: _Kind, workload: Workload) -> None:
        """Follow the typical default cost of this kind (the weights of the budget allocation)."""
        prediction = track.predictor.predict(workload)
        if prediction is None:
            return
        if track.default_duration_s == 0.0:
            track.default_duration_s, track.default_energy_j = prediction.duration_s, prediction.energy_j
            return
        alpha = 0.2
        track.default_duration_s += alpha * (prediction.duration_s - track.default_duration_s)
        track.default_energy_j += alpha * (prediction.energy_j - track.default_energy_j)

    def _searching(self) -> list[_Kind]:
        return [
            t
            for t in self._kinds.values()
            if t.state in (ControllerState.EXPLORING, ControllerState.RETUNING)
        ]

    def _maybe_commit(self, iteration: int) -> str | None:
        """Commit the allocation once every searching kind's allocated clock is measured well enough."""
        searching = self._searching()
        if any(t.coarse and not t.coarse_stopped for t in searching):
            return None
        if any(t.rebaseline_left > 0 for t in searching):
            return None
        plan = self._replan()
        needed = self._config.commit_samples
        exhausted = any(t.trials_in_search >= self._config.max_exploration_phases for t in searching)
        for track in searching:
            clock = plan.sm_clock_mhz.get(track.kind)
            if clock is None:
                continue
            count = len(track.curve.trials_at(clock, track.epoch_iteration))
            local = track.state is ControllerState.RETUNING
            if count < (2 if exhausted or local else needed):
                return None
        failing = self._failing_kind(plan)
        if failing is not None:
            clock = plan.sm_clock_mhz[failing.kind]
            assert clock is not None
            failing.floor_mhz = clock + 1
            failing.floor_iteration = iteration
            return f"trial at {clock} MHz measured below the threshold: search above it"
        self._judge_refine(plan)
        for track in searching:
            track.committed_mhz = plan.sm_clock_mhz.get(track.kind)
            track.state = ControllerState.COMMITTED
            track.window = None
            track.trials_in_search = 0
            track.since_control = 0
            track.recent_time.clear()
            track.recent_energy.clear()
            track.recent_shift.clear()
            measured = (
                track.curve.measured_at(track.committed_mhz, track.epoch_iteration)
                if track.committed_mhz is not None
                else None
            )
            track.reference_time, track.reference_energy = (1.0, 1.0) if measured is None else measured[:2]
        return (
            f"commit: expected throughput {plan.throughput_ratio:.3f}, energy {plan.energy_ratio:.3f} "
            "of the predicted default"
        )

    def _refine_interval(self) -> int:
        return self._config.refine_interval_phases * self._refine_backoff

    def _judge_refine(self, plan: Allocation) -> None:
        """Back off the refine when the re-tune it started commits no better than the allocation it left."""
        if self._refine_from_energy is None:
            return
        if plan.energy_ratio > self._refine_from_energy - self._config.switch_gain_with_surplus:
            self._refine_backoff = min(2 * self._refine_backoff, self._config.max_refine_backoff)
        else:
            self._refine_backoff = 1
        self._refine_from_energy = None

    def _failing_kind(self, plan: Allocation) -> _Kind | None:
        """The kind whose measured trials put the allocation below the threshold, if any."""
        tracks = list(self._kinds.values())
        measured_time = 0.0
        default_time = 0.0
        worst: tuple[float, _Kind] | None = None
        for track in tracks:
            clock = plan.sm_clock_mhz.get(track.kind)
            ratio = 1.0
            if clock is not None:
                measured = track.curve.measured_at(clock, track.epoch_iteration)
                ratio = measured[0] if measured is not None else 1.0
            measured_time += track.default_duration_s * ratio
            default_time += track.default_duration_s
            excess = track.default_duration_s * (ratio - 1.0)
            searching = track.state in (ControllerState.EXPLORING, ControllerState.RETUNING)
            if clock is not None and searching and (worst is None or excess > worst[0]):
                worst = (excess, track)
        if self._settings.mode is ExecutionMode.ASYNC and len(tracks) == 1:
            track = tracks[0]
            cap = self._time_cap(track)
            clock = plan.sm_clock_mhz.get(track.kind)
            if clock is None:
                return None
            measured = track.curve.measured_at(clock, track.epoch_iteration)
            return track if measured is not None and measured[0] > cap else None
        if default_time / max(measured_time, 1e-12) < self._settings.throughput_threshold and worst:
            return worst[1]
        return None

    def _refine(self, iteration: int) -> str | None:
        """Re-check a committed allocation with everything measured since, and move it locally if needed.

        Committed phases keep adding trials at the committed clocks, so the allocation's estimate sharpens
        over time. If it now looks below the threshold, or a neighbouring allocation saves clearly more,
        the kinds that would move re-tune locally (their earlier trials are kept).
        """
        tracks = list(self._kinds.values())
        if any(t.state is not ControllerState.COMMITTED for t in tracks):
            return None
        if self._settings.mode is ExecutionMode.ASYNC and len(tracks) == 1:
            peer = float(np.median(self._peer_durations)) if self._peer_durations else None
            current = allocate_async(self._committed_option(tracks[0]), peer, self._threshold(), 0.0)
            best = allocate_async(
                self._options(tracks[0], free=True, extrapolate=False), peer, self._threshold(), 0.0
            )
        else:
            current = allocate_sync([self._committed_option(t) for t in tracks], self._threshold())
            best = allocate_sync(
                [self._options(t, free=True, extrapolate=False) for t in tracks], self._threshold()
            )
        short = current.throughput_ratio < self._settings.throughput_threshold - 0.005
        gain = current.energy_ratio - best.energy_ratio
        moving = [t for t in tracks if best.sm_clock_mhz.get(t.kind) != t.committed_mhz]
        # Energy alone moves a commit only when it leaves clear throughput unused (else it would flap).
        surplus = current.throughput_ratio > self._threshold() + self._config.refine_surplus
        if not moving or not (short or (surplus and gain > self._config.switch_gain_with_surplus)):
            return None
        stale = [
            t for t in tracks if iteration - t.last_default_iteration > self._config.refine_interval_phases
        ]
        if stale:
            # Judge against a fresh baseline first: a stale predictor under drift skews every ratio.
            for track in stale:
                track.since_control = self._config.control_interval_phases
                track.since_refine = self._config.refine_interval_phases - 2
            return None
        span = self._config.retune_window_steps * self._fine_step_mhz
        for track in moving:
            center = track.committed_mhz
            track.state = ControllerState.RETUNING
            track.window = None if center is None else (int(center - span), int(center + span))
            track.coarse = []
            track.coarse_stopped = True
            track.floor_mhz = 0
            track.trials_in_search = 0
            track.epoch_iteration = iteration - self._config.refine_interval_phases * 3
        # Only an energy-driven move is judged by its outcome; a commit below the threshold must move.
        self._refine_from_energy = None if short else current.energy_ratio
        why = "below the threshold" if short else f"{gain:.1%} more energy than a neighbour"
        return f"refine: the committed allocation is {why} by all trials so far; re-tune locally"

    def _monitor(
        self, track: _Kind, obs: PhaseObservation, time_ratio: float, energy_ratio: float
    ) -> str | None:
        """Watch a committed kind; decide when drift calls for a re-tune (medians: outliers cannot)."""
        config = self._config
        track.recent_time.append(time_ratio)
        track.recent_energy.append(energy_ratio)
        means = track.predictor.feature_means()
        features = workload_features(track.kind, obs.workload)
        watched = _WATCHED_FEATURES[track.kind]
        if means is not None:
            for index in watched:
                shift = float(features[index] / means[index] - 1.0) if means[index] > 0 else 0.0
                track.recent_shift.setdefault(index, deque(maxlen=32)).append(shift)
        window = config.monitor_window
        spread = track.predictor.feature_spread()
        # The watched feature furthest outside its band (tokens; for generation also the longest response,
        # which a raised response cap moves while the token count barely does).
        moved: tuple[float, int] | None = None
        for index in watched:
            band = config.drift_feature_band
            if spread is not None:
                band = max(band, 2.5 * float(spread[index]))
            recent = list(track.recent_shift.get(index, ()))[-window:]
            median_shift = float(np.median(recent)) if recent else 0.0
            if len(recent) >= window and abs(median_shift) > band:
                excess = abs(median_shift) / band
                if moved is None or excess > moved[0]:
                    moved = (excess, index)
        if moved is not None:
            index = moved[1]
            track.since_control = config.control_interval_phases
            track.recent_shift.clear()
            track.state = ControllerState.RETUNING
            # Judge the size of the move on the newest phases against the newest default phases: when the
            # window's median first leaves the band after a step, half the window still holds the old
            # regime, and under drift the window's mean lags far behind the last control phase.
            newest_shift = 0.0
            latest = track.predictor.newest_feature_means(config.rebaseline_phases)
            if latest is not None and latest[index] > 0:
                newest_shift = float(features[index] / latest[index] - 1.0)
            if abs(newest_shift) > config.step_feature_band:
                # A new regime: the old default phases would make the predictor extrapolate.
                track.rebaseline_left = config.rebaseline_phases
                track.fresh_start = True
                return f"workload stepped ({newest_shift:+.0%}): re-baseline, then re-tune"
            # Gradual drift: the predictor follows the workload and the clock curve (ratios against the
            # predicted default) stays valid, so refresh the baseline and re-check the allocation with it;
            # the refine moves the clocks locally only if the budget now sits differently.
            track.state = ControllerState.COMMITTED
            self._refine_backoff = 1
            track.since_refine = config.refine_interval_phases - 1
            return "workload left its band: control phase, then re-check the allocation"
        time_shift = _median_shift(list(track.recent_time), window, config.drift_ratio_band)
        energy_shift = _median_shift(list(track.recent_energy), window, config.drift_ratio_band)
        if time_shift is not None or energy_shift is not None:
            track.state = ControllerState.RETUNING
            track.rebaseline_left = self._config.rebaseline_phases
            track.fresh_start = True
            return (
                f"ratios left their band (time {time_shift or 0.0:+.3f}, energy {energy_shift or 0.0:+.3f}): "
                "control phase, then re-tune"
            )
        return None

    def _start_retune(self, track: _Kind, iteration: int, *, fresh: bool) -> None:
        """Search again around the committed clock (with trials from now on only, after a step change)."""
        track.state = ControllerState.RETUNING
        track.epoch_iteration = iteration
        if fresh:
            track.curve.discount(keep_after_iteration=iteration - 1)
            # A changed workload: the next refines judge fresh estimates, at the normal pace.
            self._refine_backoff = 1
            self._refine_from_energy = None
        if track.committed_mhz is None:
            # Nothing to be local around: explore again from the top.
            track.state = ControllerState.EXPLORING
            track.window = None
            track.floor_mhz = 0
            track.trials_in_search = 0
            track.coarse = self._coarse_schedule()
            track.coarse_stopped = False
            track.min_energy_ratio = np.inf
            return
        center = track.committed_mhz
        span = self._config.retune_window_steps * self._fine_step_mhz
        track.window = (int(center - span), int(center + span))
        track.floor_mhz = 0
        track.trials_in_search = 0
        edges = {
            nearest_supported_mhz(self._fine, center - span),
            nearest_supported_mhz(self._fine, center + span),
        } - {center}
        track.coarse = [center, *sorted(edges)] if track.committed_mhz is not None else sorted(edges)
        track.coarse_stopped = False
        track.min_energy_ratio = np.inf


def create_eerl_controller(settings: ControllerSettings) -> Controller:
    """The factory the daemon looks up: an EE-RL controller for one session."""
    return EerlController(settings)


_WATCHED_FEATURES: dict[PhaseKind, tuple[int, ...]] = {
    PhaseKind.GENERATION: (0, 1),  # tokens, longest response
    PhaseKind.TRAINING: (0,),  # tokens
}


def _median_shift(values: list[float], window: int, floor: float) -> float | None:
    """The shift of the last ``window`` values' median from the earlier ones', when it is significant.

    Significant: beyond ``floor`` and beyond four standard errors (robust scale of the earlier values).
    Medians on both sides: a single outlier moves neither.
    """
    if len(values) < 2 * window:
        return None
    before = np.asarray(values[:-window])
    recent = np.asarray(values[-window:])
    shift = float(np.median(recent) - np.median(before))
    scale = max(1.4826 * float(np.median(np.abs(before - np.median(before)))), 0.003)
    bound = max(floor, 5.0 * 1.25 * scale * float(np.sqrt(1.0 / window + 1.0 / len(before))))
    return shift if abs(shift) > bound else None


def _fine_grid(clocks: tuple[int, ...], step_mhz: float) -> tuple[int, ...]:
    """Every clock at least ``step_mhz`` above the previous one kept (top clock always in)."""
    kept = [clocks[-1]]
    for clock in reversed(clocks[:-1]):
        if kept[-1] - clock >= step_mhz - 1e-9:
            kept.append(clock)
    return tuple(sorted(kept))
