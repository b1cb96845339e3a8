"""The work between the phases: how long a sync iteration spends outside its phases.

Real trainers do more per iteration than rollout and update — reference and old log-probabilities, rewards,
advantages, weight sync. The daemon releases a phase's lock when the phase ends, so that work runs at the
default governor, exactly as it would without eerl: it takes the same time whatever the phases' clocks.
The throughput promise covers the whole iteration, so that time belongs in the budget on both sides — the
default iteration takes ``phases + between`` and a planned one ``slowed phases + between`` — which gives
the phases a little more room than the phases alone would.

Each observation carries the gap from the session's previous phase's end to its own begin (measured by the
daemon or the bench); a sync iteration's between time is the sum of its phases' gaps. The budget uses the
median over the last few complete iterations, so that an occasional long gap (a checkpoint, an evaluation, a
paused job) never widens it. Async pools never count gaps: a pool's gap is waiting for its peer, which
:mod:`eerl.control.slack` handles.
"""

from __future__ import annotations

from collections import deque

import numpy as np

BETWEEN_HISTORY = 9
"""Complete iterations the between time is the median of."""


class BetweenWork:
    """Per iteration, the time spent between the phases; the typical one for the budget."""

    def __init__(self, *, active: bool) -> None:
        self.active = active
        """True for a sync session: only there is a gap work of the iteration rather than a wait."""
        self._iteration: int | None = None
        self._open_s = 0.0
        self._totals_s: deque[float] = deque(maxlen=BETWEEN_HISTORY)
        self._median_s = 0.0
        """The median of ``_totals_s``, kept as they change: the plan and every phase read it."""

    def observe(self, iteration: int, gap_before_s: float) -> None:
        """Add a phase's gap to its iteration's total; a later iteration completes the earlier one."""
        if not self.active or gap_before_s < 0:
            return
        if self._iteration is not None and iteration > self._iteration:
            self._totals_s.append(self._open_s)
            self._median_s = float(np.median(self._totals_s))
            self._open_s = 0.0
        if self._iteration is None or iteration >= self._iteration:
            self._iteration = iteration
            self._open_s += gap_before_s

    def per_iteration_s(self) -> float:
        """The typical between time of an iteration (median of the last few complete ones; 0 before)."""
        return self._median_s
