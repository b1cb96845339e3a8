"""eerl-bench multinode on short runs: every policy on the same draws, the JSON schema, the plot, errors."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
from eerl.phases import PhaseKind
from eerl_sim.bench.cli import main
from eerl_sim.bench.multinode import POLICIES, MultinodeReport, MultinodeRun, job_workload, run_multinode
from eerl_sim.scenario import load_scenario

ITERATIONS = 40


@pytest.fixture(scope="module")
def short_report() -> MultinodeReport:
    return run_multinode(load_scenario("multinode-4-h100"), 0.95, iterations=ITERATIONS)


class TestPolicies:
    def test_every_policy_is_reported_against_the_default(self, short_report: MultinodeReport) -> None:
        assert set(short_report.policies) == set(POLICIES)
        default = short_report.policies["default"]
        assert default.savings == 0.0
        assert default.throughput_ratio == pytest.approx(1.0)

    def test_the_oracle_is_a_uniform_pair_at_the_threshold(self, short_report: MultinodeReport) -> None:
        oracle = short_report.policies["oracle"]
        assert oracle.throughput_ratio >= 0.95
        assert oracle.savings > 0.1

    def test_the_online_policies_save_without_collapsing_throughput(
        self, short_report: MultinodeReport
    ) -> None:
        """A 40-iteration run is mostly search; both online policies still save, near the threshold."""
        for name in ("independent", "job"):
            figures = short_report.policies[name]
            assert figures.savings > 0.0, name
            assert figures.throughput_ratio >= 0.9, name

    def test_the_jobs_workload_is_every_nodes(self) -> None:
        run = MultinodeRun(load_scenario("multinode-4-h100"), iterations=1)
        run.price()
        table = run.table(0, PhaseKind.TRAINING)
        job = job_workload(table.workload, 4)
        assert job.tokens == 4 * table.workload.tokens
        assert job.max_response_tokens == table.workload.max_response_tokens


class TestCommand:
    def test_json_and_plot(self, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
        out, plot = tmp_path / "multinode.json", tmp_path / "multinode.png"
        code = main(
            [
                "multinode",
                "--scenario",
                "multinode-4-h100",
                "--nodes",
                "2",
                "--seeds",
                "1-2",
                "--iterations",
                "12",
                "--json",
                str(out),
                "--plot",
                str(plot),
            ]
        )
        assert code == 0
        runs = json.loads(out.read_text())["runs"]
        assert [(r["scenario"], r["nodes"], r["seed"]) for r in runs] == [
            ("multinode-4-h100", 2, 1),
            ("multinode-4-h100", 2, 2),
        ]
        for run in runs:
            assert set(run) == {"scenario", "nodes", "seed", "policies"}
            assert set(run["policies"]) == set(POLICIES)
            for figures in run["policies"].values():
                assert set(figures) == {"savings", "throughput_ratio", "energy_per_valid_token_j"}
        assert plot.read_bytes().startswith(b"\x89PNG")
        printed = capsys.readouterr().out
        assert "median capture" in printed

    def test_markdown_replaces_its_own_section_and_keeps_the_rest(self, tmp_path: Path) -> None:
        """`--markdown` writes the multi-node section at the end of the file: appended the first time,
        replaced (not appended again) the next, the part before it untouched."""
        results = tmp_path / "results.md"
        results.write_text("# eerl-bench results\n\nthe single-node table\n")
        command = ["multinode", "--scenario", "multinode-4-h100", "--nodes", "2", "--iterations", "4"]
        for seeds in ("1", "2"):
            assert main([*command, "--seeds", seeds, "--markdown", str(results)]) == 0
        text = results.read_text()
        head, section = text.split("\n## Multi-node jobs\n")
        assert head == "# eerl-bench results\n\nthe single-node table\n"
        assert "--seeds 2" in section
        assert "--seeds 1" not in section
        assert "| multinode-4-h100 | 2 | 2 |" in section

    def test_a_single_node_scenario_is_refused(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["multinode", "--scenario", "sync-h100", "--iterations", "2"]) == 1
        assert "no [workload.nodes] table" in capsys.readouterr().err

    def test_a_bad_node_count_is_refused(self, capsys: pytest.CaptureFixture[str]) -> None:
        assert main(["multinode", "--scenario", "multinode-4-h100", "--nodes", "0"]) == 1
        assert "--nodes" in capsys.readouterr().err

    def test_seeds_change_the_draws(self) -> None:
        base = load_scenario("multinode-4-h100")
        other = dataclasses.replace(base, workload=dataclasses.replace(base.workload, seed=2))
        a, b = MultinodeRun(base, 2), MultinodeRun(other, 2)
        assert (a.draws.speed != b.draws.speed).all()
