"""The controller benchmark's figures: default vs offline oracle vs online, as a table and as JSON."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from eerl.phases import ControllerState, PhaseKind

from eerl_sim.bench.peers import Peer
from eerl_sim.bench.runner import OnlineRun, RunTotals


@dataclass(frozen=True, slots=True)
class ControllerReport:
    """One scenario's comparison (savings are of energy per valid token, against the default governor)."""

    scenario: str
    iterations: int
    threshold: float
    default: RunTotals
    oracle: RunTotals
    oracle_sm_clocks_mhz: dict[PhaseKind, int | None]
    online: RunTotals
    exploration_phases: int
    exploration_cost_j: float
    final_states: dict[PhaseKind, tuple[ControllerState, int | None]]
    runtime_s: float
    peers: tuple[Peer, ...] = ()
    """What a user would set by hand instead, on the same draws (:mod:`eerl_sim.bench.peers`)."""

    def savings(self, totals: RunTotals) -> float:
        """1 − a run's energy per valid token / the default's."""
        return 1.0 - totals.energy_per_valid_token_j / self.default.energy_per_valid_token_j

    def throughput_ratio(self, totals: RunTotals) -> float:
        """A run's throughput over the default's."""
        return totals.throughput_tokens_per_s / self.default.throughput_tokens_per_s

    @property
    def savings_online(self) -> float:
        """1 − online energy per valid token / default's."""
        return self.savings(self.online)

    @property
    def savings_oracle(self) -> float:
        """1 − oracle energy per valid token / default's."""
        return self.savings(self.oracle)

    @property
    def throughput_ratio_online(self) -> float:
        """Online throughput over the default's."""
        return self.throughput_ratio(self.online)

    @property
    def throughput_ratio_oracle(self) -> float:
        """Oracle throughput over the default's."""
        return self.throughput_ratio(self.oracle)

    @property
    def capture(self) -> float:
        """Online savings over oracle savings."""
        return self.savings_online / self.savings_oracle if self.savings_oracle > 0 else float("nan")

    def to_json(self) -> dict[str, Any]:
        """The JSON document of ``eerl-bench controller --json``."""

        def run(totals: RunTotals) -> dict[str, Any]:
            return {
                "energy_j": totals.energy_j,
                "wall_s": totals.wall_s,
                "valid_tokens": totals.valid_tokens,
                "energy_per_valid_token_j": totals.energy_per_valid_token_j,
                "throughput_tokens_per_s": totals.throughput_tokens_per_s,
            }

        oracle = run(self.oracle)
        oracle["sm_clock_mhz"] = {k.value: v for k, v in self.oracle_sm_clocks_mhz.items()}
        online = run(self.online)
        online["exploration_phases"] = self.exploration_phases
        online["exploration_cost_j"] = self.exploration_cost_j
        online["final"] = {
            k.value: {"state": s.value, "sm_clock_mhz": c} for k, (s, c) in self.final_states.items()
        }
        return {
            "scenario": self.scenario,
            "iterations": self.iterations,
            "threshold": self.threshold,
            "default": run(self.default),
            "oracle": oracle,
            "online": online,
            "savings_online": self.savings_online,
            "savings_oracle": self.savings_oracle,
            "throughput_ratio_online": self.throughput_ratio_online,
            "throughput_ratio_oracle": self.throughput_ratio_oracle,
            "capture": self.capture,
            "peers": {
                peer.name: {
                    **run(peer.totals),
                    "setting": peer.setting,
                    "savings": self.savings(peer.totals),
                    "throughput_ratio": self.throughput_ratio(peer.totals),
                }
                for peer in self.peers
            },
            "runtime_s": self.runtime_s,
        }

    def table(self) -> str:
        """A table for people."""
        header = f"{'run':<21} {'J/valid token':>14} {'tokens/s':>10} {'savings':>8} {'throughput':>10}"
        rows = [
            f"scenario {self.scenario}, {self.iterations} iterations, threshold {self.threshold:.2f}",
            header,
        ]
        runs = [
            ("default", self.default),
            *((f"{peer.name.removeprefix('one ')} {peer.setting}", peer.totals) for peer in self.peers),
            ("oracle", self.oracle),
            ("online", self.online),
        ]
        for name, totals in runs:
            rows.append(
                f"{name:<21} {totals.energy_per_valid_token_j:>14.4f} "
                f"{totals.throughput_tokens_per_s:>10.1f} "
                f"{self.savings(totals):>8.1%} {self.throughput_ratio(totals):>10.3f}"
            )
        clocks = ", ".join(f"{k.value} {v or 'default'}" for k, v in self.oracle_sm_clocks_mhz.items())
        rows.append(f"oracle clocks (MHz): {clocks}")
        finals = ", ".join(
            f"{k.value} {s.value} at {c or 'default'}" for k, (s, c) in self.final_states.items()
        )
        rows.append(f"online final: {finals}")
        rows.append(
            f"exploration: {self.exploration_phases} phases, cost {self.exploration_cost_j / 1e3:.1f} kJ "
            f"in trials that missed the threshold; capture {self.capture:.3f}"
        )
        return "\n".join(rows)


def final_states(run: OnlineRun) -> dict[PhaseKind, tuple[ControllerState, int | None]]:
    """Each kind's last state and clock."""
    return {
        kind: (run.timeline.state[kind][-1], run.timeline.sm_clock_mhz[kind][-1])
        for kind in run.timeline.state
        if run.timeline.state[kind]
    }


def exploration_cost_j(run: OnlineRun) -> float:
    """The controllers' own count of energy spent on trials that missed the threshold."""
    seen: set[int] = set()
    total = 0.0
    for controller in run.controllers.values():
        if id(controller) in seen:
            continue
        seen.add(id(controller))
        total += sum(s.exploration_cost_j for s in controller.snapshot())
    return total
