"""The fixed-clock comparison table and the calibration report."""

from __future__ import annotations

import pytest
from eerl_sim.fixed_report import (
    FixedSetting,
    calibration_figures,
    compare_fixed,
    format_calibration,
    format_table,
)
from eerl_sim.scenario import Scenario, load_scenario


class TestCompareFixed:
    def test_the_default_comes_first_and_is_its_own_baseline(self, sync_h100: Scenario) -> None:
        rows = compare_fixed(sync_h100, [FixedSetting("gen 1200", 1200, None)], iterations=2)
        assert rows[0].setting.label == "default governor"
        assert rows[0].energy_saving_fraction == 0.0
        assert rows[0].throughput_ratio == 1.0

    def test_a_lower_generation_clock_saves_energy_at_a_small_throughput_cost(
        self, sync_h100: Scenario
    ) -> None:
        rows = compare_fixed(sync_h100, [FixedSetting("gen 1200", 1200, None)], iterations=2)
        assert rows[1].energy_saving_fraction > 0.05
        assert 0.95 < rows[1].throughput_ratio < 1.0
        assert rows[1].generation_mean_clock_mhz == pytest.approx(1200, rel=1e-3)

    def test_the_table_has_a_line_per_setting(self, sync_h100: Scenario) -> None:
        rows = compare_fixed(sync_h100, [FixedSetting("gen 1200", 1200, None)], iterations=1)
        table = format_table(rows)
        assert len(table.splitlines()) == 2 + len(rows)
        assert "gen 1200" in table


class TestCalibrationReport:
    def test_the_report_names_every_calibration_figure(self, sync_h100: Scenario) -> None:
        text = format_calibration(calibration_figures(sync_h100, iterations=2))
        for phrase in ("generation share", "generation power", "power cap", "1200 MHz", "best fixed pair"):
            assert phrase in text

    def test_a_profile_without_the_h100_s_clocks_is_measured_at_its_nearest(self) -> None:
        """The A100 tops out at 1410 MHz: the 1500 MHz figure uses its top clock and says so."""
        figures = calibration_figures(load_scenario("sync-a100"), iterations=1)
        assert figures.probe_clocks_mhz == (1200, 900, 1410)
        assert "T(900)/T(1410) ÷ 1410/900" in format_calibration(figures)
