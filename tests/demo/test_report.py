"""The demo's summary says, in words, whether the run kept the session's threshold."""

from __future__ import annotations

from demo.report import threshold_line


class TestThresholdLine:
    def test_a_run_at_or_above_its_threshold_says_so(self) -> None:
        """95.3 % against 95 % is kept, and says so without a flag."""
        line = threshold_line(0.953, 0.95)
        assert "95.3%" in line
        assert "at or above the session's threshold (95%)" in line
        assert "UNDER" not in line

    def test_a_run_under_its_threshold_is_flagged_with_the_shortfall(self) -> None:
        """The issue's run: 94.2 % beside a 95 % threshold is flagged, with how far under."""
        line = threshold_line(0.942, 0.95)
        assert line.strip().startswith("UNDER THE THRESHOLD")
        assert "94.2%" in line
        assert "0.8 points under the session's 95%" in line

    def test_a_shortfall_within_the_noise_tolerance_is_named_but_not_flagged(self) -> None:
        """0.2 points under is within the 0.3-point tolerance: said, not shouted."""
        line = threshold_line(0.948, 0.95)
        assert "UNDER" not in line
        assert "0.2 points under the session's threshold (95%)" in line
        assert "within the 0.3-point noise tolerance" in line

    def test_a_threshold_with_a_fraction_of_a_percent_prints_it(self) -> None:
        """A 97.5 % threshold is not rounded to 98 %."""
        assert "(97.5%)" in threshold_line(0.99, 0.975)

    def test_a_run_without_valid_tokens_is_not_measured_rather_than_flagged(self) -> None:
        """No valid tokens, no throughput: said plainly, neither kept nor missed."""
        line = threshold_line(float("nan"), 0.95)
        assert "not measured" in line
        assert "UNDER" not in line
