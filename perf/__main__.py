"""``make bench`` (``python -m perf``): every benchmark of eerl, one after the other, figures printed.

Figures are medians and ratios (the machines are shared and noisy); none of them is asserted anywhere.
Each benchmark is its own module and can be run alone (``python -m perf.NAME``); this one only sequences
them.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BENCHMARKS: dict[str, list[str]] = {
    "simulator speed (300 iterations, sweep)": ["-m", "perf.sim_speed", "--repeats", "3"],
    "controller vs default vs offline oracle, every scenario": [
        "-m",
        "eerl_sim.bench.cli",
        "all",
        "--out-dir",
        "out/bench",
    ],
    "phase-event latency against a no-op gRPC floor": [
        "-m",
        "perf.phase_latency",
        "--clients",
        "1,32",
        "--rounds",
        "5000",
        "--kills",
        "5",
    ],
    "client caller cost per phase event": ["-m", "perf.client_overhead", "--phases", "1000"],
    "whole iterations on verl-h100: lock held vs released, gap counted vs hidden": [
        "-m",
        "perf.whole_iterations",
        "--seeds",
        "1-5",
    ],
    "the controller's cost per phase and memory over 2000 iterations": ["-m", "perf.controller_cost"],
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m perf", description=__doc__)
    parser.add_argument("--only", help="run only the benchmarks whose title contains this text")
    args = parser.parse_args(argv)
    failed: list[str] = []
    for title, command in BENCHMARKS.items():
        if args.only and args.only not in title:
            continue
        print(f"\n=== {title}\n$ python {' '.join(command)}", flush=True)
        started = time.monotonic()
        result = subprocess.run([sys.executable, *command], cwd=ROOT, check=False)
        print(f"--- {title}: exit {result.returncode} after {time.monotonic() - started:.0f} s", flush=True)
        if result.returncode != 0:
            failed.append(title)
    if failed:
        print(f"Error: failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
