"""What trading throughput across a job's regimes could save, at best, over planning each at the threshold.

``python -m perf.regime_trade --set switch --set cadence --seeds 1-3 --threshold 0.95``

The fixed-pair oracle holds one clock pair for the whole run, so on a job whose regimes switch it runs some
below the threshold and others above it. Three allocations are priced on each run's own table (sync
single-node scenarios with drift steps; regimes cut at the steps), as fractions of the default's energy:

- **fixed**: the best single clock pair whose run meets the threshold (the bench's oracle, phases only);
- **per regime**: each regime's best pair meeting the threshold on its own (what a controller that plans
  every regime at the threshold reaches at best);
- **one price**: each regime's pair minimising energy + λ·time, one λ for the run, set (by bisection) so
  the run meets the threshold (the best a run-level price of time could do).

docs/results-promise.md ("Kept (2026-12-07, fifth)") quotes the ratios to the fixed pair.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
from eerl.phases import ExecutionMode, PhaseKind
from eerl_sim.bench.cli import parse_seeds, with_seed
from eerl_sim.bench.runner import ScenarioRun
from eerl_sim.scenario import load_scenario

from perf.promise import chosen_files, scenario_parser

FloatArray = npt.NDArray[np.float64]
KINDS = (PhaseKind.GENERATION, PhaseKind.TRAINING)


@dataclasses.dataclass(frozen=True, slots=True)
class Trade:
    scenario: str
    seed: int
    regimes: int
    fixed: float
    per_regime: float
    one_price: float


def regime_tables(run: ScenarioRun, cuts: Sequence[int]) -> tuple[FloatArray, FloatArray]:
    """Per regime, its summed time and energy for every (generation, training) clock pair."""
    table = run.price_table()
    bounds = [0, *cuts, run.iterations]
    times, energies = [], []
    for start, end in itertools.pairwise(bounds):
        if start >= end:
            continue
        g_t, t_t = (table.duration_s[k][start:end].sum(axis=0) for k in KINDS)
        g_e, t_e = (table.energy_j[k][start:end].sum(axis=0) for k in KINDS)
        times.append(g_t[:, None] + t_t[None, :])
        energies.append(g_e[:, None] + t_e[None, :])
    return np.array(times), np.array(energies)


def trade(times: FloatArray, energies: FloatArray, threshold: float) -> tuple[float, float, float]:
    """Savings (fractions of the default's energy) of the fixed pair, per regime, and one price of time."""
    top = times.shape[1] - 1
    default_time = float(times[:, top, top].sum())
    default_energy = float(energies[:, top, top].sum())
    budget = default_time / threshold
    total_time, total_energy = times.sum(axis=0), energies.sum(axis=0)
    fixed = float(total_energy[total_time <= budget].min())
    per_regime = sum(
        float(e[t <= t[top, top] / threshold].min()) for t, e in zip(times, energies, strict=True)
    )

    def at_price(price: float) -> tuple[float, float]:
        time = energy = 0.0
        for t, e in zip(times, energies, strict=True):
            best = np.unravel_index(int(np.argmin(e + price * t)), e.shape)
            time += float(t[best])
            energy += float(e[best])
        return time, energy

    low, high = 0.0, 1e3 * default_energy / default_time
    for _ in range(80):
        middle = (low + high) / 2.0
        if at_price(middle)[0] <= budget:
            high = middle
        else:
            low = middle
    _, one_price = at_price(high)
    return tuple(1.0 - x / default_energy for x in (fixed, per_regime, one_price))  # type: ignore[return-value]


def main(argv: Sequence[str] | None = None) -> None:
    parser = scenario_parser(__doc__.splitlines()[0], seeds="1-3")
    args = parser.parse_args(argv)
    files = chosen_files(args)
    print("| scenario | seed | regimes | fixed pair | per regime (÷ fixed) | one price (÷ fixed) |")
    print("|---|---|---|---|---|---|")
    for path in files:
        base = load_scenario(str(path))
        steps = [step.at_iteration for step in base.workload.drift.steps]
        if not steps or base.workload.nodes is not None or base.workload.mode is not ExecutionMode.SYNC:
            continue
        for seed in parse_seeds(args.seeds):
            run = ScenarioRun(with_seed(base, seed))
            fixed, per_regime, one_price = trade(*regime_tables(run, steps), args.threshold)
            print(
                f"| {path.stem} | {seed} | {len(steps) + 1} | {fixed:.1%} | {per_regime:.1%} "
                f"({per_regime / fixed:.3f}) | {one_price:.1%} ({one_price / fixed:.3f}) |"
            )


if __name__ == "__main__":
    main()
