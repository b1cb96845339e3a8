"""The clock grid the search walks: fine candidates, the coarse descent and re-tune windows."""

from __future__ import annotations

import itertools

import pytest
from eerl.control.config import EerlConfig
from eerl.control.grid import ClockGrid
from eerl.control.search import candidate_clocks
from eerl.control.state import SearchState
from eerl.errors import ValidationError
from hypothesis import given
from hypothesis import strategies as st

from tests.client.control.parts import CONFIG, GRID
from tests.client.control.synthetic import GRID_MHZ


class TestClockGrid:
    def test_the_fine_grid_keeps_the_top_and_spaces_clocks_a_fine_step_apart(self) -> None:
        """Fine candidates are supported clocks, the top one included, at least a fine step apart."""
        assert GRID.fine_mhz[-1] == GRID_MHZ[-1]
        assert set(GRID.fine_mhz) <= set(GRID_MHZ)
        gaps = [b - a for a, b in itertools.pairwise(GRID.fine_mhz)]
        assert min(gaps) >= GRID.fine_step_mhz - 1e-9

    def test_the_coarse_descent_starts_below_the_top_and_descends_by_its_factor(self) -> None:
        """The first coarse trial is the clock nearest 0.77 of the top, each next one nearest 0.88 of that."""
        schedule = GRID.coarse_schedule()
        assert schedule[:3] == [1530, 1335, 1185]  # nearest 1524.6, 1341.6, 1180.6 MHz
        assert all(a > b for a, b in itertools.pairwise(schedule))
        assert schedule[-1] * 0.88 < GRID_MHZ[0]

    def test_upward_trials_climb_from_a_clock_that_was_too_slow(self) -> None:
        """Above a too slow first trial the coarse trials ascend, nearest first, on the supported grid."""
        upward = GRID.coarse_upward(915)
        assert upward[0] == 1035  # nearest 915 / 0.88
        assert upward == sorted(upward)
        assert all(915 < c <= GRID.max_mhz and c in GRID_MHZ for c in upward)

    def test_a_retune_window_spans_its_steps_on_either_side_of_the_centre(self) -> None:
        """The window is ± three fine steps around the centre; its edges snap to the fine grid, and it
        holds them even where they snap just outside the span (1174–1435 here): a window without its own
        lower edge trial could never choose it, nor slide down past it."""
        assert GRID.window_edges(1305) == [1170, 1440]
        assert GRID.window_around(1305) == (1170, 1440)
        search = SearchState(window=GRID.window_around(1305))
        assert candidate_clocks(search, GRID, (1170, 1440), None, 0)[0] == 1170

    def test_an_empty_grid_is_a_validation_error(self) -> None:
        """A session without supported clocks cannot be searched."""
        with pytest.raises(ValidationError):
            ClockGrid.build((), EerlConfig())

    @given(st.lists(st.integers(100, 3000), min_size=1, max_size=60, unique=True))
    def test_every_clock_it_proposes_is_supported(self, clocks: list[int]) -> None:
        """Whatever the supported clocks, fine candidates and coarse trials are among them, in order."""
        grid = ClockGrid.build(tuple(clocks), CONFIG)
        assert set(grid.fine_mhz) <= set(clocks)
        assert grid.fine_mhz == tuple(sorted(grid.fine_mhz))
        schedule = grid.coarse_schedule()
        assert set(schedule) <= set(clocks)
        assert all(a > b for a, b in itertools.pairwise(schedule))
        for clock in clocks:
            assert set(grid.window_edges(clock)) <= set(grid.fine_mhz)
            low, high = grid.window_around(clock)
            assert all(low <= edge <= high for edge in grid.window_edges(clock))
