"""``eerl-bench``: the controller against the default governor and the offline oracle, in virtual time.

eerl-bench controller --scenario NAME|FILE [--threshold 0.95] [--iterations N] [--json OUT] [--timeline PNG]
eerl-bench sweep --scenario NAME|FILE [--threshold 0.95] [--iterations N] [--plot PNG]
eerl-bench headroom --scenario NAME|FILE [--threshold 0.95] [--regimes 150,...]
eerl-bench all [--threshold 0.95] [--iterations N] [--out-dir docs/results] [--markdown docs/results.md]
eerl-bench multinode --scenario NAME|FILE|all [--nodes N] [--seeds 1-5] [--json OUT] [--plot PNG]
eerl-bench calibration [--json OUT] [--plot PNG]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Never

import numpy as np
from eerl.control.eerl import create_eerl_controller
from eerl.phases import ExecutionMode

from eerl_sim import __version__
from eerl_sim.bench.calibration import add_calibration_parser
from eerl_sim.bench.headroom import Headroom, headroom
from eerl_sim.bench.multinode import MultinodeReport, run_multinode, with_nodes
from eerl_sim.bench.peers import best_fixed_clock, best_power_limit
from eerl_sim.bench.report import ControllerReport, exploration_cost_j, final_states
from eerl_sim.bench.runner import Progress, ScenarioRun
from eerl_sim.scenario import Scenario, builtin_scenario_names, load_scenario
from eerl_sim.sweep import KINDS
from eerld.errors import DaemonError

MISSING_EXTRA_ERROR = "Error: eerl-bench needs its extra: pip install 'eerl-sim[bench]'"
_BENCH_EXTRA = frozenset({"tqdm", "matplotlib"})
"""The distributions of the ``bench`` extra (the base wheel installs eerl-bench, not these)."""
_missing_extra: str | None = None
try:
    from tqdm import tqdm

    from eerl_sim.bench.plots import multinode_plot, pareto_plot, timeline_plot
except ModuleNotFoundError as missing:  # main() says which extra to install, without a traceback
    if missing.name not in _BENCH_EXTRA:
        raise
    _missing_extra = missing.name


def _updater(bar: tqdm[Never]) -> Progress:
    """A progress callback that advances the bar."""

    def advance(done: int) -> None:
        bar.update(done)

    return advance


def _progress(total: int, description: str) -> tqdm[Never]:
    bar: tqdm[Never] = tqdm(
        total=total, desc=description, unit="it", leave=False, file=sys.stderr, dynamic_ncols=True
    )
    return bar


def run_controller(
    scenario: Scenario,
    threshold: float,
    iterations: int | None = None,
    timeline_png: Path | None = None,
    run: ScenarioRun | None = None,
    *,
    peers: bool = False,
) -> ControllerReport:
    """Default, oracle and online on the same sampled workload; optionally draw the timeline.

    ``run`` lets a caller keep the priced scenario for further figures (the re-tune headroom); ``peers``
    adds the best fixed clock and the best power limit (:mod:`eerl_sim.bench.peers`; seconds per scenario).
    """
    started = time.perf_counter()
    run = ScenarioRun(scenario, iterations) if run is None else run
    with _progress(run.iterations, f"{scenario.name}: pricing every clock") as bar:
        run.price_table(_updater(bar))
    default = run.default_totals()
    pair, oracle = run.oracle(threshold)
    clocks = run.price_table().sm_clocks_mhz
    top = len(clocks) - 1
    oracle_clocks = {
        kind: (None if index == top else clocks[index]) for kind, index in zip(KINDS, pair, strict=True)
    }
    with _progress(run.iterations, f"{scenario.name}: online EE-RL") as bar:
        online = run.run_online(create_eerl_controller, threshold, _updater(bar))
    others = (best_fixed_clock(run, threshold), best_power_limit(run, threshold)) if peers else ()
    report = ControllerReport(
        scenario=scenario.name,
        iterations=run.iterations,
        threshold=threshold,
        default=default,
        oracle=oracle,
        oracle_sm_clocks_mhz=oracle_clocks,
        online=online.totals,
        exploration_phases=online.exploration_phases,
        exploration_cost_j=exploration_cost_j(online),
        final_states=final_states(online),
        runtime_s=time.perf_counter() - started,
        peers=others,
    )
    if timeline_png is not None:
        table = run.price_table()
        wall, energy = table.combined(scenario, (top, top))
        valid = np.maximum(table.valid_tokens.astype(np.float64), 1.0)
        title = (
            f"{scenario.name}: online saves {report.savings_online:.1%} at throughput "
            f"{report.throughput_ratio_online:.3f} "
            f"(oracle {report.savings_oracle:.1%}; capture {report.capture:.2f})"
        )
        timeline_plot(
            online,
            default_iteration_energy_per_token_j=energy / valid,
            default_iteration_throughput=valid / wall,
            top_clock_mhz=int(clocks[-1]),
            title=title,
            path=timeline_png,
        )
    return report


def with_seed(scenario: Scenario, seed: int | None) -> Scenario:
    """The scenario with another workload seed (other response lengths, valid fractions and noise)."""
    if seed is None:
        return scenario
    workload = dataclasses.replace(scenario.workload, seed=seed)
    return dataclasses.replace(scenario, workload=workload, name=f"{scenario.name} (seed {seed})")


def parse_seeds(text: str) -> list[int]:
    """``1-5`` or ``1,3,7`` (or a mix) as a list of seeds."""
    seeds: list[int] = []
    try:
        for part in text.split(","):
            low, _, high = part.partition("-")
            seeds.extend(range(int(low), int(high or low) + 1))
    except ValueError:
        raise DaemonError(f"--seeds: expected e.g. 1-5 or 1,3,7, got {text!r}") from None
    if not seeds:
        raise DaemonError(f"--seeds: no seed in {text!r}")
    return seeds


def _cmd_controller(args: argparse.Namespace) -> int:
    scenario = with_seed(load_scenario(args.scenario), args.seed)
    report = run_controller(scenario, args.threshold, args.iterations, args.timeline, peers=True)
    print(report.table())
    print(f"runtime {report.runtime_s:.1f} s")
    if args.json is not None:
        args.json.write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario)
    run = ScenarioRun(scenario, args.iterations)
    with _progress(run.iterations, f"{scenario.name}: pricing every clock") as bar:
        run.price_table(_updater(bar))
    energy, wall = run.sweep()
    default = run.default_totals()
    clocks = run.price_table().sm_clocks_mhz
    pair, best = run.oracle(args.threshold)
    tokens = run.price_table().valid_tokens.sum()
    per_token = energy / tokens
    throughput = tokens / wall
    print(
        f"scenario {scenario.name}, {run.iterations} iterations: "
        f"fixed-clock sweep ({len(clocks)} clocks per phase)"
    )
    print(f"{'generation':>10} {'training':>9} {'J/valid token':>14} {'savings':>8} {'throughput':>10}")
    top = len(clocks) - 1
    rows = [(top, top)]
    rows += [(g, t) for g in range(0, len(clocks), max(1, len(clocks) // 12)) for t in (pair[1],)]
    rows.append(pair)
    for g, t in rows:
        savings = 1.0 - per_token[g, t] / default.energy_per_valid_token_j
        ratio = default.wall_s / wall[g, t]
        label_g = "default" if g == top else str(clocks[g])
        label_t = "default" if t == top else str(clocks[t])
        mark = "  <- best at threshold" if (g, t) == pair else ""
        print(f"{label_g:>10} {label_t:>9} {per_token[g, t]:>14.4f} {savings:>8.1%} {ratio:>10.3f}{mark}")
    if args.plot is not None:
        pareto_plot(
            per_token,
            throughput=throughput,
            default=default,
            best=best,
            threshold=args.threshold,
            title=f"{scenario.name}: fixed-clock sweep",
            path=args.plot,
        )
    return 0


def _cmd_headroom(args: argparse.Namespace) -> int:
    scenario = load_scenario(args.scenario)
    run = ScenarioRun(scenario, args.iterations)
    with _progress(run.iterations, f"{scenario.name}: pricing every clock") as bar:
        run.price_table(_updater(bar))
    boundaries = [int(b) for b in args.regimes.split(",")] if args.regimes else None
    print(headroom(run, args.threshold, boundaries).table())
    return 0


def _cmd_seeds(args: argparse.Namespace) -> int:
    """Capture and throughput of the online controller over several workload seeds per scenario."""
    names = builtin_scenario_names() if args.scenario == "all" else (args.scenario,)
    rows: list[dict[str, object]] = []
    lines = [
        "| scenario | seed | oracle savings | online savings | capture | online throughput |",
        "|---|---|---|---|---|---|",
    ]

    def emit(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    for line in lines:
        print(line)
    for name in names:
        captures: list[float] = []
        throughputs: list[float] = []
        for seed, report in seed_reports(load_scenario(name), parse_seeds(args.seeds), args):
            captures.append(report.capture)
            throughputs.append(report.throughput_ratio_online)
            rows.append({"scenario": name, "seed": seed, **report.to_json()})
            emit(
                f"| {name} | {seed} | {report.savings_oracle:.1%} | {report.savings_online:.1%} | "
                f"{report.capture:.3f} | {report.throughput_ratio_online:.3f} |"
            )
        emit(
            f"| {name} | **min / median** | | | {min(captures):.3f} / {statistics.median(captures):.3f} | "
            f"{min(throughputs):.3f} / {statistics.median(throughputs):.3f} |"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    if args.markdown is not None:
        args.markdown.write_text(
            "# eerl-bench seeds\n\n"
            f"Written by `eerl-bench seeds --scenario {args.scenario} --seeds {args.seeds} "
            f"--threshold {args.threshold}`:\nthe online controller on other workload seeds (other response "
            "lengths, valid fractions and noise\ndraws); the oracle is re-swept for each seed.\n\n"
            + "\n".join(lines)
            + "\n"
        )
    return 0


def seeds_label(seeds: Sequence[int]) -> str:
    """Seeds as a table names them: ``1–5`` for a run of them, else a list."""
    first, last = seeds[0], seeds[-1]
    if list(seeds) == list(range(first, last + 1)) and last > first:
        return f"{first}–{last}"
    return ",".join(str(seed) for seed in seeds)


@dataclasses.dataclass(frozen=True, slots=True)
class SeedSummary:
    """A scenario's capture and throughput over several workload seeds: the headline is never one seed."""

    seeds: tuple[int, ...]
    captures: tuple[float, ...]
    throughputs: tuple[float, ...]

    @property
    def label(self) -> str:
        """The seeds as a table names them."""
        return seeds_label(self.seeds)

    @classmethod
    def of(cls, runs: Sequence[tuple[int, ControllerReport]]) -> SeedSummary:
        """The summary of ``(seed, report)`` pairs."""
        return cls(
            tuple(seed for seed, _ in runs),
            tuple(report.capture for _, report in runs),
            tuple(report.throughput_ratio_online for _, report in runs),
        )


def seed_reports(
    scenario: Scenario, seeds: Sequence[int], args: argparse.Namespace, own: ControllerReport | None = None
) -> Iterator[tuple[int, ControllerReport]]:
    """The online controller on each seed, as it runs (``own``, if given, is the scenario's own seed's)."""
    for seed in seeds:
        if own is not None and seed == scenario.workload.seed:
            yield seed, own
        else:
            yield seed, run_controller(with_seed(scenario, seed), args.threshold, args.iterations, None)


def _cmd_all(args: argparse.Namespace) -> int:
    out_dir: Path = args.out_dir
    out_dir.mkdir(parents=True, exist_ok=True)
    seeds = parse_seeds(args.seeds)
    reports = []
    summaries: list[SeedSummary] = []
    rooms: list[Headroom] = []
    for name in builtin_scenario_names():
        scenario = load_scenario(name)
        run = ScenarioRun(scenario, args.iterations)
        report = run_controller(
            scenario, args.threshold, args.iterations, out_dir / f"{name}-timeline.png", run=run, peers=True
        )
        (out_dir / f"{name}.json").write_text(json.dumps(report.to_json(), indent=2) + "\n")
        print(report.table())
        summary = SeedSummary.of(list(seed_reports(scenario, seeds, args, own=report)))
        print(
            f"seeds {summary.label}: capture median {statistics.median(summary.captures):.3f}, "
            f"worst {min(summary.captures):.3f}; throughput worst {min(summary.throughputs):.3f}"
        )
        print(f"runtime {report.runtime_s:.1f} s\n")
        reports.append(report)
        summaries.append(summary)
        if scenario.workload.mode is ExecutionMode.SYNC:
            rooms.append(headroom(run, args.threshold))
    table = results_markdown(reports, summaries) + "\n" + HEADROOM_INTRO + headroom_markdown(rooms)
    print(table)
    if args.markdown is not None:
        label = seeds_label(seeds)
        _, kept = _split_at_section(args.markdown, MULTINODE_HEADING)  # the section `multinode` writes
        args.markdown.write_text(
            "# eerl-bench results\n\n"
            f"Written by `eerl-bench all --threshold {args.threshold} --seeds {args.seeds}` (virtual time, "
            "simulated GPUs).\n"
            "Savings are of GPU energy per valid training token against the default governor over the\n"
            "whole run (idle waits included); the oracle is the best fixed clock pair of the exhaustive\n"
            "sweep that meets the threshold; capture = online savings / oracle savings; runtime is the\n"
            "wall time of the whole comparison.\n"
            f"The headline columns are the online controller over workload seeds {label} "
            "(other response\nlengths, valid fractions and noise draws; the oracle re-swept for each): "
            "median and worst capture\nand the worst throughput (each seed: `eerl-bench seeds`, "
            "`docs/results-seeds.md`); the other columns\nare the scenario file's own seed. "
            "Beside them, what a user would set by hand instead, each\n"
            "the best of its kind at the threshold with hindsight (`sim/eerl_sim/bench/peers.py`): "
            "one fixed clock\n"
            "for the whole job (`nvidia-smi -lgc`, held through the work between the phases too) and one\n"
            "power limit (`nvidia-smi -pl`, as Zeus's power-limit optimizer picks, in 25 W steps).\n"
            "Per-scenario JSON and timelines: `docs/results/`.\n"
            "The controller: `docs/algorithm.md`.\n\n" + table + kept
        )
    return 0


def results_markdown(reports: Sequence[ControllerReport], summaries: Sequence[SeedSummary]) -> str:
    """The results table of docs/results.md: the seeds' figures first, then the scenario's own seed's."""
    label = summaries[0].label if summaries else "—"
    lines = [
        f"| scenario | capture median / worst, seeds {label} | throughput worst, seeds {label} "
        "| iterations | one fixed clock | one power limit | oracle savings | online savings "
        "| capture, own seed | online throughput, own seed | oracle clocks (gen, train) | runtime |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r, summary in zip(reports, summaries, strict=True):
        clocks = ", ".join(str(r.oracle_sm_clocks_mhz.get(k) or "default") for k in KINDS)
        peers = " | ".join(f"{r.savings(p.totals):.1%} ({p.setting})" for p in r.peers) or "— | —"
        lines.append(
            f"| {r.scenario} | {statistics.median(summary.captures):.3f} / {min(summary.captures):.3f} "
            f"| {min(summary.throughputs):.3f} "
            f"| {r.iterations} | {peers} | {r.savings_oracle:.1%} | {r.savings_online:.1%} "
            f"| {r.capture:.3f} "
            f"| {r.throughput_ratio_online:.3f} | {clocks} | {r.runtime_s:.0f} s |"
        )
    return "\n".join(lines) + "\n"


HEADROOM_INTRO = (
    "## Re-tune headroom\n\n"
    "What any controller that changes clocks mid-run could gain over the oracle (`eerl-bench headroom`):\n"
    "the best pair of each regime with every regime at the threshold (regimes: the scenario's drift steps,\n"
    "else three equal slices), and the foresight bound: no choice of clocks per iteration and phase that\n"
    "meets the whole-run threshold saves more, whatever a controller knows (Lagrangian dual over the price\n"
    "table). In brackets: the difference to the oracle in points of savings.\n\n"
)


def headroom_markdown(rooms: Sequence[Headroom]) -> str:
    """The re-tune headroom table of docs/results.md."""
    lines = [
        "| scenario | oracle savings | best pairs per regime (gen/train MHz) | per regime at threshold "
        "| foresight bound |",
        "|---|---|---|---|---|",
    ]
    for h in rooms:
        pairs = "; ".join(
            f"[{r.first_iteration}, {r.end_iteration}): {r.generation_sm_clock_mhz}/{r.training_sm_clock_mhz}"
            for r in h.regimes
        )
        lines.append(
            f"| {h.scenario} | {h.oracle_savings:.2%} | {pairs} "
            f"| {h.per_regime_savings:.2%} ({h.per_regime_savings - h.oracle_savings:+.2%}) "
            f"| {h.bound_savings:.2%} ({h.bound_savings - h.oracle_savings:+.2%}) |"
        )
    return "\n".join(lines) + "\n"


def _cmd_multinode(args: argparse.Namespace) -> int:
    """Policies of a multi-node job side by side on the same draws, over seeds."""
    names = builtin_scenario_names(multinode=True) if args.scenario == "all" else (args.scenario,)
    seeds = parse_seeds(args.seeds)
    reports: list[MultinodeReport] = []
    print(MULTINODE_HEADER, flush=True)
    for name in names:
        base = with_nodes(load_scenario(name), args.nodes)
        for seed in seeds:
            scenario = dataclasses.replace(base, workload=dataclasses.replace(base.workload, seed=seed))
            iterations = args.iterations or scenario.workload.iterations
            with _progress(iterations, f"{scenario.name} seed {seed}: pricing every clock") as bar:
                report = run_multinode(scenario, args.threshold, args.iterations, _updater(bar))
            reports.append(report)
            print(multinode_row(report), flush=True)
    print()
    print(multinode_summary(reports, args.threshold))
    if args.json is not None:
        runs = [report.to_json() for report in reports]
        args.json.write_text(json.dumps({"runs": runs}, indent=2) + "\n")
    if args.markdown is not None:
        _write_section(args.markdown, MULTINODE_HEADING, multinode_markdown(args, reports))
    if args.plot is not None:
        multinode_plot(
            reports,
            threshold=args.threshold,
            title=f"eerl-bench multinode --scenario {args.scenario} --seeds {args.seeds}",
            path=args.plot,
        )
    return 0


MULTINODE_HEADING = "## Multi-node jobs"


def _split_at_section(path: Path, heading: str) -> tuple[str, str]:
    """A markdown file cut where the section ``heading`` starts (it runs to the end of the file): what comes
    before it and the section itself (empty when absent; both empty when there is no file)."""
    text = path.read_text() if path.is_file() else ""
    index = text.find("\n" + heading + "\n")
    return (text, "") if index < 0 else (text[:index], text[index:])


def _write_section(path: Path, heading: str, section: str) -> None:
    """Replace (or append) the section that starts at ``heading`` and runs to the end of the file."""
    head = _split_at_section(path, heading)[0]
    path.write_text(head.rstrip("\n") + "\n\n" + section)


def multinode_markdown(args: argparse.Namespace, reports: Sequence[MultinodeReport]) -> str:
    """The multi-node section of docs/results.md."""
    command = f"eerl-bench multinode --scenario {args.scenario} --seeds {args.seeds}"
    if args.nodes is not None:
        command += f" --nodes {args.nodes}"
    if args.threshold != 0.95:
        command += f" --threshold {args.threshold}"
    return (
        f"{MULTINODE_HEADING}\n\n"
        f"Written by `{command} --json docs/results/multinode.json --plot docs/results/multinode.png "
        "--markdown docs/results.md`\n(the `[workload.nodes]` model: docs/simulator.md; the policies and the "
        "job-level controller:\ndocs/multinode.md). Every policy runs on the same draws; savings and "
        "throughput are against the default\ngovernor on every node; the oracle is the best uniform fixed "
        "pair of the job's sweep at the threshold;\ncapture = job savings / oracle savings. `independent` is "
        "one controller per node fed its own node, as\nthe daemons alone would run it.\n\n"
        + MULTINODE_HEADER
        + "\n"
        + "\n".join(multinode_row(r) for r in reports)
        + "\n\n"
        + "\n".join(f"- {line}" for line in multinode_summary(reports, args.threshold).splitlines())
        + "\n\n![savings against throughput, every run and policy](results/multinode.png)\n"
    )


MULTINODE_HEADER = (
    "| scenario | nodes | seed | oracle savings | job savings | job throughput | capture "
    "| independent savings | independent throughput | runtime |\n|---|---|---|---|---|---|---|---|---|---|"
)


def multinode_row(report: MultinodeReport) -> str:
    """One run's row of the multinode table."""
    policies = report.policies
    oracle, job, independent = policies["oracle"], policies["job"], policies["independent"]
    return (
        f"| {report.scenario} | {report.nodes} | {report.seed} | {oracle.savings:.1%} | {job.savings:.1%} "
        f"| {job.throughput_ratio:.3f} | {report.capture:.3f} | {independent.savings:.1%} "
        f"| {independent.throughput_ratio:.3f} | {report.runtime_s:.0f} s |"
    )


def multinode_summary(reports: Sequence[MultinodeReport], threshold: float) -> str:
    """Worst throughput and median capture of each online policy over every run."""
    lines = []
    for policy in ("job", "independent"):
        captures = [r.capture_of(policy) for r in reports]
        throughputs = [r.policies[policy].throughput_ratio for r in reports]
        under = sum(t < threshold - 0.01 for t in throughputs)
        lines.append(
            f"{policy}: median capture {statistics.median(captures):.3f} (worst {min(captures):.3f}), "
            f"throughput worst {min(throughputs):.3f} / median {statistics.median(throughputs):.3f}, "
            f"{under} of {len(reports)} runs under {threshold - 0.01:.2f}"
        )
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    """The command line."""
    parser = argparse.ArgumentParser(prog="eerl-bench", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"eerl-bench {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    commands = parser.add_subparsers(dest="command", required=True)

    def common(sub: argparse.ArgumentParser, scenario: bool = True) -> None:
        if scenario:
            sub.add_argument("--scenario", required=True, help="built-in scenario name or TOML file")
        sub.add_argument("--threshold", type=float, default=0.95, help="throughput threshold (default 0.95)")
        sub.add_argument("--iterations", type=int, default=None, help="run only the first N iterations")

    controller = commands.add_parser("controller", help="default vs oracle vs online EE-RL")
    common(controller)
    controller.add_argument("--json", type=Path, default=None, help="write the figures as JSON here")
    controller.add_argument("--seed", type=int, default=None, help="override the scenario's workload seed")
    controller.add_argument("--timeline", type=Path, default=None, help="write the timeline plot (PNG) here")
    controller.set_defaults(handler=_cmd_controller)
    seeds = commands.add_parser("seeds", help="capture and throughput over several workload seeds")
    common(seeds, scenario=False)
    seeds.add_argument("--scenario", default="all", help="built-in scenario name, TOML file, or all")
    seeds.add_argument("--seeds", default="1-5", help="seeds: 1-5 or 1,3,7 (default 1-5)")
    seeds.add_argument("--json", type=Path, default=None, help="write every run's figures as JSON here")
    seeds.add_argument("--markdown", type=Path, default=None, help="write the table here")
    seeds.set_defaults(handler=_cmd_seeds)
    sweep = commands.add_parser("sweep", help="the fixed-clock sweep and its Pareto front")
    common(sweep)
    sweep.add_argument("--plot", type=Path, default=None, help="write the Pareto plot (PNG) here")
    sweep.set_defaults(handler=_cmd_sweep)
    room = commands.add_parser("headroom", help="what re-tuning could gain over the best fixed pair")
    common(room)
    room.add_argument(
        "--regimes", default=None, help="regime boundaries, e.g. 150 or 100,200 (default: the drift steps)"
    )
    room.set_defaults(handler=_cmd_headroom)
    every = commands.add_parser("all", help="every built-in scenario; writes JSON, timelines and a table")
    common(every, scenario=False)
    every.add_argument("--out-dir", type=Path, default=Path("docs/results"))
    every.add_argument(
        "--seeds", default="1-5", help="the headline's workload seeds: 1-5 or 1,3,7 (default 1-5)"
    )
    every.add_argument("--markdown", type=Path, default=None, help="write the results table here")
    every.set_defaults(handler=_cmd_all)
    multinode = commands.add_parser("multinode", help="policies of a multi-node job side by side")
    common(multinode, scenario=False)
    multinode.add_argument("--scenario", default="all", help="multi-node scenario name, TOML file, or all")
    multinode.add_argument("--nodes", type=int, default=None, help="override the scenario's node count")
    multinode.add_argument("--seeds", default="1", help="seeds: 1-5 or 1,3,7 (default 1)")
    multinode.add_argument("--json", type=Path, default=None, help="write every run's figures as JSON here")
    multinode.add_argument("--plot", type=Path, default=None, help="write savings vs throughput (PNG) here")
    multinode.add_argument(
        "--markdown", type=Path, default=None, help="write the table as this file's multi-node section"
    )
    multinode.set_defaults(handler=_cmd_multinode)
    add_calibration_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``eerl-bench``; returns the exit code."""
    if _missing_extra is not None:
        print(MISSING_EXTRA_ERROR, file=sys.stderr)
        return 2
    parser = build_parser()
    args = parser.parse_args(argv)
    if not 0.0 < args.threshold <= 1.0:
        print("Error: --threshold must be in (0, 1]", file=sys.stderr)
        return 2
    if args.iterations is not None and args.iterations < 1:
        print("Error: --iterations must be positive", file=sys.stderr)
        return 2
    try:
        return int(args.handler(args))
    except (DaemonError, OSError) as error:
        if args.debug:
            raise
        print(f"Error: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
