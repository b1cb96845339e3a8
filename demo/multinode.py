"""``make demo-multinode`` (``python -m demo.multinode``): one clock decision per job, across a Ray cluster.

A local Ray cluster (``ray.cluster_utils.Cluster``) of ``--nodes`` simulated nodes, each with its own
``eerld`` on the sim backend (its own sockets, ledger and simulated GPUs; ``python -m demo.daemon``), and a
simulated synchronous RL job driven from this process, the Ray driver, through :class:`eerl.ray.RayJob`:
one node agent per node holds that node's job-mode session, and one job-level controller (here, in the
driver) plans every phase's clock for all nodes.

Per node, a worker actor pinned to the node runs the scenario's sampled iteration on that node's simulated
GPUs, slowed by the node's own speed factor and stragglers (the ``[workload.nodes]`` model of
``eerl_sim.nodes``); a phase ends when its slowest node is done. The job runs twice on the same draws:
under ``policy=off`` (every phase at the default governor: the baseline) and under the EE-RL controller.
It ends with a summary table and ``out/demo-multinode/summary.json``: ``nodes``, ``same_clock_every_phase``
(every node applied the same directive in every phase), ``savings``, ``throughput_ratio``,
``gpus_locked_after_stop`` and the fan-out's cost per phase (p50, p99, as a fraction of the phase's wall
time) for the main run and for each ``--fanout-nodes`` count (a short job on a cluster of that size).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import ray
from eerl.phases import PhaseKind
from eerl.ray import RayJob
from eerl_sim.evaluate import IterationSample, sample_iteration
from eerl_sim.gpu import SimDevice, open_sim_device
from eerl_sim.nodes import NodeDraws, draw_nodes, phase_factors
from eerl_sim.scenario import Scenario, load_scenario
from ray.cluster_utils import Cluster
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from demo.daemon import PARENT_ENV
from soak.daemon import DaemonProcess

ROOT = Path(__file__).resolve().parents[1]
KINDS = (PhaseKind.GENERATION, PhaseKind.TRAINING)
BASE_SCENARIO = "multinode-4-h100"
DEFAULT_NODES = 4
DEFAULT_GPUS = 2
DEFAULT_ITERATIONS = 40
DEFAULT_SPEEDUP = 100.0
DEFAULT_FANOUT_ITERATIONS = 6
OBJECT_STORE_BYTES = 80 * 1024 * 1024
DEADLINE_S = 1.0

log = logging.getLogger("demo.multinode")


def demo_scenario(nodes: int, gpus: int, iterations: int) -> Scenario:
    """The built-in multi-node H100 job scaled to ``gpus`` simulated GPUs per node (same work per GPU)."""
    base = load_scenario(BASE_SCENARIO)
    spec = base.workload
    assert spec.nodes is not None
    generation = replace(spec.generation, prompts=max(1, spec.generation.prompts * gpus // spec.gpus))
    workload = replace(
        spec,
        gpus=gpus,
        iterations=iterations,
        generation=generation,
        nodes=replace(spec.nodes, count=nodes, gpus=gpus),
    )
    return replace(base, workload=workload)


# ---- the simulated nodes ------------------------------------------------------------------------------


def node_daemon(directory: Path, gpus: int, speedup: float) -> DaemonProcess:
    """One node's eerld (``python -m demo.daemon``: eerld on the sim backend, no fsync) in its own folder,
    with no controller of its own, stopping with the demo."""
    return DaemonProcess(
        directory,
        gpus,
        sim_speedup=speedup,
        controller="off",
        extra_args=["--sim-profile=h100-sxm"],
        env={PARENT_ENV: str(os.getpid())},
        module="demo.daemon",
    )


def locked_gpus(daemon: DaemonProcess) -> int:
    """GPUs whose SM clock is locked, as the simulated hardware holds it."""
    return sum(lock is not None for lock in daemon.hardware_locks())


def locked_after_close(daemons: Sequence[DaemonProcess], patience_s: float = 5.0) -> int:
    """GPUs still locked on any node once the job's sessions closed (0 is right): polled until none is, or
    ``patience_s`` has passed (the daemons reset a closed session's GPUs as its close arrives)."""
    deadline_s = time.monotonic() + patience_s
    while (locked := sum(locked_gpus(daemon) for daemon in daemons)) and time.monotonic() < deadline_s:
        time.sleep(0.02)
    return locked


class SimNodeWorkerImpl:
    """A node's share of the RL job: each phase's segments on the node's simulated GPUs (a Ray actor)."""

    def __init__(self, nodes: int, gpus: int, iterations: int, node: int, sim_state: str) -> None:
        self.scenario = demo_scenario(nodes, gpus, iterations)
        spec = self.scenario.workload
        assert spec.nodes is not None
        self.nodes_spec = spec.nodes
        self.node = node
        self.device: SimDevice = open_sim_device(Path(sim_state), durable_writes=False)
        self.draws: NodeDraws = draw_nodes(self.nodes_spec, spec.seed, 0.1)
        self._sample: IterationSample | None = None

    def run(self, iteration: int, kind: PhaseKind) -> float:
        """Runs the phase's work on every GPU of the node at whatever clock holds; how long the node's
        slowest GPU took, simulated seconds."""
        if self._sample is None or self._sample.iteration != iteration:
            self._sample = sample_iteration(self.scenario, iteration)
        segments = self._sample.phase(kind).segments
        factors = phase_factors(self.nodes_spec, self.draws, self.scenario.workload.seed, iteration, kind)
        tickets = []
        start_s = self.device.now_s()
        for gpu in range(segments.gpus):
            rows = slice(int(segments.gpu_bounds[gpu]), int(segments.gpu_bounds[gpu + 1]))
            if rows.stop <= rows.start:
                continue
            tickets.append(
                self.device.submit_segments(
                    gpu,
                    segments.compute_mhz_s[rows],
                    segments.memory_s[rows],
                    segments.mem_activity_scale[rows],
                    segments.duration_noise[rows] * factors.duration[self.node, gpu],
                    segments.power_noise[rows] * factors.power[self.node, gpu],
                )
            )
        ends = [self.device.wait(ticket).end_s for ticket in tickets]
        return max(ends, default=start_s) - start_s


SimNodeWorker: Any = ray.remote(num_cpus=0, max_restarts=0)(SimNodeWorkerImpl)


@dataclass
class SimCluster:
    """The Ray cluster and its nodes' daemons."""

    nodes: int
    gpus: int
    iterations: int
    speedup: float
    root: Path
    daemons: list[DaemonProcess] = field(default_factory=list)
    cluster: Any = None
    node_ids: list[str] = field(default_factory=list)
    workers: list[Any] = field(default_factory=list)
    started_s: float = 0.0
    locked_after_stop: int = 0

    def start(self) -> None:
        began = time.monotonic()
        for index in range(self.nodes):
            directory = self.root / f"node{index}"
            directory.mkdir(parents=True)
            daemon = node_daemon(directory, self.gpus, self.speedup)
            self.daemons.append(daemon)
            daemon.launch()
        for daemon in self.daemons:
            daemon.wait_ready(60.0)

        def node_args(daemon: DaemonProcess) -> dict[str, Any]:
            return {
                "num_cpus": 1,
                "num_gpus": self.gpus,
                "object_store_memory": OBJECT_STORE_BYTES,
                "env_vars": {"EERL_SOCKET": str(daemon.socket_path), "PYTHONPATH": str(ROOT)},
            }

        self.cluster = Cluster(
            initialize_head=True, head_node_args={**node_args(self.daemons[0]), "include_dashboard": False}
        )
        ray_nodes = [self.cluster.head_node]
        ray_nodes += [self.cluster.add_node(**node_args(daemon)) for daemon in self.daemons[1:]]
        self.cluster.wait_for_nodes()
        ray.init(
            address=self.cluster.address,
            log_to_driver=False,
            include_dashboard=False,
            runtime_env={"env_vars": {"PYTHONPATH": str(ROOT)}},
        )
        self.node_ids = [str(node.node_id) for node in ray_nodes]
        self.workers = [
            SimNodeWorker.options(
                scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
            ).remote(self.nodes, self.gpus, self.iterations, index, str(daemon.state_file))
            for index, (node_id, daemon) in enumerate(zip(self.node_ids, self.daemons, strict=True))
        ]
        self.started_s = time.monotonic() - began

    def stop(self) -> int:
        """Shuts down Ray and the daemons; the GPUs left locked on every node (0 is right)."""
        for worker in self.workers:
            with contextlib.suppress(Exception):
                ray.kill(worker)
        if ray.is_initialized():
            ray.shutdown()
        if self.cluster is not None:
            self.cluster.shutdown()
        for daemon in self.daemons:
            daemon.stop()
        self.locked_after_stop = sum(locked_gpus(daemon) for daemon in self.daemons)
        return self.locked_after_stop


@contextlib.contextmanager
def sim_cluster(nodes: int, gpus: int, iterations: int, speedup: float) -> Iterator[SimCluster]:
    root = Path(tempfile.mkdtemp(prefix="eerl-mn-", dir="/tmp"))  # Unix socket paths must be short
    cluster = SimCluster(nodes, gpus, iterations, speedup, root)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


# ---- the job ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PhaseRow:
    """One phase of the job as the driver saw it."""

    iteration: int
    kind: str
    sim_s: float
    """Simulated seconds from the phase's begin to its end as the driver saw it (fan-outs and Ray's
    dispatch included: at a high speed-up its wall-time jitter weighs many simulated seconds)."""
    work_s: float
    """Simulated seconds of the slowest node's GPU work: how long the phase lasts on the GPUs."""
    wall_s: float
    fanout_s: float
    """Wall seconds of the begin and end fan-outs together."""
    energy_j: float
    """The nodes' metered energy, summed (their daemons' EndPhase)."""
    clocks: tuple[int | None, ...]
    """The SM clock each node's daemon applied, by node."""
    verdicts: tuple[str, ...]
    answered: int
    valid_tokens: int


@dataclass
class RunResult:
    policy: str
    phases: list[PhaseRow]
    started_s: float
    locked_after_close: int
    committed: dict[str, int | None]

    @property
    def sim_s(self) -> float:
        return sum(p.sim_s for p in self.phases)

    @property
    def work_s(self) -> float:
        return sum(p.work_s for p in self.phases)

    @property
    def energy_j(self) -> float:
        return sum(p.energy_j for p in self.phases)

    @property
    def valid_tokens(self) -> int:
        return sum(p.valid_tokens for p in self.phases)

    def same_clock_every_phase(self, nodes: int) -> bool:
        return all(
            p.answered == nodes and len(set(p.clocks)) == 1 and len(set(p.verdicts)) == 1 for p in self.phases
        )

    def fanout_fraction(self) -> dict[str, float]:
        fractions = np.array([p.fanout_s / p.wall_s for p in self.phases if p.wall_s > 0])
        costs = np.array([p.fanout_s for p in self.phases])
        # Of the simulated phase: what the fan-out would cost a real job whose phase lasts that long.
        of_sim = np.array([p.fanout_s / p.work_s for p in self.phases if p.work_s > 0])
        return {
            "p50": float(np.percentile(fractions, 50)),
            "p99": float(np.percentile(fractions, 99)),
            "p50_of_simulated_phase": float(np.percentile(of_sim, 50)),
            "p99_of_simulated_phase": float(np.percentile(of_sim, 99)),
            "p50_s": float(np.percentile(costs, 50)),
            "p99_s": float(np.percentile(costs, 99)),
            "phase_wall_p50_s": float(np.median([p.wall_s for p in self.phases])),
        }


def run_job(cluster: SimCluster, policy: str, iterations: int, *, progress: bool = True) -> RunResult:
    """``iterations`` iterations of the job, every phase through :class:`RayJob`, under ``policy``."""
    clock_device = open_sim_device(cluster.daemons[0].state_file, durable_writes=False)
    scenario = demo_scenario(cluster.nodes, cluster.gpus, iterations)
    began = time.monotonic()
    job = RayJob(
        job_id=f"demo-multinode-{policy}",
        node_ids=cluster.node_ids,
        policy=policy,
        deadline_s=DEADLINE_S,
        clock=clock_device.now_s,
    )
    started_s = time.monotonic() - began
    rows: list[PhaseRow] = []
    try:
        for iteration in range(iterations):
            sample = sample_iteration(scenario, iteration)
            for kind in KINDS:
                workload = sample.phase(kind).workload
                fanouts_before = len(job.fanouts)
                wall0, sim0 = time.monotonic(), clock_device.now_s()
                with job.phase(kind, iteration) as phase:
                    work = ray.get([worker.run.remote(iteration, kind) for worker in cluster.workers])
                    phase.report(**asdict(workload))
                wall1, sim1 = time.monotonic(), clock_device.now_s()
                by_rank = {b.node_rank: b for b in job.last_begins}
                rows.append(
                    PhaseRow(
                        iteration=iteration,
                        kind=kind.value,
                        sim_s=sim1 - sim0,
                        work_s=max(work),
                        wall_s=wall1 - wall0,
                        fanout_s=sum(f.seconds for f in job.fanouts[fanouts_before:]),
                        energy_j=sum(r.energy_j for r in job.last_reports),
                        clocks=tuple(
                            by_rank[r].sm_clock_mhz if r in by_rank else -1 for r in range(job.nodes)
                        ),
                        verdicts=tuple(
                            by_rank[r].verdict.value if r in by_rank else "absent" for r in range(job.nodes)
                        ),
                        answered=sum(1 for r in job.last_reports if r.gpus > 0),
                        valid_tokens=workload.valid_tokens,
                    )
                )
            if progress:
                last = rows[-2:]
                print(
                    f"  {policy:>4} iteration {iteration:3d}: "
                    + "  ".join(f"{p.kind[:3]} {_clock(p.clocks[0]):>8} {p.work_s:6.1f} s" for p in last),
                    flush=True,
                )
        committed: dict[str, int | None] = {}
        controller = job.controller
        if controller is not None and hasattr(controller, "snapshot"):
            for snap in controller.snapshot():
                committed[snap.kind.value] = snap.sm_clock_mhz
    finally:
        job.close()
    return RunResult(policy, rows, started_s, locked_after_close(cluster.daemons), committed)


def _clock(mhz: int | None) -> str:
    return "default" if mhz is None else f"{mhz} MHz"


def measure_fanout(nodes: int, gpus: int, iterations: int, speedup: float) -> dict[str, Any]:
    """A short job on a cluster of ``nodes``: the fan-out's cost per phase."""
    with sim_cluster(nodes, gpus, iterations, speedup) as cluster:
        result = run_job(cluster, "eerl", iterations, progress=False)
        figures = result.fanout_fraction()
        figures["cluster_start_s"] = cluster.started_s
        figures["same_clock_every_phase"] = result.same_clock_every_phase(nodes)
    return figures


# ---- command line -----------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m demo.multinode", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--nodes", type=int, default=DEFAULT_NODES, help=f"simulated nodes (default {DEFAULT_NODES})"
    )
    p.add_argument(
        "--gpus", type=int, default=DEFAULT_GPUS, help=f"simulated GPUs per node (default {DEFAULT_GPUS})"
    )
    p.add_argument("--iterations", type=int, default=DEFAULT_ITERATIONS)
    p.add_argument(
        "--speedup", type=float, default=DEFAULT_SPEEDUP, help="simulated time runs this much faster"
    )
    p.add_argument(
        "--fanout-nodes",
        default="8",
        help="also measure the fan-out on clusters of these sizes, comma-separated ('' for none; default 8)",
    )
    p.add_argument("--fanout-iterations", type=int, default=DEFAULT_FANOUT_ITERATIONS)
    p.add_argument("--out", type=Path, default=Path("out/demo-multinode"))
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    if args.nodes < 2 or args.gpus < 1 or args.iterations < 1:
        print("Error: --nodes ≥ 2, --gpus ≥ 1, --iterations ≥ 1", file=sys.stderr)
        return 2
    try:
        extra = sorted({int(n) for n in str(args.fanout_nodes).split(",") if n.strip()} - {args.nodes})
    except ValueError:
        print(f"Error: --fanout-nodes: {args.fanout_nodes!r} is not a list of numbers", file=sys.stderr)
        return 2
    print(
        f"demo-multinode: {args.nodes} simulated nodes × {args.gpus} H100, {args.iterations} iterations, "
        f"simulated time ×{args.speedup:g}",
        flush=True,
    )
    with sim_cluster(args.nodes, args.gpus, args.iterations, args.speedup) as cluster:
        print(f"cluster up in {cluster.started_s:.1f} s; baseline run (every phase at the default governor)")
        baseline = run_job(cluster, "off", args.iterations)
        print("job-level EE-RL controller run")
        job = run_job(cluster, "eerl", args.iterations)
    locked_after_stop = cluster.locked_after_stop
    fanout: dict[str, Any] = {str(args.nodes): job.fanout_fraction()}
    fanout[str(args.nodes)]["cluster_start_s"] = cluster.started_s
    for count in extra:
        print(f"fan-out on {count} nodes ({args.fanout_iterations} iterations)", flush=True)
        fanout[str(count)] = measure_fanout(count, args.gpus, args.fanout_iterations, args.speedup)
    energy_per_token = [r.energy_j / max(1, r.valid_tokens) for r in (baseline, job)]
    savings = 1.0 - energy_per_token[1] / energy_per_token[0] if energy_per_token[0] > 0 else 0.0
    # The same tokens in both runs: throughput is the inverse of time. On the GPUs' own time (the slowest
    # node's work per phase), and as the driver saw it (Ray's dispatch jitter included).
    throughput_ratio = baseline.work_s / job.work_s
    throughput_ratio_driver = baseline.sim_s / job.sim_s
    summary = {
        "nodes": args.nodes,
        "gpus_per_node": args.gpus,
        "iterations": args.iterations,
        "speedup": args.speedup,
        "scenario": f"{BASE_SCENARIO} scaled to {args.gpus} GPUs per node",
        "same_clock_every_phase": job.same_clock_every_phase(args.nodes)
        and baseline.same_clock_every_phase(args.nodes),
        "savings": savings,
        "throughput_ratio": throughput_ratio,
        "throughput_ratio_driver": throughput_ratio_driver,
        "gpus_locked_after_stop": locked_after_stop + job.locked_after_close + baseline.locked_after_close,
        "committed_sm_clock_mhz": job.committed,
        "baseline": {
            "work_s": baseline.work_s,
            "sim_s": baseline.sim_s,
            "energy_j": baseline.energy_j,
            "valid_tokens": baseline.valid_tokens,
        },
        "job": {
            "work_s": job.work_s,
            "sim_s": job.sim_s,
            "energy_j": job.energy_j,
            "valid_tokens": job.valid_tokens,
        },
        "fanout": fanout,
        "phases": [asdict(p) for p in job.phases],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "summary.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    print_summary(summary)
    print(f"wrote {path}")
    return 0


def print_summary(summary: dict[str, Any]) -> None:
    rows = [
        ("nodes", f"{summary['nodes']} × {summary['gpus_per_node']} simulated H100"),
        ("iterations", str(summary["iterations"])),
        (
            "committed clocks",
            ", ".join(f"{k} {_clock(v)}" for k, v in summary["committed_sm_clock_mhz"].items()),
        ),
        ("same clock on every node, every phase", "yes" if summary["same_clock_every_phase"] else "NO"),
        ("energy per valid token saved", f"{summary['savings']:.1%}"),
        (
            "throughput vs default",
            f"{summary['throughput_ratio']:.3f} "
            f"(as the driver saw it: {summary['throughput_ratio_driver']:.3f})",
        ),
        ("GPUs locked after stop", str(summary["gpus_locked_after_stop"])),
    ]
    for count, figures in summary["fanout"].items():
        rows.append(
            (
                f"fan-out per phase, {count} nodes",
                f"p50 {figures['p50_s'] * 1000:.0f} / p99 {figures['p99_s'] * 1000:.0f} ms: "
                f"{figures['p50']:.1%} / {figures['p99']:.1%} of the demo's phase, "
                f"{figures['p50_of_simulated_phase']:.3%} / {figures['p99_of_simulated_phase']:.3%} "
                "of a real one",
            )
        )
    width = max(len(name) for name, _ in rows)
    print()
    for name, value in rows:
        print(f"  {name:<{width}}  {value}")
    print()


if __name__ == "__main__":
    sys.exit(main())
