"""The simulated GPUs against the measured DVFS sweeps shipped with eerl-sim (issue #34's targets).

A change to the physics or to the a100-sxm / a40 profiles that moves any dataset beyond its tolerance
fails here; the figures themselves: ``eerl-bench calibration``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eerl_sim.bench.cli import main
from eerl_sim.calibration import (
    TOLERANCE_ENERGY_MIN_MHZ,
    TOLERANCE_MAX,
    TOLERANCE_RMS,
    DatasetComparison,
    compare,
)
from eerl_sim.measured import DATASET_PROFILES, MeasuredDataset, measured_datasets, parse_stage_profile
from eerl_sim.profiles import builtin_profile

from eerld.errors import ConfigError

DATASETS = {d.name: d for d in measured_datasets()}


@pytest.fixture(scope="module")
def comparisons() -> dict[str, DatasetComparison]:
    """Every dataset against its built-in profile."""
    return {name: compare(builtin_profile(d.profile), d) for name, d in DATASETS.items()}


class TestMeasuredData:
    def test_every_dataset_ships_with_its_stages_and_clocks(self) -> None:
        """Four files, eight pipeline stages of forward and backward each, the published clock ranges."""
        assert set(DATASETS) == set(DATASET_PROFILES)
        for d in DATASETS.values():
            assert len(d.curves) == 16
            expected = (855, 1410, 38) if "a100" in d.name else (855, 1740, 60)
            assert (d.sm_clocks_mhz[0], d.sm_clocks_mhz[-1], len(d.sm_clocks_mhz)) == expected

    def test_the_attribution_and_license_ship_beside_the_data(self) -> None:
        folder = Path(__file__).resolve().parents[2] / "sim" / "eerl_sim" / "measured"
        notice = (folder / "NOTICE.md").read_text()
        assert "ml-energy/zeus" in notice
        assert "Apache License" in notice
        assert "Apache License" in (folder / "LICENSE").read_text()

    def test_a_published_anchor_reads_as_published(self) -> None:
        """A100 GPT-3 stage 0 forward: 50.2 ms and 23.8 J at 1410 MHz; its energy minimum at 1080 MHz."""
        curve = DATASETS["gpt3-175b+a100_sxm_bf16"].curves[0]
        assert (curve.stage, curve.instruction) == (0, "forward")
        assert curve.time_s[-1] == pytest.approx(0.0502, abs=1e-4)
        assert curve.energy_j[-1] == pytest.approx(23.8, abs=0.1)
        assert curve.sm_clocks_mhz[curve.energy_j.index(min(curve.energy_j))] == 1080

    @pytest.mark.parametrize(
        ("text", "problem"),
        [
            ("stage,instruction,clock,time,energy\n", "expected the header"),
            ("stage,instruction,frequency,time,energy\n0,forward,1410,x,1\n", ":2: expected 5 numbers"),
            ("stage,instruction,frequency,time,energy\n0,forward,1410,0,1\n", "must be positive"),
            ("stage,instruction,frequency,time,energy\n", "no measurement"),
        ],
    )
    def test_a_malformed_file_is_refused_with_file_and_problem(self, text: str, problem: str) -> None:
        with pytest.raises(ConfigError, match=problem) as raised:
            parse_stage_profile(text, source="x.csv")
        assert str(raised.value).startswith("x.csv")

    def test_a_sweep_whose_kernels_cover_other_clocks_is_refused(self) -> None:
        """A default-governor recording may hold one clock per kernel; a sweep to compare may not."""
        text = "stage,instruction,frequency,time,energy\n0,forward,1410,1,1\n0,backward,1395,1,1\n"
        dataset = MeasuredDataset("x", "a40", parse_stage_profile(text, source="x.csv"))
        with pytest.raises(ConfigError, match="x: stage 0 backward is not measured at the same clocks"):
            compare(builtin_profile("a40"), dataset)


class TestCalibration:
    @pytest.mark.parametrize("name", sorted(DATASET_PROFILES))
    def test_every_dataset_is_within_its_tolerance(
        self, comparisons: dict[str, DatasetComparison], name: str
    ) -> None:
        """rms of the time and energy ratios <= 2 %, max <= 5 %, energy minimum within 45 MHz."""
        c = comparisons[name]
        assert c.rms_time_error <= TOLERANCE_RMS
        assert c.rms_energy_error <= TOLERANCE_RMS
        assert c.max_error <= TOLERANCE_MAX
        assert abs(c.energy_min_mhz_simulated - c.energy_min_mhz_measured) <= TOLERANCE_ENERGY_MIN_MHZ
        assert c.within_tolerance()

    def test_a_profile_off_the_measurements_is_caught(self) -> None:
        """The check has teeth: the H100's smooth roofline on the A100 data misses the targets."""
        wrong = builtin_profile("a100-sxm").with_overrides({"roofline_exponent": 3.0, "v_floor": 0.9})
        assert not compare(wrong, DATASETS["gpt3-175b+a100_sxm_bf16"]).within_tolerance()

    def test_the_a40_runs_power_capped_at_its_top_clocks(self) -> None:
        """Measured and simulated alike, the A40's top clocks cost the same time: the 300 W limit binds."""
        c = compare(builtin_profile("a40"), DATASETS["gpt3-175b+a40_bf16"])
        assert c.simulated_time_ratio[-2] == pytest.approx(1.0, abs=0.01)
        assert c.measured_time_ratio[-2] == pytest.approx(1.0, abs=0.01)

    def test_the_ratios_are_to_the_top_clock(self, comparisons: dict[str, DatasetComparison]) -> None:
        for c in comparisons.values():
            assert c.simulated_time_ratio[-1] == c.measured_time_ratio[-1] == 1.0
            assert c.simulated_energy_ratio[-1] == pytest.approx(1.0)


class TestCalibrationCommand:
    def test_it_prints_the_table_and_writes_exactly_the_documented_fields(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        out = tmp_path / "calibration.json"
        png = tmp_path / "calibration.png"
        assert main(["calibration", "--json", str(out), "--plot", str(png)]) == 0
        table = capsys.readouterr().out
        document = json.loads(out.read_text())
        assert [row["dataset"] for row in document] == list(DATASET_PROFILES)
        for row in document:
            assert set(row) == {
                "dataset",
                "rms_time_error",
                "rms_energy_error",
                "max_error",
                "energy_min_mhz_measured",
                "energy_min_mhz_simulated",
            }
            assert row["dataset"] in table
        assert png.stat().st_size > 10_000
