"""The clock grid the search walks: the fine candidates, the coarse descent and the re-tune window.

Built once per session from the supported clocks and the tuning; immutable, so every part may share it.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from eerl.clocks import nearest_supported_mhz
from eerl.control.config import EerlConfig
from eerl.errors import ValidationError


@dataclass(frozen=True, slots=True)
class ClockGrid:
    """The supported clocks, the fine candidates spaced ``fine_step_mhz`` apart, and the search's geometry."""

    clocks_mhz: tuple[int, ...]
    """Supported clocks, ascending, without duplicates."""
    fine_mhz: tuple[int, ...]
    """The fine candidates: every supported clock at least a fine step above the previous one."""
    fine_step_mhz: float
    coarse_factor: float
    coarse_start_fraction: float
    retune_span_mhz: float
    """Half the width of a local re-tune's window."""

    @classmethod
    def build(cls, supported_mhz: tuple[int, ...], config: EerlConfig) -> ClockGrid:
        """The grid of a session; ValidationError when no clock is supported."""
        clocks = tuple(sorted(set(supported_mhz)))
        if not clocks:
            raise ValidationError("supported_sm_clocks_mhz", "must name at least one clock")
        fine_step_mhz = max(1.0, config.fine_step_fraction * clocks[-1])
        return cls(
            clocks_mhz=clocks,
            fine_mhz=fine_grid(clocks, config.fine_step_fraction * clocks[-1]),
            fine_step_mhz=fine_step_mhz,
            coarse_factor=config.coarse_factor,
            coarse_start_fraction=config.coarse_start_fraction,
            retune_span_mhz=config.retune_window_steps * fine_step_mhz,
        )

    @property
    def max_mhz(self) -> int:
        """The top supported clock (where the default governor runs a busy GPU)."""
        return self.clocks_mhz[-1]

    @property
    def curve_bandwidth_mhz(self) -> float:
        """The clock curve's kernel width: trials this close share their information."""
        return 2.2 * self.fine_step_mhz

    def coarse_schedule(self) -> list[int]:
        """Descending coarse trials, starting a few steps below the top (where savings begin to matter)."""
        clocks: list[int] = []
        target = self.max_mhz * self.coarse_start_fraction
        while target >= self.clocks_mhz[0]:
            snapped = nearest_supported_mhz(self.clocks_mhz, target)
            if not clocks or snapped < clocks[-1]:
                clocks.append(snapped)
            target *= self.coarse_factor
        return clocks

    def coarse_upward(self, clock_mhz: int) -> list[int]:
        """Coarse trials above a first trial that was already too slow (nearest first)."""
        clocks: list[int] = []
        target = clock_mhz / self.coarse_factor
        while target < self.max_mhz:
            snapped = nearest_supported_mhz(self.clocks_mhz, target)
            if snapped > (clocks[-1] if clocks else clock_mhz):
                clocks.append(snapped)
            target /= self.coarse_factor
        return clocks

    def window_around(self, center_mhz: int) -> tuple[int, int]:
        """The clock range a local re-tune around ``center_mhz`` searches, its edge trials included.

        The edges snap to the nearest fine candidates, which may lie just outside the span: a window that
        left its own lower edge trial out could never choose it, so it could never slide down past it.
        """
        low, high = int(center_mhz - self.retune_span_mhz), int(center_mhz + self.retune_span_mhz)
        upper_edge = nearest_supported_mhz(self.fine_mhz, center_mhz + self.retune_span_mhz)
        return min(low, self.lower_edge_mhz(center_mhz)), max(high, upper_edge)

    def window_edges(self, center_mhz: int) -> list[int]:
        """The fine candidates nearest the window's edges (ascending, the centre left out)."""
        edges = {
            self.lower_edge_mhz(center_mhz),
            nearest_supported_mhz(self.fine_mhz, center_mhz + self.retune_span_mhz),
        } - {center_mhz}
        return sorted(edges)

    def fine_below(self, clock_mhz: int) -> int | None:
        """The highest fine candidate below ``clock_mhz`` (None at the bottom of the grid)."""
        index = bisect.bisect_left(self.fine_mhz, clock_mhz)
        return self.fine_mhz[index - 1] if index > 0 else None

    def lower_edge_mhz(self, center_mhz: int) -> int:
        """The fine candidate nearest the lower edge of the window around ``center_mhz``."""
        return nearest_supported_mhz(self.fine_mhz, center_mhz - self.retune_span_mhz)


def fine_grid(clocks: tuple[int, ...], step_mhz: float) -> tuple[int, ...]:
    """Every clock at least ``step_mhz`` above the previous one kept (top clock always in)."""
    kept = [clocks[-1]]
    for clock in reversed(clocks[:-1]):
        if kept[-1] - clock >= step_mhz - 1e-9:
            kept.append(clock)
    return tuple(sorted(kept))
