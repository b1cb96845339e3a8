"""The monitor: control phases that re-validate the predictor, and drift judged on medians."""

from __future__ import annotations

import pytest
from eerl.control.baseline import learn_default
from eerl.control.monitor import (
    Drift,
    RatioDrift,
    WorkloadDrift,
    WorkloadStep,
    control_due,
    judge_control_phase,
    median_shift,
    stepped_phase,
    watch,
)
from eerl.control.state import KindTrack, MonitorState
from eerl.phases import ControllerState, PhaseKind, Workload
from hypothesis import given
from hypothesis import strategies as st

from tests.client.control.parts import CONFIG, DEFAULT_J, DEFAULT_S, default_phase, fitted_track, workload


def _judge(monitor: MonitorState, error: float | None, *, at_default: bool = False) -> bool:
    return judge_control_phase(monitor, error, 0.01, at_default=at_default, config=CONFIG)


def _committed(kind: PhaseKind = PhaseKind.TRAINING) -> KindTrack:
    return fitted_track(kind, ControllerState.COMMITTED)


def _watch(
    track: KindTrack, work: Workload, time_ratio: float = 1.0, energy_ratio: float = 0.8
) -> Drift | None:
    return watch(
        track.monitor,
        track.baseline.predictor,
        track.kind,
        work,
        time_ratio=time_ratio,
        energy_ratio=energy_ratio,
        config=CONFIG,
    )


def _control_phase(track: KindTrack, scale: float) -> None:
    """A control phase on ``scale`` times the baseline's tokens, its cost in proportion (learned)."""
    work = workload(tokens=int(1_000_000 * scale))
    phase = default_phase(track.kind, 10, work, DEFAULT_S * scale, DEFAULT_J * scale)
    before = track.baseline.predictor.count
    learn_default(track.baseline, phase, relearning=False)
    assert track.baseline.predictor.count == before + 1


class TestControlPhases:
    def test_a_control_phase_is_due_every_control_interval(self) -> None:
        """After 60 committed phases the next one runs on the default governor."""
        assert not control_due(MonitorState(since_control=59), CONFIG)
        assert control_due(MonitorState(since_control=60), CONFIG)

    def test_a_control_phase_within_the_band_confirms_the_predictor(self) -> None:
        """A 3% error (band: max(3 × 1%, 4%)) restarts the interval and clears a pending miss."""
        monitor = MonitorState(since_control=60, control_miss_sign=1)
        assert not _judge(monitor, 0.03)
        assert (monitor.since_control, monitor.control_miss_sign) == (0, 0)

    def test_one_miss_asks_for_a_second_control_phase_at_once(self) -> None:
        """A single miss may be an outlier: it changes nothing but makes the next phase a control phase."""
        monitor = MonitorState(since_control=60)
        assert not _judge(monitor, 0.10)
        assert monitor.control_miss_sign == 1
        assert control_due(monitor, CONFIG)

    def test_a_second_miss_of_the_same_sign_confirms(self) -> None:
        """Two control phases off alike confirm the miss."""
        monitor = MonitorState(since_control=60)
        _judge(monitor, -0.10)
        assert _judge(monitor, -0.12)
        assert monitor.control_miss_sign == 0

    def test_misses_of_opposite_signs_do_not_confirm(self) -> None:
        """Off one way then the other is noise, not a biased predictor."""
        monitor = MonitorState(since_control=60)
        _judge(monitor, 0.10)
        assert not _judge(monitor, -0.10)
        assert monitor.control_miss_sign == -1

    def test_a_kind_committed_at_the_default_judges_only_each_intervals_phase(self) -> None:
        """Committed at the default every phase is a default phase; only the due one is judged."""
        monitor = MonitorState(since_control=10)
        assert not _judge(monitor, 0.5, at_default=True)
        assert (monitor.since_control, monitor.control_miss_sign) == (11, 0)

    @given(st.floats(-2.0, 2.0))
    def test_a_single_control_phase_never_confirms_a_miss(self, error: float) -> None:
        """Whatever one control phase measured, it alone never confirms a miss."""
        assert not _judge(MonitorState(since_control=60), error)


class TestDrift:
    def test_a_stationary_committed_kind_shows_no_drift(self) -> None:
        """Thirty phases like the baseline's, at steady ratios, are no drift."""
        track = _committed()
        assert all(_watch(track, workload()) is None for _ in range(30))

    def test_the_tokens_doubling_is_a_step_once_the_window_median_shows_it(self) -> None:
        """Ten phases with twice the tokens: the tenth reports a step of +100%, not earlier ones."""
        track = _committed()
        verdicts = [_watch(track, workload(tokens=2_000_000)) for _ in range(CONFIG.monitor_window)]
        assert verdicts[:-1] == [None] * (CONFIG.monitor_window - 1)
        # Where it stepped to, the newest phases' tokens: what a kept regime is matched on.
        assert verdicts[-1] == WorkloadStep(0, 1.0, (2_000_000.0,))
        assert verdicts[-1].reason == "workload stepped (+100%): re-baseline, then re-tune"
        assert control_due(track.monitor, CONFIG)
        assert track.monitor.recent_shift == {}

    def test_halving_the_tokens_is_a_step_too(self) -> None:
        """Half the tokens is as far as twice them (the band is ×1.5 either way, not ±50%)."""
        track = _committed()
        verdicts = [_watch(track, workload(tokens=500_000)) for _ in range(CONFIG.monitor_window)]
        assert verdicts[-1] == WorkloadStep(0, -0.5, (500_000.0,))

    def test_two_far_phases_then_the_usual_workload_are_no_step(self) -> None:
        """Two phases at twice the tokens between usual ones: outliers, never a step."""
        track = _committed()
        phases = [1_000_000] * 5 + [2_000_000] * 2 + [1_000_000] + [2_000_000] * 2 + [1_000_000] * 5
        assert all(_watch(track, workload(tokens=tokens)) is None for tokens in phases)

    def test_a_control_phase_on_a_step_is_a_step(self) -> None:
        """A committed kind's default phase at three times the tokens is a step on that one phase, with
        its own workload as the signature; one at 1.2 times is not."""
        track = _committed()
        step = stepped_phase(track.baseline.predictor, track.kind, workload(tokens=3_000_000), CONFIG)
        assert step == WorkloadStep(0, 2.0, (3_000_000.0,))
        assert stepped_phase(track.baseline.predictor, track.kind, workload(tokens=1_200_000), CONFIG) is None

    def test_a_moderate_move_of_the_tokens_is_gradual_drift(self) -> None:
        """Tokens 20% up (beyond the 12% band, within the 50% step band) are drift the predictor follows."""
        track = _committed()
        verdicts = [_watch(track, workload(tokens=1_200_000)) for _ in range(CONFIG.monitor_window)]
        assert verdicts[-1] == WorkloadDrift(0)

    def test_drift_is_judged_from_the_newest_default_phase(self) -> None:
        """After a control phase at +20% tokens, ten phases 2% beyond it are no drift.

        The window's mean still sits near the eight older phases (+2%): judged from it, the workload would
        stay out of its band and every window of committed phases would ask for one more control phase.
        """
        track = fitted_track(PhaseKind.TRAINING, ControllerState.COMMITTED, phases=8)
        _control_phase(track, scale=1.2)
        verdicts = [_watch(track, workload(tokens=1_224_000)) for _ in range(3 * CONFIG.monitor_window)]
        assert verdicts == [None] * (3 * CONFIG.monitor_window)

    def test_a_control_phase_on_a_new_regimes_first_phase_does_not_hide_the_step(self) -> None:
        """Tokens triple just as a control phase runs: the phases after it match it, yet it is a step.

        Judged from the newest three default phases together (+80%): otherwise the predictor would keep
        the old regime's phases and extrapolate from them for the rest of the run.
        """
        track = _committed()
        _control_phase(track, scale=3.0)
        verdicts = [_watch(track, workload(tokens=3_000_000)) for _ in range(CONFIG.monitor_window)]
        assert verdicts[:-1] == [None] * (CONFIG.monitor_window - 1)
        step = verdicts[-1]
        assert isinstance(step, WorkloadStep)
        assert (step.feature, round(step.shift, 6)) == (0, 0.8)

    def test_generation_also_watches_its_longest_response(self) -> None:
        """A raised response cap (longest response ×2, same tokens) is a generation step."""
        track = _committed(PhaseKind.GENERATION)
        verdicts = [_watch(track, workload(longest=16384)) for _ in range(CONFIG.monitor_window)]
        step = verdicts[-1]
        assert isinstance(step, WorkloadStep)
        assert (step.feature, step.shift, step.signature[1]) == (1, 1.0, 16384.0)

    def test_ratios_leaving_their_band_are_drift(self) -> None:
        """Ten phases 10% slower than the ten before are ratio drift, with the time shift named."""
        track = _committed()
        for _ in range(CONFIG.monitor_window):
            assert _watch(track, workload(), time_ratio=1.0) is None
        verdicts = [_watch(track, workload(), time_ratio=1.1) for _ in range(CONFIG.monitor_window)]
        assert verdicts[:-1] == [None] * (CONFIG.monitor_window - 1)
        drift = verdicts[-1]
        assert isinstance(drift, RatioDrift)
        assert drift.time_shift is not None
        assert abs(drift.time_shift - 0.1) < 1e-9
        assert drift.energy_shift is None

    @pytest.mark.parametrize(("odd_phase", "since"), [(None, 14), (16, 15)])
    def test_ratio_drift_names_the_phase_where_the_cost_changed(
        self, odd_phase: int | None, since: int
    ) -> None:
        """Phases from iteration 14 on run 10 % slower: the drift, seen once most of a window moved, names
        iteration 14 as where it began (the phases since ran at the new cost: the run's ledger judges
        them on the new yardstick); with one phase among them at the old level, within a phase."""
        track = _committed()
        drift: Drift | None = None
        iteration = 0
        while drift is None:
            slower = iteration >= 14 and iteration != odd_phase
            drift = watch(
                track.monitor,
                track.baseline.predictor,
                track.kind,
                workload(),
                time_ratio=1.1 if slower else 1.0,
                energy_ratio=0.8,
                config=CONFIG,
                iteration=iteration,
            )
            iteration += 1
        assert isinstance(drift, RatioDrift)
        assert drift.since_iteration == since

    def test_no_shift_is_judged_before_two_windows(self) -> None:
        """Fewer than two windows of values say nothing, however far apart."""
        assert median_shift([1.0] * 10 + [2.0] * 9, 10, 0.04) is None

    @given(
        position=st.integers(0, 19),
        outlier=st.one_of(st.floats(0.0, 0.9), st.floats(1.1, 100.0)),
    )
    def test_a_single_outlier_is_never_drift(self, position: int, outlier: float) -> None:
        """Among twenty steady ratios, one far off anywhere moves neither median."""
        values = [1.0] * 20
        values[position] = outlier
        assert median_shift(values, 10, 0.04) is None
