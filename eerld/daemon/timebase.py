"""Wall-clock times of phase-clock readings: what turns a decision's ``time_s`` into UTC.

Phases are timed on the backend's own clock where it has one (the simulator's accelerated time, which
starts near zero and runs ``speedup`` times faster than the host's), else on the monotonic clock. Neither
is a wall-clock time, and no fixed offset converts the simulator's: every reading of the phase clock is
therefore taken together with the wall clock (:meth:`PhaseTimebase.now`), and :meth:`PhaseTimebase.
to_unix_s` maps a phase-clock time back to the wall clock — exactly for a reading it took (every decision
carries one), by interpolation between the two nearest readings otherwise, by the slope of the nearest
pair (or 1.0) before the first or after the last. The readings kept are bounded: when the table is full
every other one is dropped, so that it still spans the daemon's whole life.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Callable

MAX_ANCHORS = 4096


class PhaseTimebase:
    """The phase clock, with every reading paired with the wall clock."""

    def __init__(
        self,
        phase_clock: Callable[[], float],
        wall_clock: Callable[[], float],
        *,
        max_anchors: int = MAX_ANCHORS,
    ) -> None:
        self._phase = phase_clock
        self._wall = wall_clock
        self._max = max(4, max_anchors)
        self._lock = threading.Lock()
        self._phase_s: list[float] = []
        self._unix_s: list[float] = []
        self.now()  # one anchor from the start: a conversion never lacks one

    def now(self) -> float:
        """Read the phase clock (and remember the wall-clock time of this reading)."""
        with self._lock:
            phase_s, unix_s = self._phase(), self._wall()
            if self._phase_s and phase_s <= self._phase_s[-1]:
                if phase_s == self._phase_s[-1]:
                    return phase_s  # the same reading (a coarse or stopped clock): keep the first
                # a clock that went back (never for a monotonic one): start afresh from here
                self._phase_s.clear()
                self._unix_s.clear()
            self._phase_s.append(phase_s)
            self._unix_s.append(unix_s)
            if len(self._phase_s) > self._max:
                # thin out the oldest half, keep the newest half whole
                half = len(self._phase_s) // 2
                self._phase_s = self._phase_s[:half:2] + self._phase_s[half:]
                self._unix_s = self._unix_s[:half:2] + self._unix_s[half:]
            return phase_s

    def to_unix_s(self, phase_s: float) -> float:
        """The wall-clock time (seconds since the Unix epoch) of a phase-clock time."""
        with self._lock:
            xs, ys = self._phase_s, self._unix_s
            i = bisect.bisect_left(xs, phase_s)
            if i < len(xs) and xs[i] == phase_s:
                return ys[i]
            if len(xs) == 1:
                return ys[0] + (phase_s - xs[0])
            lo = min(max(i - 1, 0), len(xs) - 2)  # the pair around it, or the nearest pair at an end
            x0, x1, y0, y1 = xs[lo], xs[lo + 1], ys[lo], ys[lo + 1]
            return y0 + (phase_s - x0) * (y1 - y0) / (x1 - x0)


__all__ = ["MAX_ANCHORS", "PhaseTimebase"]
