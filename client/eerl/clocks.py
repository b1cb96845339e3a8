"""The supported-clock grid: the one "nearest supported clock" rule, for controllers and the daemon alike.

A shared noun about clocks, not part of the controller: the controllers (:mod:`eerl.control`) snap to it and
eerld names the nearest supported clocks in its errors (pins, fixed clocks) with the same rule.
"""

from __future__ import annotations

from collections.abc import Iterable


def nearest_supported_mhz(supported_mhz: Iterable[int], wanted_mhz: float) -> int:
    """The supported clock closest to ``wanted_mhz`` (ties go to the lower clock); ValueError when empty."""
    return min(supported_mhz, key=lambda c: (abs(c - wanted_mhz), c))


def nearest_supported_text(supported_mhz: Iterable[int], wanted_mhz: float, count: int = 2) -> str:
    """``"nearest supported: 1230, 1245 MHz"``: the ``count`` closest clocks, ascending, for errors."""
    nearest = sorted(sorted(supported_mhz, key=lambda c: (abs(c - wanted_mhz), c))[:count])
    return f"nearest supported: {', '.join(str(c) for c in nearest)} MHz"
