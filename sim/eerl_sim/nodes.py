"""The multi-node model of the sim-model spec ("Nodes"): many nodes run the same iteration, in sync.

``count`` nodes of ``gpus`` GPUs each run the scenario's iteration (the same sampled segments: common random
numbers across nodes and policies). What differs per node, all drawn from the scenario's seed only:

* a speed factor ``s_n`` (log-normal, σ ``speed_sigma``; silicon, cooling and power-delivery spread), fixed
  for the run, that multiplies every segment's duration on the node;
* per node and phase, with probability ``straggle_probability``, a straggle factor drawn uniformly from
  ``straggle_factor``;
* per GPU and phase, one log-normal factor on its duration and one on its power (phase-level noise,
  σ ``noise_phase_duration`` and ``noise_phase_power``), shared by all the phase's segments.

A phase of the job ends when its slowest node ends; nodes (and GPUs) that finish early wait at idle power.
The single-node physics prices the segments once per GPU at every grid clock (the per-GPU busy time and
energy of :func:`eerl_sim.evaluate.evaluate_phase`); a node's GPU then takes ``busy · k`` seconds and
``energy · k · p`` joules at that clock (``k`` its duration factor, ``p`` its power factor), so any clock per
node costs an index, not a re-evaluation. Like the sweep, the model leaves out the 15 ms clock-switch window.

**Metering as the daemon does.** Each GPU has its own energy counter (:class:`eerl_sim.meter.EnergyCounters`,
as in the single-node bench), advancing in steps of ``energy_counter_period_ms`` (each GPU's steps at its own
fixed offset); a node's phase energy is the difference of two reads, at the phase's start and at the job's
phase end (the node's daemon meters until the phase ends, idle wait included), so the job's energy is the sum
of the nodes'. The energy of the last partial step of one phase is read by the next phase: over a run the
readings (:func:`meter_nodes`) telescope to the true total. A node's reported duration is its own (its
slowest GPU's end): what that node's hook sees.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from eerl.phases import PhaseKind, Workload

from eerl_sim.meter import EnergyCounters
from eerl_sim.scenario import NodesSpec
from eerl_sim.workload import BoolArray, FloatArray, IntArray, iteration_rng

NODE_SPEED_STREAM = 3
"""Stream of the per-run draws (speed factors, counter offsets); per-phase draws use streams 4 and 5."""
_PHASE_STREAM = {PhaseKind.GENERATION: 4, PhaseKind.TRAINING: 5}


@dataclass(frozen=True, slots=True, eq=False)
class NodeDraws:
    """The per-run draws of the nodes: speed factors ``[node]`` and counter step offsets ``[node, gpu]``."""

    speed: FloatArray
    counter_offset_s: FloatArray


def draw_nodes(spec: NodesSpec, seed: int, counter_period_s: float) -> NodeDraws:
    """The nodes' speed factors and counter offsets; depends on (spec, seed) only."""
    rng = iteration_rng(seed, 0, NODE_SPEED_STREAM)
    speed = np.exp(spec.speed_sigma * rng.standard_normal(spec.count))
    offsets = rng.uniform(0.0, counter_period_s, size=(spec.count, spec.gpus))
    return NodeDraws(speed, offsets)


@dataclass(frozen=True, slots=True, eq=False)
class NodePhaseFactors:
    """One phase of one iteration on every node: per GPU the factor on its duration (speed × straggle ×
    phase noise) and on its power, ``[node, gpu]``; which nodes straggle, ``[node]``."""

    duration: FloatArray
    power: FloatArray
    straggling: BoolArray


def phase_factors(
    spec: NodesSpec, draws: NodeDraws, seed: int, iteration: int, kind: PhaseKind
) -> NodePhaseFactors:
    """The node factors of one phase; depends on (spec, seed, iteration, kind) only (fixed draw order)."""
    rng = iteration_rng(seed, iteration, _PHASE_STREAM[kind])
    shape = (spec.count, spec.gpus)
    straggling = rng.uniform(size=spec.count) < spec.straggle_probability
    low, high = spec.straggle_factor
    straggle = np.where(straggling, rng.uniform(low, high, size=spec.count), 1.0)
    duration_noise = np.exp(spec.noise_phase_duration * rng.standard_normal(shape))
    power_noise = np.exp(spec.noise_phase_power * rng.standard_normal(shape))
    duration = duration_noise * (draws.speed * straggle)[:, None]
    return NodePhaseFactors(duration, power_noise, straggling)


@dataclass(frozen=True, slots=True, eq=False)
class NodePhaseTable:
    """One phase of one iteration: one node's GPUs priced at every grid clock (``[gpu, clock]``, busy
    seconds and busy joules, no idle) and the nodes' factors."""

    kind: PhaseKind
    busy_s: FloatArray
    energy_j: FloatArray
    factors: NodePhaseFactors
    workload: Workload
    """One node's workload."""


@dataclass(frozen=True, slots=True, eq=False)
class NodesOutcome:
    """A phase of the job at one clock per node (true values, ``[node]`` unless noted)."""

    busy_s: FloatArray
    """``[node, gpu]``: each GPU's busy time."""
    busy_energy_j: FloatArray
    """``[node, gpu]``: each GPU's energy while busy."""
    node_duration_s: FloatArray
    """When each node's slowest GPU ended: the node's own phase time."""
    duration_s: float
    """The job's phase: its slowest node."""
    energy_j: FloatArray
    """Each node's energy over the job's phase, idle waits included."""

    @property
    def total_energy_j(self) -> float:
        """The job's phase energy: the sum over nodes."""
        return float(self.energy_j.sum())


def price_nodes(table: NodePhaseTable, clock_index: IntArray, idle_power_w: float) -> NodesOutcome:
    """The phase with node ``n`` at grid column ``clock_index[n]``."""
    factors = table.factors
    busy = table.busy_s[:, clock_index].T * factors.duration
    busy_energy = table.energy_j[:, clock_index].T * factors.duration * factors.power
    node_duration = busy.max(axis=1) if busy.size else np.zeros(len(clock_index))
    duration = float(node_duration.max()) if len(node_duration) else 0.0
    energy = (busy_energy + idle_power_w * (duration - busy)).sum(axis=1)
    return NodesOutcome(busy, busy_energy, node_duration, duration, energy)


def uniform_job_phase(table: NodePhaseTable, idle_power_w: float) -> tuple[FloatArray, FloatArray]:
    """The job's phase duration and energy with every node at the same clock, for every grid clock."""
    factors = table.factors
    busy = table.busy_s[None, :, :] * factors.duration[:, :, None]
    busy_energy = table.energy_j[None, :, :] * (factors.duration * factors.power)[:, :, None]
    duration = busy.max(axis=(0, 1))
    gpus = busy.shape[0] * busy.shape[1]
    energy = busy_energy.sum(axis=(0, 1)) + idle_power_w * (gpus * duration - busy.sum(axis=(0, 1)))
    return duration, energy


def node_counters(draws: NodeDraws, period_s: float, idle_power_w: float) -> EnergyCounters:
    """The energy counters of every GPU of every node, as one bank (node-major: ``[node * gpu]``)."""
    return EnergyCounters(draws.counter_offset_s.ravel(), period_s, idle_power_w)


def meter_nodes(counters: EnergyCounters, outcome: NodesOutcome) -> FloatArray:
    """Run a phase of the job through the counters of :func:`node_counters`: each node's phase energy as its
    daemon reads it, its GPUs' counter differences summed (``[node]``)."""
    per_gpu = counters.meter(outcome.duration_s, outcome.busy_s.ravel(), outcome.busy_energy_j.ravel())
    per_node: FloatArray = per_gpu.reshape(outcome.busy_s.shape).sum(axis=1)
    return per_node
