"""What the live demo records: every phase the worker ran, beside the simulator's default-governor prediction.

Pure bookkeeping: a :class:`Record` collects one :class:`PhaseView` per phase (the worker's measurement,
the controller's state when the phase began, and what the default governor would have taken for the very
same iteration: common random numbers) and the daemon's own view at the end (Status, decisions), and
answers totals over any set of iterations. :func:`record_json` is the JSON the demo writes beside its plot.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eerl.phases import ControllerState, PhaseKind
from eerl.v1 import eerl_pb2 as pb

from demo.worker import KINDS, PhaseRun


@dataclass(slots=True)
class PhaseView:
    """One phase: the worker's measurement and the controller's state when the phase began."""

    run: PhaseRun
    state: ControllerState | None
    default_duration_s: float
    default_energy_j: float


@dataclass(slots=True)
class Totals:
    """Energy, simulated time and valid tokens over some iterations."""

    energy_j: float = 0.0
    duration_s: float = 0.0
    valid_tokens: int = 0

    def add(self, energy_j: float, duration_s: float, valid_tokens: int) -> None:
        """Accumulate one iteration."""
        self.energy_j += energy_j
        self.duration_s += duration_s
        self.valid_tokens += valid_tokens

    @property
    def energy_per_valid_token_j(self) -> float:
        """The figure of merit (NaN without tokens)."""
        return self.energy_j / self.valid_tokens if self.valid_tokens else math.nan

    @property
    def throughput_tokens_per_s(self) -> float:
        """Valid training tokens per simulated second (NaN without time)."""
        return self.valid_tokens / self.duration_s if self.duration_s > 0 else math.nan


@dataclass(frozen=True, slots=True)
class Overhead:
    """Live over predicted, for the same phases at the same clocks (1.0: none)."""

    time: float
    energy: float
    phases: int = 0


_NO_OVERHEAD = Overhead(1.0, 1.0)


@dataclass(slots=True)
class Record:
    """Everything the demo saw, in order."""

    phases: dict[tuple[int, PhaseKind], PhaseView] = field(default_factory=dict)
    session_id: str = ""
    final_status: pb.StatusResponse | None = None
    decisions: list[pb.Decision] = field(default_factory=list)
    reports: list[pb.SessionReport] = field(default_factory=list)
    """The daemon's report of the demo's job once its session closed (``eerlctl report``)."""

    def iterations(self) -> list[int]:
        """Iterations with both phases done."""
        return sorted(
            i for (i, kind) in self.phases if kind is PhaseKind.TRAINING and (i, KINDS[0]) in self.phases
        )

    def iteration(self, i: int) -> tuple[PhaseView, PhaseView]:
        """Generation and training of iteration ``i``."""
        return self.phases[(i, PhaseKind.GENERATION)], self.phases[(i, PhaseKind.TRAINING)]

    def totals(
        self,
        iterations: Sequence[int],
        *,
        default: bool,
        overhead: Mapping[PhaseKind, Overhead] | None = None,
    ) -> Totals:
        """Measured totals over ``iterations``; with ``default``, the simulator's default-governor prediction
        for the same iterations, times this run's ``overhead`` per phase kind when given."""
        totals = Totals()
        for i in iterations:
            views = self.iteration(i)
            if default:
                scale = [overhead.get(v.run.kind, _NO_OVERHEAD) if overhead else _NO_OVERHEAD for v in views]
                totals.add(
                    sum(v.default_energy_j * o.energy for v, o in zip(views, scale, strict=True)),
                    sum(v.default_duration_s * o.time for v, o in zip(views, scale, strict=True)),
                    views[1].run.workload.valid_tokens,
                )
            else:
                totals.add(
                    sum(v.run.energy_j for v in views),
                    sum(v.run.duration_s for v in views),
                    views[1].run.workload.valid_tokens,
                )
        return totals

    def committed_iterations(self) -> list[int]:
        """Iterations whose phases both ran a committed clock."""
        return [
            i
            for i in self.iterations()
            if all(
                v.state is ControllerState.COMMITTED and v.run.sm_lock_mhz is not None
                for v in self.iteration(i)
            )
        ]

    def overhead(self) -> dict[PhaseKind, Overhead]:
        """Per phase kind, live over predicted time and energy of the phases run under the default governor.

        Queuing a phase's work and the RPCs around it take wall time, which the speed-up turns into simulated
        seconds the simulator's prediction does not have; this measures how much, where both ran the same
        clocks.
        """
        result: dict[PhaseKind, Overhead] = {}
        for kind in KINDS:
            views = [
                v
                for v in self.phases.values()
                if v.run.kind is kind and v.run.sm_lock_mhz is None and v.default_duration_s > 0
            ]
            if views:
                result[kind] = Overhead(
                    time=sum(v.run.duration_s for v in views) / sum(v.default_duration_s for v in views),
                    energy=sum(v.run.energy_j for v in views) / sum(v.default_energy_j for v in views),
                    phases=len(views),
                )
        return result


def record_json(
    record: Record,
    *,
    scenario: str,
    controller: str,
    speedup: float,
    locked_after_stop: list[int] | None,
) -> dict[str, Any]:
    """The demo's JSON output (``eerl-demo.json``): the run's settings and every phase, in order."""
    phases = [
        {
            **json.loads(view.run.to_json()),
            "controller_state": view.state.value if view.state else None,
            "default_duration_s": view.default_duration_s,
            "default_energy_j": view.default_energy_j,
        }
        for view in record.phases.values()
    ]
    return {
        "scenario": scenario,
        "controller": controller,
        "speedup": speedup,
        "phases": phases,
        "locked_after_stop": locked_after_stop,
    }
