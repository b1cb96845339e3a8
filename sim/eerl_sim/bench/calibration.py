"""``eerl-bench calibration``: the built-in profiles against the measured sweeps shipped with eerl-sim.

Per dataset, the simulated against the measured time and energy ratios to the top clock over the measured
clocks (:mod:`eerl_sim.calibration`), their rms and largest error, and where each puts the energy minimum.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from eerl_sim.calibration import (
    TOLERANCE_ENERGY_MIN_MHZ,
    TOLERANCE_MAX,
    TOLERANCE_RMS,
    DatasetComparison,
    compare,
)
from eerl_sim.measured import measured_datasets
from eerl_sim.profiles import builtin_profile


def comparisons() -> list[DatasetComparison]:
    """Every shipped dataset against the built-in profile fitted to it."""
    return [compare(builtin_profile(d.profile), d) for d in measured_datasets()]


def calibration_table(rows: Sequence[DatasetComparison]) -> str:
    """The table for people: one line per dataset, the targets in the header."""
    lines = [
        f"targets: rms <= {TOLERANCE_RMS:.0%} (time and energy), max <= {TOLERANCE_MAX:.0%}, "
        f"energy minimum within {TOLERANCE_ENERGY_MIN_MHZ} MHz",
        f"{'dataset':<26} {'profile':<9} {'rms time':>8} {'rms energy':>10} {'max':>6} "
        f"{'E-min measured':>14} {'E-min simulated':>15}  ok",
    ]
    for c in rows:
        lines.append(
            f"{c.dataset:<26} {c.profile:<9} {c.rms_time_error:>8.2%} {c.rms_energy_error:>10.2%} "
            f"{c.max_error:>6.2%} {c.energy_min_mhz_measured:>10} MHz {c.energy_min_mhz_simulated:>11} MHz"
            f"  {'yes' if c.within_tolerance() else 'NO'}"
        )
    return "\n".join(lines)


def _cmd_calibration(args: argparse.Namespace) -> int:
    rows = comparisons()
    print(calibration_table(rows))
    if args.json is not None:
        document: list[dict[str, Any]] = [c.to_json() for c in rows]
        args.json.write_text(json.dumps(document, indent=2) + "\n")
    if args.plot is not None:
        from eerl_sim.bench.plots import calibration_plot  # noqa: PLC0415 - matplotlib only when plotting

        calibration_plot(rows, path=args.plot)
    return 0


def add_calibration_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``calibration`` on eerl-bench's subcommands."""
    sub = commands.add_parser("calibration", help="the simulated GPUs against measured DVFS sweeps")
    sub.add_argument("--json", type=Path, default=None, help="write each dataset's figures as JSON here")
    sub.add_argument("--plot", type=Path, default=None, help="write measured vs simulated ratios (PNG) here")
    sub.set_defaults(handler=_cmd_calibration, threshold=0.95, iterations=None)
