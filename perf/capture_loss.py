"""Where a run's capture goes: its default-governor phases, its trials, its commits, its unspent throughput.

``python -m perf.capture_loss --set builtin --seeds 1-5 --threshold 0.95 [--no-phase-noise]``

A run's shortfall, ``1 - capture``, is its energy above the fixed-pair oracle's over the oracle's savings.
Phase by phase that is the energy at the run's clock minus the energy at the oracle's clock (both read off
the run's own price table), but a phase that ran slower than the oracle's clock saved energy by spending
time, which the run repays elsewhere. So each phase is charged its energy difference plus the time it took
beyond the oracle's clock at the oracle's own price of time λ (the slope of the best energy against wall
time at the threshold: what another 0.3 % or 0.6 % of throughput saves the oracle), and what is left is the
throughput the run did not spend: λ × (the oracle's wall time − the run's) over the oracle's savings. The
groups and that rest add up to ``1 - capture`` but for what the table cannot show — a lock takes effect a
few milliseconds late ("lock switches", well under 0.01). Sync single-node scenarios only: there a run's
time is its phases' and the work between them, which both runs do at the default governor.

``--no-phase-noise`` prices the scenarios with the per-phase duration and power noise off (segment noise
stays): the run's phases are then as predictable as their workload makes them, which shows what the
noise costs. docs/results-promise.md ("2026-12-07, eighth") quotes its figures.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
from eerl.control.eerl import create_eerl_controller
from eerl.phases import ControllerState, ExecutionMode, PhaseKind
from eerl_sim.bench.cli import parse_seeds
from eerl_sim.bench.runner import ScenarioRun, best_pair

from perf.promise import chosen_files, scenario_parser, single_node_runs

FloatArray = npt.NDArray[np.float64]
KINDS = (PhaseKind.GENERATION, PhaseKind.TRAINING)
DEFAULT = "default"
"""The group of a phase run at the default governor, whatever the controller's state."""
STEPS = (0.003, 0.006)
"""Throughput given up below the threshold to read the oracle's price of time off its frontier."""


def time_price(energy_j: FloatArray, wall_s: FloatArray, default_wall_s: float, threshold: float) -> float:
    """The oracle's price of time (J/s): the energy its best pair saves per second of wall time it may add,
    read off the sweep (``[generation, training]`` tables of run energy and wall time) between the
    threshold and a little below it; 0 where the energy minimum already meets the threshold."""
    oracle = best_pair(energy_j, wall_s, default_wall_s, threshold)
    prices = []
    for step in STEPS:
        looser = best_pair(energy_j, wall_s, default_wall_s, threshold - step)
        added_s = float(wall_s[looser] - wall_s[oracle])
        if added_s > 1e-9:
            prices.append(float(energy_j[oracle] - energy_j[looser]) / added_s)
    return float(np.mean(prices)) if prices else 0.0


def phase_charges(
    clocks: Sequence[int | None],
    states: Sequence[ControllerState],
    *,
    column_of: Mapping[int | None, int],
    duration_s: FloatArray,
    energy_j: FloatArray,
    oracle_column: int,
    price: float,
) -> dict[str, float]:
    """One kind's phases charged ``ΔE + λ·Δt`` against the oracle's clock (J), summed by group: the
    controller's state of a locked phase, :data:`DEFAULT` for one on the default governor. ``duration_s``
    and ``energy_j`` are the price table's (iterations × clocks); ``column_of`` maps a clock (None: the
    default governor) to its column."""
    charges: dict[str, float] = {}
    for i, (clock, state) in enumerate(zip(clocks, states, strict=True)):
        column = column_of[clock]
        charge = float(energy_j[i, column] - energy_j[i, oracle_column]) + price * float(
            duration_s[i, column] - duration_s[i, oracle_column]
        )
        group = DEFAULT if clock is None else state.value
        charges[group] = charges.get(group, 0.0) + charge
    return charges


def run_loss(run: ScenarioRun, threshold: float) -> dict[str, float]:
    """One sync run's ``1 - capture`` by group (``"<kind> <group>"``), plus ``"unspent"`` and ``"lock
    switches"``: fractions of the oracle's savings that add up to the shortfall."""
    table = run.price_table()
    energy, wall = run.sweep()
    default = run.default_totals()
    pair, oracle = run.oracle(threshold)
    savings = default.energy_j - oracle.energy_j
    price = time_price(energy, wall, default.wall_s, threshold)
    online = run.run_online(create_eerl_controller, threshold)
    column_of: dict[int | None, int] = {c: i for i, c in enumerate(table.sm_clocks_mhz)}
    column_of[None] = len(table.sm_clocks_mhz) - 1  # the default governor is the top column
    loss: dict[str, float] = {}
    for kind, oracle_column in zip(KINDS, pair, strict=True):
        charges = phase_charges(
            online.timeline.sm_clock_mhz[kind],
            online.timeline.state[kind],
            column_of=column_of,
            duration_s=table.duration_s[kind],
            energy_j=table.energy_j[kind],
            oracle_column=oracle_column,
            price=price,
        )
        for group, joules in charges.items():
            loss[f"{kind.value} {group}"] = joules / savings
    loss["unspent"] = price * (oracle.wall_s - online.totals.wall_s) / savings
    # The table prices each phase as if its clock held from its first instant; a lock takes effect a
    # little late (and the counter is read in steps): the rest, small, is that.
    shortfall = (online.totals.energy_j - oracle.energy_j) / savings
    loss["lock switches"] = shortfall - sum(loss.values())
    return loss


def main(argv: Sequence[str] | None = None) -> None:
    parser = scenario_parser(__doc__.splitlines()[0], seeds="1-5")
    parser.add_argument("--cache", type=Path, default=None, help="perf.promise's price cache")
    parser.add_argument("--no-phase-noise", action="store_true", help="price with the phase noise off")
    parser.add_argument("--runs", action="store_true", help="print every run's figures too")
    args = parser.parse_args(argv)
    losses: list[dict[str, float]] = []
    priced = single_node_runs(
        chosen_files(args), parse_seeds(args.seeds), args.cache, phase_noise=not args.no_phase_noise
    )
    for path, seed, run in priced:
        if run.scenario.workload.mode is ExecutionMode.SYNC:
            losses.append(run_loss(run, args.threshold))
            if args.runs:
                parts = " ".join(f"{group}: {value:+.3f}" for group, value in sorted(losses[-1].items()))
                print(f"{path.stem} seed {seed}: 1 - capture {sum(losses[-1].values()):.3f} = {parts}")
    if not losses:
        raise SystemExit("no sync single-node scenario among those given")
    means = {
        group: sum(loss.get(group, 0.0) for loss in losses) / len(losses) for group in set().union(*losses)
    }
    print(f"{len(losses)} sync single-node runs at {args.threshold}; mean share of the oracle's savings:")
    print("| where | 1 - capture |\n|---|---|")
    print("\n".join(f"| {group} | {mean:+.4f} |" for group, mean in sorted(means.items())))
    print(f"| **all** | {sum(means.values()):.4f} |")


if __name__ == "__main__":
    main()
