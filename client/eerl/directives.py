"""The nouns of job mode (multi-node control; docs/multinode.md): a job-level controller's
:class:`Directive` for one phase, why it was issued (:class:`DirectivePurpose`), and the daemon's
:class:`DirectiveVerdict` on it.

Pure values shared by the job-level controller (inside the RL job), the node agents and eerld; the wire
tables are in :mod:`eerl.wire.enums`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from eerl.phases import PhaseKind

__all__ = ["Directive", "DirectivePurpose", "DirectiveVerdict"]


class DirectivePurpose(enum.StrEnum):
    """Why a phase's clock was chosen: the daemon budgets trials, and falls back only to committed clocks."""

    TRIAL = "trial"
    COMMITTED = "committed"
    CONTROL = "control"


class DirectiveVerdict(enum.StrEnum):
    """The daemon's answer to a phase's directive; anything but ACCEPTED runs the phase at the fallback
    (the last accepted committed clock of that phase kind, else the default governor)."""

    ACCEPTED = "accepted"
    MISSING = "missing"
    NOT_JOB_MODE = "not_job_mode"
    STALE_INCARNATION = "stale_incarnation"
    STALE_EPOCH = "stale_epoch"
    WRONG_PHASE = "wrong_phase"
    OFF_GRID = "off_grid"
    BELOW_FLOOR = "below_floor"
    TRIAL_BUDGET = "trial_budget"
    RATE_LIMITED = "rate_limited"
    BAD_PURPOSE = "bad_purpose"


@dataclass(frozen=True, slots=True)
class Directive:
    """One phase's clock, decided once for the whole job and applied by every node's daemon alike."""

    incarnation: int
    """The job-level controller's incarnation; a restarted controller takes a larger one."""
    epoch: int
    """The plan epoch: never goes back within an incarnation."""
    iteration: int
    kind: PhaseKind
    sm_clock_mhz: int | None
    """None: the default governor."""
    purpose: DirectivePurpose
