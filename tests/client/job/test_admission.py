"""Job admission (eerl.job.admission): each check on a job-level directive, in order, and the fallback.

Pure tests: a directive, what the session accepted so far and the time go in; a ruling comes out. The same
rules over the daemon's sockets: tests/eerld/api/test_job_mode.py, tests/security/test_job_mode_attacks.py.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import pytest
from eerl.directives import Directive, DirectivePurpose, DirectiveVerdict
from eerl.job.admission import (
    AUTO_FLOOR_FRACTION,
    AcceptedSoFar,
    CommittedClock,
    JobPolicy,
    ReceivedDirective,
    Ruling,
    fallback,
    judge,
    rate_limited,
    refuse_session,
    to_default,
    trials_in_window,
)
from eerl.phases import ControllerState, PhaseKind

GEN, TRAIN = PhaseKind.GENERATION, PhaseKind.TRAINING
TRIAL, COMMITTED, CONTROL = DirectivePurpose.TRIAL, DirectivePurpose.COMMITTED, DirectivePurpose.CONTROL
V = DirectiveVerdict
GRID = tuple(range(210, 1981, 15))
TOP = GRID[-1]
AUTO_FLOOR = math.ceil(AUTO_FLOOR_FRACTION * TOP)
NOTHING = AcceptedSoFar()


def directive(
    clock: int | None = 1200,
    purpose: DirectivePurpose | None = TRIAL,
    *,
    incarnation: int = 1,
    epoch: int = 1,
    iteration: int = 3,
    kind: PhaseKind | None = GEN,
) -> ReceivedDirective:
    return ReceivedDirective(incarnation, epoch, iteration, kind, clock, purpose)


def rule(
    got: ReceivedDirective | None,
    accepted: AcceptedSoFar = NOTHING,
    policy: JobPolicy | None = None,
    *,
    newest: int | None = None,
    kind: PhaseKind = GEN,
    iteration: int = 3,
    supported: Sequence[int] = GRID,
    now_s: float = 1000.0,
) -> Ruling:
    return judge(
        got,
        accepted,
        policy or JobPolicy(),
        newest_incarnation=newest,
        kind=kind,
        iteration=iteration,
        supported_mhz=supported,
        now_s=now_s,
    )


class TestOpening:
    def test_a_session_opens_where_job_mode_is_allowed_at_the_newest_incarnation_or_later(self) -> None:
        """No refusal for the job's first session, its newest incarnation again, or a newer one."""
        for newest in (None, 2, 1):
            assert refuse_session(JobPolicy(), "job-a", 2, newest_incarnation=newest) is None

    def test_denied_job_mode_refuses_every_session(self) -> None:
        """--job-mode deny: refused, saying which flag."""
        refusal = refuse_session(JobPolicy(allowed=False), "job-a", 1, newest_incarnation=None)
        assert refusal is not None
        assert "--job-mode deny" in refusal

    def test_an_older_incarnation_is_refused_naming_the_job(self) -> None:
        """A stale job-level controller cannot reopen the job's session."""
        refusal = refuse_session(JobPolicy(), "job-a", 2, newest_incarnation=3)
        assert refusal == (
            "job_mode.incarnation: incarnation 2 is older than incarnation 3, already seen for job 'job-a' "
            "(a stale job-level controller)"
        )


class TestAccepted:
    @pytest.mark.parametrize(
        ("purpose", "state"),
        [
            (TRIAL, ControllerState.EXPLORING),
            (COMMITTED, ControllerState.COMMITTED),
            (CONTROL, ControllerState.BASELINE),
        ],
    )
    def test_a_good_directive_is_applied_as_asked(
        self, purpose: DirectivePurpose, state: ControllerState
    ) -> None:
        """A directive that passes every check: its clock, its epoch, the state its purpose stands for."""
        got = directive(1200, purpose, epoch=7)
        ruling = rule(got)
        assert ruling == Ruling(V.ACCEPTED, "", got, 1200, 7, state)
        assert ruling.accepted
        assert ruling.reason() == "job directive accepted: " + got.describe()

    def test_the_default_governor_is_always_on_the_grid_above_the_floor_and_no_trial(self) -> None:
        """A directive for the default governor skips the grid, the floor and the trial budget."""
        spent = AcceptedSoFar(trials=(999.0,))
        ruling = rule(directive(None, TRIAL), spent, JobPolicy(clock_floor_mhz=TOP, max_trials=1))
        assert ruling.verdict is V.ACCEPTED
        assert ruling.sm_clock_mhz is None

    def test_nothing_is_changed_by_judging(self) -> None:
        """judge reads what was accepted; it records nothing (the daemon does, for an applied ruling)."""
        accepted = AcceptedSoFar(epochs={GEN: (1, 1)}, trials=(1.0,))
        rule(directive(1200, TRIAL, epoch=2), accepted)
        assert accepted == AcceptedSoFar(epochs={GEN: (1, 1)}, trials=(1.0,))


class TestRefused:
    def test_1_missing(self) -> None:
        """A BeginPhase without a directive is refused as MISSING."""
        ruling = rule(None)
        assert (ruling.verdict, ruling.directive) == (V.MISSING, None)

    def test_2_stale_incarnation(self) -> None:
        """An incarnation older than the newest accepted for the job is refused; the same one is fine."""
        assert rule(directive(incarnation=1), newest=2).verdict is V.STALE_INCARNATION
        assert "older than incarnation 2" in rule(directive(incarnation=1), newest=2).detail
        assert rule(directive(incarnation=2), newest=2).verdict is V.ACCEPTED

    def test_3_stale_epoch_within_the_incarnation_and_kind(self) -> None:
        """An epoch older than the one accepted for the kind is refused; a resend or another kind is not."""
        accepted = AcceptedSoFar(epochs={GEN: (1, 5)})
        assert rule(directive(epoch=4), accepted).verdict is V.STALE_EPOCH
        assert rule(directive(epoch=5), accepted).verdict is V.ACCEPTED  # the same plan, resent
        assert rule(directive(epoch=4, kind=TRAIN), accepted, kind=TRAIN).verdict is V.ACCEPTED

    def test_3_a_new_incarnation_starts_its_epochs_afresh(self) -> None:
        """Epochs are compared within an incarnation: a newer controller may start at epoch 1."""
        accepted = AcceptedSoFar(epochs={GEN: (1, 5)})
        assert rule(directive(epoch=1, incarnation=2), accepted, newest=1).verdict is V.ACCEPTED

    @pytest.mark.parametrize(("kind", "iteration"), [(TRAIN, 3), (GEN, 4), (None, 3)])
    def test_4_wrong_phase(self, kind: PhaseKind | None, iteration: int) -> None:
        """A directive for another phase kind or iteration than the BeginPhase's is refused."""
        ruling = rule(directive(kind=kind, iteration=iteration), kind=GEN, iteration=3)
        assert ruling.verdict is V.WRONG_PHASE
        assert "not generation of iteration 3" in ruling.detail

    def test_5_bad_purpose(self) -> None:
        """A directive without a (known) purpose is refused."""
        assert rule(directive(purpose=None)).verdict is V.BAD_PURPOSE

    @pytest.mark.parametrize("clock", [1201, 100, 5000])
    def test_6_off_grid_never_snapped(self, clock: int) -> None:
        """A clock not supported by every GPU of the session is refused, not snapped to the grid."""
        ruling = rule(directive(clock))
        assert ruling.verdict is V.OFF_GRID
        assert f"{clock} MHz" in ruling.detail
        assert f"{GRID[0]}-{TOP} MHz" in ruling.detail

    def test_6_an_empty_grid_refuses_every_clock(self) -> None:
        """With no clock supported by every GPU, only the default governor is on the grid."""
        assert rule(directive(1200), supported=()).verdict is V.OFF_GRID

    def test_7_below_the_auto_floor(self) -> None:
        """``auto``: a fraction of the session's top clock; a clock below it is refused, at it accepted."""
        below = max(c for c in GRID if c < AUTO_FLOOR)
        at_or_above = min(c for c in GRID if c >= AUTO_FLOOR)
        assert rule(directive(below)).verdict is V.BELOW_FLOOR
        assert rule(directive(at_or_above)).verdict is V.ACCEPTED

    def test_7_an_explicit_floor_and_no_floor(self) -> None:
        """The admin's floor in MHz, or 0 for none but the grid."""
        assert rule(directive(900), policy=JobPolicy(clock_floor_mhz=1000)).verdict is V.BELOW_FLOOR
        assert rule(directive(GRID[0]), policy=JobPolicy(clock_floor_mhz=0)).verdict is V.ACCEPTED

    def test_8_trial_budget_counts_the_window_only(self) -> None:
        """A trial past max_trials in the window is refused; older trials and non-trials do not count."""
        policy = JobPolicy(max_trials=2, trial_window_s=60.0)
        two_recent = AcceptedSoFar(trials=(950.0, 990.0))
        assert rule(directive(1200, TRIAL), two_recent, policy, now_s=1000.0).verdict is V.TRIAL_BUDGET
        assert "2 trials in the last 60 s (at most 2)" in rule(directive(), two_recent, policy).detail
        assert rule(directive(1200, TRIAL), two_recent, policy, now_s=1010.0).verdict is V.ACCEPTED
        assert rule(directive(1200, COMMITTED), two_recent, policy).verdict is V.ACCEPTED

    def test_the_checks_run_in_order(self) -> None:
        """The first check that fails is the verdict (a stale incarnation before an off-grid clock)."""
        got = directive(1201, None, incarnation=1, kind=TRAIN)
        assert rule(got, newest=2).verdict is V.STALE_INCARNATION
        assert rule(got).verdict is V.WRONG_PHASE


class TestFallback:
    def test_a_refusal_runs_the_last_committed_clock_of_the_kind(self) -> None:
        """The fallback is the last accepted committed clock of that kind, with its epoch; never a trial."""
        accepted = AcceptedSoFar(committed={GEN: CommittedClock(1500, 4)})
        ruling = rule(directive(1201), accepted)
        assert (ruling.sm_clock_mhz, ruling.applied_epoch, ruling.state) == (
            1500,
            4,
            ControllerState.COMMITTED,
        )
        assert ruling.reason().endswith("fallback 1500 MHz (epoch 4)")

    def test_without_a_committed_clock_the_fallback_is_the_default(self) -> None:
        """No committed clock of the kind (or a committed default): the default governor."""
        for accepted in (NOTHING, AcceptedSoFar(committed={TRAIN: CommittedClock(1500, 4)})):
            ruling = rule(directive(1201), accepted)
            assert (ruling.sm_clock_mhz, ruling.applied_epoch, ruling.state) == (None, 0, ControllerState.OFF)
        committed_default = AcceptedSoFar(committed={GEN: CommittedClock(None, 2)})
        assert fallback(committed_default, GEN, V.MISSING, "", None).sm_clock_mhz is None

    def test_9_rate_limited_falls_back_with_its_own_verdict(self) -> None:
        """A directive the rate limit refuses: the fallback, verdict RATE_LIMITED, the directive kept."""
        accepted = AcceptedSoFar(committed={GEN: CommittedClock(1500, 4)})
        accepted_ruling = rule(directive(1200), accepted)
        ruling = rate_limited(accepted, accepted_ruling, GEN)
        assert (ruling.verdict, ruling.sm_clock_mhz, ruling.directive) == (
            V.RATE_LIMITED,
            1500,
            directive(1200),
        )
        assert "refuses 1200 MHz now" in ruling.detail

    def test_to_default_keeps_the_verdict(self) -> None:
        """A fallback the rate limit refuses too runs at the default governor, under the same verdict."""
        ruling = to_default(rule(directive(1201), AcceptedSoFar(committed={GEN: CommittedClock(1500, 4)})))
        assert (ruling.verdict, ruling.sm_clock_mhz, ruling.applied_epoch) == (V.OFF_GRID, None, 0)


class TestParts:
    def test_floor_mhz(self) -> None:
        """auto is a fraction of the top clock (0 without clocks); an explicit floor is as given."""
        assert JobPolicy().floor_mhz(GRID) == AUTO_FLOOR
        assert JobPolicy().floor_mhz(()) == 0
        assert JobPolicy(clock_floor_mhz=700).floor_mhz(GRID) == 700

    def test_trials_in_window(self) -> None:
        """Trials that began after now - window count; one exactly at the edge does not."""
        assert trials_in_window((10.0, 40.0, 41.0), now_s=100.0, window_s=60.0) == 1
        assert trials_in_window((), now_s=100.0, window_s=60.0) == 0

    def test_a_received_directive_of_a_directive(self) -> None:
        """The received form keeps every field; describe() says it in words."""
        sent = Directive(incarnation=2, epoch=5, iteration=9, kind=TRAIN, sm_clock_mhz=1200, purpose=TRIAL)
        got = ReceivedDirective.of(sent)
        assert got == directive(1200, TRIAL, incarnation=2, epoch=5, iteration=9, kind=TRAIN)
        assert got.describe() == "trial 1200 MHz (incarnation 2, epoch 5)"
        assert replace(got, sm_clock_mhz=None, purpose=None).describe() == (
            "no purpose default (incarnation 2, epoch 5)"
        )
