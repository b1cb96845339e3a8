"""``eerl-bench multinode``: policies for a multi-node job side by side, on the same draws, in virtual time.

The job runs the scenario's ``[workload.nodes]`` model (:mod:`eerl_sim.nodes`): every node the same
iteration, each with its speed factor, stragglers and phase noise, a phase lasting as long as its slowest
node. Each iteration is priced once at every grid clock; each policy then pays for the clocks it chose:

* ``default`` — the default governor everywhere;
* ``oracle`` — the best uniform fixed (generation, training) pair of the whole run at the threshold, found on
  the job's own sweep as the single-node oracle is;
* ``independent`` — one EE-RL controller per node, fed its own node's duration and energy, as each node's
  daemon alone would run it (each node's clocks are its own; the job waits for the slowest node);
* ``job`` — one :class:`eerl.job.JobController` for the job: one directive per phase for every node, fed the
  nodes' reports (median duration, summed energy, the driver's tokens) and the iteration's wall time.

Controllers see what the daemons would report: durations from the (virtual) wall clock, energy as the
difference of two energy-counter reads, no hints about the phase to come. Figures (savings of energy per
valid token, throughput against the default's) use the true energy of the whole job, idle waits included.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from eerl.control.base import Controller, ControllerSettings, PhaseObservation
from eerl.control.registry import DEFAULT_CONTROLLER, controller_factory
from eerl.directives import DirectiveVerdict
from eerl.job.controller import JobController, NodeReport
from eerl.phases import ExecutionMode, PhaseKind, Workload

from eerl_sim.bench.runner import RunTotals, best_pair
from eerl_sim.evaluate import evaluate_phase, sample_iteration
from eerl_sim.nodes import (
    NodeDraws,
    NodePhaseTable,
    NodesOutcome,
    draw_nodes,
    meter_nodes,
    node_counters,
    phase_factors,
    price_nodes,
    uniform_job_phase,
)
from eerl_sim.pricing import clock_grid, clock_index
from eerl_sim.scenario import NodesSpec, Scenario
from eerl_sim.sweep import KINDS, pair_totals
from eerl_sim.workload import FloatArray
from eerld.errors import ConfigError

ControllerFactory = Callable[[ControllerSettings], Controller]

POLICIES = ("default", "oracle", "independent", "job")
Progress = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class PolicyFigures:
    """One policy's run against the default governor on the same draws."""

    savings: float
    throughput_ratio: float
    energy_per_valid_token_j: float

    def to_json(self) -> dict[str, float]:
        """The JSON of one policy (the keys of the issue's schema)."""
        return {
            "savings": self.savings,
            "throughput_ratio": self.throughput_ratio,
            "energy_per_valid_token_j": self.energy_per_valid_token_j,
        }


@dataclass(frozen=True, slots=True)
class MultinodeReport:
    """One scenario at one seed: every policy's figures."""

    scenario: str
    nodes: int
    seed: int
    iterations: int
    policies: dict[str, PolicyFigures]
    runtime_s: float = 0.0

    @property
    def capture(self) -> float:
        """Job savings over oracle savings (0 when the oracle saves nothing)."""
        return self.capture_of("job")

    def capture_of(self, policy: str) -> float:
        """A policy's savings over the oracle's (0 when the oracle saves nothing)."""
        oracle = self.policies["oracle"].savings
        return self.policies[policy].savings / oracle if oracle > 0 else 0.0

    def to_json(self) -> dict[str, object]:
        """``{"scenario", "nodes", "seed", "policies": {name: figures}}``."""
        return {
            "scenario": self.scenario,
            "nodes": self.nodes,
            "seed": self.seed,
            "policies": {name: figures.to_json() for name, figures in self.policies.items()},
        }


def with_nodes(scenario: Scenario, nodes: int | None) -> Scenario:
    """The scenario with another node count (``--nodes``)."""
    spec = scenario.workload.nodes
    if spec is None:
        raise ConfigError(f"{scenario.source}: not a multi-node scenario (it has no [workload.nodes] table)")
    if nodes is None:
        return scenario
    if nodes < 1:
        raise ConfigError("--nodes must be at least 1")
    workload = dataclasses.replace(scenario.workload, nodes=dataclasses.replace(spec, count=nodes))
    return dataclasses.replace(scenario, workload=workload)


def job_workload(workload: Workload, nodes: int) -> Workload:
    """The job's workload: every node's (the same iteration on each), summed; the longest response and the
    busiest worker's KV reads are one node's."""
    return Workload(
        tokens=workload.tokens * nodes,
        valid_tokens=workload.valid_tokens * nodes,
        sequences=workload.sequences * nodes,
        max_response_tokens=workload.max_response_tokens,
        prompt_tokens=workload.prompt_tokens * nodes,
        max_worker_kv_tokens=workload.max_worker_kv_tokens,
    )


class MultinodeRun:
    """A multi-node scenario's priced iterations, shared by every policy on it."""

    def __init__(self, scenario: Scenario, iterations: int | None = None) -> None:
        spec = scenario.workload.nodes
        if spec is None or scenario.workload.mode is not ExecutionMode.SYNC:
            raise ConfigError(f"{scenario.source}: multinode needs a sync scenario with [workload.nodes]")
        self.scenario = scenario
        self.spec: NodesSpec = spec
        self.iterations = scenario.workload.iterations if iterations is None else iterations
        profile = scenario.gpu
        self.clocks = tuple(int(c) for c in clock_grid(profile).sm_clocks_mhz)
        self.top = len(self.clocks) - 1
        self.idle_w = profile.idle_power_w
        self.period_s = profile.energy_counter_period_ms / 1000.0
        self.draws: NodeDraws = draw_nodes(spec, scenario.workload.seed, self.period_s)
        self._tables: list[dict[PhaseKind, NodePhaseTable]] = []
        self.valid_tokens = np.zeros(self.iterations, dtype=np.int64)
        self.uniform_duration = {k: np.zeros((self.iterations, len(self.clocks))) for k in KINDS}
        self.uniform_energy = {k: np.zeros((self.iterations, len(self.clocks))) for k in KINDS}

    def price(self, progress: Progress | None = None) -> None:
        """Sample and price every iteration at every grid clock (once)."""
        if self._tables:
            return
        requested: list[int | None] = list(self.clocks)
        seed = self.scenario.workload.seed
        for i in range(self.iterations):
            sample = sample_iteration(self.scenario, i)
            tables = {}
            for kind in KINDS:
                priced = evaluate_phase(self.scenario, sample, kind, requested)
                factors = phase_factors(self.spec, self.draws, seed, i, kind)
                table = NodePhaseTable(
                    kind, priced.gpu_busy_s, priced.gpu_busy_energy_j, factors, priced.workload
                )
                tables[kind] = table
                duration, job_energy = uniform_job_phase(table, self.idle_w)
                self.uniform_duration[kind][i] = duration
                self.uniform_energy[kind][i] = job_energy
            self._tables.append(tables)
            self.valid_tokens[i] = sample.valid_tokens * self.spec.count
            if progress is not None:
                progress(1)

    def table(self, iteration: int, kind: PhaseKind) -> NodePhaseTable:
        """The priced phase (after :meth:`price`)."""
        return self._tables[iteration][kind]

    # ------------------------------------------------------------------ fixed policies

    def fixed_totals(self, pair: tuple[int, int]) -> RunTotals:
        """The job at grid columns (generation, training) on every node."""
        g, t = pair
        gen, train = PhaseKind.GENERATION, PhaseKind.TRAINING
        wall = self.uniform_duration[gen][:, g].sum() + self.uniform_duration[train][:, t].sum()
        energy = self.uniform_energy[gen][:, g].sum() + self.uniform_energy[train][:, t].sum()
        return RunTotals(float(energy), float(wall), int(self.valid_tokens.sum()))

    def default_totals(self) -> RunTotals:
        """The default governor on every node (the top grid column)."""
        return self.fixed_totals((self.top, self.top))

    def oracle(self, threshold: float) -> tuple[tuple[int, int], RunTotals]:
        """The best uniform fixed pair meeting the threshold on the whole run."""
        gen, train = PhaseKind.GENERATION, PhaseKind.TRAINING
        energy, wall = pair_totals(
            self.scenario,
            self.uniform_duration[gen],
            self.uniform_energy[gen],
            self.uniform_duration[train],
            self.uniform_energy[train],
        )
        pair = best_pair(energy, wall, self.default_totals().wall_s, threshold)
        return pair, self.fixed_totals(pair)

    # ------------------------------------------------------------------ online policies

    def _settings(self, threshold: float) -> ControllerSettings:
        return ControllerSettings(self.clocks, KINDS, ExecutionMode.SYNC, threshold)

    def _column(self, sm_clock_mhz: int | None) -> int:
        return clock_index(self.scenario.gpu, sm_clock_mhz)

    def run_independent(self, threshold: float, progress: Progress | None = None) -> RunTotals:
        """A controller per node, each fed its own node's duration and metered energy."""
        factory = controller_factory(DEFAULT_CONTROLLER)
        nodes = self.spec.count
        controllers = [factory(self._settings(threshold)) for _ in range(nodes)]
        counters = node_counters(self.draws, self.period_s, self.idle_w)
        now_s = energy_total = wall_total = 0.0
        for i in range(self.iterations):
            for kind in KINDS:
                table = self.table(i, kind)
                chosen = [c.decide(kind, i, None, now_s).sm_clock_mhz for c in controllers]
                columns = np.array([self._column(c) for c in chosen], dtype=np.int64)
                outcome = price_nodes(table, columns, self.idle_w)
                measured = meter_nodes(counters, outcome)
                now_s += outcome.duration_s
                for n, controller in enumerate(controllers):
                    controller.observe(
                        PhaseObservation(
                            kind=kind,
                            iteration=i,
                            workload=table.workload,
                            duration_s=float(outcome.node_duration_s[n]),
                            energy_j=float(measured[n]),
                            sm_clock_mhz=chosen[n],
                            gpus=self.spec.gpus,
                            end_time_s=now_s,
                        ),
                        now_s,
                    )
                wall_total += outcome.duration_s
                energy_total += outcome.total_energy_j
            if progress is not None:
                progress(1)
        return RunTotals(energy_total, wall_total, int(self.valid_tokens.sum()))

    def run_job(
        self, threshold: float, progress: Progress | None = None, controller: ControllerFactory | None = None
    ) -> RunTotals:
        """One job-level controller: the same directive on every node, fed the nodes' reports (over
        ``controller``'s controller where given, else the default job tuning)."""
        nodes = self.spec.count
        settings = self._settings(threshold)
        inner = None if controller is None else controller(settings)
        job = (
            JobController(settings, nodes)
            if inner is None
            else JobController(settings, nodes, controller=inner)
        )
        counters = node_counters(self.draws, self.period_s, self.idle_w)
        now_s = energy_total = wall_total = 0.0
        for i in range(self.iterations):
            iteration_wall = 0.0
            for kind in KINDS:
                table = self.table(i, kind)
                directive = job.plan(kind, i, now_s)
                columns = np.full(nodes, self._column(directive.sm_clock_mhz), dtype=np.int64)
                outcome = price_nodes(table, columns, self.idle_w)
                measured = meter_nodes(counters, outcome)
                now_s += outcome.duration_s
                reports = _reports(
                    outcome,
                    measured,
                    epoch=directive.epoch,
                    sm_clock_mhz=directive.sm_clock_mhz,
                    iteration=i,
                    kind=kind,
                    spec=self.spec,
                )
                job.observe(kind, i, reports, job_workload(table.workload, nodes), now_s)
                iteration_wall += outcome.duration_s
                energy_total += outcome.total_energy_j
            wall_total += iteration_wall
            job.end_iteration(i, iteration_wall, int(self.valid_tokens[i]), now_s)
            if progress is not None:
                progress(1)
        return RunTotals(energy_total, wall_total, int(self.valid_tokens.sum()))


def _reports(
    outcome: NodesOutcome,
    measured: FloatArray,
    *,
    epoch: int,
    sm_clock_mhz: int | None,
    iteration: int,
    kind: PhaseKind,
    spec: NodesSpec,
) -> list[NodeReport]:
    """Every node's report of a phase that every daemon accepted."""
    return [
        NodeReport(
            node_rank=n,
            session_epoch=1,
            iteration=iteration,
            kind=kind,
            applied_epoch=epoch,
            sm_clock_mhz=sm_clock_mhz,
            verdict=DirectiveVerdict.ACCEPTED,
            duration_s=float(outcome.node_duration_s[n]),
            energy_j=float(measured[n]),
            gpus=spec.gpus,
        )
        for n in range(spec.count)
    ]


def figures(run: RunTotals, default: RunTotals) -> PolicyFigures:
    """Savings and throughput of a run against the default's."""
    per_token = run.energy_per_valid_token_j
    return PolicyFigures(
        savings=1.0 - per_token / default.energy_per_valid_token_j,
        throughput_ratio=run.throughput_tokens_per_s / default.throughput_tokens_per_s,
        energy_per_valid_token_j=per_token,
    )


def run_multinode(
    scenario: Scenario,
    threshold: float,
    iterations: int | None = None,
    progress: Progress | None = None,
) -> MultinodeReport:
    """Every policy on one multi-node scenario (its seed as given)."""
    started = time.perf_counter()
    run = MultinodeRun(scenario, iterations)
    run.price(progress)
    default = run.default_totals()
    _, oracle = run.oracle(threshold)
    totals = {
        "default": default,
        "oracle": oracle,
        "independent": run.run_independent(threshold),
        "job": run.run_job(threshold),
    }
    return MultinodeReport(
        scenario=scenario.name,
        nodes=run.spec.count,
        seed=scenario.workload.seed,
        iterations=run.iterations,
        policies={name: figures(value, default) for name, value in totals.items()},
        runtime_s=time.perf_counter() - started,
    )
