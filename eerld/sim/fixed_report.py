"""Fixed-clock comparison: a scenario under the default governor and at chosen clock pairs, as a table.

Used by ``python -m eerld.demo``; every figure states its baseline (the default governor on the same
iterations, which see the same workload and noise by construction).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from eerld.control.base import PhaseKind
from eerld.sim.evaluate import ProgressCallback, RunResult, run_fixed
from eerld.sim.scenario import Scenario
from eerld.sim.workload import FloatArray


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
    runs: list[tuple[FixedSetting, RunResult]] = []
    for setting in (default, *settings):
        clocks = {
            PhaseKind.GENERATION: setting.generation_sm_clock_mhz,
            PhaseKind.TRAINING: setting.training_sm_clock_mhz,
        }
        runs.append((setting, run_fixed(scenario, clocks, iterations, progress)))
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
