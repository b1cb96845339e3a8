"""Re-tune headroom: how much could any controller that changes clocks mid-run gain over the best fixed pair?

A controller that re-tunes can only beat the offline oracle (the best *fixed* clock pair over the whole run)
if the best clocks differ between parts of the run. Three figures answer how much they do, all on the
scenario's price table (every sampled iteration priced at every grid clock, common random numbers):

* the **oracle**: one pair for the whole run, meeting the threshold over the whole run;
* **per regime at threshold**: the best pair of each regime, each regime meeting the threshold on its own
  (what a controller that holds every iteration at the threshold can at best reach);
* the **foresight bound**: a lower bound on the energy of *any* choice of clocks per iteration and phase
  that meets the whole-run threshold (the Lagrangian dual: minimise energy + λ · time per phase, λ shared
  by the whole run). No controller, online or with foresight, can save more; its distance to the oracle
  is the headroom.

Sync mode only: there, phases add, so each phase can be priced on its own.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from eerl.phases import ExecutionMode, PhaseKind

from eerl_sim.bench.runner import FloatArray, ScenarioRun
from eerld.errors import ValidationError

_GEN, _TRAIN = PhaseKind.GENERATION, PhaseKind.TRAINING


@dataclass(frozen=True, slots=True)
class RegimeBest:
    """The best pair of one regime that meets the threshold within that regime."""

    first_iteration: int
    end_iteration: int
    generation_sm_clock_mhz: int
    training_sm_clock_mhz: int
    savings: float
    throughput_ratio: float
    generation_share: float
    """Generation's share of the default governor's wall time in this regime."""


@dataclass(frozen=True, slots=True)
class Headroom:
    """Oracle, per-regime and foresight savings of one scenario (fractions of default energy/token)."""

    scenario: str
    oracle_sm_clocks_mhz: tuple[int, int]
    oracle_savings: float
    regimes: tuple[RegimeBest, ...]
    per_regime_savings: float
    per_regime_throughput_ratio: float
    bound_savings: float
    """No controller meeting the whole-run threshold saves more (Lagrangian dual bound)."""

    def table(self) -> str:
        """Human-readable summary."""
        gen_mhz, train_mhz = self.oracle_sm_clocks_mhz
        lines = [
            f"scenario {self.scenario}: re-tune headroom",
            f"oracle (one pair, whole run): {gen_mhz}, {train_mhz} MHz saves {self.oracle_savings:.2%}",
        ]
        for r in self.regimes:
            lines.append(
                f"  regime [{r.first_iteration}, {r.end_iteration}): "
                f"generation share {r.generation_share:.2f}, best {r.generation_sm_clock_mhz}, "
                f"{r.training_sm_clock_mhz} MHz saves {r.savings:.2%} at {r.throughput_ratio:.3f}"
            )
        per_regime_gain = self.per_regime_savings - self.oracle_savings
        bound_gain = self.bound_savings - self.oracle_savings
        lines.append(
            f"best pair per regime, each at the threshold: saves {self.per_regime_savings:.2%} "
            f"(throughput {self.per_regime_throughput_ratio:.3f}; {per_regime_gain:+.2%} vs oracle)"
        )
        lines.append(
            "foresight bound (any clocks per iteration, whole-run threshold): "
            f"at most {self.bound_savings:.2%} ({bound_gain:+.2%} vs oracle)"
        )
        return "\n".join(lines)


def default_boundaries(run: ScenarioRun) -> tuple[int, ...]:
    """Regime boundaries: the scenario's drift steps, else three equal slices."""
    steps = sorted({s.at_iteration for s in run.scenario.workload.drift.steps if s.at_iteration > 0})
    inside = tuple(s for s in steps if s < run.iterations)
    if inside:
        return inside
    third = run.iterations // 3
    return (third, 2 * third) if third > 0 else ()


def _best_pair(
    gen_d: FloatArray,
    gen_e: FloatArray,
    train_d: FloatArray,
    train_e: FloatArray,
    threshold: float,
    *,
    between_s: float = 0.0,
) -> tuple[int, int]:
    """The least-energy pair whose wall time (the work between the phases, at default, included) meets the
    threshold; that work's energy is the same for every pair, so it does not change the choice."""
    wall = gen_d[:, None] + train_d[None, :] + between_s
    energy = gen_e[:, None] + train_e[None, :]
    ok = wall[-1, -1] / wall >= threshold - 1e-12
    g, t = np.unravel_index(int(np.argmin(np.where(ok, energy, np.inf))), energy.shape)
    return int(g), int(t)


def headroom(run: ScenarioRun, threshold: float, boundaries: Sequence[int] | None = None) -> Headroom:
    """Oracle, best pair per regime and the foresight bound of a sync scenario (see the module docstring)."""
    if run.scenario.workload.mode is not ExecutionMode.SYNC:
        raise ValidationError("scenario", "re-tune headroom is computed for sync scenarios only")
    table = run.price_table()
    clocks = table.sm_clocks_mhz
    gd, ge = table.duration_s[_GEN], table.energy_j[_GEN]
    td, te = table.duration_s[_TRAIN], table.energy_j[_TRAIN]
    bd, be = table.between_duration_s, table.between_energy_j  # at the default for every clock
    default_wall = float(gd[:, -1].sum() + td[:, -1].sum() + bd.sum())
    default_energy = float(ge[:, -1].sum() + te[:, -1].sum() + be.sum())

    g, t = _best_pair(gd.sum(0), ge.sum(0), td.sum(0), te.sum(0), threshold, between_s=float(bd.sum()))
    oracle_savings = 1.0 - float(ge[:, g].sum() + te[:, t].sum() + be.sum()) / default_energy

    edges = [0, *sorted(b for b in (boundaries or default_boundaries(run)) if 0 < b < run.iterations)]
    edges.append(run.iterations)
    regimes: list[RegimeBest] = []
    energy_sum = wall_sum = 0.0
    for start, end in itertools.pairwise(edges):
        part = slice(start, end)
        sums = [a[part].sum(0) for a in (gd, ge, td, te)]
        between_s, between_j = float(bd[part].sum()), float(be[part].sum())
        rg, rt = _best_pair(sums[0], sums[1], sums[2], sums[3], threshold, between_s=between_s)
        energy = float(sums[1][rg] + sums[3][rt]) + between_j
        wall = float(sums[0][rg] + sums[2][rt]) + between_s
        base_energy = float(sums[1][-1] + sums[3][-1]) + between_j
        base_wall = float(sums[0][-1] + sums[2][-1]) + between_s
        regimes.append(
            RegimeBest(
                start,
                end,
                clocks[rg],
                clocks[rt],
                1.0 - energy / base_energy,
                base_wall / wall,
                float(sums[0][-1]) / base_wall,
            )
        )
        energy_sum += energy
        wall_sum += wall

    bound_energy = _foresight_bound(gd, ge, td, te, default_wall / threshold - float(bd.sum()))
    bound_energy += float(be.sum())
    return Headroom(
        scenario=run.scenario.name,
        oracle_sm_clocks_mhz=(clocks[g], clocks[t]),
        oracle_savings=oracle_savings,
        regimes=tuple(regimes),
        per_regime_savings=1.0 - energy_sum / default_energy,
        per_regime_throughput_ratio=default_wall / wall_sum,
        bound_savings=1.0 - bound_energy / default_energy,
    )


def _foresight_bound(
    gd: FloatArray, ge: FloatArray, td: FloatArray, te: FloatArray, allowed_wall_s: float
) -> float:
    """A lower bound on the energy of any per-iteration, per-phase clocks within ``allowed_wall_s``.

    Lagrangian dual: for a price λ ≥ 0 (J per s) every phase independently picks the clock minimising
    energy + λ · time; Σ min(energy + λ · time) − λ · allowed time is at most the energy of any schedule that
    meets the time limit, so its maximum over λ (a concave function, scanned on a fine grid) bounds every
    controller from below, whatever it knows.
    """
    best = -np.inf
    for price in np.concatenate(([0.0], np.geomspace(1.0, 1e6, 2400))):
        value = float((ge + price * gd).min(axis=1).sum() + (te + price * td).min(axis=1).sum())
        best = max(best, value - price * allowed_wall_s)
    return best


__all__ = ["Headroom", "RegimeBest", "default_boundaries", "headroom"]
