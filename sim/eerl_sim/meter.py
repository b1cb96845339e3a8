"""Energy counters as the daemon reads them (sim-model "Measurement"; "The benchmark measures as the daemon
does").

Each GPU's counter integrates its true power but advances in steps of ``energy_counter_period_ms``, each GPU's
steps at its own fixed offset: a read at time ``t`` returns the true cumulative energy at the last step at or
before ``t``. A phase's metered energy is the difference of two reads (its start and its end), summed over the
GPUs of its pool — what the daemon reports. Within a phase a GPU is busy first (at its mean busy power) and
then waits at idle power for the slowest GPU; gaps between phases (an async pool with nothing to do) are idle.

Only the last period of history matters to a read, so the counters keep a few recent intervals only.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from eerl_sim.counters import last_steps_s
from eerl_sim.workload import FloatArray


class EnergyCounters:
    """The energy counters of one pool of GPUs over a run in virtual time (starting at ``t = 0``)."""

    def __init__(self, offsets_s: FloatArray, period_s: float, idle_power_w: float) -> None:
        self._offset = np.asarray(offsets_s, dtype=np.float64)
        self._period = period_s
        self._idle = float(idle_power_w)
        self._now = 0.0
        self._total = np.zeros_like(self._offset)
        # Recent intervals: (start, busy s [gpu], busy power [gpu], end, cumulative energy at start [gpu]).
        self._recent: deque[tuple[float, FloatArray, FloatArray, float, FloatArray]] = deque()

    @property
    def now_s(self) -> float:
        """Virtual time up to which the counters have integrated."""
        return self._now

    @property
    def true_total_j(self) -> FloatArray:
        """Each GPU's true cumulative energy at :attr:`now_s`."""
        return self._total.copy()

    def advance(
        self, duration_s: float, busy_s: FloatArray | None = None, busy_energy_j: FloatArray | None = None
    ) -> None:
        """Integrate ``duration_s`` more: each GPU busy for ``busy_s`` (with ``busy_energy_j``), then idle."""
        gpus = len(self._offset)
        busy = (
            np.zeros(gpus) if busy_s is None else np.minimum(np.asarray(busy_s, dtype=np.float64), duration_s)
        )
        energy = np.zeros(gpus) if busy_energy_j is None else np.asarray(busy_energy_j, dtype=np.float64)
        power = np.divide(energy, busy, out=np.full(gpus, self._idle), where=busy > 0)
        start = self._now
        self._recent.append((start, busy, power, start + duration_s, self._total.copy()))
        self._total = self._total + energy + self._idle * (duration_s - busy)
        self._now = start + duration_s
        while len(self._recent) > 1 and self._recent[1][0] <= self._now - self._period:
            self._recent.popleft()

    def meter(self, duration_s: float, busy_s: FloatArray, busy_energy_j: FloatArray) -> FloatArray:
        """Run a phase through the counters (:meth:`advance`): each GPU's reading of it, the difference of
        a read at its start and one at its end (joules)."""
        before = self.read()
        self.advance(duration_s, busy_s, busy_energy_j)
        return self.read() - before

    def read(self) -> FloatArray:
        """Each GPU's counter at :attr:`now_s`: the true energy at its last step (joules)."""
        steps = last_steps_s(self._now, self._period, self._offset)
        value = self._total.copy()
        for start, busy, power, end, at_start in self._recent:
            inside = (steps >= start) & (steps < end)
            if not inside.any():
                continue
            elapsed = steps - start
            on = np.minimum(elapsed, busy)
            value = np.where(inside, at_start + power * on + self._idle * (elapsed - on), value)
        return np.where(steps < 0, 0.0, value)
