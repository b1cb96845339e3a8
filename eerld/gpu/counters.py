"""Energy-counter arithmetic: turn two raw readings of a GPU energy counter into energy, never negative.

NVML's total-energy counter (``nvmlDeviceGetTotalEnergyConsumption``) counts millijoules since the
driver loaded, so a driver reload (or a GPU reset) starts it again from zero: a reading can be *smaller*
than the one before. Subtracting blindly would book negative energy against a phase; here a backwards
step is a reset, and the energy of the interval is what the counter has counted since the reset.

Wrap-around is not modelled: the counter is an unsigned 64-bit count of millijoules, which at 10 kW
would take more than fifty thousand years to wrap. A decrease is therefore always a reset.

Pure functions and a small value-holding class, no I/O: the daemon's energy meter reads the backend and
feeds the readings in; the benchmark feeds simulated readings in the same way.
"""

from __future__ import annotations

from typing import NamedTuple


class CounterDelta(NamedTuple):
    """Energy counted between two readings, and whether the counter was reset in between."""

    delta_mj: int
    reset_detected: bool


def counter_delta_mj(previous_mj: int, current_mj: int) -> CounterDelta:
    """Energy between two readings of a counter that only resets, never wraps.

    If ``current_mj`` is below ``previous_mj`` the counter restarted (driver reload, GPU reset); the
    energy counted since the restart, ``current_mj``, is a lower bound of the interval's energy and the
    best that can be known, so it is what is returned, with ``reset_detected`` set. The energy used
    between the last reading and the restart is lost, never guessed.

    Raises ``ValueError`` for a negative reading: counters are unsigned, so that is a caller's bug.
    """
    if previous_mj < 0 or current_mj < 0:
        raise ValueError(
            f"energy counter readings are never negative (previous={previous_mj} mJ, current={current_mj} mJ)"
        )
    if current_mj >= previous_mj:
        return CounterDelta(current_mj - previous_mj, reset_detected=False)
    return CounterDelta(current_mj, reset_detected=True)


class EnergyCounter:
    """Accumulates the energy of one GPU's counter across resets.

    Feed it every raw reading with :meth:`observe`; it returns the energy since the previous reading and
    keeps a running total and a count of detected resets. The first reading only sets the baseline.
    """

    def __init__(self, first_reading_mj: int) -> None:
        counter_delta_mj(first_reading_mj, first_reading_mj)  # validates the reading
        self._last_mj = first_reading_mj
        self._total_mj = 0
        self._resets = 0

    @property
    def last_reading_mj(self) -> int:
        """The most recent raw reading."""
        return self._last_mj

    @property
    def total_mj(self) -> int:
        """Energy accumulated since the first reading, resets bridged."""
        return self._total_mj

    @property
    def resets(self) -> int:
        """How many times the counter went backwards."""
        return self._resets

    def observe(self, reading_mj: int) -> CounterDelta:
        """Take a new raw reading; return the energy since the previous one."""
        delta = counter_delta_mj(self._last_mj, reading_mj)
        self._last_mj = reading_mj
        self._total_mj += delta.delta_mj
        if delta.reset_detected:
            self._resets += 1
        return delta
