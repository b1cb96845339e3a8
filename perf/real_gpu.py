"""Read-only check of eerld on a real NVIDIA GPU: the daemon in --dry-run, real work, real energy counters.

Safe on a shared node: the daemon runs with ``--dry-run`` (the arbiter never actuates and its backend
refuses every clock change), and this script itself makes only read-only NVML calls. It never locks,
resets or changes clocks, power limits, persistence or MIG.

What it measures, on GPU 0:
1. NVML read latency through eerld's backend (energy, SM clock, power, clock-event reasons): p50/p99.
2. A PyTorch job of alternating phases through eerld: generation = memory-bound copies, training =
   bf16 matrix products. For each phase the energy eerld attributes (EndPhase) against the energy read
   independently from NVML around the same interval, and the SM clock and power sampled during it
   (what the default governor does on this GPU, for the simulator's calibration).
   Before that, a decode-like and a training-like kernel mix at the default governor: the clock it held,
   duration, power and energy (:mod:`perf.kernel_mix`), written to ``kernel_mix.csv`` in the format of
   the measured sweeps eerl-sim ships, so that the H100/H200 profile can be set beside them.
3. The same phases through the fail-open ``eerl`` client (connect + ``session.phase``).
4. BeginPhase+EndPhase round trip over the Unix socket with no work in between, against the no-op
   gRPC echo floor (:mod:`perf.echo_server`), one client, same run.
5. ``eerlctl status --json``, ``/metrics`` and the controller's decisions, saved to ``--out``; and a check
   that the daemon's log holds no lock or reset and that the clocks are as they were.

Usage (on a GPU node, from the repository root): ``python -m perf.real_gpu --out DIR [--iterations 8]``, in
the dev venv (``make setup``) or in a plain checkout with eerld's dependencies and PyTorch installed and
``PYTHONPATH=client``; the daemon and the tools it starts get the checkout on their path either way.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import eerl
import grpc
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.app import nvml_unavailable
from eerld.errors import BackendFailure
from eerld.gpu.nvml import NvmlBackend
from perf.kernel_mix import Sampler, make_mixes, measure_mix, steps_per_second, write_stage_profile
from perf.stats import percentile as pct

REPO = Path(__file__).resolve().parents[1]
GEN, TRAIN = pb.PHASE_KIND_GENERATION, pb.PHASE_KIND_TRAINING
METRICS = "127.0.0.1:9478"
Work = dict[int, Callable[[], int]]
"""One phase's GPU work per phase kind; each call returns the steps it ran."""


def child_env() -> dict[str, str]:
    """This environment with the checkout's eerld and eerl importable (a run from a plain checkout)."""
    paths = [str(REPO), str(REPO / "client"), os.environ.get("PYTHONPATH", "")]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


def nvml_latency(backend: NvmlBackend, calls: int = 500) -> dict[str, dict[str, float]]:
    """p50 and p99 (µs) of each read eerld makes through its NVML backend."""
    reads: dict[str, Callable[[], object]] = {
        "total_energy_mj": lambda: backend.total_energy_mj(0),
        "clocks": lambda: backend.clocks(0),
        "power_w": lambda: backend.power_w(0),
        "clock_event_reasons": lambda: backend.clock_event_reasons(0),
        "utilization": lambda: backend.utilization(0),
    }
    out: dict[str, dict[str, float]] = {}
    for name, read in reads.items():
        samples: list[float] = []
        for _ in range(calls):
            t0 = time.perf_counter()
            read()
            samples.append((time.perf_counter() - t0) * 1e6)
        out[name] = {"p50_us": pct(samples, 0.5), "p99_us": pct(samples, 0.99)}
    return out


def counter_update_period_s(backend: NvmlBackend, seconds: float = 1.5) -> dict[str, float]:
    """How often the energy counter changes: read it back to back, date each change (read-only)."""
    changes: list[float] = []
    last = backend.total_energy_mj(0)
    deadline = time.perf_counter() + seconds
    reads = 0
    while time.perf_counter() < deadline:
        value = backend.total_energy_mj(0)
        reads += 1
        if value != last:
            changes.append(time.perf_counter())
            last = value
    gaps = [b - a for a, b in itertools.pairwise(changes)]
    return {
        "reads": reads,
        "changes": len(changes),
        "median_change_interval_ms": statistics.median(gaps) * 1e3 if gaps else float("nan"),
    }


def make_work(seconds: float) -> Work:
    """Memory-bound copies (generation) and bf16 matrix products (training), each about ``seconds`` long."""
    import torch  # noqa: PLC0415 - only this check needs torch (present on GPU nodes)

    device = torch.device("cuda:0")
    src = torch.empty(2 * 1024**3, dtype=torch.uint8, device=device)  # 2 GiB: memory-bound copies
    dst = torch.empty_like(src)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device=device)

    def timed(step: Callable[[], object], per_s: float) -> int:
        count = max(1, int(seconds * per_s))
        for _ in range(count):
            step()
        torch.cuda.synchronize()
        return count

    # Calibrate how many steps fill ``seconds``.
    steps: tuple[tuple[str, Callable[[], object]], ...] = (
        ("generation", lambda: dst.copy_(src)),
        ("training", lambda: a @ b),
    )
    rates = {name: steps_per_second(step, torch.cuda.synchronize) for name, step in steps}
    return {
        GEN: lambda: timed(lambda: dst.copy_(src), rates["generation"]),
        TRAIN: lambda: timed(lambda: a @ b, rates["training"]),
    }


def start_daemon(tmp: Path, *extra: str) -> subprocess.Popen[bytes]:
    """eerld on the nvml backend in dry-run, its sockets, state and log in ``tmp``."""
    tmp.mkdir(exist_ok=True)
    log = (tmp / "eerld.log").open("wb")
    env = child_env()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "eerld.main", "--backend=nvml", "--dry-run",
            f"--socket={tmp / 'w.sock'}", f"--admin-socket={tmp / 'a.sock'}", f"--state-dir={tmp / 'state'}",
            "--tenancy=single", "--log-format=json", *extra,
        ],
        cwd=REPO, stdout=log, stderr=subprocess.STDOUT, env=env,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while not (tmp / "w.sock").exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"eerld did not start: {(tmp / 'eerld.log').read_text()[-2000:]}")
        time.sleep(0.05)
    time.sleep(0.3)
    return proc


def raw_phases(
    stub: pb_grpc.PhaseServiceStub, backend: NvmlBackend, iterations: int, work: Work
) -> list[dict[str, Any]]:
    """Phases through eerld's RPCs, each metered by eerld and by direct NVML reads around it."""
    session = stub.OpenSession(pb.OpenSessionRequest(job_id="real-gpu-check", gpus=[pb.GpuRef(index=0)]))
    sid = session.session_id
    rows: list[dict[str, Any]] = []
    for iteration in range(iterations):
        for kind in (GEN, TRAIN):
            t0 = time.perf_counter()
            began = stub.BeginPhase(pb.BeginPhaseRequest(session_id=sid, kind=kind, iteration=iteration))
            begin_ms = (time.perf_counter() - t0) * 1e3
            e0 = backend.total_energy_mj(0)
            w0 = time.perf_counter()
            with Sampler(backend) as sampler:
                steps = work[kind]()
            wall = time.perf_counter() - w0
            e1 = backend.total_energy_mj(0)
            tokens = steps * 1000
            t1 = time.perf_counter()
            ended = stub.EndPhase(
                pb.EndPhaseRequest(
                    session_id=sid,
                    kind=kind,
                    iteration=iteration,
                    workload=pb.Workload(tokens=tokens, valid_tokens=tokens // 2, sequences=64),
                )
            )
            end_ms = (time.perf_counter() - t1) * 1e3
            rows.append(
                {
                    "iteration": iteration,
                    "kind": "generation" if kind == GEN else "training",
                    "would_lock_mhz": began.target_sm_clock_mhz or None,
                    "begin_ms": begin_ms,
                    "end_ms": end_ms,
                    "eerld_energy_j": ended.energy_mj / 1e3,
                    "eerld_duration_s": ended.duration_s,
                    "nvml_energy_j": (e1 - e0) / 1e3,
                    "wall_s": wall,
                    "sm_clock_mhz_median": statistics.median(sampler.clocks) if sampler.clocks else None,
                    "power_w_median": statistics.median(sampler.power) if sampler.power else None,
                }
            )
            r = rows[-1]
            print(
                f"  it {iteration} {r['kind']:<10} eerld {r['eerld_energy_j']:8.1f} J"
                f" / {r['eerld_duration_s']:.3f} s  nvml {r['nvml_energy_j']:8.1f} J / {wall:.3f} s"
                f"  SM {r['sm_clock_mhz_median']} MHz"
                f"  {r['power_w_median']:.0f} W  would lock {r['would_lock_mhz']}",
                flush=True,
            )
        stub.Heartbeat(pb.HeartbeatRequest(session_id=sid))
    stub.CloseSession(pb.CloseSessionRequest(session_id=sid))
    return rows


def client_phases(socket: Path, iterations: int, work: Work) -> dict[str, Any]:
    """The same phases through the fail-open client: the caller's cost of entering and leaving a phase."""
    session = eerl.connect(gpus=[0], job_id="real-gpu-client", config=eerl.ClientConfig.uds(socket))
    connected = session.wait_until_connected(10.0)
    costs: list[float] = []
    for iteration in range(iterations):
        for kind in ("generation", "training"):
            t0 = time.perf_counter()
            with session.phase(kind, iteration=iteration) as phase:
                enter_us = (time.perf_counter() - t0) * 1e6
                steps = work[GEN if kind == "generation" else TRAIN]()
                phase.report(tokens=steps * 1000, valid_tokens=steps * 500, sequences=64)
                t1 = time.perf_counter()
            costs.append(enter_us)
            costs.append((time.perf_counter() - t1) * 1e6)
    time.sleep(1.0)
    stats = session.stats()
    session.close()
    return {
        "connected": connected,
        "caller_cost_us_p50": pct(costs, 0.5),
        "caller_cost_us_p99": pct(costs, 0.99),
        "stats": repr(stats),
    }


def rpc_latency(socket: Path, echo_socket: Path, rounds: int) -> dict[str, float]:
    """BeginPhase + EndPhase round trips with no work between them, beside the echo floor's (ms)."""

    def measure(call: Callable[[int], object]) -> list[float]:
        out: list[float] = []
        for i in range(rounds + 20):
            t0 = time.perf_counter()
            call(i)
            if i >= 20:
                out.append((time.perf_counter() - t0) * 1e3)
        return out

    with grpc.insecure_channel(f"unix:{echo_socket}") as ch:
        ping = ch.unary_unary("/bench.Echo/Ping", request_serializer=None, response_deserializer=None)
        begin = pb.BeginPhaseRequest(session_id="x" * 32, kind=GEN, iteration=1).SerializeToString()
        end = pb.EndPhaseRequest(session_id="x" * 32, kind=GEN, iteration=1).SerializeToString()
        floor = measure(lambda _i: (ping(begin), ping(end)))
    with grpc.insecure_channel(f"unix:{socket}") as ch:
        stub = pb_grpc.PhaseServiceStub(ch)
        sid = stub.OpenSession(pb.OpenSessionRequest(job_id="latency", gpus=[pb.GpuRef(index=0)])).session_id
        workload = pb.Workload(tokens=4096, valid_tokens=2048, sequences=16)

        def round_trip(i: int) -> None:
            kind = GEN if i % 2 == 0 else TRAIN
            stub.BeginPhase(pb.BeginPhaseRequest(session_id=sid, kind=kind, iteration=i // 2))
            stub.EndPhase(pb.EndPhaseRequest(session_id=sid, kind=kind, iteration=i // 2, workload=workload))

        measured = measure(round_trip)
        stub.CloseSession(pb.CloseSessionRequest(session_id=sid))
    return {
        "eerld_p50_ms": pct(measured, 0.5),
        "eerld_p99_ms": pct(measured, 0.99),
        "floor_p50_ms": pct(floor, 0.5),
        "floor_p99_ms": pct(floor, 0.99),
        "ratio_p50": pct(measured, 0.5) / pct(floor, 0.5),
        "ratio_p99": pct(measured, 0.99) / pct(floor, 0.99),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m perf.real_gpu", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--phase-s", type=float, default=2.0)
    parser.add_argument("--rounds", type=int, default=1000)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    report: dict[str, Any] = {}
    try:
        nvml = NvmlBackend()
    except BackendFailure as e:  # no NVML here: one line, not a traceback
        sys.exit(f"python -m perf.real_gpu: needs an NVIDIA GPU: {nvml_unavailable(e)}")
    with nvml as backend, tempfile.TemporaryDirectory(prefix="eerl-gpu-", dir="/tmp") as d:
        tmp = Path(d)
        gpu = backend.inventory()[0]
        clocks_before = backend.clocks(0)
        sm_clocks = list(backend.supported_sm_clocks_mhz(0))
        report["gpu"] = {
            "name": gpu.name,
            "uuid": gpu.uuid,
            "pci_bus_id": gpu.pci_bus_id,
            "power_limit_w": backend.power_limit_w(0),
            "sm_clocks_mhz": [sm_clocks[0], sm_clocks[-1]],
            "sm_clock_count": len(sm_clocks),
            "mem_clocks_mhz": list(backend.supported_mem_clocks_mhz(0)),
            "supports_locked_clocks": backend.supports_locked_clocks(0),
        }
        print("GPU:", json.dumps(report["gpu"]), flush=True)
        report["energy_counter_updates"] = counter_update_period_s(backend)
        print("energy counter:", json.dumps(report["energy_counter_updates"]), flush=True)
        report["nvml_read_latency"] = nvml_latency(backend)
        print("NVML read latency:", json.dumps(report["nvml_read_latency"]), flush=True)
        mixes = make_mixes(args.phase_s)
        records = [measure_mix(backend, name, run) for name, run in mixes.items()]
        write_stage_profile(records, args.out / "kernel_mix.csv")
        report["kernel_mix_default_governor"] = [
            {"mix": r.instruction, "sm_clock_mhz": r.sm_clock_mhz, "time_s": r.time_s,
             "energy_j": r.energy_j, "power_w": r.power_w} for r in records]  # fmt: skip
        print("kernel mixes:", json.dumps(report["kernel_mix_default_governor"]), flush=True)
        work = make_work(args.phase_s)
        daemon = start_daemon(tmp, f"--metrics-address={METRICS}")
        echo_server = [sys.executable, "-m", "perf.echo_server", str(tmp / "echo.sock")]
        echo = subprocess.Popen(echo_server, cwd=REPO, stdout=subprocess.DEVNULL, env=child_env())
        try:
            with grpc.insecure_channel(f"unix:{tmp / 'w.sock'}") as ch:
                print("raw phases through eerld (dry-run):", flush=True)
                rows = raw_phases(pb_grpc.PhaseServiceStub(ch), backend, args.iterations, work)
            report["phases"] = rows
            ratios = [r["eerld_energy_j"] / r["nvml_energy_j"] for r in rows if r["nvml_energy_j"] > 0]
            report["energy_ratio_eerld_over_nvml"] = {
                "median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)}  # fmt: skip
            for kind in ("generation", "training"):
                mine = [r for r in rows if r["kind"] == kind]
                report[f"{kind}_default_governor"] = {
                    "sm_clock_mhz_median": statistics.median(r["sm_clock_mhz_median"] for r in mine),
                    "power_w_median": statistics.median(r["power_w_median"] for r in mine),
                    "would_lock_mhz_last": mine[-1]["would_lock_mhz"],
                }
            print("energy eerld/nvml:", report["energy_ratio_eerld_over_nvml"], flush=True)
            print("client path:", flush=True)
            report["client"] = client_phases(tmp / "w.sock", 2, work)
            print(json.dumps(report["client"]), flush=True)
            report["rpc_latency_dry_run"] = rpc_latency(tmp / "w.sock", tmp / "echo.sock", args.rounds)
            print("RPC latency:", json.dumps(report["rpc_latency_dry_run"]), flush=True)
            # The same with the energy counters read on the RPC path (no background sampling).
            direct = start_daemon(tmp / "direct", "--metrics-address=off", "--energy-sample-ms=0")
            try:
                report["rpc_latency_dry_run_direct_reads"] = rpc_latency(
                    tmp / "direct" / "w.sock", tmp / "echo.sock", args.rounds
                )
            finally:
                direct.send_signal(signal.SIGTERM)
                direct.wait(timeout=30)
            print("RPC latency, direct reads:", json.dumps(report["rpc_latency_dry_run_direct_reads"]))
            env = child_env()
            ctl = [
                sys.executable,
                "-m",
                "eerlctl",
                f"--socket={tmp / 'a.sock'}",
            ]
            status = subprocess.run(
                [*ctl, "--json", "status"], capture_output=True, text=True, env=env, check=False
            )
            (args.out / "status.json").write_text(status.stdout + status.stderr)
            table = subprocess.run([*ctl, "status"], capture_output=True, text=True, env=env, check=False)
            print(table.stdout, table.stderr, flush=True)
            decisions = subprocess.run(
                [*ctl, "decisions"], capture_output=True, text=True, env=env, check=False
            )
            (args.out / "decisions.txt").write_text(decisions.stdout + decisions.stderr)
            with urllib.request.urlopen(f"http://{METRICS}/metrics", timeout=10) as response:
                (args.out / "metrics.txt").write_bytes(response.read())
        finally:
            echo.send_signal(signal.SIGTERM)
            daemon.send_signal(signal.SIGTERM)
            report["daemon_exit"] = daemon.wait(timeout=30)
            echo.wait(timeout=30)
        log = (tmp / "eerld.log").read_text()
        (args.out / "eerld.log").write_text(log)
        events = ("clock_lock", "clock_reset", "application_clock_set")
        actuations = [line for line in log.splitlines() if any(f'"event": "{e}"' in line for e in events)]
        report["actuations_in_log"] = len(actuations)
        clocks_after = backend.clocks(0)
        report["clocks_before_after"] = [str(clocks_before), str(clocks_after)]
    (args.out / "report.json").write_text(json.dumps(report, indent=2, default=str))
    print(json.dumps({k: v for k, v in report.items() if k != "phases"}, indent=2, default=str))


if __name__ == "__main__":
    main()
