"""The promise over many runs: capture and throughput per scenario, seed and threshold (issue #33).

Each scenario and seed is priced once (and cached on disk, keyed by the scenario file's text, the seed and the
simulator's source: a change to how the simulator prices or reports a phase is priced afresh), then the online
controller runs on that price table at every threshold — the same code path as ``eerl-bench seeds`` /
``eerl-bench multinode`` (the ``job`` policy), so the figures are theirs. Prints a markdown table per set:
capture median / worst and the worst run's throughput per threshold, ✗ where a run ended below threshold −
0.003, "(med thr …)" where the median run ended below the threshold.

    python -m perf.promise --set builtin --set tuning --set heldout --seeds 1-5 --json out.json

Single-node scenarios only by default; ``--multinode`` adds the multi-node files of each set.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import json
import pickle
import statistics
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from eerl.control.base import Controller, ControllerSettings
from eerl.control.eerl import JOB_CONFIG, EerlConfig, EerlController, create_eerl_controller
from eerl_sim.bench.cli import parse_seeds, with_seed
from eerl_sim.bench.multinode import MultinodeRun, figures
from eerl_sim.bench.runner import ScenarioRun
from eerl_sim.scenario import Scenario, load_scenario

SIMULATOR = Path(__file__).resolve().parents[1] / "sim" / "eerl_sim"
SCENARIOS = SIMULATOR / "scenarios"
SETS = {
    "builtin": SCENARIOS,
    "tuning": SCENARIOS / "promise" / "tuning",
    "heldout": SCENARIOS / "promise" / "heldout",
    "after": SCENARIOS / "promise" / "after",
    "ledger": SCENARIOS / "promise" / "ledger",
    "nodes": SCENARIOS / "promise" / "nodes",
    "noise": SCENARIOS / "promise" / "noise",
    "switch": SCENARIOS / "promise" / "switch",
    "jobs": SCENARIOS / "promise" / "jobs",
    "cadence": SCENARIOS / "promise" / "cadence",
    "cost": SCENARIOS / "promise" / "cost",
}
TOLERANCE = 0.003
"""A run may end this far below its threshold (noise no controller can see coming)."""


@dataclass(frozen=True, slots=True)
class Cell:
    """One run: scenario, seed, threshold, capture and throughput."""

    scenario: str
    seed: int
    threshold: float
    capture: float
    throughput: float


@functools.cache
def _simulator_digest() -> bytes:
    """The simulator's Python source, hashed: a price table is only as current as the code that priced it."""
    digest = hashlib.sha256()
    for source in sorted(SIMULATOR.rglob("*.py")):
        digest.update(source.relative_to(SIMULATOR).as_posix().encode() + b"\0" + source.read_bytes())
    return digest.digest()


def _cache_key(path: Path, seed: int) -> str:
    return hashlib.sha256(_simulator_digest() + path.read_bytes() + f"/{seed}".encode()).hexdigest()[:20]


def without_phase_noise(scenario: Scenario) -> Scenario:
    """``scenario`` with each phase's own duration and power noise off, on its GPUs and its nodes (the
    segments keep theirs): what is left to predict is the workload's doing."""
    gpu = dataclasses.replace(scenario.gpu, noise_phase_duration=0.0, noise_phase_power=0.0)
    workload = scenario.workload
    if workload.nodes is not None:
        nodes = dataclasses.replace(workload.nodes, noise_phase_duration=0.0, noise_phase_power=0.0)
        workload = dataclasses.replace(workload, nodes=nodes)
    return dataclasses.replace(scenario, gpu=gpu, workload=workload)


def priced_run(
    path: Path, seed: int, cache: Path | None, *, phase_noise: bool = True
) -> ScenarioRun | MultinodeRun:
    """One scenario file at one seed, priced at every clock (from ``cache`` when it holds it);
    ``phase_noise`` False prices it :func:`without_phase_noise`."""
    scenario: Scenario = with_seed(load_scenario(str(path)), seed)
    key = _cache_key(path, seed)
    if not phase_noise:
        scenario, key = without_phase_noise(scenario), f"{key}-quiet"
    file = None if cache is None else cache / f"{path.stem}-{key}.pickle"
    if file is not None and file.exists():
        # Written by this tool only, in the user's own cache directory: nothing untrusted is unpickled.
        loaded: ScenarioRun | MultinodeRun = pickle.loads(file.read_bytes())  # noqa: S301
        return loaded
    run: ScenarioRun | MultinodeRun
    if scenario.workload.nodes is not None:
        run = MultinodeRun(scenario)
        run.price()
    else:
        run = ScenarioRun(scenario)
        run.price_table()
        for i in range(run.iterations):
            run.sample(i)
    if file is not None:
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(pickle.dumps(run))
    return run


def single_node_runs(
    files: Sequence[Path], seeds: Sequence[int], cache: Path | None, *, phase_noise: bool = True
) -> Iterator[tuple[Path, int, ScenarioRun]]:
    """Each single-node file at each seed, priced (the studies beside this bench walk these)."""
    for path in files:
        for seed in seeds:
            run = priced_run(path, seed, cache, phase_noise=phase_noise)
            if isinstance(run, ScenarioRun):
                yield path, seed, run


def _local_controller(settings: ControllerSettings) -> Controller:
    return EerlController(settings, EerlConfig(physics_curve=False))


def _local_job_controller(settings: ControllerSettings) -> Controller:
    return EerlController(settings, dataclasses.replace(JOB_CONFIG, physics_curve=False))


def run_cells(
    path: Path,
    seed: int,
    thresholds: Sequence[float],
    cache: Path | None,
    phase_noise: bool = True,
    *,
    local_curve: bool = False,
) -> list[Cell]:
    """Every threshold on one priced scenario and seed (``local_curve``: the controller with
    ``EerlConfig.physics_curve`` off, its clock curves the local fit alone)."""
    run = priced_run(path, seed, cache, phase_noise=phase_noise)
    cells = []
    for threshold in thresholds:
        default = run.default_totals()
        _, oracle = run.oracle(threshold)
        if isinstance(run, MultinodeRun):
            online = run.run_job(threshold, controller=_local_job_controller if local_curve else None)
        else:
            factory = _local_controller if local_curve else create_eerl_controller
            online = run.run_online(factory, threshold).totals
        saved, best = figures(online, default), figures(oracle, default)
        capture = saved.savings / best.savings if best.savings > 0 else float("nan")
        cells.append(Cell(path.stem, seed, threshold, capture, saved.throughput_ratio))
    return cells


def table(cells: Sequence[Cell], thresholds: Sequence[float]) -> str:
    """The markdown table of one set."""
    head = " | ".join(f"{t:.2f}: capture median / worst, throughput worst" for t in thresholds)
    lines = [f"| scenario | {head} |", "|---" * (len(thresholds) + 1) + "|"]
    names = sorted({c.scenario for c in cells})
    for name in [*names, "**all**"]:
        row = [name]
        for t in thresholds:
            runs = [c for c in cells if c.threshold == t and name in ("**all**", c.scenario)]
            captures = [c.capture for c in runs]
            throughputs = [c.throughput for c in runs]
            text = f"{statistics.median(captures):.3f} / {min(captures):.3f}"
            if name != "**all**":
                text += f", {min(throughputs):.3f}"
                if min(throughputs) < t - TOLERANCE:
                    text += " ✗"
                if statistics.median(throughputs) < t:
                    text += f" (med thr {statistics.median(throughputs):.3f})"
            else:
                misses = sum(1 for x in throughputs if x < t - TOLERANCE)
                text += f", {misses} of {len(runs)} runs ✗"
            row.append(text)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines) + "\n"


def scenario_parser(description: str, seeds: str) -> argparse.ArgumentParser:
    """The arguments the one-threshold studies beside this bench share: scenario sets and files, seeds."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--set", action="append", choices=sorted(SETS), dest="sets", default=[])
    parser.add_argument("--scenario", action="append", default=[], help="a file (repeatable)")
    parser.add_argument("--seeds", default=seeds)
    parser.add_argument("--threshold", type=float, default=0.95)
    return parser


def chosen_files(args: argparse.Namespace) -> list[Path]:
    """The files a :func:`scenario_parser` command line names: its ``--scenario`` files, then its sets'."""
    return [Path(f) for f in args.scenario] + [f for s in args.sets for f in sorted(SETS[s].glob("*.toml"))]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf.promise", description=__doc__.split("\n")[0])
    parser.add_argument("--set", action="append", choices=sorted(SETS), dest="sets")
    parser.add_argument("--scenario", action="append", type=Path, default=[], help="a file (repeatable)")
    parser.add_argument("--seeds", default="1-5")
    parser.add_argument("--thresholds", default="0.90,0.95,0.98")
    parser.add_argument("--multinode", action="store_true", help="include the multi-node files")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "eerl" / "promise")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--no-phase-noise",
        action="store_true",
        help="price the scenarios with their per-phase noise off (what it costs: see perf.capture_loss)",
    )
    parser.add_argument(
        "--local-curve",
        action="store_true",
        help="run the controller with EerlConfig.physics_curve off (the local fit alone; the default before)",
    )
    args = parser.parse_args(argv)
    seeds = parse_seeds(args.seeds)
    thresholds = [float(t) for t in args.thresholds.split(",")]
    groups: dict[str, list[Path]] = {}
    for name in args.sets or []:
        groups[name] = sorted(SETS[name].glob("*.toml"))
    if args.scenario:
        groups["files"] = list(args.scenario)
    for name, paths in groups.items():
        if not args.multinode:
            groups[name] = [p for p in paths if "[workload.nodes]" not in p.read_text()]
    jobs = [(p, s) for paths in groups.values() for p in paths for s in seeds]
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        futures = {
            job: pool.submit(
                run_cells,
                job[0],
                job[1],
                thresholds,
                args.cache,
                not args.no_phase_noise,
                local_curve=args.local_curve,
            )
            for job in jobs
        }
        results = {job: future.result() for job, future in futures.items()}
    everything: dict[str, list[dict[str, object]]] = {}
    for name, paths in groups.items():
        cells = [c for p in paths for s in seeds for c in results[(p, s)]]
        print(f"\n### {name}\n")
        print(table(cells, thresholds))
        everything[name] = [_as_dict(c) for c in cells]
    if args.json is not None:
        args.json.write_text(json.dumps(everything, indent=1) + "\n")
    sys.stdout.flush()
    return 0


def _as_dict(cell: Cell) -> dict[str, object]:
    return {f: getattr(cell, f) for f in cell.__slots__}


if __name__ == "__main__":
    raise SystemExit(main())
