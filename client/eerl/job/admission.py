"""Job admission: which directive of a job-level controller a daemon applies, and what runs instead.

A session opened in job mode takes its clock per phase from the directive its BeginPhase carries; its own
controller stays off. Such a session opens only where the admin allows job mode and with an incarnation no
older than the job's newest (:func:`refuse_session`). The daemon stays the only actuator and judges every
directive with :func:`judge`, in this order (the first check that fails is the verdict):

1. ``MISSING``: no directive;
2. ``STALE_INCARNATION``: older than the newest incarnation accepted for the job (per worker socket and job
   id);
3. ``STALE_EPOCH``: older than the newest plan epoch accepted in this session for that phase kind and
   incarnation (epochs never go back; the same epoch again is the same plan, resent);
4. ``WRONG_PHASE``: it names another iteration or phase kind than the BeginPhase it rides on;
5. ``BAD_PURPOSE``: no purpose, or an unknown one;
6. ``OFF_GRID``: a clock not on the grid of every GPU of the session (never snapped; the default governor,
   ``None``, is always on it);
7. ``BELOW_FLOOR``: below the admin's floor (:meth:`JobPolicy.floor_mhz`);
8. ``TRIAL_BUDGET``: a trial when the session already had ``max_trials`` trials accepted in the window;
9. ``RATE_LIMITED``: the GPUs' clock-change rate limit would refuse the change (asked of the daemon's
   arbiter after :func:`judge`; :func:`rate_limited` is the ruling then).

Anything but ``ACCEPTED`` runs the phase at the fallback (:func:`fallback`): the last accepted committed
clock of that phase kind in this session, else the default governor — never a trial. A refused directive
changes nothing: only an accepted one (or a session that opened) raises the job's incarnation, and only an
accepted one the session's epoch, its trial count or its committed clock (the daemon records that).

This is the job-mode policy's one home (docs/multinode.md), next to the job-level controller
(:mod:`eerl.job.controller`) that writes the directives: eerld imports it, and a simulator or a test can ask
it without a daemon. Pure: no I/O, no locks, no clock reads; what the session accepted so far and the time
come in as arguments.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from eerl.directives import Directive, DirectivePurpose, DirectiveVerdict
from eerl.phases import ControllerState, PhaseKind

AUTO_FLOOR_FRACTION = 0.40
"""``--job-clock-floor-mhz auto``: this fraction of the session's top clock. The built-in EE-RL controller's
coarse descent (0.77 × top, then × 0.88 a rung) has its sixth rung at 0.406 × top; its lowest trial in every
built-in bench scenario was the fifth (0.46 × top: 915 of 1980 MHz on H100, 952 of 2062 MHz on GB200)."""
DEFAULT_MAX_TRIALS = 64
"""Trials per window: the EE-RL search makes at most 24 exploration phases per phase kind (48 for a
synchronous session's two kinds), and 22 + 22 in the most restless built-in scenario over 300 iterations."""
DEFAULT_TRIAL_WINDOW_S = 600.0

_STATE_OF_PURPOSE = {
    DirectivePurpose.TRIAL: ControllerState.EXPLORING,
    DirectivePurpose.COMMITTED: ControllerState.COMMITTED,
    DirectivePurpose.CONTROL: ControllerState.BASELINE,
}


@dataclass(frozen=True, slots=True)
class JobPolicy:
    """The admin's envelope for job mode (``--job-mode``, ``--job-clock-floor-mhz``, ``--job-max-trials``,
    ``--job-trial-window-s``)."""

    allowed: bool = True
    clock_floor_mhz: int | None = None
    """None: ``auto`` (:data:`AUTO_FLOOR_FRACTION` of the session's top clock); 0: no floor but the grid."""
    max_trials: int = DEFAULT_MAX_TRIALS
    trial_window_s: float = DEFAULT_TRIAL_WINDOW_S

    def floor_mhz(self, supported_mhz: Sequence[int]) -> int:
        """The floor for a session whose GPUs all support ``supported_mhz`` (ascending)."""
        if self.clock_floor_mhz is not None:
            return self.clock_floor_mhz
        return math.ceil(AUTO_FLOOR_FRACTION * supported_mhz[-1]) if supported_mhz else 0


@dataclass(frozen=True, slots=True)
class ReceivedDirective:
    """A directive as it arrived: its kind or purpose may be unknown (the verdict says so, not an error)."""

    incarnation: int
    epoch: int
    iteration: int
    kind: PhaseKind | None
    sm_clock_mhz: int | None
    """None: the default governor (0 on the wire)."""
    purpose: DirectivePurpose | None

    @classmethod
    def of(cls, directive: Directive) -> ReceivedDirective:
        """The received form of a well-formed directive."""
        return cls(
            directive.incarnation,
            directive.epoch,
            directive.iteration,
            directive.kind,
            directive.sm_clock_mhz,
            directive.purpose,
        )

    def describe(self) -> str:
        """``trial 1200 MHz (incarnation 2, epoch 5)``."""
        clock = "default" if self.sm_clock_mhz is None else f"{self.sm_clock_mhz} MHz"
        purpose = self.purpose.value if self.purpose is not None else "no purpose"
        return f"{purpose} {clock} (incarnation {self.incarnation}, epoch {self.epoch})"


@dataclass(frozen=True, slots=True)
class Ruling:
    """The verdict on one phase's directive and the clock the session asks the arbiter for."""

    verdict: DirectiveVerdict
    detail: str
    """Why, in words, when the verdict is not ACCEPTED."""
    directive: ReceivedDirective | None
    sm_clock_mhz: int | None
    """The clock of the phase: the directive's when accepted, else the fallback's."""
    applied_epoch: int
    """The plan epoch of that clock (the fallback's committed directive; 0 for the default governor)."""
    state: ControllerState

    @property
    def accepted(self) -> bool:
        """True when the directive is applied as asked."""
        return self.verdict is DirectiveVerdict.ACCEPTED

    def reason(self) -> str:
        """The decision's reason, for GetDecisions and logs."""
        clock = "default" if self.sm_clock_mhz is None else f"{self.sm_clock_mhz} MHz"
        if self.accepted:
            assert self.directive is not None
            return f"job directive accepted: {self.directive.describe()}"
        epoch = f" (epoch {self.applied_epoch})" if self.applied_epoch else ""
        return f"job directive refused ({self.verdict.value}: {self.detail}); fallback {clock}{epoch}"


@dataclass(frozen=True, slots=True)
class CommittedClock:
    """The last accepted committed clock of a phase kind: the fallback."""

    sm_clock_mhz: int | None
    epoch: int


class Accepted(Protocol):
    """What a job-mode session accepted so far: the facts :func:`judge` reads (the daemon's session state
    offers them; :class:`AcceptedSoFar` is a plain one)."""

    @property
    def epochs(self) -> Mapping[PhaseKind, tuple[int, int]]:
        """Per phase kind: (incarnation, epoch) of the newest accepted directive."""
        ...

    @property
    def committed(self) -> Mapping[PhaseKind, CommittedClock]:
        """Per phase kind: the last accepted committed clock."""
        ...

    @property
    def trials(self) -> Sequence[float]:
        """When each accepted trial began (monotonic seconds), oldest first."""
        ...


@dataclass(frozen=True, slots=True)
class AcceptedSoFar:
    """A plain :class:`Accepted`: nothing yet by default."""

    epochs: Mapping[PhaseKind, tuple[int, int]] = field(default_factory=dict)
    committed: Mapping[PhaseKind, CommittedClock] = field(default_factory=dict)
    trials: Sequence[float] = ()


def trials_in_window(trials: Sequence[float], now_s: float, window_s: float) -> int:
    """Accepted trials that began within the window ending ``now_s`` (after ``now_s - window_s``)."""
    return sum(1 for began_s in trials if began_s > now_s - window_s)


def fallback(
    accepted: Accepted,
    kind: PhaseKind,
    verdict: DirectiveVerdict,
    detail: str,
    got: ReceivedDirective | None,
) -> Ruling:
    """The ruling for a refused directive: the last accepted committed clock, else the default."""
    committed = accepted.committed.get(kind)
    if committed is None or committed.sm_clock_mhz is None:
        return Ruling(verdict, detail, got, None, 0, ControllerState.OFF)
    return Ruling(verdict, detail, got, committed.sm_clock_mhz, committed.epoch, ControllerState.COMMITTED)


def refuse_session(
    policy: JobPolicy, job_id: str, incarnation: int, *, newest_incarnation: int | None
) -> str | None:
    """Why a job-mode session of ``job_id`` may not open, in words (None: it may): job mode denied on this
    node, or an incarnation older than the newest accepted for the job (a stale job-level controller)."""
    if not policy.allowed:
        return "job_mode: this node's eerld does not allow job mode (--job-mode deny)"
    if newest_incarnation is not None and incarnation < newest_incarnation:
        return (
            f"job_mode.incarnation: incarnation {incarnation} is older than incarnation "
            f"{newest_incarnation}, already seen for job {job_id!r} (a stale job-level controller)"
        )
    return None


def judge(
    got: ReceivedDirective | None,
    accepted: Accepted,
    policy: JobPolicy,
    *,
    newest_incarnation: int | None,
    kind: PhaseKind,
    iteration: int,
    supported_mhz: Sequence[int],
    now_s: float,
) -> Ruling:
    """Checks 1-8 of the module docstring on one BeginPhase's directive.

    ``newest_incarnation`` is the newest incarnation accepted for the job (None: none yet);
    ``supported_mhz`` the clocks every GPU of the session supports, ascending; ``now_s`` the time of the
    BeginPhase (the clock of ``accepted.trials``). Changes nothing.
    """

    def refuse(verdict: DirectiveVerdict, detail: str) -> Ruling:
        return fallback(accepted, kind, verdict, detail, got)

    if got is None:
        return refuse(DirectiveVerdict.MISSING, "this BeginPhase carried no directive")
    if newest_incarnation is not None and got.incarnation < newest_incarnation:
        return refuse(
            DirectiveVerdict.STALE_INCARNATION,
            f"incarnation {got.incarnation} is older than incarnation {newest_incarnation} of this job",
        )
    epoch = accepted.epochs.get(kind)
    if epoch is not None and epoch[0] == got.incarnation and got.epoch < epoch[1]:
        return refuse(
            DirectiveVerdict.STALE_EPOCH,
            f"epoch {got.epoch} is older than epoch {epoch[1]}, already accepted for {kind.value}",
        )
    if got.kind is not kind or got.iteration != iteration:
        named = got.kind.value if got.kind is not None else "no phase kind"
        return refuse(
            DirectiveVerdict.WRONG_PHASE,
            f"the directive is for {named} of iteration {got.iteration}, "
            f"not {kind.value} of iteration {iteration}",
        )
    if got.purpose is None:
        return refuse(DirectiveVerdict.BAD_PURPOSE, "the purpose must be trial, committed or control")
    clock = got.sm_clock_mhz
    if clock is not None:
        if clock not in supported_mhz:
            low, high = (supported_mhz[0], supported_mhz[-1]) if supported_mhz else (0, 0)
            return refuse(
                DirectiveVerdict.OFF_GRID,
                f"{clock} MHz is not a supported clock of every GPU of the session "
                f"({low}-{high} MHz; never snapped)",
            )
        floor = policy.floor_mhz(supported_mhz)
        if clock < floor:
            return refuse(DirectiveVerdict.BELOW_FLOOR, f"{clock} MHz is below the floor of {floor} MHz")
        if got.purpose is DirectivePurpose.TRIAL:
            used = trials_in_window(accepted.trials, now_s, policy.trial_window_s)
            if used >= policy.max_trials:
                return refuse(
                    DirectiveVerdict.TRIAL_BUDGET,
                    f"{used} trials in the last {policy.trial_window_s:g} s (at most {policy.max_trials})",
                )
    return Ruling(DirectiveVerdict.ACCEPTED, "", got, clock, got.epoch, _STATE_OF_PURPOSE[got.purpose])


def rate_limited(accepted: Accepted, ruling: Ruling, kind: PhaseKind) -> Ruling:
    """Check 9: the ruling for a directive whose change the rate limit refuses (the fallback)."""
    clock = "default" if ruling.sm_clock_mhz is None else f"{ruling.sm_clock_mhz} MHz"
    return fallback(
        accepted,
        kind,
        DirectiveVerdict.RATE_LIMITED,
        f"the GPUs' clock-change rate limit refuses {clock} now",
        ruling.directive,
    )


def to_default(ruling: Ruling) -> Ruling:
    """The ruling at the default governor (a committed fallback the rate limit refuses too: a reset is never
    held back)."""
    return Ruling(ruling.verdict, ruling.detail, ruling.directive, None, 0, ControllerState.OFF)


__all__ = [
    "AUTO_FLOOR_FRACTION",
    "DEFAULT_MAX_TRIALS",
    "DEFAULT_TRIAL_WINDOW_S",
    "Accepted",
    "AcceptedSoFar",
    "CommittedClock",
    "JobPolicy",
    "ReceivedDirective",
    "Ruling",
    "fallback",
    "judge",
    "rate_limited",
    "refuse_session",
    "to_default",
    "trials_in_window",
]
