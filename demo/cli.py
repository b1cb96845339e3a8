"""The live demo's command line: ``python -m demo [--iterations 30] [--speedup 50] [--out out/demo] …``.

Parses the flags, runs :class:`demo.live.LiveDemo` in a private temporary folder and, whatever happens
(normal end, error, Ctrl-C), stops its processes and removes the folder. Errors print one ``Error:`` line.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import shutil
import signal
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from demo.live import DEFAULT_ITERATIONS, DEFAULT_SCENARIO, DEFAULT_SPEEDUP, LiveDemo, Options, work_dir
from eerld.errors import DaemonError


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m demo``."""
    p = argparse.ArgumentParser(
        prog="python -m demo",
        description="Run eerld on simulated GPUs with a simulated RL job, live, and summarise what it saved.",
    )
    p.add_argument(
        "--iterations",
        type=int,
        default=DEFAULT_ITERATIONS,
        help=f"RL iterations (default {DEFAULT_ITERATIONS})",
    )
    p.add_argument(
        "--speedup",
        type=float,
        default=DEFAULT_SPEEDUP,
        help=f"simulated seconds per wall second (default {DEFAULT_SPEEDUP:g})",
    )
    p.add_argument(
        "--out", type=Path, default=Path("out/demo"), help="where the plot and JSON go (default out/demo)"
    )
    p.add_argument(
        "--scenario", default=DEFAULT_SCENARIO, help=f"a sync scenario (default {DEFAULT_SCENARIO})"
    )
    p.add_argument(
        "--controller",
        choices=("eerl", "fixed", "off"),
        default="eerl",
        help="default: eerl if available, else fixed",
    )
    return p


@contextlib.contextmanager
def _no_interrupts() -> Iterator[None]:
    """Shield cleanup from a second Ctrl-C (the children are stopped either way)."""
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point; returns the exit code (0: ran and left no GPU locked; 130 after Ctrl-C)."""
    started_wall_s = time.monotonic()
    args = build_parser().parse_args(argv)
    if args.iterations < 1 or not (math.isfinite(args.speedup) and args.speedup > 0):
        print("Error: --iterations must be ≥ 1 and --speedup a positive number", file=sys.stderr)
        return 2
    options = Options(args.iterations, args.speedup, args.out, args.scenario, args.controller)
    work = work_dir()
    demo: LiveDemo | None = None
    try:
        demo = LiveDemo(options, work, started_wall_s=started_wall_s)
        return demo.run()
    except KeyboardInterrupt:
        print("\ninterrupted: stopping the worker and eerld", file=sys.stderr)
        return 130
    except (DaemonError, RuntimeError, OSError) as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    finally:
        with _no_interrupts():
            if demo is not None:
                demo.stop()
                if demo.locked_after_stop:
                    print(f"Error: GPUs left locked: {demo.locked_after_stop}", file=sys.stderr)
            shutil.rmtree(work, ignore_errors=True)
