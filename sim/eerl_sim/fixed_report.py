"""Fixed-clock comparison: a scenario under the default governor and at chosen clock pairs, as a table,
and the calibration figures of docs/simulator.md (``python -m eerl_sim.fixed_report``).

Every figure states its baseline (the default governor on the same iterations, which see the same
workload and noise by construction).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from eerl.phases import PhaseKind

from eerl_sim.evaluate import ProgressCallback, RunResult, evaluate_phase, run_fixed, sample_iteration
from eerl_sim.pricing import clock_grid
from eerl_sim.scenario import Scenario, load_scenario
from eerl_sim.sweep import sweep
from eerl_sim.workload import FloatArray, IntArray
from eerld.errors import DaemonError


@dataclass(frozen=True, slots=True)
class FixedSetting:
    """A named clock pair (None: default governor for that phase)."""

    label: str
    generation_sm_clock_mhz: int | None
    training_sm_clock_mhz: int | None


@dataclass(frozen=True, slots=True)
class FixedRow:
    """One setting's whole-run figures and their ratios to the default governor."""

    setting: FixedSetting
    energy_per_valid_token_j: float
    throughput_tokens_per_s: float
    energy_saving_fraction: float
    throughput_ratio: float
    generation_mean_clock_mhz: float
    training_mean_clock_mhz: float


def compare_fixed(
    scenario: Scenario,
    settings: Sequence[FixedSetting],
    iterations: int | None = None,
    progress: ProgressCallback | None = None,
) -> list[FixedRow]:
    """Run the default governor, then each setting, over the same iterations; first row is the default."""
    default = FixedSetting("default governor", None, None)
    count = scenario.workload.iterations if iterations is None else iterations
    samples = [sample_iteration(scenario, i) for i in range(count)]
    runs: list[tuple[FixedSetting, RunResult]] = []
    for setting in (default, *settings):
        clocks = {
            PhaseKind.GENERATION: setting.generation_sm_clock_mhz,
            PhaseKind.TRAINING: setting.training_sm_clock_mhz,
        }
        runs.append((setting, run_fixed(scenario, clocks, count, progress, samples=samples)))
    base = runs[0][1]
    return [
        FixedRow(
            setting=setting,
            energy_per_valid_token_j=run.energy_per_valid_token_j,
            throughput_tokens_per_s=run.throughput_tokens_per_s,
            energy_saving_fraction=1.0 - run.energy_per_valid_token_j / base.energy_per_valid_token_j,
            throughput_ratio=run.throughput_tokens_per_s / base.throughput_tokens_per_s,
            generation_mean_clock_mhz=_time_weighted(
                run.generation_mean_clock_mhz, run.generation_duration_s
            ),
            training_mean_clock_mhz=_time_weighted(run.training_mean_clock_mhz, run.training_duration_s),
        )
        for setting, run in runs
    ]


def _time_weighted(values: FloatArray, weights: FloatArray) -> float:
    total = float(weights.sum())
    return float((values * weights).sum() / total) if total > 0 else 0.0


def format_table(rows: Sequence[FixedRow]) -> str:
    """A plain-text table for people (one line per setting, default first)."""
    header = (
        f"{'setting':<34} {'gen MHz':>8} {'train MHz':>9} {'held gen/train':>15} "
        f"{'J/valid token':>14} {'tokens/s':>10} {'ΔJ/token':>8} {'thr. ratio':>10}"
    )
    lines = [header, "-" * len(header)]
    for row in rows:
        setting = row.setting
        held = f"{row.generation_mean_clock_mhz:.0f}/{row.training_mean_clock_mhz:.0f}"
        saving = "—" if row.setting.label == "default governor" else f"{-row.energy_saving_fraction:+.1%}"
        lines.append(
            f"{setting.label:<34} {_clock(setting.generation_sm_clock_mhz):>8} "
            f"{_clock(setting.training_sm_clock_mhz):>9} {held:>15} {row.energy_per_valid_token_j:>14.4f} "
            f"{row.throughput_tokens_per_s:>10,.0f} {saving:>8} {row.throughput_ratio:>10.3f}"
        )
    return "\n".join(lines)


def _clock(sm_clock_mhz: int | None) -> str:
    return "default" if sm_clock_mhz is None else str(sm_clock_mhz)


@dataclass(frozen=True, slots=True)
class CalibrationFigures:
    """The figures the sim-model calibration checks are about, for one scenario under the default governor."""

    scenario: str
    profile: str
    iterations: int
    generation_share: float
    generation_power_w: float
    """Average power per GPU during generation."""
    training_power_w: float
    training_capped_clock_mhz: tuple[int, int]
    """Lowest and highest default-governor clock of the training micro-batch segments."""
    generation_1200_time_change: float
    generation_1200_energy_change: float
    training_900_over_1500_vs_clock_ratio: float
    """(T(low)/T(high)) / (high/low) at the grid clocks nearest 900 and 1500 MHz: 1.0 is exact 1/f."""
    best_generation_sm_clock_mhz: int | None
    best_training_sm_clock_mhz: int | None
    best_energy_saving_fraction: float
    best_throughput_ratio: float
    probe_clocks_mhz: tuple[int, int, int] = (1200, 900, 1500)
    """The grid clocks nearest 1200 (generation), 900 and 1500 MHz (training) that the figures use: a
    profile whose grid lacks them (the A100 tops out at 1410 MHz) is measured at its nearest."""


def _nearest(grid: IntArray, mhz: int) -> int:
    """The grid clock nearest ``mhz`` (the lower one on a tie)."""
    return int(grid[int(np.argmin(np.abs(grid - mhz)))])


def calibration_figures(scenario: Scenario, iterations: int | None = None) -> CalibrationFigures:
    """Measure the calibration figures of ``scenario`` over its first ``iterations`` iterations."""
    count = scenario.workload.iterations if iterations is None else iterations
    gen_d = np.zeros(2)
    gen_e = np.zeros(2)
    train_d = np.zeros(3)
    train_e = np.zeros(3)
    capped: list[int] = []
    grid = clock_grid(scenario.gpu).sm_clocks_mhz
    micro_batches = scenario.workload.training.micro_batches
    probe, low, high = (_nearest(grid, mhz) for mhz in (1200, 900, 1500))
    for i in range(count):
        sample = sample_iteration(scenario, i)
        gen = evaluate_phase(scenario, sample, PhaseKind.GENERATION, [None, probe])
        train = evaluate_phase(scenario, sample, PhaseKind.TRAINING, [None, low, high])
        gen_d += gen.duration_s
        gen_e += gen.energy_j
        train_d += train.duration_s
        train_e += train.energy_j
        bounds = sample.training.segments.gpu_bounds
        for g in range(sample.training.segments.gpus):
            if bounds[g + 1] > bounds[g]:
                capped.extend(
                    int(c) for c in grid[sample.training.capped_index[bounds[g] : bounds[g] + micro_batches]]
                )
    best = sweep(scenario, iterations=count).best(0.95)
    gpus_gen = scenario.workload.pool_gpus(PhaseKind.GENERATION)
    gpus_train = scenario.workload.pool_gpus(PhaseKind.TRAINING)
    return CalibrationFigures(
        scenario=scenario.name,
        profile=scenario.gpu.name,
        iterations=count,
        generation_share=float(gen_d[0] / (gen_d[0] + train_d[0])),
        generation_power_w=float(gen_e[0] / gen_d[0] / gpus_gen),
        training_power_w=float(train_e[0] / train_d[0] / gpus_train),
        training_capped_clock_mhz=(min(capped), max(capped)) if capped else (0, 0),
        generation_1200_time_change=float(gen_d[1] / gen_d[0] - 1),
        generation_1200_energy_change=float(gen_e[1] / gen_e[0] - 1),
        training_900_over_1500_vs_clock_ratio=float((train_d[1] / train_d[2]) / (high / low)),
        best_generation_sm_clock_mhz=best.generation_sm_clock_mhz,
        best_training_sm_clock_mhz=best.training_sm_clock_mhz,
        best_energy_saving_fraction=best.energy_saving_fraction,
        best_throughput_ratio=best.throughput_ratio,
        probe_clocks_mhz=(probe, low, high),
    )


def format_calibration(figures: CalibrationFigures) -> str:
    """The figures as the few lines docs/simulator.md and the closing notes quote."""
    low, high = figures.training_capped_clock_mhz
    probe, slow, fast = figures.probe_clocks_mhz
    return "\n".join(
        [
            f"{figures.scenario} ({figures.profile}, {figures.iterations} iterations, default governor):",
            f"  generation share of the iteration   {figures.generation_share:.1%}",
            f"  generation power per GPU            {figures.generation_power_w:.0f} W",
            f"  training power per GPU              {figures.training_power_w:.0f} W",
            f"  training clock under the power cap  {low}–{high} MHz",
            f"  generation at {probe} MHz              time {figures.generation_1200_time_change:+.1%}, "
            f"energy {figures.generation_1200_energy_change:+.1%}",
            f"  training T({slow})/T({fast}) ÷ {fast}/{slow}  "
            f"{figures.training_900_over_1500_vs_clock_ratio:.3f}",
            f"  best fixed pair at ≥95% throughput  {_clock(figures.best_generation_sm_clock_mhz)} / "
            f"{_clock(figures.best_training_sm_clock_mhz)} MHz: saves "
            f"{figures.best_energy_saving_fraction:.1%} energy per valid token "
            f"at {figures.best_throughput_ratio:.1%} throughput",
        ]
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m eerl_sim.fixed_report [SCENARIO ...] [--iterations N]``: print calibration figures."""
    parser = argparse.ArgumentParser(prog="python -m eerl_sim.fixed_report", description=main.__doc__)
    parser.add_argument("scenarios", nargs="*", default=["sync-h100", "sync-gb200"])
    parser.add_argument("--iterations", type=int, default=None, help="default: the scenario's own")
    args = parser.parse_args(argv)
    try:
        for name in args.scenarios:
            print(format_calibration(calibration_figures(load_scenario(name), args.iterations)))
    except DaemonError as e:
        print(f"Error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
