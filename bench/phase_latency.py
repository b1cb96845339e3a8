"""BeginPhase + EndPhase round-trip latency over eerld's Unix socket, against a no-op gRPC floor.

For 1 and 32 concurrent client *processes*, each on its own simulated GPU, the script measures the
round trip of BeginPhase + EndPhase (alternating generation and training, so every BeginPhase changes the
lock) against eerld on the sim backend, and two no-op unary RPCs against bench/echo_server.py over the
same kind of socket at the same concurrency, in the same run. It reports p50/p99 of each and the ratio
(target: eerld ≤ 1.5× the floor). It then measures the time from a client's SIGKILL to its GPU's reset,
for a stream-bound and a lease-bound session (lease TTL 1 s), watching the sim state file from outside.

``--backends`` adds variants of the daemon with part of its work taken out (bench/daemon_variant.py: no
simulator, no log lines, no daemon work at all) to see where the time goes; ``--handler-times`` adds each
RPC's duration as the server saw it.

Usage: python bench/phase_latency.py [--clients 1,32] [--rounds 1000] [--kills 5] [--repeats 3]
       [--backends sim,fake,nolog,noop] [--handler-times] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout: python bench/phase_latency.py
    sys.path.insert(0, str(REPO))

from eerld.gpu.sim import open_sim_device  # noqa: E402 - after the path set-up above

sys.path.insert(0, str(Path(__file__).resolve().parent))
from soak_common import percentile  # noqa: E402 - the bench scripts' one nearest-rank quantile

ECHO = Path(__file__).with_name("echo_server.py")
VARIANT = Path(__file__).with_name("daemon_variant.py")
GEN, TRAIN = pb.PHASE_KIND_GENERATION, pb.PHASE_KIND_TRAINING
WARMUP_ROUNDS = 20


# -- clients (run in their own processes) ------------------------------------------------------------


def eerld_client(socket_path: str, gpu: int, rounds: int, start_at: float, out: mp.Queue) -> None:
    channel = grpc.insecure_channel(f"unix:{socket_path}")
    stub = pb_grpc.PhaseServiceStub(channel)
    session = stub.OpenSession(pb.OpenSessionRequest(job_id="bench", rank=gpu, gpus=[pb.GpuRef(index=gpu)]))
    sid = session.session_id
    workload = pb.Workload(tokens=4096, valid_tokens=2048, sequences=16)
    samples: list[float] = []
    iteration = 0
    while time.time() < start_at:
        time.sleep(0.001)
    for i in range(WARMUP_ROUNDS + rounds):
        kind = GEN if i % 2 == 0 else TRAIN
        t0 = time.perf_counter()
        stub.BeginPhase(pb.BeginPhaseRequest(session_id=sid, kind=kind, iteration=iteration))
        stub.EndPhase(pb.EndPhaseRequest(session_id=sid, kind=kind, iteration=iteration, workload=workload))
        elapsed = time.perf_counter() - t0
        if kind == TRAIN:
            iteration += 1
        if i >= WARMUP_ROUNDS:
            samples.append(elapsed)
    stub.CloseSession(pb.CloseSessionRequest(session_id=sid))
    channel.close()
    out.put(samples)


def echo_client(socket_path: str, gpu: int, rounds: int, start_at: float, out: mp.Queue) -> None:
    channel = grpc.insecure_channel(f"unix:{socket_path}")
    ping = channel.unary_unary("/bench.Echo/Ping")
    begin = pb.BeginPhaseRequest(session_id="x" * 32, kind=GEN, iteration=1).SerializeToString()
    end = pb.EndPhaseRequest(
        session_id="x" * 32,
        kind=GEN,
        iteration=1,
        workload=pb.Workload(tokens=4096, valid_tokens=2048, sequences=16),
    ).SerializeToString()
    samples: list[float] = []
    while time.time() < start_at:
        time.sleep(0.001)
    for i in range(WARMUP_ROUNDS + rounds):
        t0 = time.perf_counter()
        ping(begin)
        ping(end)
        elapsed = time.perf_counter() - t0
        if i >= WARMUP_ROUNDS:
            samples.append(elapsed)
    channel.close()
    out.put(samples)


def run_clients(
    target, socket_path: Path, clients: int, rounds: int, *, ctx=None, start_delay_s: float | None = None
) -> list[float]:
    """``clients`` processes of ``target`` (spawned unless ``ctx`` says otherwise), started together."""
    ctx = ctx or mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    start_at = time.time() + (1.0 + 0.15 * clients if start_delay_s is None else start_delay_s)
    procs = [
        ctx.Process(target=target, args=(str(socket_path), gpu, rounds, start_at, out))
        for gpu in range(clients)
    ]
    for p in procs:
        p.start()
    samples: list[float] = []
    for _ in procs:
        samples.extend(out.get(timeout=600))
    for p in procs:
        p.join(timeout=60)
    return samples


# -- servers -----------------------------------------------------------------------------------------


def wait_ready(proc: subprocess.Popen, socket_path: Path) -> None:
    deadline = time.monotonic() + 60
    while not socket_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"server did not start (exit {proc.returncode})")
        time.sleep(0.05)
    time.sleep(0.2)


def start_eerld(
    tmp: Path,
    gpus: int,
    *,
    backend: str = "sim",
    sim_state: Path | None = None,
    lease_ttl_s: float = 10.0,
    handler_times: Path | None = None,
) -> subprocess.Popen:
    if backend == "sim" and handler_times is None:
        program = [sys.executable, "-m", "eerld.main", "--backend=sim", f"--sim-gpus={gpus}"]
    else:  # a variant with part of the work taken out, or with the server's handler times recorded
        program = [sys.executable, str(VARIANT), backend, str(gpus), f"--sim-gpus={gpus}"]
    args = [
        *program,
        f"--socket={tmp / 'w.sock'}",
        f"--admin-socket={tmp / 'a.sock'}",
        f"--state-dir={tmp / 'state'}",
        "--controller=fixed",
        "--fixed-clocks=generation=1200,training=1500",
        "--metrics-address=off",
        # The worst case: every BeginPhase really changes the lock (the rate limit would skip most).
        "--max-clock-changes-per-s=0",
        "--log-format=json",
        f"--lease-ttl={lease_ttl_s}",
    ]
    if sim_state is not None:
        args.append(f"--sim-state={sim_state}")
    env = dict(os.environ, EERL_HANDLER_TIMES=str(handler_times)) if handler_times else None
    with (tmp / "eerld.log").open("ab") as log:  # the daemon keeps its own descriptor
        proc = subprocess.Popen(args, cwd=REPO, stdout=log, stderr=log, env=env)
    wait_ready(proc, tmp / "w.sock")
    return proc


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def read_handler_times(path: Path) -> dict[str, float]:
    """Server-side median and p99 (ms) per RPC, as bench/daemon_variant.py wrote them when it stopped."""
    times: dict[str, float] = {}
    for line in path.read_text().splitlines():
        name, _count, median_s, p99_s = line.split()
        times[f"{name}_handler_p50_ms"] = float(median_s) * 1e3
        times[f"{name}_handler_p99_ms"] = float(p99_s) * 1e3
    return times


def latency(
    clients: int, rounds: int, backend: str, repeats: int, *, handler_times: bool = False
) -> dict[str, object]:
    """Floor and eerld measured alternately ``repeats`` times; the figures are medians over the repeats."""
    runs: list[dict[str, float]] = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="eerl-bench-", dir="/tmp") as d:
            tmp = Path(d)
            echo_sock = tmp / "echo.sock"
            echo = subprocess.Popen([sys.executable, str(ECHO), str(echo_sock)], stdout=subprocess.DEVNULL)
            wait_ready(echo, echo_sock)
            try:
                floor = run_clients(echo_client, echo_sock, clients, rounds)
            finally:
                stop(echo)
            times_file = tmp / "handler-times.txt" if handler_times else None
            daemon = start_eerld(tmp, max(clients, 1), backend=backend, handler_times=times_file)
            try:
                measured = run_clients(eerld_client, tmp / "w.sock", clients, rounds)
            finally:
                stop(daemon)
            server_side = read_handler_times(times_file) if times_file is not None else {}
        run = {
            "eerld_p50_ms": percentile(measured, 0.5) * 1e3,
            "eerld_p99_ms": percentile(measured, 0.99) * 1e3,
            "floor_p50_ms": percentile(floor, 0.5) * 1e3,
            "floor_p99_ms": percentile(floor, 0.99) * 1e3,
        }
        run["ratio_p50"] = run["eerld_p50_ms"] / run["floor_p50_ms"]
        run["ratio_p99"] = run["eerld_p99_ms"] / run["floor_p99_ms"]
        run.update(server_side)
        runs.append(run)
    result: dict[str, object] = {
        "backend": backend,
        "clients": clients,
        "round_trips_per_run": rounds * clients,
        "repeats": repeats,
    }
    for key in runs[0]:
        result[key] = statistics.median(r[key] for r in runs)
    result["ratio_p50_runs"] = [round(r["ratio_p50"], 2) for r in runs]
    return result


# -- SIGKILL to reset --------------------------------------------------------------------------------

VICTIM = """
import sys, time, grpc
from eerl.v1 import eerl_pb2 as pb, eerl_pb2_grpc as g
stub = g.PhaseServiceStub(grpc.insecure_channel("unix:" + sys.argv[1]))
request = pb.OpenSessionRequest(job_id="victim", gpus=[pb.GpuRef(index=0)], lease_ttl_s=float(sys.argv[3]))
s = stub.OpenSession(request)
if sys.argv[2] == "stream":
    events = stub.Attach(pb.AttachRequest(session_id=s.session_id)); next(events)
stub.BeginPhase(pb.BeginPhaseRequest(session_id=s.session_id, kind=pb.PHASE_KIND_GENERATION))
print("ready", flush=True)
while True:
    if sys.argv[2] == "lease":
        stub.Heartbeat(pb.HeartbeatRequest(session_id=s.session_id))
    time.sleep(0.2)
"""


def kill_to_reset(mode: str, kills: int, lease_ttl_s: float) -> list[float]:
    times: list[float] = []
    with tempfile.TemporaryDirectory(prefix="eerl-kill-", dir="/tmp") as d:
        tmp = Path(d)
        state = tmp / "sim.state"
        daemon = start_eerld(tmp, 1, sim_state=state, lease_ttl_s=lease_ttl_s)
        try:
            device = open_sim_device(state)
            for _ in range(kills):
                victim = subprocess.Popen(
                    [sys.executable, "-c", VICTIM, str(tmp / "w.sock"), mode, str(lease_ttl_s)],
                    stdout=subprocess.PIPE,
                    text=True,
                )
                assert victim.stdout is not None
                assert victim.stdout.readline().strip() == "ready"
                assert device.observe(0).sm_lock_mhz == 1200
                t0 = time.monotonic()
                os.kill(victim.pid, signal.SIGKILL)
                while device.observe(0).sm_lock_mhz is not None:
                    time.sleep(0.005)
                    if time.monotonic() - t0 > 60:
                        raise RuntimeError("GPU never reset")
                times.append(time.monotonic() - t0)
                victim.wait()
                victim.stdout.close()
                time.sleep(0.3)
        finally:
            stop(daemon)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,32")
    parser.add_argument("--rounds", type=int, default=1000, help="round trips per run, split over clients")
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument(
        "--backends",
        default="sim,fake",
        help="what to measure: sim (eerld as shipped) and the variants of bench/daemon_variant.py "
        "(fake: no simulator, nolog: no INFO log lines, noop: eerld's gRPC surface alone)",
    )
    parser.add_argument(
        "--handler-times",
        action="store_true",
        help="also report each RPC's duration inside the server (median over runs of the runs' p50 and p99)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="alternating floor/eerld runs per setting")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    results: dict[str, object] = {"latency": [], "kill_to_reset_s": {}}
    for backend in args.backends.split(","):
        for clients in (int(c) for c in args.clients.split(",")):
            rounds = max(20, args.rounds // clients)
            r = latency(clients, rounds, backend, args.repeats, handler_times=args.handler_times)
            results["latency"].append(r)  # type: ignore[union-attr]
            if not args.json:
                print(
                    f"{backend:>4} {clients:>3} client process(es): "
                    f"eerld p50 {r['eerld_p50_ms']:.2f} ms p99 {r['eerld_p99_ms']:.2f} ms"
                    f" | floor p50 {r['floor_p50_ms']:.2f} ms p99 {r['floor_p99_ms']:.2f} ms"
                    f" | ratio p50 {r['ratio_p50']:.2f}x p99 {r['ratio_p99']:.2f}x"
                    f" (median of {r['repeats']} runs of {r['round_trips_per_run']} round trips;"
                    f" p50 ratios {r['ratio_p50_runs']})",
                    flush=True,
                )
                if args.handler_times:
                    print(
                        "     inside the server: "
                        + ", ".join(
                            f"{rpc} p50 {r[f'{rpc}_handler_p50_ms'] * 1e3:.0f} µs"
                            f" p99 {r[f'{rpc}_handler_p99_ms'] * 1e3:.0f} µs"
                            for rpc in ("BeginPhase", "EndPhase")
                            if f"{rpc}_handler_p50_ms" in r
                        ),
                        flush=True,
                    )
    for mode, ttl in (("stream", 10.0), ("lease", 1.0)) if args.kills > 0 else ():
        times = kill_to_reset(mode, args.kills, ttl)
        results["kill_to_reset_s"][mode] = {
            "median": statistics.median(times),
            "max": max(times),
            "ttl_s": ttl,
        }  # type: ignore[index]
        if not args.json:
            print(
                f"SIGKILL to reset ({mode}{f', TTL {ttl:.0f} s' if mode == 'lease' else ''}): "
                f"median {statistics.median(times) * 1e3:.0f} ms, max {max(times) * 1e3:.0f} ms"
                f" over {len(times)} kills",
                flush=True,
            )
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
