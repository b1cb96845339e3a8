"""The supported-clock grid: the one nearest-supported-clock rule, and its words for an error message."""

from __future__ import annotations

import pytest
from eerl.clocks import nearest_supported_mhz, nearest_supported_text
from hypothesis import given
from hypothesis import strategies as st

GRID = (1185, 1200, 1215, 1230)


class TestNearestSupportedMhz:
    def test_a_supported_clock_is_its_own_nearest(self) -> None:
        """A clock on the grid comes back unchanged."""
        assert nearest_supported_mhz(GRID, 1200) == 1200

    def test_a_tie_goes_to_the_lower_clock(self) -> None:
        """Halfway between two clocks, the lower one wins (whatever order the grid is given in)."""
        assert nearest_supported_mhz(GRID, 1207.5) == 1200
        assert nearest_supported_mhz(tuple(reversed(GRID)), 1207.5) == 1200

    def test_outside_the_grid_the_nearest_end_is_chosen(self) -> None:
        """Below the lowest clock the lowest one, above the highest the highest one."""
        assert nearest_supported_mhz(GRID, 300) == 1185
        assert nearest_supported_mhz(GRID, 3000) == 1230

    def test_an_empty_grid_is_a_value_error(self) -> None:
        """No clock is nearest to anything on an empty grid."""
        with pytest.raises(ValueError):
            nearest_supported_mhz((), 1200)

    @given(st.lists(st.integers(100, 3000), min_size=1, unique=True), st.floats(0, 4000))
    def test_no_supported_clock_is_closer(self, grid: list[int], wanted: float) -> None:
        """The result is on the grid and no clock of the grid is strictly closer to the wanted one."""
        nearest = nearest_supported_mhz(grid, wanted)
        assert nearest in grid
        assert all(abs(c - wanted) >= abs(nearest - wanted) for c in grid)


class TestNearestSupportedText:
    def test_names_the_two_closest_clocks_in_ascending_order(self) -> None:
        """Between two clocks, both are named, lower first."""
        assert nearest_supported_text(GRID, 1234) == "nearest supported: 1215, 1230 MHz"
        assert nearest_supported_text(GRID, 1190) == "nearest supported: 1185, 1200 MHz"

    def test_a_grid_of_one_clock_names_that_clock(self) -> None:
        """With a single supported clock there is only one to name."""
        assert nearest_supported_text((1980,), 2100) == "nearest supported: 1980 MHz"
