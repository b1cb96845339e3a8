"""``make demo``: the simulated reference RL job under the default governor and at fixed clocks.

Until the daemon runs the simulated loop itself, this shows what eerl is about with real numbers from
the simulator: generation is memory-bound and barely slows at lower SM clocks, training is power-capped
and slows in proportion, so a lower generation clock and a slightly lower training clock save energy
per valid training token at a small cost in throughput. The best pair comes from the offline sweep.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from eerld.errors import EerlError
from eerld.sim.fixed_report import FixedSetting, compare_fixed, format_table
from eerld.sim.scenario import load_scenario
from eerld.sim.sweep import sweep


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo; returns the exit code (errors print one ``Error:`` line)."""
    parser = argparse.ArgumentParser(prog="python -m eerld.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="sync-h100", help="built-in name or path (default: sync-h100)")
    parser.add_argument("--iterations", type=int, default=60, help="RL iterations to simulate (default: 60)")
    parser.add_argument("--threshold", type=float, default=0.95, help="throughput floor for the best pair")
    args = parser.parse_args(argv)
    try:
        return _run(args.scenario, args.iterations, args.threshold)
    except (EerlError, ValueError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1


def _run(scenario_name: str, iterations: int, threshold: float) -> int:
    if iterations < 1:
        raise ValueError("--iterations must be at least 1")
    started = time.perf_counter()
    scenario = load_scenario(scenario_name)
    gpu = scenario.gpu
    print(
        f"eerl demo: simulated '{scenario.name}' ({scenario.workload.gpus} x {gpu.name}, "
        f"{scenario.workload.mode} RL), {iterations} iterations in virtual time"
    )
    print(f"  {scenario.description}")
    result = sweep(scenario, iterations=iterations)
    best = result.best(threshold)
    settings = [
        FixedSetting("generation locked at 1200 MHz", 1200, None),
        FixedSetting("training locked at 1500 MHz", None, 1500),
        FixedSetting("both low: 1005 / 1305 MHz", 1005, 1305),
        FixedSetting(
            f"best pair of the sweep (≥{threshold:.0%} thr.)",
            best.generation_sm_clock_mhz,
            best.training_sm_clock_mhz,
        ),
    ]
    grid = set(gpu.sm_clock_grid_mhz())
    usable = [
        s
        for s in settings
        if all(c is None or c in grid for c in (s.generation_sm_clock_mhz, s.training_sm_clock_mhz))
    ]
    rows = compare_fixed(scenario, usable, iterations)
    print()
    print(format_table(rows))
    print()
    print(
        "energy and throughput are relative to the default governor on the same iterations (same responses, "
        "same noise);\nenergy covers all GPUs, both phases and idle waits; 'held' is the time-weighted clock "
        "that actually held."
    )
    print(
        f"sweep: {len(result.sm_clocks_mhz)}² clock pairs over {iterations} iterations; best pair saves "
        f"{best.energy_saving_fraction:.1%} at {best.throughput_ratio:.1%} throughput. "
        f"({time.perf_counter() - started:.1f} s)"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
