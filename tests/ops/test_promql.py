"""The PromQL scanner that the dashboard and alert tests rely on."""

from __future__ import annotations

from tests.ops.promql import metric_names


class TestMetricNames:
    def test_aggregations_and_functions_are_not_metrics(self) -> None:
        """Only the metric inside sum(rate(...)) is reported, not sum, rate or the by-labels."""
        expr = 'sum by (Hostname, phase) (rate(eerl_phase_energy_joules_total{Hostname=~"$Hostname"}[5m]))'
        assert metric_names(expr) == {"eerl_phase_energy_joules_total"}

    def test_binary_operations_report_both_sides(self) -> None:
        """a / clamp_min(1 - b, 0.01) reads a and b."""
        assert metric_names('a_total / clamp_min(1 - b_ratio{x="y"}, 0.01)') == {"a_total", "b_ratio"}

    def test_matching_clauses_and_keywords_are_skipped(self) -> None:
        """on (...) group_left and `and` are syntax, not metrics."""
        expr = "x == 1 and on (Hostname) group_left (gpu) y == 0 unless z"
        assert metric_names(expr) == {"x", "y", "z"}

    def test_an_unknown_word_is_reported(self) -> None:
        """A misspelt metric is reported as a name, so a test comparing names catches it."""
        assert metric_names("rate(eerl_gpu_energy_joule_total[$__rate_interval])") == {
            "eerl_gpu_energy_joule_total"
        }
