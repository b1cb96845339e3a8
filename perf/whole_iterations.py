"""Whole iterations on ``verl-h100``: why a lock ends with its phase, and what counting the gap gains.

``python -m perf.whole_iterations [--scenario verl-h100] [--seeds 1-5]``

Two comparisons, on the same sampled iterations:

- **lock held vs released**: the offline oracle's clock pair with the work between the phases at the
  default governor (what eerld does: the lock ends with its phase) and at generation's lock (what a daemon
  that kept the lock until the next phase would give): whole-iteration throughput and savings.
- **gap counted vs ignored**: the online controller as the daemon feeds it (each phase's gap since the last
  one ended), and the same controller with every gap hidden (``gap_before_s = 0``): capture and throughput.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence

import numpy as np
from eerl.control.base import Decision, PhaseObservation
from eerl.control.eerl import create_eerl_controller
from eerl_sim.bench.cli import parse_seeds
from eerl_sim.bench.runner import ControllerFactory, ScenarioRun
from eerl_sim.bench.wrapped import WrappedController
from eerl_sim.evaluate import evaluate_between
from eerl_sim.scenario import Scenario, load_scenario

THRESHOLD = 0.95


class GapHidden(WrappedController):
    """The EE-RL controller, shown every phase with no gap before it (the budget sees phases only)."""

    def observe(self, observation: PhaseObservation, now_s: float) -> Decision | None:
        return self.inner.observe(dataclasses.replace(observation, gap_before_s=0.0), now_s)


def held_vs_released(run: ScenarioRun) -> tuple[float, float, float, float]:
    """(throughput released, throughput held, savings released, savings held) at the oracle's pair."""
    pair, oracle = run.oracle(THRESHOLD)
    default = run.default_totals()
    table = run.price_table()
    generation_mhz = table.sm_clocks_mhz[pair[0]]
    extra_s = extra_j = 0.0
    for i in range(run.iterations):
        held = evaluate_between(run.scenario, run.sample(i), held_sm_clock_mhz=generation_mhz)
        extra_s += held.duration_s - float(table.between_duration_s[i])
        extra_j += held.energy_j - float(table.between_energy_j[i])
    return (
        default.wall_s / oracle.wall_s,
        default.wall_s / (oracle.wall_s + extra_s),
        1.0 - oracle.energy_j / default.energy_j,
        1.0 - (oracle.energy_j + extra_j) / default.energy_j,
    )


def capture(run: ScenarioRun, factory: ControllerFactory) -> tuple[float, float]:
    """(capture, throughput) of one online run."""
    default = run.default_totals()
    _, oracle = run.oracle(THRESHOLD)
    online = run.run_online(factory, THRESHOLD).totals
    saved = 1.0 - online.energy_per_valid_token_j / default.energy_per_valid_token_j
    best = 1.0 - oracle.energy_per_valid_token_j / default.energy_per_valid_token_j
    return saved / best, default.wall_s / online.wall_s


def with_seed(scenario: Scenario, seed: int) -> Scenario:
    return dataclasses.replace(scenario, workload=dataclasses.replace(scenario.workload, seed=seed))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf.whole_iterations", description=__doc__)
    parser.add_argument("--scenario", default="verl-h100")
    parser.add_argument("--seeds", default="1-5")
    args = parser.parse_args(argv)
    base = load_scenario(args.scenario)
    print(
        "| seed | thr released | thr held | savings released | savings held "
        "| capture (gap counted) | thr | capture (gap hidden) | thr |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    counted, hidden = [], []
    for seed in parse_seeds(args.seeds):
        run = ScenarioRun(with_seed(base, seed))
        released, held, saved_released, saved_held = held_vs_released(run)
        with_gap = capture(run, create_eerl_controller)
        without = capture(run, GapHidden)
        counted.append(with_gap[0])
        hidden.append(without[0])
        print(
            f"| {seed} | {released:.3f} | {held:.3f} | {saved_released:.1%} | {saved_held:.1%} "
            f"| {with_gap[0]:.3f} | {with_gap[1]:.3f} | {without[0]:.3f} | {without[1]:.3f} |",
            flush=True,
        )
    print(f"capture median: gap counted {np.median(counted):.3f}, gap hidden {np.median(hidden):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
