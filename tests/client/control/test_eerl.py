"""The EE-RL controller against a synthetic job: its invariants and its behaviour."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from eerl.clocks import nearest_supported_mhz
from eerl.control.base import Controller, ControllerFactory, ControllerSettings, PhaseObservation
from eerl.control.eerl import (
    PROBE_REASON,
    EerlConfig,
    EerlController,
    create_eerl_controller,
    create_job_eerl_controller,
)
from eerl.control.plan import newest_predictors
from eerl.control.registry import controller_factory
from eerl.errors import ValidationError
from eerl.phases import ControllerState, ExecutionMode, PhaseKind, Workload
from hypothesis import HealthCheck, Phase, example, given
from hypothesis import settings as hyp_settings
from hypothesis import strategies as st

from tests.client.control.synthetic import (
    GRID_MHZ,
    KINDS,
    SyntheticJob,
    drive_sync,
    iteration_ratios,
    oracle_energy_ratio,
    run_throughput,
)

MAX_SPEND = EerlConfig().max_run_spend


def last_committed(clocks: list[int | None], reasons: list[str]) -> int | None:
    """The clock of a kind's last committed phase (its last phase may be a control phase or a probe)."""
    return [clock for clock, reason in zip(clocks, reasons, strict=True) if reason == "committed"][-1]


class _WarmUp(SyntheticJob):
    """Its first iterations run 2% slower at the default governor than the job ever does again (a warm-up):
    the baseline predicts the default 2% slow, and every locked phase looks 2% faster than it is."""

    def observe(
        self, kind: PhaseKind, iteration: int, sm_clock_mhz: int | None, now_s: float
    ) -> PhaseObservation:
        observation = super().observe(kind, iteration, sm_clock_mhz, now_s)
        if iteration < 4:
            return dataclasses.replace(observation, duration_s=observation.duration_s * 1.02)
        return observation


class _EnergyOutlier(SyntheticJob):
    """The descent's second generation trial (iteration 5) reads 20% more energy than it cost."""

    def observe(
        self, kind: PhaseKind, iteration: int, sm_clock_mhz: int | None, now_s: float
    ) -> PhaseObservation:
        observation = super().observe(kind, iteration, sm_clock_mhz, now_s)
        if (kind, iteration) == (PhaseKind.GENERATION, 5):
            return dataclasses.replace(observation, energy_j=observation.energy_j * 1.2)
        return observation


# Each example drives a controller through tens of iterations: few examples, no slow shrinking.
FAST = hyp_settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
)


def running_mhz(job: SyntheticJob, kind: PhaseKind, clock: int | None) -> int:
    """Where a phase locked at ``clock`` (None: the default governor) runs: the lowest clock of the same
    cost (above the power cap, the cap's)."""
    cost = job.true_cost(kind, 0, clock)
    return min(c for c in GRID_MHZ if job.true_cost(kind, 0, c) == cost)


def _committed_iteration(trace_states: list[str]) -> int:
    return trace_states.index(ControllerState.COMMITTED.value)


class TestInvariants:
    @FAST
    @given(
        step=st.sampled_from([1, 2, 3, 7]),
        offset=st.integers(min_value=0, max_value=6),
        threshold=st.floats(min_value=0.85, max_value=0.99),
        noise=st.sampled_from([0.0, 0.01, 0.03]),
        seed=st.integers(min_value=0, max_value=1000),
    )
    def test_never_proposes_an_unsupported_clock(
        self, step: int, offset: int, threshold: float, noise: float, seed: int
    ) -> None:
        """Whatever the grid, threshold and noise, every decision is a supported clock or the default."""
        grid = GRID_MHZ[offset::step]
        controller = create_eerl_controller(ControllerSettings(grid, throughput_threshold=threshold))
        trace = drive_sync(controller, SyntheticJob(noise=noise, seed=seed), 50)
        proposed = {c for kind in KINDS for c in trace.clocks[kind]}
        assert proposed <= {*grid, None}

    @FAST
    @given(
        threshold=st.floats(min_value=0.85, max_value=0.99),
        tokens=st.integers(min_value=200_000, max_value=3_000_000),
        kinds=st.sampled_from([KINDS, (PhaseKind.GENERATION,), (PhaseKind.TRAINING,)]),
    )
    def test_a_commit_dips_below_the_threshold_by_at_most_what_the_run_banked(
        self, threshold: float, tokens: int, kinds: tuple[PhaseKind, ...]
    ) -> None:
        """On a noiseless job a commit dips below the threshold by at most ``max_run_spend`` (the run's
        banked throughput), and the run, every phase since its first included, keeps the threshold (within
        0.001: the search's slow trials are its cost, not a debt)."""
        controller = create_eerl_controller(
            ControllerSettings(GRID_MHZ, kinds=kinds, throughput_threshold=threshold)
        )
        job = SyntheticJob(tokens=tokens)
        trace = drive_sync(controller, job, 40, kinds)
        committed = [
            i for i in range(40) if all(trace.states[k][i] == ControllerState.COMMITTED.value for k in kinds)
        ]
        assert committed  # every kind commits, so the check below is never vacuous
        # The search's own cost is not repaid: the run may end a hair below, never more.
        assert run_throughput(job, trace) >= threshold - 0.001
        for i in committed:
            if any(trace.reasons[k][i] == PROBE_REASON for k in kinds):
                continue  # a probe runs one phase a fine step lower, on the run's banked throughput
            throughput, _ = iteration_ratios(job, {k: trace.clocks[k][i] for k in kinds})
            assert throughput >= threshold - MAX_SPEND - 1e-9

    @FAST
    @given(
        threshold=st.floats(min_value=0.88, max_value=0.98),
        tokens=st.integers(min_value=300_000, max_value=3_000_000),
    )
    # Thresholds between two allocations: 0.931 time-shares generation's 1125 and 1170 MHz (0.926 and
    # 0.934), 0.969 two clocks of the ninth session's curve.
    @example(threshold=0.931, tokens=1_000_000)
    @example(threshold=0.969, tokens=1_000_000)
    def test_converges_on_a_stationary_noiseless_workload(self, threshold: float, tokens: int) -> None:
        """Without noise it commits within 30 iterations, settles, and ends within 2% of the oracle.

        Settles: the commits of the last 100 iterations (control phases and probes aside) lie within three
        fine steps, and after the first commit a kind re-tunes at most once per refine interval (20
        committed phases): the run's banked throughput may carry a commit to the allocation just below the
        threshold and back once it is spent, time-sharing the two that bracket it, each way at a refine's
        turn. The run keeps its threshold.
        """
        job = SyntheticJob(tokens=tokens)
        controller = create_eerl_controller(ControllerSettings(GRID_MHZ, throughput_threshold=threshold))
        trace = drive_sync(controller, job, 200)
        fine = controller._grid.fine_mhz
        for kind in KINDS:
            states = trace.states[kind]
            first = _committed_iteration(states)
            assert first < 30
            retunes = sum(
                1
                for i in range(first + 1, len(states))
                if states[i] == ControllerState.RETUNING.value and states[i - 1] != states[i]
            )
            assert retunes <= (len(states) - first) // EerlConfig().refine_interval_phases
            commits = {
                clock
                for clock, state, reason in zip(
                    trace.clocks[kind][100:], trace.states[kind][100:], trace.reasons[kind][100:], strict=True
                )
                if state == ControllerState.COMMITTED.value
                and reason != PROBE_REASON
                and not reason.startswith("default governor")  # a control phase
            }
            assert commits
            # A clock above the power cap runs where the cap holds it, as the default governor does.
            steps = [fine.index(nearest_supported_mhz(fine, running_mhz(job, kind, c))) for c in commits]
            assert max(steps) - min(steps) <= 3
        final = {k: controller._tracks[k].committed_mhz for k in KINDS}
        _, energy = iteration_ratios(job, final)
        assert energy <= oracle_energy_ratio(job, threshold) + 0.02
        assert run_throughput(job, trace) >= threshold

    @FAST
    @given(
        factor=st.sampled_from([0.3, 2.0, 5.0, 20.0]),
        kind=st.sampled_from(KINDS),
        when=st.integers(min_value=0, max_value=20),
        tokens=st.integers(min_value=300_000, max_value=3_000_000),
    )
    def test_a_single_outlier_does_not_flip_a_commit(
        self, factor: float, kind: PhaseKind, when: int, tokens: int
    ) -> None:
        """One phase measured far off (slow, fast, costly) after a commit changes neither lock nor state."""
        reference = drive_sync(
            create_eerl_controller(ControllerSettings(GRID_MHZ)), SyntheticJob(tokens=tokens), 60
        )
        start = max(_committed_iteration(reference.states[k]) for k in KINDS) + 2 + when
        job = SyntheticJob(tokens=tokens, outliers={(kind, start): factor})
        trace = drive_sync(create_eerl_controller(ControllerSettings(GRID_MHZ)), job, 60)
        for k in KINDS:
            # Control phases (default governor) and probes may come at other times; the commits and
            # states may not.
            assert trace.committed_clocks(k, since=start) == reference.committed_clocks(k, since=start)
            assert set(trace.states[k][start:]) == {ControllerState.COMMITTED.value}


class TestWhatItReports:
    def test_the_snapshot_s_throughput_is_the_run_s_own_on_a_noiseless_job(self) -> None:
        """The report's throughput (default-equivalent time over time taken, both kinds) is the true run
        throughput against the default governor within 0.5 % on a noiseless job (the predictor's error),
        and exactly 1 while only default-governor phases ran."""
        controller = create_eerl_controller(ControllerSettings(GRID_MHZ, throughput_threshold=0.95))
        job = SyntheticJob()
        early = drive_sync(controller, job, 2)
        snaps = controller.snapshot()
        assert all(s.default_s == s.actual_s > 0 for s in snaps)  # the baseline: the default governor
        later = drive_sync(controller, job, 60, start=2)
        snaps = controller.snapshot()
        reported = sum(s.default_s for s in snaps) / sum(s.actual_s for s in snaps)
        assert reported == pytest.approx(run_throughput(job, early, later), abs=0.005)
        assert all(s.default_energy_j > 0 for s in snaps)


class TestBehaviour:
    @pytest.mark.parametrize("threshold", [0.90, 0.95, 0.98])
    def test_a_default_mispredicted_by_two_percent_is_judged_again_and_repaid(self, threshold: float) -> None:
        """The baseline's phases run 2% slower than the default ever does again (a warm-up), so every locked
        phase looks 2% faster than it is. The run's ledger judges its locked phases again on the newest
        predictor, which the control phases corrected: what it believes the run delivered comes a fifth or
        more closer to the truth than the predictors of their day said (a third to a half on most seeds),
        and the debt it then sees is repaid. Over 300 iterations the run ends within 0.009 of its threshold
        (up to 0.008 short; before, up to 0.013). Not the issue's 0.003: the newest predictor still
        carries half the bias (its four baseline phases against five control phases), which
        docs/results-promise.md records as open. How much closer varies by seed (0.40-0.81 of the gap
        left, 0.60-0.68 on average over three seeds): judged per seed it is only ever closer; over the
        seeds, a third closer."""
        left = []
        for seed in range(3):
            job = _WarmUp(noise=0.01, seed=seed)
            controller = EerlController(ControllerSettings(GRID_MHZ, throughput_threshold=threshold))
            trace = drive_sync(controller, job, 300)
            delivered = run_throughput(job, trace)
            run = controller._planner.run
            believed = run.default_s / run.actual_s
            judged_again = 1.0 + run.banked_s(1.0, newest_predictors(controller._all)) / run.actual_s
            assert believed - delivered > 0.005  # the bias is real: the early predictors flattered the run
            left.append(abs(judged_again - delivered) / (believed - delivered))
            assert left[-1] < 1.0
            assert delivered >= threshold - 0.009
        assert sum(left) / len(left) < 0.75

    @pytest.mark.parametrize(
        ("kind", "steps"),
        # One step above a power-capped training clock changes nothing: no case there.
        [(PhaseKind.GENERATION, -1), (PhaseKind.GENERATION, 1), (PhaseKind.TRAINING, -1)],
    )
    def test_a_commit_one_fine_step_from_the_best_reaches_it(
        self, settings: ControllerSettings, kind: PhaseKind, steps: int
    ) -> None:
        """On a stationary noiseless job, a commit one fine step off where it converged gets back.

        Within 60 iterations it holds an allocation as good as the converged one: no more than 0.1% more
        energy, the run (both parts) at the threshold.
        """
        job = SyntheticJob()
        controller = EerlController(settings)
        converged = drive_sync(controller, job, 80)
        best = {k: converged.clocks[k][-1] for k in KINDS}
        _, best_energy = iteration_ratios(job, best)
        track = controller._tracks[kind]  # put the commit one step off by hand
        assert track.state is ControllerState.COMMITTED
        fine = controller._grid.fine_mhz
        committed = running_mhz(job, kind, track.committed_mhz)  # the default governor: the power cap's
        here = min(range(len(fine)), key=lambda i: abs(fine[i] - committed))
        track.committed_mhz = fine[here + steps]
        off = dict(best) | {kind: fine[here + steps]}
        throughput_off, energy_off = iteration_ratios(job, off)
        assert throughput_off < settings.throughput_threshold or energy_off > best_energy + 0.001

        later = drive_sync(controller, job, 60, start=80)
        final = {k: controller._tracks[k].committed_mhz for k in KINDS}
        throughput, energy = iteration_ratios(job, final)
        assert throughput >= settings.throughput_threshold - MAX_SPEND
        assert energy <= best_energy + 0.001
        assert run_throughput(job, converged, later) >= settings.throughput_threshold

    def test_a_run_committed_at_the_default_governor_still_refines(
        self, settings: ControllerSettings
    ) -> None:
        """Both kinds committed at the default governor (a search that an early, biased yardstick showed
        nothing fast enough) leave the whole allowance unspent: the refine still runs on their default
        phases, and within 60 iterations the run is back to an allocation as good as the converged one.
        (Before: a default commit never refined; `quiet-a100-long` seed 2 at 0.98 spent 390 iterations at
        the default, capture 0.01.)"""
        job = SyntheticJob()
        controller = EerlController(settings)
        converged = drive_sync(controller, job, 80)
        best = {k: converged.clocks[k][-1] for k in KINDS}
        _, best_energy = iteration_ratios(job, best)
        locked = {t.kind for t in controller._all if t.committed_mhz is not None}
        assert PhaseKind.GENERATION in locked  # (training may hold the default: above its power cap)
        for track in controller._all:  # commit both kinds at the default governor by hand
            assert track.state is ControllerState.COMMITTED
            track.committed_mhz = None
        drive_sync(controller, job, 60, start=80)
        assert any(d.iteration >= 80 and d.reason.startswith("refine") for d in controller.decisions())
        final = {k: controller._tracks[k].committed_mhz for k in KINDS}
        assert all(final[k] is not None for k in locked)
        throughput, energy = iteration_ratios(job, final)
        assert throughput >= settings.throughput_threshold - MAX_SPEND
        assert energy <= best_energy + 0.001

    def test_a_step_during_a_search_is_seen_on_its_trials(self, settings: ControllerSettings) -> None:
        """The workload steps (twice the tokens, memory-heavier) while both kinds are still searching: the
        second trial of the new regime confirms the step (before: nothing watched a search, its trials were
        judged on the regime it left until a commit's monitor saw the step), and the run ends on an
        allocation within 1 % energy of the oracle's for the new regime."""
        job = SyntheticJob(step_at_iteration=6, step_tokens_factor=2.0, step_memory_factor=2.0)
        controller = create_eerl_controller(settings)
        trace = drive_sync(controller, job, 160)
        for kind in KINDS:
            seen = [d.iteration for d in controller.decisions() if d.kind is kind and "stepped" in d.reason]
            assert seen[:1] == [7], kind
        final = {k: trace.clocks[k][-1] for k in KINDS}
        throughput, energy = iteration_ratios(job, final, iteration=159)
        assert throughput >= settings.throughput_threshold - MAX_SPEND
        assert energy <= oracle_energy_ratio(job, settings.throughput_threshold, iteration=159) + 0.01

    def test_a_committed_kind_sees_a_step_on_its_second_phase(self, settings: ControllerSettings) -> None:
        """Committed at a clock, a kind holds back its first phase past the step band and the second confirms
        the step (the monitor's median over its newest phases took three to five: phases of the new regime
        that went into the old one's curve and, kept with it, came back when it did); committed at the
        default governor, its first phase is a default phase and shows the step itself."""
        job = SyntheticJob(step_at_iteration=100, step_tokens_factor=2.0, step_memory_factor=2.0)
        controller = create_eerl_controller(settings)
        converged = drive_sync(controller, job, 100)
        commits = {k: controller._tracks[k].committed_mhz for k in KINDS}
        assert commits[PhaseKind.GENERATION] is not None
        drive_sync(controller, job, 10, start=100)
        for kind in KINDS:
            assert converged.states[kind][99] == ControllerState.COMMITTED.value, kind
            seen = [d.iteration for d in controller.decisions() if d.kind is kind and "stepped" in d.reason]
            assert seen[:1] == ([100] if commits[kind] is None else [101]), kind

    def test_one_odd_batch_during_a_search_is_no_step(self, settings: ControllerSettings) -> None:
        """One generation batch with 0.55 of the usual tokens (the cost following them) mid-search: held back
        for a phase, it is no step, and the search goes on to its commit."""

        @dataclasses.dataclass
        class _OddBatch(SyntheticJob):
            def workload(self, iteration: int) -> Workload:
                usual = super().workload(iteration)
                if iteration != 6:
                    return usual
                return dataclasses.replace(usual, tokens=int(usual.tokens * 0.55))

        job = _OddBatch()
        controller = create_eerl_controller(settings)
        trace = drive_sync(controller, job, 60)
        assert not any("stepped" in d.reason for d in controller.decisions())
        assert all(trace.states[k][-1] == ControllerState.COMMITTED.value for k in KINDS)

    def test_a_regime_left_mid_search_takes_its_search_up_again(self, settings: ControllerSettings) -> None:
        """Regimes that alternate every 12 iterations from iteration 7, shorter than a search: the first is
        left mid-search and, when it returns, goes on searching over its trials (one default phase to
        check its predictor) instead of sitting at the default governor as if that were its commit. A
        search whose plan holds the default governor (training above its power cap) sees the return on
        its default phases too."""
        job = SyntheticJob(step_at_iteration=7, alternate_every=12, step_memory_factor=2.0)
        controller = create_eerl_controller(settings)
        trace = drive_sync(controller, job, 48)
        for kind in KINDS:
            back = [
                d.iteration
                for d in controller.decisions()
                if d.kind is kind and 19 <= d.iteration < 31 and "back to a regime seen before" in d.reason
            ]
            assert back, kind
            assert trace.states[kind][back[0]] != ControllerState.COMMITTED.value, kind  # searching on
            after = range(back[0] + 1, 31)
            unplanned = [
                i
                for i in after
                if trace.clocks[kind][i] is None
                and not trace.reasons[kind][i].startswith(("fine trial", "committed", "commit:"))
            ]
            assert len(unplanned) <= 1, kind

    def test_a_commit_probes_a_fine_step_below_while_the_run_has_throughput_to_spend(
        self, settings: ControllerSettings
    ) -> None:
        """With throughput banked, every ``probe_interval_phases`` committed phases one runs a fine step
        below the commit, and the curve keeps it as evidence there; the kind stays committed on its
        clock. Without a bank there is no probe. (The refine is kept out of the way: it is not what this
        checks.)"""
        controller = EerlController(settings, EerlConfig(refine_interval_phases=10_000))
        converged = drive_sync(controller, SyntheticJob(), 40)
        assert PROBE_REASON not in {r for k in KINDS for r in converged.reasons[k]}  # nothing banked yet
        commits = {k: controller._tracks[k].committed_mhz for k in KINDS}
        for _ in range(300):  # as if many default phases had run at full speed
            controller._planner.run.add_default(10.0, between_s=0.0)
        later = drive_sync(controller, SyntheticJob(), 40, start=40)
        interval = EerlConfig().probe_interval_phases
        assert commits[PhaseKind.GENERATION] is not None
        for kind in KINDS:
            commit = commits[kind]
            if commit is None:  # held at the default governor (training above its power cap): no probe
                assert PROBE_REASON not in later.reasons[kind]
                continue
            below = controller._grid.fine_below(commit)
            assert below is not None
            probes = [i for i, r in enumerate(later.reasons[kind]) if r == PROBE_REASON]
            assert len(probes) >= 3
            # every interval committed phases, a control phase (default governor) aside
            assert all(b - a in (interval + 1, interval + 2) for a, b in itertools.pairwise(probes))
            assert {later.clocks[kind][i] for i in probes} == {below}
            assert len(controller._tracks[kind].curve.trials_at(below, 40)) == len(probes)
            assert set(later.states[kind]) == {ControllerState.COMMITTED.value}
            assert controller._tracks[kind].committed_mhz == commit

    def test_starts_with_the_default_governor_to_learn_the_baseline(
        self, settings: ControllerSettings
    ) -> None:
        """The first phases of each kind run unlocked, in state baseline."""
        trace = drive_sync(create_eerl_controller(settings), SyntheticJob(), 3)
        for kind in KINDS:
            assert trace.clocks[kind] == [None, None, None]
            assert set(trace.states[kind]) == {ControllerState.BASELINE.value}

    def test_spends_the_slowdown_on_the_memory_bound_phase(self, settings: ControllerSettings) -> None:
        """Generation (memory-bound) gets a deeper clock cut than compute-bound training."""
        trace = drive_sync(create_eerl_controller(settings), SyntheticJob(), 60)
        generation = trace.clocks[PhaseKind.GENERATION][-1]
        training = trace.clocks[PhaseKind.TRAINING][-1]
        assert generation is not None
        assert training is None or generation < training

    def test_retunes_after_a_step_change_and_stays_within_the_threshold(
        self, settings: ControllerSettings
    ) -> None:
        """When the workload changes abruptly, it re-tunes and commits a setting that meets the threshold."""
        job = SyntheticJob(noise=0.005, step_at_iteration=60, step_memory_factor=0.25)
        trace = drive_sync(create_eerl_controller(settings), job, 160)
        after = [s for k in KINDS for s in trace.states[k][60:]]
        assert ControllerState.RETUNING.value in after
        final = {k: trace.clocks[k][-1] for k in KINDS}
        throughput, _ = iteration_ratios(job, final, iteration=159)
        assert throughput >= 0.95 - 0.01

    def test_under_gradual_drift_a_control_phase_follows_each_band_of_growth(
        self, settings: ControllerSettings
    ) -> None:
        """Tokens growing 0.2% an iteration leave the 12% band about every 57 iterations: over 240
        committed iterations the 60-phase interval and the drift ask for at most six control phases, not
        one per monitor window because the predictor's older default phases lag behind (eight to twelve
        before)."""
        job = SyntheticJob(noise=0.005, growth_per_iteration=0.002)
        trace = drive_sync(create_eerl_controller(settings), job, 300)
        for kind in KINDS:
            controls = [r for r in trace.reasons[kind][60:] if "control phase" in r]
            assert 4 <= len(controls) <= 6, kind

    @pytest.mark.parametrize(
        "factory",
        [create_eerl_controller, controller_factory("eerl"), create_job_eerl_controller],
        ids=["one node", "registry (what eerld runs)", "job tuning"],
    )
    def test_one_phase_with_its_energy_far_off_does_not_stop_the_descent(
        self, settings: ControllerSettings, factory: ControllerFactory
    ) -> None:
        """The descent's second generation trial reads 20% more energy than it cost (a straggling node's
        wait on a multi-node job; on one node a predictor whose energy is four phases old): it is
        repeated, the descent goes on, and the run ends within 1% energy of the oracle at the threshold
        (stopped there, generation stayed at 1620 MHz and the iteration's energy 6% above the oracle's)."""
        job = _EnergyOutlier()
        trace = drive_sync(factory(settings), job, 80)
        generation = trace.clocks[PhaseKind.GENERATION]
        assert generation[5] == generation[6]  # the trial past the minimum, repeated
        assert generation[7] < generation[6]  # and the descent went on below it
        final = {k: trace.clocks[k][-1] for k in KINDS}
        _, energy = iteration_ratios(job, final)
        assert run_throughput(job, trace) >= settings.throughput_threshold
        assert energy <= oracle_energy_ratio(job, settings.throughput_threshold) + 0.01

    def test_without_the_repeat_the_descent_stops_on_the_outlier(self, settings: ControllerSettings) -> None:
        """What the repeat is for: with ``recheck_energy_stop`` off the same outlier stops the descent at
        once and the run ends more than 1% energy above the oracle."""
        job = _EnergyOutlier()
        controller = EerlController(settings, EerlConfig(recheck_energy_stop=False))
        trace = drive_sync(controller, job, 80)
        generation = trace.clocks[PhaseKind.GENERATION]
        assert generation[5] != generation[6]
        final = {k: trace.clocks[k][-1] for k in KINDS}
        _, energy = iteration_ratios(job, final)
        assert energy > oracle_energy_ratio(job, settings.throughput_threshold) + 0.01

    def test_a_retune_after_a_step_walks_past_its_first_window(self, settings: ControllerSettings) -> None:
        """After a step whose best clocks lie more than a window's half-width below the old commit, the
        re-tune slides its window down and ends within 1% energy of the oracle at the threshold it plans
        for; the run keeps the threshold (the final commit may spend what the run banked or repay what it
        owes: it is the run that is judged, the regime before the step included)."""
        job = SyntheticJob(step_at_iteration=60, step_memory_factor=2.0, step_tokens_factor=2.0)
        controller = create_eerl_controller(settings)
        trace = drive_sync(controller, job, 200)
        planned = controller._planner.threshold(controller._all)
        before = {k: trace.clocks[k][55] for k in KINDS}
        final = {k: last_committed(trace.clocks[k], trace.reasons[k]) for k in KINDS}
        span = 3 * 0.022 * max(GRID_MHZ)  # the re-tune window's half-width (fine steps x step)
        moved = [b - f for b, f in zip(before.values(), final.values(), strict=True) if b and f]
        assert max(moved) > span
        assert run_throughput(job, trace) >= settings.throughput_threshold
        throughput, energy = iteration_ratios(job, final, iteration=199)
        assert throughput >= settings.throughput_threshold - MAX_SPEND
        assert energy <= oracle_energy_ratio(job, max(planned, 0.95 - MAX_SPEND), iteration=199) + 0.01

    def test_a_returning_regime_takes_up_its_earlier_commit_within_a_few_iterations(
        self, settings: ControllerSettings
    ) -> None:
        """Regimes alternating every 60 iterations: when the first returns (iteration 120), each kind takes
        it up again within six iterations and holds the clock it left it at for the eight after, with at
        most one default phase among them (a control phase, if the regime's own cadence calls for one) and
        no trials (before regime memory: three default phases and a re-tune at every return); the run
        keeps the threshold."""
        job = SyntheticJob(noise=0.005, step_at_iteration=60, alternate_every=60, step_memory_factor=2.0)
        controller = create_eerl_controller(settings)
        trace = drive_sync(controller, job, 240)
        for kind in KINDS:
            reasons = trace.reasons[kind]
            left_at = [trace.clocks[kind][i] for i in range(50, 60) if reasons[i] == "committed"][-1]
            taken_up = [
                d.iteration
                for d in controller.decisions()
                if d.kind is kind and 120 <= d.iteration < 127 and "back to a regime seen before" in d.reason
            ]
            assert taken_up, kind
            after = range(taken_up[0] + 1, taken_up[0] + 9)
            assert sum(reasons[i] != "committed" for i in after) <= 1  # a control phase at most
            assert all(trace.states[kind][i] == ControllerState.COMMITTED.value for i in after)
            held = {trace.clocks[kind][i] for i in after if reasons[i] == "committed"}
            assert held == {left_at}
        assert run_throughput(job, trace) >= settings.throughput_threshold - 0.001

    @pytest.mark.parametrize("every", [15, 30, 60])
    def test_across_returning_regimes_the_run_is_judged_as_it_ran(self, every: int) -> None:
        """Regimes alternating every 15, 30 or 60 iterations: what the run's ledger believes it delivered
        stays within 0.005 of what it did. It judged every locked phase on its kind's newest predictor, after
        a return the other regime's (its model of another workload: believed 1.12–1.26, delivered
        0.952–0.981), and restarted at each re-baseline; a regime left now keeps its own predictor's
        judgement, and the phase that showed the step counts at its default."""
        for seed in range(3):
            job = SyntheticJob(
                noise=0.01, seed=seed, step_at_iteration=every, alternate_every=every, step_memory_factor=2.0
            )
            controller = EerlController(ControllerSettings(GRID_MHZ))
            trace = drive_sync(controller, job, 240)
            run = controller._planner.run
            judged = 1.0 + run.banked_s(1.0, newest_predictors(controller._all)) / run.actual_s
            assert judged == pytest.approx(run_throughput(job, trace), abs=0.005)

    def test_when_the_same_work_changes_its_cost_the_baseline_follows(
        self, settings: ControllerSettings
    ) -> None:
        """The workload stays the same but its memory traffic halves (its cost changes): the ratio drift
        re-baselines on fresh default phases only, and the commit keeps the threshold afterwards."""
        job = SyntheticJob(step_at_iteration=60, step_memory_factor=0.5, step_tokens_factor=1.0)
        controller = EerlController(settings)
        trace = drive_sync(controller, job, 200)
        for kind in KINDS:
            prediction = controller._tracks[kind].baseline.predictor.predict(job.workload(199))
            assert prediction is not None
            assert abs(prediction.duration_s / job.true_cost(kind, 199, None)[0] - 1.0) < 0.02
        final = {k: trace.clocks[k][-1] for k in KINDS}
        throughput, _ = iteration_ratios(job, final, iteration=199)
        # The commit may spend what the run banked (the re-tune's trials ran fast), never the promise.
        assert throughput >= settings.throughput_threshold - MAX_SPEND
        assert run_throughput(job, trace) >= settings.throughput_threshold

    def test_when_one_kinds_cost_changes_the_other_re_tunes_with_it(self) -> None:
        """Generation's memory traffic drops to 35 % under the same work: its share of the iteration and
        what its slowdown buys change, so the allocation is chosen again for both kinds. Re-tuned alone,
        generation had to fit around training's old commit and ended at the default governor, 4 % more
        energy than the oracle's allocation for the new regime; now within 1 %."""
        job = SyntheticJob(step_at_iteration=60, step_memory_factor=0.35, step_tokens_factor=1.0)
        settings = ControllerSettings(GRID_MHZ, throughput_threshold=0.90)
        controller = create_eerl_controller(settings)
        trace = drive_sync(controller, job, 200)
        retuned = [
            d.iteration
            for d in controller.decisions()
            if d.kind is PhaseKind.TRAINING and d.iteration >= 60 and d.state is ControllerState.RETUNING
        ]
        assert retuned
        final = {k: trace.clocks[k][-1] for k in KINDS}
        throughput, energy = iteration_ratios(job, final, iteration=199)
        assert throughput >= settings.throughput_threshold - MAX_SPEND
        assert energy <= oracle_energy_ratio(job, settings.throughput_threshold, iteration=199) + 0.01
        assert run_throughput(job, trace) >= settings.throughput_threshold - 0.001

    def test_a_workload_step_alone_triggers_a_rebaseline(self, settings: ControllerSettings) -> None:
        """A doubling of the tokens is caught from the workload alone and re-baselines the predictor."""
        job = SyntheticJob(noise=0.005, step_at_iteration=80, step_tokens_factor=2.0, step_memory_factor=1.0)
        controller = create_eerl_controller(settings)
        trace = drive_sync(controller, job, 110)
        reasons = [d.reason for d in controller.decisions() if d.iteration >= 80]
        assert any(r.startswith("workload stepped") for r in reasons)
        assert any(trace.clocks[k][i] is None for k in KINDS for i in range(80, 100))

    def test_a_raised_response_cap_is_a_step_even_when_the_tokens_barely_move(
        self, settings: ControllerSettings
    ) -> None:
        """The longest response doubling (tokens +5%, generation 1.6x slower) re-baselines generation."""
        job = SyntheticJob(
            noise=0.005,
            step_at_iteration=80,
            step_tokens_factor=1.05,
            step_memory_factor=1.5,
            step_longest_factor=2.0,
        )
        controller = create_eerl_controller(settings)
        drive_sync(controller, job, 110)
        stepped = [
            d
            for d in controller.decisions()
            if d.iteration >= 80
            and d.kind is PhaseKind.GENERATION
            and d.reason.startswith("workload stepped")
        ]
        assert stepped
        assert stepped[0].iteration < 95

    def test_a_waiting_async_pool_uses_its_slack(self) -> None:
        """In async mode a pool whose peer takes twice as long slows down far beyond the threshold alone."""
        job = SyntheticJob()
        controller = create_eerl_controller(
            ControllerSettings(GRID_MHZ, kinds=(PhaseKind.TRAINING,), mode=ExecutionMode.ASYNC)
        )
        now_s = 0.0
        peer_duration_s = 2.0 * job.true_cost(PhaseKind.TRAINING, 0, None)[0]
        clock: int | None = None
        for i in range(60):
            clock = controller.decide(PhaseKind.TRAINING, i, None, now_s).sm_clock_mhz
            own = job.observe(PhaseKind.TRAINING, i, clock, now_s)
            peer = PhaseObservation(
                PhaseKind.GENERATION,
                i,
                Workload(tokens=1),
                peer_duration_s,
                1.0,
                None,
                8,
                now_s + peer_duration_s,
            )
            now_s += peer_duration_s
            controller.observe(own, now_s)
            controller.observe(peer, now_s)
        assert clock is not None
        duration, _ = job.true_cost(PhaseKind.TRAINING, 0, clock)
        assert duration / job.true_cost(PhaseKind.TRAINING, 0, None)[0] > 1.3
        assert duration <= peer_duration_s / 0.95

    def test_an_async_pool_banks_its_own_phases_not_its_waits(self) -> None:
        """An async pool alone keeps its own run ledger: its default phases bank throughput, its gaps
        (waiting for the peer) bank nothing, however long."""
        job = SyntheticJob()
        spends = []
        for gap_s in (0.0, 1000.0):
            controller = EerlController(
                ControllerSettings(GRID_MHZ, kinds=(PhaseKind.TRAINING,), mode=ExecutionMode.ASYNC)
            )
            for i in range(4):
                observation = job.observe(PhaseKind.TRAINING, i, None, 0.0)
                controller.observe(dataclasses.replace(observation, gap_before_s=gap_s), 0.0)
            spends.append(controller._planner.spend(controller._all))
        assert spends[0] == spends[1] < 0.0

    def test_an_async_pool_counts_the_iterations_its_peer_ran_longer(self) -> None:
        """The iteration lasts as long as the slower pool: a gating pool whose peer ran 6 % past it in some
        iterations has delivered that much less, and its ledger says so (before: it banked its own phases
        as if it had set every iteration's length); a peer that ran shorter changes nothing."""
        job = SyntheticJob()
        spends = []
        for overrun in (0.0, -0.1, 0.06):
            controller = EerlController(
                ControllerSettings(GRID_MHZ, kinds=(PhaseKind.TRAINING,), mode=ExecutionMode.ASYNC)
            )
            for i in range(4):
                own = job.observe(PhaseKind.TRAINING, i, None, 0.0)
                controller.observe(own, 0.0)
                peer = dataclasses.replace(
                    own, kind=PhaseKind.GENERATION, duration_s=own.duration_s * (1.0 + overrun)
                )
                controller.observe(peer, 0.0)
            spends.append(controller._planner.spend(controller._all))
        assert spends[0] == spends[1] < 0.0
        assert spends[2] > 0.0  # iterations at 1/1.06 of the default: behind the plan, the next ones repay

    def test_ignores_kinds_it_does_not_decide_for(self) -> None:
        """A generation-only session answers OFF for training and ignores training observations."""
        controller = create_eerl_controller(ControllerSettings(GRID_MHZ, kinds=(PhaseKind.GENERATION,)))
        decision = controller.decide(PhaseKind.TRAINING, 0, None, 0.0)
        assert decision.state is ControllerState.OFF
        assert decision.sm_clock_mhz is None
        assert [s.kind for s in controller.snapshot()] == [PhaseKind.GENERATION]

    def test_snapshot_reports_state_candidate_and_predictor_error(self, settings: ControllerSettings) -> None:
        """After a run every kind reports committed, its clock, its phases and a small predictor error."""
        controller = create_eerl_controller(settings)
        drive_sync(controller, SyntheticJob(noise=0.01), 60)
        snapshots = {s.kind: s for s in controller.snapshot()}
        for snapshot in snapshots.values():
            assert snapshot.state is ControllerState.COMMITTED
            assert snapshot.phases == 60
            assert snapshot.predictor_error_fraction < 0.05
        assert snapshots[PhaseKind.GENERATION].estimated_savings_fraction > 0.05

    def test_phases_on_the_default_governor_report_no_savings(self, settings: ControllerSettings) -> None:
        """While it learns the baseline (default governor only), a noisy job shows exactly zero savings."""
        controller = create_eerl_controller(settings)
        trace = drive_sync(controller, SyntheticJob(noise=0.03, seed=5), 3)
        assert all(c is None for kind in KINDS for c in trace.clocks[kind])
        for snapshot in controller.snapshot():
            assert snapshot.estimated_savings_fraction == 0.0

    def test_decision_history_is_bounded_and_gives_reasons(self, settings: ControllerSettings) -> None:
        """The history keeps at most its configured length, oldest first, each entry with a reason."""
        controller = EerlController(settings, dataclasses.replace(EerlConfig(), history=10))
        drive_sync(controller, SyntheticJob(noise=0.01), 60)
        history = controller.decisions()
        assert len(history) == 10
        assert all(d.reason for d in history)
        assert [d.time_s for d in history] == sorted(d.time_s for d in history)

    def test_commit_verdict_carries_the_measured_ratios(self, settings: ControllerSettings) -> None:
        """The commit entry in the history states throughput and energy ratios."""
        controller = create_eerl_controller(settings)
        drive_sync(controller, SyntheticJob(), 40)
        commits = [d for d in controller.decisions() if d.reason.startswith("commit:")]
        assert commits
        assert all(d.throughput_ratio is not None and d.energy_ratio is not None for d in commits)

    def test_rejects_an_empty_clock_list(self) -> None:
        """A session without supported clocks is a validation error."""
        with pytest.raises(ValidationError):
            create_eerl_controller(ControllerSettings(()))

    def test_satisfies_the_controller_protocol(self, settings: ControllerSettings) -> None:
        """The factory's product is a Controller."""
        controller: Controller = create_eerl_controller(settings)
        assert controller.decisions() == []
