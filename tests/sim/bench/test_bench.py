"""eerl-bench on short runs of the built-in scenarios: figures within bounds, files written, errors clear."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from eerl_sim.bench.cli import main, parse_seeds, run_controller
from eerl_sim.bench.report import ControllerReport
from eerl_sim.scenario import load_scenario


@pytest.fixture(scope="module")
def short_sync_report() -> ControllerReport:
    """The controller benchmark on the first 60 iterations of sync-h100."""
    return run_controller(load_scenario("sync-h100"), 0.95, iterations=60)


class TestControllerRegression:
    def test_online_captures_most_of_the_oracle_savings(self, short_sync_report: ControllerReport) -> None:
        """Even with exploration in a 60-iteration run, online captures at least 0.75 of the oracle."""
        assert short_sync_report.savings_oracle > 0.1
        assert short_sync_report.capture >= 0.75

    def test_online_keeps_the_throughput_threshold(self, short_sync_report: ControllerReport) -> None:
        """Online throughput stays within 0.01 of the threshold (and does not give away more than 0.02)."""
        assert 0.94 <= short_sync_report.throughput_ratio_online <= 0.97

    def test_oracle_meets_the_threshold_and_beats_the_default(
        self, short_sync_report: ControllerReport
    ) -> None:
        """The oracle is a real fixed setting: at or above the threshold, below the default's energy."""
        assert short_sync_report.throughput_ratio_oracle >= 0.95
        assert (
            short_sync_report.oracle.energy_per_valid_token_j
            < short_sync_report.default.energy_per_valid_token_j
        )


class TestCli:
    def test_controller_writes_json_and_timeline(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`controller` prints the table and writes the documented JSON keys and a PNG."""
        out = tmp_path / "run.json"
        png = tmp_path / "timeline.png"
        code = main(
            [
                "controller",
                "--scenario",
                "async-h100",
                "--iterations",
                "12",
                "--json",
                str(out),
                "--timeline",
                str(png),
            ]
        )
        assert code == 0
        assert "capture" in capsys.readouterr().out
        document = json.loads(out.read_text())
        for run in ("default", "oracle", "online"):
            assert {"energy_per_valid_token_j", "throughput_tokens_per_s"} <= set(document[run])
        assert {"savings_online", "savings_oracle", "throughput_ratio_online", "capture"} <= set(document)
        assert png.read_bytes().startswith(b"\x89PNG")

    def test_sweep_writes_a_pareto_plot(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        """`sweep` prints the table with the best setting marked and draws the Pareto plot."""
        png = tmp_path / "pareto.png"
        assert main(["sweep", "--scenario", "sync-h100", "--iterations", "4", "--plot", str(png)]) == 0
        assert "best at threshold" in capsys.readouterr().out
        assert png.read_bytes().startswith(b"\x89PNG")

    def test_unknown_scenario_is_one_error_line(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A scenario that does not exist exits 1 with a single `Error:` line."""
        assert main(["controller", "--scenario", "no-such-scenario", "--iterations", "2"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1
        assert err[0].startswith("Error:")

    def test_rejects_a_threshold_out_of_range(self, capsys: pytest.CaptureFixture[str]) -> None:
        """A threshold above 1 exits 2 with an error line."""
        assert main(["controller", "--scenario", "sync-h100", "--threshold", "1.5"]) == 2
        assert capsys.readouterr().err.startswith("Error:")

    def test_seeds_runs_each_seed_on_its_own_workload(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`seeds` reports one row per seed and a min/median row; other seeds draw other workloads."""
        out = tmp_path / "seeds.json"
        code = main(
            ["seeds", "--scenario", "sync-h100", "--seeds", "1,2", "--iterations", "6", "--json", str(out)]
        )
        assert code == 0
        printed = capsys.readouterr().out
        assert "| sync-h100 | 1 |" in printed
        assert "| sync-h100 | 2 |" in printed
        assert "min / median" in printed
        rows = json.loads(out.read_text())
        assert [r["seed"] for r in rows] == [1, 2]
        energies = {r["default"]["energy_per_valid_token_j"] for r in rows}
        assert len(energies) == 2

    def test_all_heads_its_table_with_the_seeds_median_and_worst(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """`all` reports each scenario's capture over the seeds (median, worst) before its own seed's."""
        assert (
            main(
                [
                    "seeds",
                    "--scenario",
                    "all",
                    "--seeds",
                    "1,2",
                    "--iterations",
                    "6",
                    "--json",
                    str(tmp_path / "seeds.json"),
                ]
            )
            == 0
        )
        runs = [
            {**r, "scenario": r["scenario"].split(" (seed")[0]}  # a run's own name says its seed
            for r in json.loads((tmp_path / "seeds.json").read_text())
        ]
        markdown = tmp_path / "results.md"
        code = main(
            [
                "all",
                "--seeds",
                "1,2",
                "--iterations",
                "6",
                "--out-dir",
                str(tmp_path),
                "--markdown",
                str(markdown),
            ]
        )
        assert code == 0
        capsys.readouterr()
        text = markdown.read_text()
        assert "| scenario | capture median / worst, seeds 1–2 | throughput worst, seeds 1–2 |" in text
        for name in {r["scenario"] for r in runs}:
            captures = [r["capture"] for r in runs if r["scenario"] == name]
            throughputs = [r["throughput_ratio_online"] for r in runs if r["scenario"] == name]
            own = next(r for r in runs if r["scenario"] == name and r["seed"] == 1)
            median, worst = statistics.median(captures), min(captures)
            row = f"| {name} | {median:.3f} / {worst:.3f} | {min(throughputs):.3f} | 6 |"
            assert row in text, name
            assert f"| {own['capture']:.3f} | {own['throughput_ratio_online']:.3f} |" in text, name

    @pytest.mark.parametrize(("text", "seeds"), [("1-3", [1, 2, 3]), ("4,7", [4, 7]), ("1-2,9", [1, 2, 9])])
    def test_seed_lists_parse(self, text: str, seeds: list[int]) -> None:
        assert parse_seeds(text) == seeds

    def test_a_bad_seed_list_is_one_error_line(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["seeds", "--scenario", "sync-h100", "--seeds", "one-two"]) == 1
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1
        assert "--seeds" in err[0]
