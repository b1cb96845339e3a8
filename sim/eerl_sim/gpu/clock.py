"""Simulated time for the ``sim`` GPU backend: virtual (the caller advances it) or real time with a speed-up.

Every timestamp the simulated device stores is in *simulated seconds since the device's epoch*. With
:class:`RealTimeClock` the epoch is a ``time.monotonic()`` value kept in the state file, and
``CLOCK_MONOTONIC`` is system-wide, so several processes sharing one state file agree on "now". With
:class:`VirtualClock` time only moves when someone calls :meth:`VirtualClock.advance` (or sleeps on it),
which makes tests exact and instant; it is meant for one process.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Protocol, runtime_checkable

from eerld.errors import ConfigError


@runtime_checkable
class SimClock(Protocol):
    """Where simulated time comes from and how a simulated worker waits for it to pass."""

    @property
    def kind(self) -> str:
        """``"real"`` or ``"virtual"``: recorded in the state file so that processes cannot mix them."""
        ...

    @property
    def speedup(self) -> float:
        """Simulated seconds per wall second (``math.inf`` for a virtual clock)."""
        ...

    def now_s(self) -> float:
        """Simulated seconds since the epoch; never decreases."""
        ...

    def sleep_s(self, duration_s: float) -> None:
        """Let ``duration_s`` simulated seconds pass (really sleep, or advance a virtual clock)."""
        ...


class RealTimeClock:
    """Simulated seconds = (``time.monotonic()`` − epoch) × ``speedup``.

    ``epoch_monotonic_s`` defaults to now; a device bound to a state file replaces it with the epoch
    stored there (:meth:`with_epoch`), so that every process reads the same simulated time.
    """

    def __init__(self, speedup: float = 1.0, *, epoch_monotonic_s: float | None = None) -> None:
        if not (math.isfinite(speedup) and speedup > 0):
            raise ConfigError(f"sim speedup must be a positive finite number, got {speedup!r}")
        self._speedup = float(speedup)
        self.epoch_monotonic_s = time.monotonic() if epoch_monotonic_s is None else epoch_monotonic_s

    @property
    def kind(self) -> str:
        """Always ``"real"``."""
        return "real"

    @property
    def speedup(self) -> float:
        """Simulated seconds per wall second."""
        return self._speedup

    def with_epoch(self, epoch_monotonic_s: float) -> RealTimeClock:
        """The same speed-up counted from another epoch (the one a shared state file holds)."""
        return RealTimeClock(self._speedup, epoch_monotonic_s=epoch_monotonic_s)

    def now_s(self) -> float:
        """Simulated seconds since the epoch (never negative)."""
        return max(0.0, (time.monotonic() - self.epoch_monotonic_s) * self._speedup)

    def sleep_s(self, duration_s: float) -> None:
        """Sleep ``duration_s / speedup`` wall seconds."""
        if duration_s > 0:
            time.sleep(duration_s / self._speedup)

    def __repr__(self) -> str:
        return f"RealTimeClock(speedup={self._speedup})"


class VirtualClock:
    """A clock that only moves when told to; ``sleep_s`` advances it (thread-safe, one process)."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = float(start_s)
        self._lock = threading.Lock()

    @property
    def kind(self) -> str:
        """Always ``"virtual"``."""
        return "virtual"

    @property
    def speedup(self) -> float:
        """Infinite: waiting costs no wall time."""
        return math.inf

    def now_s(self) -> float:
        """The current virtual time."""
        with self._lock:
            return self._now_s

    def advance(self, duration_s: float) -> float:
        """Move time forward by ``duration_s`` (≥ 0); returns the new time."""
        if duration_s < 0:
            raise ValueError(f"virtual time cannot go backwards (advance by {duration_s})")
        with self._lock:
            self._now_s += duration_s
            return self._now_s

    def advance_to(self, time_s: float) -> float:
        """Move time forward to ``time_s`` (no-op if already past it); returns the new time."""
        with self._lock:
            self._now_s = max(self._now_s, time_s)
            return self._now_s

    def sleep_s(self, duration_s: float) -> None:
        """A simulated worker waiting: advances the clock."""
        if duration_s > 0:
            self.advance(duration_s)

    def __repr__(self) -> str:
        return f"VirtualClock(now_s={self.now_s()})"
