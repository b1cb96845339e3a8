"""Measured DVFS sweeps shipped with eerl-sim, to check the simulated profiles against real GPUs.

The CSV files beside this module are the Perseus artifact's stage profiles (SOSP '24; ``NOTICE.md`` names
the source, the commit and the license): per pipeline stage and instruction (forward, backward), the time
and energy at every locked SM clock. ``python -m perf.real_gpu`` writes the same format for a GPU at hand,
so :func:`parse_stage_profile` reads both.
"""

from __future__ import annotations

import csv
import io
from collections import defaultdict
from dataclasses import dataclass
from importlib import resources

from eerld.errors import ConfigError

STAGE_PROFILE_COLUMNS = ("stage", "instruction", "frequency", "time", "energy")
"""The header of a stage-profile CSV: SM clock in MHz, time in s, energy in J."""

DATASET_PROFILES = {
    "gpt3-175b+a100_sxm_bf16": "a100-sxm",
    "bloom+a100_sxm_bf16": "a100-sxm",
    "gpt3-175b+a40_bf16": "a40",
    "bloom+a40_bf16": "a40",
}
"""Each shipped dataset (its file's stem) and the built-in profile fitted to it."""


@dataclass(frozen=True, slots=True)
class MeasuredCurve:
    """One kernel's sweep: time and energy at each SM clock, clocks ascending."""

    stage: int
    instruction: str
    sm_clocks_mhz: tuple[int, ...]
    time_s: tuple[float, ...]
    energy_j: tuple[float, ...]


@dataclass(frozen=True, slots=True)
class MeasuredDataset:
    """One file of sweeps (a model on a GPU) and the profile it checks."""

    name: str
    profile: str
    curves: tuple[MeasuredCurve, ...]

    @property
    def sm_clocks_mhz(self) -> tuple[int, ...]:
        """The clocks every curve of the dataset was measured at; ConfigError if they differ."""
        clocks = self.curves[0].sm_clocks_mhz
        for curve in self.curves:
            if curve.sm_clocks_mhz != clocks:
                raise ConfigError(
                    f"{self.name}: stage {curve.stage} {curve.instruction} is not measured at the same clocks"
                )
        return clocks


def parse_stage_profile(text: str, *, source: str) -> tuple[MeasuredCurve, ...]:
    """The curves of a stage-profile CSV, in order of first appearance; ConfigError naming ``source`` if
    the header or a value is off. Curves may cover different clocks (a default-governor recording holds
    one clock per kernel mix); a sweep's comparison needs them alike (``MeasuredDataset.sm_clocks_mhz``)."""
    reader = csv.reader(io.StringIO(text))
    header = next(reader, None)
    if header is None or tuple(h.strip() for h in header) != STAGE_PROFILE_COLUMNS:
        raise ConfigError(f"{source}: expected the header {','.join(STAGE_PROFILE_COLUMNS)}, got {header}")
    points: dict[tuple[int, str], dict[int, tuple[float, float]]] = defaultdict(dict)
    for line, row in enumerate(reader, start=2):
        try:
            stage_text, instruction_text, clock_text, time_text, energy_text = row
            point = (float(time_text), float(energy_text))
            points[int(stage_text), instruction_text.strip()][round(float(clock_text))] = point
        except ValueError:
            expected = len(STAGE_PROFILE_COLUMNS)
            raise ConfigError(f"{source}:{line}: expected {expected} numbers, got {row}") from None
        if not (point[0] > 0 and point[1] > 0):
            raise ConfigError(f"{source}:{line}: time and energy must be positive, got {row}")
    if not points:
        raise ConfigError(f"{source}: no measurement")
    curves = []
    for (stage, instruction), by_clock in points.items():
        clocks = sorted(by_clock)
        curves.append(
            MeasuredCurve(
                stage=stage,
                instruction=instruction,
                sm_clocks_mhz=tuple(clocks),
                time_s=tuple(by_clock[c][0] for c in clocks),
                energy_j=tuple(by_clock[c][1] for c in clocks),
            )
        )
    return tuple(curves)


def measured_datasets() -> tuple[MeasuredDataset, ...]:
    """Every shipped dataset, in the order of :data:`DATASET_PROFILES`."""
    folder = resources.files(__name__)
    return tuple(
        MeasuredDataset(
            name=name,
            profile=profile,
            curves=parse_stage_profile(
                (folder / f"{name}.csv").read_text(encoding="utf-8"), source=f"{name}.csv"
            ),
        )
        for name, profile in DATASET_PROFILES.items()
    )
