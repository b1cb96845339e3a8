"""What giving early nodes a lower clock ("slack") could save over the uniform oracle, at best.

``python -m perf.slack_bound --scenario multinode-4-h100,multinode-16-h100 --seeds 1-5``

Two bounds per run, both at the oracle's clock pair (the best uniform fixed pair at the threshold):

- **perfect**: in every phase each node runs the lowest grid clock at or below the oracle's that does not make
  it finish later than the job's phase at the oracle clock, knowing that phase's own draws (its speed factor,
  its straggler, its noise). Same wall time as the oracle; no policy can save more by slack alone.
- **speed-only**: each node's clock chosen from its fixed speed factor alone (what a policy could learn),
  leaving ``--margin`` of the time to spare, and checked against the real phases: this is what is reachable.

docs/multinode.md ("Beyond a uniform clock") quotes both.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

import numpy as np
from eerl.phases import PhaseKind
from eerl_sim.bench import multinode
from eerl_sim.bench.cli import parse_seeds
from eerl_sim.bench.runner import RunTotals
from eerl_sim.nodes import price_nodes
from eerl_sim.scenario import load_scenario


@dataclasses.dataclass(frozen=True, slots=True)
class Bound:
    scenario: str
    seed: int
    oracle_savings: float
    bound_savings: float
    bound_throughput: float


def _runs(names: Sequence[str], seeds: Sequence[int]) -> list[tuple[str, int, multinode.MultinodeRun]]:
    runs = []
    for name in names:
        for seed in seeds:
            scenario = load_scenario(name)
            workload = dataclasses.replace(scenario.workload, seed=seed)
            run = multinode.MultinodeRun(dataclasses.replace(scenario, workload=workload))
            run.price()
            runs.append((name, seed, run))
    return runs


def perfect_bound(run: multinode.MultinodeRun, threshold: float) -> tuple[float, float, float]:
    """(oracle savings, bound savings, bound throughput) with perfect knowledge of every phase's draws."""
    default = run.default_totals()
    pair, oracle = run.oracle(threshold)
    nodes = run.spec.count
    energy_j = wall_s = 0.0
    for i in range(run.iterations):
        for kind, column in ((PhaseKind.GENERATION, pair[0]), (PhaseKind.TRAINING, pair[1])):
            table = run.table(i, kind)
            job_s = price_nodes(table, np.full(nodes, column), run.idle_w).duration_s
            factors = table.factors
            busy = table.busy_s[None, :, : column + 1] * factors.duration[:, :, None]  # node, gpu, clock
            busy_energy = (
                table.energy_j[None, :, : column + 1] * (factors.duration * factors.power)[:, :, None]
            )
            node_energy = (busy_energy + run.idle_w * (job_s - busy)).sum(axis=1)  # over the job's phase
            in_time = busy.max(axis=1) <= job_s * (1 + 1e-12)
            energy_j += float(np.where(in_time, node_energy, np.inf).min(axis=1).sum())
            wall_s += job_s
    bound = RunTotals(energy_j, wall_s, int(run.valid_tokens.sum()))
    oracle_figures, bound_figures = multinode.figures(oracle, default), multinode.figures(bound, default)
    return oracle_figures.savings, bound_figures.savings, bound_figures.throughput_ratio


def speed_only_bound(
    run: multinode.MultinodeRun, threshold: float, margin: float
) -> tuple[float, float, float]:
    """(oracle savings, savings, throughput) with each node's clock chosen from its speed factor alone."""
    default = run.default_totals()
    pair, oracle = run.oracle(threshold)
    speed = run.draws.speed
    allowed = speed.max() / speed * (1 - margin)  # how much longer each node may take than the slowest
    energy_j = wall_s = 0.0
    for i in range(run.iterations):
        for kind, column in ((PhaseKind.GENERATION, pair[0]), (PhaseKind.TRAINING, pair[1])):
            table = run.table(i, kind)
            reference_s = table.busy_s.max(axis=0)
            slowdown = reference_s[: column + 1] / reference_s[column]
            columns = np.array(
                [
                    int(np.nonzero(slowdown <= a)[0].min()) if (slowdown <= a).any() else column
                    for a in allowed
                ]
            )
            priced = price_nodes(table, np.minimum(columns, column), run.idle_w)
            energy_j += priced.total_energy_j
            wall_s += priced.duration_s
    totals = RunTotals(energy_j, wall_s, int(run.valid_tokens.sum()))
    oracle_figures, figures = multinode.figures(oracle, default), multinode.figures(totals, default)
    return oracle_figures.savings, figures.savings, figures.throughput_ratio


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf.slack_bound", description=__doc__.split("\n\n")[0])
    parser.add_argument("--scenario", default="multinode-4-h100", help="comma-separated multi-node scenarios")
    parser.add_argument("--seeds", default="1-5")
    parser.add_argument("--threshold", type=float, default=0.95)
    parser.add_argument("--margin", type=float, default=0.005, help="speed-only: time left to spare")
    args = parser.parse_args(argv)
    print("scenario seed | oracle | perfect bound (gain, throughput) | speed-only (gain, throughput)")
    for name, seed, run in _runs(args.scenario.split(","), parse_seeds(args.seeds)):
        oracle, perfect, perfect_tput = perfect_bound(run, args.threshold)
        _, speed, speed_tput = speed_only_bound(run, args.threshold, args.margin)
        print(
            f"{name} {seed} | {oracle:.2%} | {perfect:.2%} (+{100 * (perfect - oracle):.2f} pt, "
            f"{perfect_tput:.3f}) | {speed:.2%} (+{100 * (speed - oracle):.2f} pt, {speed_tput:.3f})",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
