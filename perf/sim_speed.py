"""How fast the simulator runs: a 300-iteration default-governor run and the whole-run sweep.

Usage: ``.venv/bin/python -m perf.sim_speed [--repeats 3] [--iterations 300] [--json]``.
Reports medians (the machine is shared and noisy); the target is < 20 s for the default run of
sync-h100 on a 2-core machine. Nothing here is asserted in tests.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from functools import partial

from eerl.phases import PhaseKind
from eerl_sim.evaluate import run_fixed
from eerl_sim.scenario import load_scenario
from eerl_sim.sweep import sweep


def _median_s(repeats: int, work: Callable[[], object]) -> tuple[float, list[float]]:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times), times


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m perf.sim_speed", description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=300)
    parser.add_argument("--sweep-repeats", type=int, default=1)
    parser.add_argument("--scenarios", nargs="+", default=["sync-h100", "sync-gb200", "async-h100"])
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")
    args = parser.parse_args()
    figures: dict[str, dict[str, float]] = {}
    for name in args.scenarios:
        scenario = load_scenario(name)
        locks = {PhaseKind.GENERATION: 1200, PhaseKind.TRAINING: 1500}
        default_s, _ = _median_s(args.repeats, partial(run_fixed, scenario, {}, args.iterations))
        locked_s, _ = _median_s(args.repeats, partial(run_fixed, scenario, locks, args.iterations))
        sweep_s, _ = _median_s(args.sweep_repeats, partial(sweep, scenario, args.iterations))
        pairs = len(scenario.gpu.sm_clock_grid_mhz()) ** 2
        figures[name] = {
            "iterations": args.iterations,
            "default_run_s": round(default_s, 3),
            "locked_run_s": round(locked_s, 3),
            "sweep_s": round(sweep_s, 3),
            "sweep_pairs": pairs,
        }
        if not args.json:
            print(
                f"{name:<12} {args.iterations} iterations: default run {default_s:6.2f} s, "
                f"locked run {locked_s:6.2f} s (median of {args.repeats}); "
                f"sweep of {pairs} pairs {sweep_s:6.2f} s"
            )
    if args.json:
        print(json.dumps(figures, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
