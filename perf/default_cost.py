"""What a run's phases on the default governor cost, as a share of the offline oracle's savings.

``python -m perf.default_cost --set builtin --seeds 1-5 --threshold 0.95``

The controller runs phases at the default governor on purpose: the baseline that fits its predictor of the
default's time, control phases that re-check that predictor while committed, and fresh baselines in a
re-tune. Each gives up what the oracle's clock pair would have saved on that very phase. This prices each
such phase on the run's own table (the default is the grid's top column), groups them by the controller's
state, and reports the mean per run: how many, and how much capture they cost (the sum over a group of the
phase's default energy minus its energy at the oracle's clock, over the oracle's savings for the run).
Single-node scenarios only. docs/results-promise.md ("2026-12-07, sixth") quotes its figures.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from eerl.control.eerl import create_eerl_controller
from eerl.phases import ControllerState, PhaseKind
from eerl_sim.bench.cli import parse_seeds
from eerl_sim.bench.runner import ScenarioRun

from perf.promise import chosen_files, scenario_parser, single_node_runs

FloatArray = npt.NDArray[np.float64]
KINDS = (PhaseKind.GENERATION, PhaseKind.TRAINING)
Group = tuple[PhaseKind, ControllerState]


def default_phase_cost(
    clocks: Sequence[int | None],
    states: Sequence[ControllerState],
    energy_default_j: FloatArray,
    energy_oracle_j: FloatArray,
    oracle_savings_j: float,
) -> tuple[Counter[ControllerState], dict[ControllerState, float]]:
    """One kind's default-governor phases (clock None) by state: their count, and the capture they cost."""
    count: Counter[ControllerState] = Counter()
    cost: dict[ControllerState, float] = {}
    for i, clock in enumerate(clocks):
        if clock is not None:
            continue
        state = states[i]
        count[state] += 1
        given_up = float(energy_default_j[i] - energy_oracle_j[i]) / oracle_savings_j
        cost[state] = cost.get(state, 0.0) + given_up
    return count, cost


def run_cost(run: ScenarioRun, threshold: float) -> tuple[Counter[Group], dict[Group, float]]:
    """Every kind's default-phase count and capture cost on one online run at ``threshold``."""
    table = run.price_table()
    top = len(table.sm_clocks_mhz) - 1
    pair, oracle = run.oracle(threshold)
    savings = run.default_totals().energy_j - oracle.energy_j
    timeline = run.run_online(create_eerl_controller, threshold).timeline
    count: Counter[Group] = Counter()
    cost: dict[Group, float] = {}
    for kind, column in zip(KINDS, pair, strict=True):
        energy = table.energy_j[kind]
        kind_count, kind_cost = default_phase_cost(
            timeline.sm_clock_mhz[kind], timeline.state[kind], energy[:, top], energy[:, column], savings
        )
        count.update({(kind, state): n for state, n in kind_count.items()})
        cost.update({(kind, state): c for state, c in kind_cost.items()})
    return count, cost


def main(argv: Sequence[str] | None = None) -> None:
    parser = scenario_parser(__doc__.splitlines()[0], seeds="1-5")
    parser.add_argument("--cache", type=Path, default=None, help="perf.promise's price cache")
    args = parser.parse_args(argv)
    files = chosen_files(args)
    count: Counter[Group] = Counter()
    cost: dict[Group, float] = {}
    runs = 0
    for _, _, run in single_node_runs(files, parse_seeds(args.seeds), args.cache):
        run_count, run_cost_ = run_cost(run, args.threshold)
        count.update(run_count)
        for group, c in run_cost_.items():
            cost[group] = cost.get(group, 0.0) + c
        runs += 1
    if runs == 0:
        raise SystemExit("no single-node scenario among those given")
    print(f"{runs} runs at {args.threshold}; per run, mean:")
    print("| kind | state | default phases | capture given up |")
    print("|---|---|---|---|")
    for kind, state in sorted(count, key=lambda g: (g[0].value, g[1].value)):
        group = (kind, state)
        print(f"| {kind.value} | {state.value} | {count[group] / runs:.2f} | {cost[group] / runs:.4f} |")
    print(f"| all | | {sum(count.values()) / runs:.2f} | {sum(cost.values()) / runs:.4f} |")


if __name__ == "__main__":
    main()
