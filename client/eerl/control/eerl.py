"""The EE-RL controller: learn the default, explore the clock grid, commit, monitor and re-tune.

Per phase kind the controller goes through four states:

* BASELINE — run the default governor for a few phases and fit the baseline predictor (default duration and
  energy as a function of the token workload);
* EXPLORING — a coarse descent over the clock grid (one trial per clock, stopping in that direction as soon
  as a trial is too slow to fit the iteration's budget or has passed the energy minimum), then a fine,
  model-based search: the curve of time and energy ratio versus clock (kernel-smoothed over all trials) feeds
  the iteration-level budget allocation, and the allocated clocks are tried until each has enough samples;
* COMMITTED — hold the allocation; every observation is judged against the predictor, a default-governor
  control phase now and then keeps the predictor honest, a probe a fine step below (while the run has
  throughput to spend) keeps evidence where the refine could move, and drift (workload features leaving
  their band, ratios leaving theirs — judged on the median of several phases, so one outlier never flips
  anything) triggers a re-tune;
* RETUNING — the same fine search, restricted to a window around the committed clock (the window slides
  down when the plan picks the lowest clock tried).

:class:`EerlController` only coordinates: it routes each phase to the part its kind's state calls for.
Each part is a module with one job, over the records of :mod:`eerl.control.state` that it owns:

* :mod:`eerl.control.baseline` — fitting the predictor under the default governor; re-baselines;
* :mod:`eerl.control.search` — which clock a searching kind tries next; the exploration bounds;
* :mod:`eerl.control.plan` — the budget across phases: each kind's options, the planned threshold;
* :mod:`eerl.control.throughput` — the run's throughput so far: what earlier phases left for the plan;
* :mod:`eerl.control.slack` — async slack: the peer pool's time and the budget it leaves;
* :mod:`eerl.control.commit` — when the searching kinds commit, and what committing resets;
* :mod:`eerl.control.monitor` — a committed kind: control phases and drift detection;
* :mod:`eerl.control.retune` — the refine of a commit, and the re-tunes that answer drift;
* :mod:`eerl.control.regimes` — regime memory: a regime a step leaves is kept, and taken up on return;
* :mod:`eerl.control.grid` — the clock grid: fine candidates, coarse descent, re-tune windows.

The allocation spends the throughput threshold over the whole iteration, the work between the phases included
(see :mod:`eerl.control.budget` and :mod:`eerl.control.between`).
Everything here is pure: time and observations come in as arguments.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from eerl.control.base import Controller, ControllerSettings, Decision, PhaseObservation, PhaseSnapshot
from eerl.control.baseline import baseline_complete, learn_default, rebaseline_step, track_default_scale
from eerl.control.between import BetweenWork
from eerl.control.budget import Allocation
from eerl.control.commit import try_commit
from eerl.control.config import EerlConfig
from eerl.control.curve import Trial
from eerl.control.grid import ClockGrid
from eerl.control.monitor import control_due, judge_control_phase, probe_due, stepped_phase, watch
from eerl.control.plan import Planner, judged_by
from eerl.control.predictor import workload_features
from eerl.control.retune import (
    refine,
    respond_to_control_miss,
    respond_to_drift,
    retune_partners,
    start_retune,
    take_refine_turn,
)
from eerl.control.search import after_coarse_trial, after_local_trial, coarse_pending, next_trial, trial_noise
from eerl.control.slack import PeerOverrun, PeerSlack
from eerl.control.state import KindTrack, RefinePace, new_track
from eerl.errors import ValidationError
from eerl.phases import ControllerState, ExecutionMode, PhaseKind, Workload

__all__ = [
    "JOB_CONFIG",
    "PROBE_REASON",
    "EerlConfig",
    "EerlController",
    "create_eerl_controller",
    "create_job_eerl_controller",
]


PROBE_REASON = "committed: probing a fine step below (the run has throughput to spend)"
"""The reason of a probe's decision: the kind stays committed, this one phase runs a fine step lower."""


class EerlController:
    """The EE-RL controller of one session (see the module docstring): routes each phase to its part."""

    def __init__(self, settings: ControllerSettings, config: EerlConfig | None = None) -> None:
        self._config = config or EerlConfig()
        self._grid = ClockGrid.build(settings.supported_sm_clocks_mhz, self._config)
        if not 0.0 < settings.throughput_threshold <= 1.0:
            raise ValidationError("throughput_threshold", "must be in (0, 1]")
        self._tracks: dict[PhaseKind, KindTrack] = {}
        for kind in settings.kinds:
            top_mhz = float(self._grid.max_mhz) if self._config.physics_curve else None
            track = new_track(kind, self._config.predictor_window, self._grid.curve_bandwidth_mhz, top_mhz)
            track.search.coarse = self._grid.coarse_schedule()
            self._tracks[kind] = track
        self._all = tuple(self._tracks.values())
        """Every kind's track, in the session's order (what the plan and the commit look at together)."""
        self._slack = PeerSlack(active=settings.mode is ExecutionMode.ASYNC and len(self._all) == 1)
        self._overrun = PeerOverrun()
        self._between = BetweenWork(active=settings.mode is ExecutionMode.SYNC)
        self._planner = Planner(
            settings.throughput_threshold, self._config, self._grid, self._slack, self._between
        )
        self._pace = RefinePace()
        self._history: deque[Decision] = deque(maxlen=self._config.history)
        self._iteration = 0

    # ------------------------------------------------------------------ interface

    def decide(self, kind: PhaseKind, iteration: int, hints: Workload | None, now_s: float) -> Decision:
        """The clock for the phase about to begin."""
        self._iteration = max(self._iteration, iteration)
        track = self._tracks.get(kind)
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
        track = self._tracks.get(observation.kind)
        if track is None:
            self._slack.observe_peer(observation.duration_s)
            if self._slack.active:
                self._planner.run.add_wait(self._overrun.peer(observation.iteration, observation.duration_s))
            return None
        self._between.observe(observation.iteration, observation.gap_before_s)
        if observation.duration_s <= 0 or observation.energy_j <= 0:
            return None
        track.ledger.phases += 1
        before_state, before_clock = track.state, track.committed_mhz
        before_predictor, rebaselining = track.baseline.predictor, track.baseline.rebaseline_left > 0
        if observation.sm_clock_mhz is None:
            verdict = self._observe_default(track, observation, now_s)
        else:
            verdict = self._observe_trial(track, observation, now_s)
        if self._slack.active:
            self._planner.run.add_wait(self._overrun.own(observation.iteration, observation.duration_s))
        left_regime = track.baseline.predictor is not before_predictor or (
            track.baseline.rebaseline_left > 0 and not rebaselining
        )
        if left_regime:
            # The regime's locked phases keep the judgement of its own predictor (before it goes).
            # After a change in what the same work costs, the phases since the change go with the new.
            self._planner.run.settle(
                track.kind, judged_by(before_predictor), carry_since=track.baseline.changed_since_iteration
            )
            track.baseline.changed_since_iteration = None
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
        return [
            PhaseSnapshot(
                kind=track.kind,
                state=track.state,
                sm_clock_mhz=(
                    track.committed_mhz if track.state is ControllerState.COMMITTED else track.candidate_mhz
                ),
                candidate_sm_clock_mhz=track.candidate_mhz,
                phases=track.ledger.phases,
                estimated_savings_fraction=track.ledger.savings_fraction,
                exploration_cost_j=track.ledger.exploration_cost_j,
                predictor_error_fraction=track.baseline.predictor.error_fraction,
                default_energy_j=track.ledger.predicted_energy_j,
                default_s=track.ledger.default_s,
                actual_s=track.ledger.actual_s,
            )
            for track in self._tracks.values()
        ]

    def state_of(self, kind: PhaseKind) -> ControllerState | None:
        """The state of ``kind``'s track (None when this session does not run that kind)."""
        track = self._tracks.get(kind)
        return track.state if track is not None else None

    def decisions(self) -> Sequence[Decision]:
        """History, oldest first (bounded)."""
        return list(self._history)

    # ------------------------------------------------------------------ choosing

    def _choose(self, track: KindTrack) -> tuple[int | None, str]:
        if track.relearning:
            return None, "default governor: baseline for the predictor"
        if track.baseline.check_pending:
            return None, "default governor: re-checking the predictor before a floor"
        if track.state is ControllerState.COMMITTED:
            if control_due(track.monitor, self._config):
                return None, "default governor: control phase to re-validate the predictor"
            probe = self._probe_clock(track)
            if probe is not None:
                track.monitor.since_probe = 0
                return probe, PROBE_REASON
            return track.committed_mhz, "committed"
        return next_trial(track, self._plan, self._grid)

    def _between_counted(self, obs: PhaseObservation) -> float:
        """The work before this phase, as the run's throughput counts it: at most twice the typical."""
        return min(obs.gap_before_s, 2.0 * self._between.per_iteration_s())

    def _probe_clock(self, track: KindTrack) -> int | None:
        """The fine step below a committed clock, when a probe is due and the run can pay for it."""
        if track.committed_mhz is None or not probe_due(track.monitor, self._config):
            return None
        if self._planner.spend(self._all) > -self._config.probe_min_spend:
            return None
        return self._grid.fine_below(track.committed_mhz)

    def _plan(self) -> Allocation:
        return self._planner.plan(self._all, self._iteration)

    def _try_commit(self, iteration: int) -> str | None:
        return try_commit(self._all, self._planner, self._pace, iteration, self._config)

    # ------------------------------------------------------------------ observing

    def _observe_default(self, track: KindTrack, obs: PhaseObservation, now_s: float) -> Decision | None:
        stepped = self._default_phase_stepped(track, obs)
        if stepped == "":
            # Held back (a search's phase past the step band): counted at its own time, not learned from.
            self._planner.run.add_default(obs.duration_s, self._between_counted(obs))
            track.ledger.add_default(obs.energy_j, obs.duration_s)
            return None
        prediction = track.baseline.predictor.predict(obs.workload)
        predicted_s = obs.duration_s if prediction is None else prediction.duration_s
        self._planner.run.add_default(predicted_s, self._between_counted(obs))
        error = learn_default(track.baseline, obs, relearning=track.relearning)
        # A phase on the default governor saves nothing by definition: its energy counts in the total
        # the savings are a fraction of, and the predictor's error on it is no saving (nor a loss).
        track.ledger.add_default(obs.energy_j, obs.duration_s)
        if track.state is ControllerState.BASELINE:
            if baseline_complete(track.baseline, self._config):
                track.state = ControllerState.EXPLORING
                track.search.epoch_iteration = obs.iteration
            return None
        if track.baseline.rebaseline_left > 0:
            same_work = track.baseline.rebaseline_same_work
            if rebaseline_step(track.baseline, obs.workload, self._config):
                start_retune(track, self._grid, self._pace, obs.iteration)
                if same_work:
                    retune_partners(self._all, track, self._grid, obs.iteration, self._config)
            return (
                None
                if stepped is None
                else Decision(track.kind, obs.iteration, None, track.state, stepped, now_s)
            )
        if track.searching:
            # The allocation chose the default governor for this kind: that is a measured choice too.
            reason = self._try_commit(obs.iteration) or stepped
            if reason is None:
                return None
            return Decision(track.kind, obs.iteration, None, track.state, reason, now_s, 1.0, 1.0)
        if track.state is not ControllerState.COMMITTED:
            return None
        missed = judge_control_phase(
            track.monitor,
            error,
            track.baseline.predictor.error_fraction,
            at_default=track.committed_mhz is None,
            config=self._config,
        )
        if not missed:
            if stepped is None and track.committed_mhz is None:
                reason = self._refine_turn(track, obs.iteration)
                if reason is not None:
                    return Decision(track.kind, obs.iteration, None, track.state, reason, now_s)
            return (
                None
                if stepped is None
                else Decision(track.kind, obs.iteration, None, track.state, stepped, now_s)
            )
        assert error is not None
        reason = respond_to_control_miss(track, obs, error, self._config)
        return Decision(track.kind, obs.iteration, None, track.state, reason, now_s)

    def _default_phase_stepped(self, track: KindTrack, obs: PhaseObservation) -> str | None:
        """A committed kind's default phase on a workload past the step band: answer the step first (the
        regime is kept, a kept one taken up, or a re-baseline starts with this phase); the reason.

        A searching kind's default phase (its plan chose the default governor) is judged as its locked
        phases are, a second phase confirming: unwatched, a training search holding the default above its
        power cap learned a returning regime's phases into the one it had left and searched on there."""
        if track.searching:
            return self._locked_phase_stepped(track, obs)
        if track.state is not ControllerState.COMMITTED:
            return None
        step = stepped_phase(track.baseline.predictor, track.kind, obs.workload, self._config)
        if step is None:
            return None
        return respond_to_drift(track, step, self._pace, self._config, obs.iteration)

    def _locked_phase_stepped(self, track: KindTrack, obs: PhaseObservation) -> str | None:
        """A searching or committed kind's locked phase (or a searching kind's default phase) on a workload
        beyond the step band: None when it is not; "" when it is held back (not learned from) until the
        next phase says whether the workload stepped; the step's reason when this phase confirms it (two in
        a row, the same way).

        Only a committed kind's monitor used to see steps, over the median of its newest phases: a search
        judged a new regime's trials on the old one's predictor, read them as too slow (or fast) and
        climbed on floors to the top clock (`regime-switch-h100` seed 4 at 0.95 spent a regime's 30
        iterations re-searching up to the top clock, capture 0.64), and a commit saw the step three to
        five phases late, those phases learned into the regime it left. One batch far from the newest
        default phases is no step (on `short-blocks-gb200` training trains on 1.3-2.6 M tokens in one
        regime): a step persists, so a second phase confirms it.
        """
        step = (
            None
            if track.relearning
            else stepped_phase(track.baseline.predictor, track.kind, obs.workload, self._config)
        )
        sign = 0 if step is None else (1 if step.shift > 0 else -1)
        pending, track.search.step_sign = track.search.step_sign, sign
        if step is None:
            return None
        if pending != sign:
            return ""
        track.search.step_sign = 0
        return respond_to_drift(track, step, self._pace, self._config, obs.iteration)

    def _observe_trial(self, track: KindTrack, obs: PhaseObservation, now_s: float) -> Decision | None:
        prediction = track.baseline.predictor.predict(obs.workload)
        if prediction is None:
            return None
        clock = int(obs.sm_clock_mhz) if obs.sm_clock_mhz is not None else 0
        features = workload_features(track.kind, obs.workload)
        time_ratio = obs.duration_s / prediction.duration_s
        energy_ratio = obs.energy_j / prediction.energy_j
        if track.searching or track.state is ControllerState.COMMITTED:
            stepped = self._locked_phase_stepped(track, obs)
            if stepped is not None:
                # Its default is the old regime's guess at another workload: the run judges it on the
                # predictor of the regime it landed in, once that is known.
                self._planner.run.add_stepped(
                    track.kind, obs.duration_s, self._between_counted(obs), features
                )
                held = Decision(track.kind, obs.iteration, clock, track.state, stepped, now_s)
                return held if stepped else None
        self._planner.run.add_locked(
            track.kind,
            clock,
            prediction.duration_s,
            obs.duration_s,
            self._between_counted(obs),
            features=features,
            iteration=obs.iteration,
        )
        track.curve.add(Trial(clock, features, obs.duration_s, obs.energy_j, obs.iteration))
        track.baseline.predictor.add_locked(clock, features, obs.duration_s, obs.energy_j)
        track.ledger.add_trial(prediction.energy_j, obs.energy_j, prediction.duration_s, obs.duration_s)
        track_default_scale(track.baseline, obs.workload)
        if track.searching:
            track.search.trials_in_search += 1
            if obs.duration_s > prediction.duration_s / self._planner.target:
                track.ledger.add_missed_trial(obs.energy_j)
        if track.state is ControllerState.COMMITTED and clock != track.committed_mhz:
            return None  # a probe: evidence for the curve, not a committed phase to judge
        reason = self._after_trial(track, obs, clock, time_ratio, energy_ratio)
        if reason is None:
            return None
        return Decision(
            track.kind,
            obs.iteration,
            track.committed_mhz if track.state is ControllerState.COMMITTED else clock,
            track.state,
            reason,
            now_s,
            throughput_ratio=1.0 / time_ratio,
            energy_ratio=energy_ratio,
        )

    def _after_trial(
        self, track: KindTrack, obs: PhaseObservation, clock: int, time_ratio: float, energy_ratio: float
    ) -> str | None:
        """Hand a trial to the part its kind's state calls for; the verdict's reason, if any."""
        if track.state is ControllerState.RETUNING and coarse_pending(track.search):
            after_local_trial(track.search, clock)
            return None
        if track.state is ControllerState.EXPLORING and coarse_pending(track.search):
            return after_coarse_trial(
                track.search,
                self._grid,
                clock,
                time_ratio,
                energy_ratio,
                time_cap=self._planner.time_cap(track, self._all),
                noise=trial_noise(track.baseline.predictor.error_fraction),
                first=track.curve.probed_range_mhz() == (clock, clock),
                config=self._config,
            )
        if track.searching:
            return self._try_commit(obs.iteration)
        if track.state is ControllerState.COMMITTED:
            return self._watch_committed(track, obs, time_ratio, energy_ratio)
        return None

    def _watch_committed(
        self, track: KindTrack, obs: PhaseObservation, time_ratio: float, energy_ratio: float
    ) -> str | None:
        """A committed phase: the monitor judges it, drift is answered, and now and then the refine runs."""
        track.monitor.since_control += 1
        drift = watch(
            track.monitor,
            track.baseline.predictor,
            track.kind,
            obs.workload,
            time_ratio=time_ratio,
            energy_ratio=energy_ratio,
            config=self._config,
            iteration=obs.iteration,
        )
        reason = (
            None if drift is None else respond_to_drift(track, drift, self._pace, self._config, obs.iteration)
        )
        track.monitor.since_probe += 1
        if reason is not None:
            track.monitor.since_refine += 1
            return reason
        return self._refine_turn(track, obs.iteration)

    def _refine_turn(self, track: KindTrack, iteration: int) -> str | None:
        """Count a committed phase towards the refine, and run the refine when its turn comes.

        A kind committed at the default governor counts too: its phases are default phases, and without
        the refine a run whose every kind committed there (a search that found nothing fast enough on an
        early, biased yardstick) would stay at the default for good, its throughput allowance unspent.
        """
        track.monitor.since_refine += 1
        if not take_refine_turn(
            track.monitor, self._pace, self._config, lambda: self._planner.threshold(self._all)
        ):
            return None
        return refine(
            self._all, self._planner, self._pace, self._grid, iteration=iteration, config=self._config
        )


def create_eerl_controller(settings: ControllerSettings) -> Controller:
    """The factory the daemon looks up: an EE-RL controller for one session."""
    return EerlController(settings)


JOB_CONFIG = EerlConfig()
"""The tuning of a job-level controller (:class:`eerl.job.JobController`): the single-node defaults. A job's
phase energy is the sum over its nodes, and one straggling node keeps all others waiting, so its coarse
descent repeating a trial past the energy minimum (``recheck_energy_stop``, first introduced for jobs) matters
most there: over seeds 1-5 of the multi-node scenarios the job's capture median rose from 0.933 to 0.950
and its worst from 0.658 to 0.822."""


def create_job_eerl_controller(settings: ControllerSettings) -> Controller:
    """The EE-RL controller a job-level controller wraps by default (:data:`JOB_CONFIG`)."""
    return EerlController(settings, JOB_CONFIG)
