"""What the EE-RL controller costs per phase, and that its memory stays bounded over a long job.

``python -m perf.controller_cost [--scenario sync-h100] [--iterations 2000] [--seed 1]``

The controller runs inside the daemon (or the job's leader) once per phase: ``decide()`` when a phase
begins, ``observe()`` when it ends. This drives it through ``--iterations`` iterations of a built-in
scenario in virtual time (the bench's own run) and reports the wall time of each decide + observe pair —
median and p99 — and the memory the controller's code holds (tracemalloc, allocations made in
``eerl/control``) at a few points of the run: bounded means it stops growing.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
import tracemalloc
from collections.abc import Sequence

import numpy as np
from eerl.control.base import ControllerSettings, Decision, PhaseObservation
from eerl.phases import PhaseKind, Workload
from eerl_sim.bench.runner import ScenarioRun
from eerl_sim.bench.wrapped import WrappedController
from eerl_sim.scenario import load_scenario

CHECKPOINTS = (100, 500, 1000, 2000, 4000)
CONTROL_CODE = tracemalloc.Filter(True, "*eerl/control/*")


def held_kib() -> float:
    """KiB currently held by allocations made in the controller's code."""
    snapshot = tracemalloc.take_snapshot().filter_traces([CONTROL_CODE])
    return sum(stat.size for stat in snapshot.statistics("filename")) / 1024


class Timed(WrappedController):
    """The EE-RL controller with each decide + observe pair timed, and its memory read at checkpoints."""

    def __init__(self, settings: ControllerSettings, measure_memory: bool) -> None:
        super().__init__(settings)
        self._measure_memory = measure_memory
        self.pair_ns: list[int] = []
        self.memory_kib: dict[int, float] = {}
        self._pending_ns = 0

    def decide(self, kind: PhaseKind, iteration: int, hints: Workload | None, now_s: float) -> Decision:
        start = time.perf_counter_ns()
        decision = self.inner.decide(kind, iteration, hints, now_s)
        self._pending_ns = time.perf_counter_ns() - start
        return decision

    def observe(self, observation: PhaseObservation, now_s: float) -> Decision | None:
        start = time.perf_counter_ns()
        verdict = self.inner.observe(observation, now_s)
        self.pair_ns.append(self._pending_ns + time.perf_counter_ns() - start)
        done = observation.iteration + 1
        if self._measure_memory and done in CHECKPOINTS and done not in self.memory_kib:
            self.memory_kib[done] = held_kib()
        return verdict


def drive(run: ScenarioRun, *, measure_memory: bool) -> Timed:
    """One online run of the scenario; the (first) controller, with its timings or memory readings."""
    controllers: list[Timed] = []

    def factory(settings: ControllerSettings) -> Timed:
        controllers.append(Timed(settings, measure_memory))
        return controllers[-1]

    run.run_online(factory, 0.95)
    return controllers[0]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="sync-h100")
    parser.add_argument("--iterations", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    base = load_scenario(args.scenario)
    scenario = dataclasses.replace(base, workload=dataclasses.replace(base.workload, seed=args.seed))
    run = ScenarioRun(scenario, iterations=args.iterations)
    timed = drive(run, measure_memory=False)
    pairs_ms = np.array(timed.pair_ns) / 1e6
    print(f"{args.scenario}, seed {args.seed}, {args.iterations} iterations, {len(pairs_ms)} phases")
    print(
        f"decide + observe: median {np.median(pairs_ms):.3f} ms, p99 {np.percentile(pairs_ms, 99):.3f} ms, "
        f"max {pairs_ms.max():.3f} ms"
    )
    tracemalloc.start()
    measured = drive(run, measure_memory=True)  # a second run: tracemalloc slows every call down
    tracemalloc.stop()
    for iteration, kib in sorted(measured.memory_kib.items()):
        print(f"held by the controller after {iteration:5d} iterations: {kib:7.1f} KiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
