"""BeginPhase + EndPhase round-trip latency over eerld's Unix socket, against a no-op gRPC floor.

For 1 and 32 concurrent client *processes*, each on its own simulated GPU, the script measures the
round trip of BeginPhase + EndPhase (alternating generation and training, so every BeginPhase changes the
lock) against eerld on the sim backend, and two no-op unary RPCs against :mod:`perf.echo_server` over the
same kind of socket at the same concurrency, in the same run: both servers run side by side and every
client alternates between them in blocks (50 round trips over all clients, at least 10 per client;
ABBA order; all clients switching together), so both are measured over the same span of time on this
shared machine. It reports p50/p99 of each over the round trips of all runs pooled, and eerld's as a
ratio to the floor's (target: ≤ 1.5×), with each run's own ratios beside them. Pooled, because this
machine stalls in bursts (every client slowed within the same 100 ms): one run's p99 rests on one or two
such bursts and on which server happened to be running then, so it scatters by ±0.2×; over several runs
the bursts fall on both. It then measures the time from a client's SIGKILL to its GPU's reset, for a
stream-bound and a lease-bound session (lease TTL 1 s), watching the sim state file from outside.

``--backends`` adds variants of the daemon with part of its work taken out (:mod:`perf.daemon_variant`: no
simulator, no log lines, no daemon work at all, a busy-wait as long as the daemon's work) to see where
the time goes; ``--handler-times`` adds each RPC's duration as the server saw it.

Usage: python -m perf.phase_latency [--clients 1,32] [--rounds 5000] [--kills 5] [--repeats 3]
       [--backends sim,fake,nolog,noop,spin] [--handler-times] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from multiprocessing.context import ForkServerContext, SpawnContext
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Barrier
from pathlib import Path
from typing import Any

import grpc
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc
from eerl_sim.gpu import open_sim_device

from perf.stats import percentile
from soak.daemon import stop_process

REPO = Path(__file__).resolve().parents[1]
"""The checkout: the servers run from it (``python -m perf.echo_server``, ``python -m eerld.main``)."""
ECHO = "perf.echo_server"
VARIANT = "perf.daemon_variant"
Context = SpawnContext | ForkServerContext
"""How client processes start: spawned (the default) or forked from a preloaded server (:mod:`soak.load`)."""
GEN, TRAIN = pb.PHASE_KIND_GENERATION, pb.PHASE_KIND_TRAINING
WORKLOAD = pb.Workload(tokens=4096, valid_tokens=2048, sequences=16)
WARMUP_ROUNDS = 20
BLOCK_ROUNDS = 50
"""Round trips in one block of one server, over all clients (see :func:`interleaved_client`)..."""
MIN_BLOCK_ROUNDS = 10
"""...but at least this many per client, so that a block is more than the burst at its start."""


# -- clients (run in their own processes) ------------------------------------------------------------


class EerldTarget:
    """One session on GPU ``gpu``; a round trip is BeginPhase + EndPhase, alternating the phase kind."""

    name = "eerld"

    def __init__(self, socket_path: str, gpu: int) -> None:
        self._channel = grpc.insecure_channel(f"unix:{socket_path}")
        self._stub = pb_grpc.PhaseServiceStub(self._channel)
        request = pb.OpenSessionRequest(job_id="bench", rank=gpu, gpus=[pb.GpuRef(index=gpu)])
        self._sid = self._stub.OpenSession(request).session_id
        self._iteration = 0
        self._kind = TRAIN

    def round_trip(self) -> float:
        self._kind = GEN if self._kind == TRAIN else TRAIN
        sid, kind, iteration = self._sid, self._kind, self._iteration
        t0 = time.perf_counter()
        self._stub.BeginPhase(pb.BeginPhaseRequest(session_id=sid, kind=kind, iteration=iteration))
        self._stub.EndPhase(
            pb.EndPhaseRequest(session_id=sid, kind=kind, iteration=iteration, workload=WORKLOAD)
        )
        elapsed = time.perf_counter() - t0
        if kind == TRAIN:
            self._iteration += 1
        return elapsed

    def close(self) -> None:
        try:
            self._stub.CloseSession(pb.CloseSessionRequest(session_id=self._sid))
        except grpc.RpcError as e:  # the noop variant never renews the lease: gone already is fine
            if e.code() != grpc.StatusCode.NOT_FOUND:
                raise
        self._channel.close()


class EchoTarget:
    """The floor: a round trip is two no-op unary RPCs carrying the bytes of a BeginPhase and an EndPhase."""

    name = "floor"

    def __init__(self, socket_path: str) -> None:
        self._channel = grpc.insecure_channel(f"unix:{socket_path}")
        self._ping = self._channel.unary_unary(
            "/bench.Echo/Ping", request_serializer=None, response_deserializer=None
        )
        self._begin = pb.BeginPhaseRequest(session_id="x" * 32, kind=GEN, iteration=1).SerializeToString()
        self._end = pb.EndPhaseRequest(
            session_id="x" * 32, kind=GEN, iteration=1, workload=WORKLOAD
        ).SerializeToString()

    def round_trip(self) -> float:
        t0 = time.perf_counter()
        self._ping(self._begin)
        self._ping(self._end)
        return time.perf_counter() - t0

    def close(self) -> None:
        self._channel.close()


def echo_client(socket_path: str, gpu: int, rounds: int, start_at: float, out: Queue[list[float]]) -> None:
    """The floor alone (:mod:`soak.load`): ``rounds`` round trips from ``start_at`` on."""
    echo = EchoTarget(socket_path)
    while time.time() < start_at:
        time.sleep(0.001)
    samples = [echo.round_trip() for _ in range(WARMUP_ROUNDS + rounds)][WARMUP_ROUNDS:]
    echo.close()
    out.put(samples)


def interleaved_client(  # noqa: PLR0917 - a process target: its arguments come by position
    echo_socket: str,
    eerld_socket: str,
    gpu: int,
    blocks: int,
    block_rounds: int,
    barrier: Barrier,
    out: Queue[dict[str, list[float]]],
) -> None:
    """Blocks of round trips on the floor and on eerld in ABBA order, every client switching together.

    Both servers are measured over the same span of time, so a change in the shared machine's load
    (other tenants, CPU frequency) weighs on both alike instead of on whichever ran at that moment.
    """
    floor, eerld = EchoTarget(echo_socket), EerldTarget(eerld_socket, gpu)
    target: EchoTarget | EerldTarget
    for target in (floor, eerld):
        for _ in range(WARMUP_ROUNDS):
            target.round_trip()
    samples: dict[str, list[float]] = {"floor": [], "eerld": []}
    for block in range(blocks):
        for target in (floor, eerld) if block % 2 == 0 else (eerld, floor):
            barrier.wait(timeout=600)  # the same concurrency on each server throughout its block
            samples[target.name].extend(target.round_trip() for _ in range(block_rounds))
    eerld.close()
    floor.close()
    out.put(samples)


def spawn_clients(
    ctx: Context, target: Callable[..., None], clients: int, args_of: Callable[[int], tuple[Any, ...]]
) -> list[Any]:
    """``clients`` processes of ``target(*args_of(gpu), out)``, started together; what each put on ``out``.

    What comes back is whatever the clients put, unpickled (``Any``: it crossed a process boundary).
    """
    out: Queue[Any] = ctx.Queue()
    procs = [ctx.Process(target=target, args=(*args_of(gpu), out)) for gpu in range(clients)]
    for p in procs:
        p.start()
    results: list[Any] = []
    deadline = time.monotonic() + 1800
    while len(results) < len(procs):
        try:
            results.append(out.get(timeout=1.0))
        except queue.Empty:
            failed = [p.exitcode for p in procs if p.exitcode not in (None, 0)]
            if not failed and time.monotonic() < deadline:
                continue
            for p in procs:  # the others would wait at the barrier for ever
                p.kill()
                p.join(timeout=60)
            if failed:
                raise RuntimeError(f"{len(failed)} client process(es) failed, exit codes {failed}") from None
            raise RuntimeError("client processes still running after 30 minutes") from None
    for p in procs:
        p.join(timeout=60)
    return results


def run_clients(
    target: Callable[..., None],
    socket_path: Path,
    clients: int,
    rounds: int,
    *,
    ctx: Context | None = None,
    start_delay_s: float | None = None,
) -> list[float]:
    """``clients`` processes of ``target`` (spawned unless ``ctx`` says otherwise), started together."""
    start_at = time.time() + (1.0 + 0.15 * clients if start_delay_s is None else start_delay_s)
    results = spawn_clients(
        ctx or mp.get_context("spawn"), target, clients, lambda gpu: (str(socket_path), gpu, rounds, start_at)
    )
    return [sample for samples in results for sample in samples]


# -- servers -----------------------------------------------------------------------------------------


def wait_ready(proc: subprocess.Popen[bytes], socket_path: Path) -> None:
    """Wait until the server has created ``socket_path`` (RuntimeError when it exits or takes a minute)."""
    deadline = time.monotonic() + 60
    while not socket_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"server did not start (exit {proc.returncode})")
        time.sleep(0.05)
    time.sleep(0.2)


def start_echo(socket_path: Path) -> subprocess.Popen[bytes]:
    """:mod:`perf.echo_server`, the floor, listening on ``socket_path``."""
    proc = subprocess.Popen(
        [sys.executable, "-m", ECHO, str(socket_path)], cwd=REPO, stdout=subprocess.DEVNULL
    )
    try:
        wait_ready(proc, socket_path)
    except BaseException:
        stop_process(proc)
        raise
    return proc


def start_eerld(
    tmp: Path,
    gpus: int,
    *,
    backend: str = "sim",
    sim_state: Path | None = None,
    lease_ttl_s: float = 10.0,
    handler_times: Path | None = None,
) -> subprocess.Popen[bytes]:
    """eerld (``backend`` sim) or one of its variants on ``gpus`` GPUs, its sockets and log in ``tmp``."""
    if backend == "sim" and handler_times is None:
        program = [sys.executable, "-m", "eerld.main", "--backend=sim", f"--sim-gpus={gpus}"]
    else:  # a variant with part of the work taken out, or with the server's handler times recorded
        program = [sys.executable, "-m", VARIANT, backend, str(gpus), f"--sim-gpus={gpus}"]
    args = [
        *program,
        f"--socket={tmp / 'w.sock'}",
        f"--admin-socket={tmp / 'a.sock'}",
        f"--state-dir={tmp / 'state'}",
        "--tenancy=single",
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


def read_handler_times(path: Path) -> dict[str, float]:
    """Server-side median and p99 (ms) per RPC, as :mod:`perf.daemon_variant` wrote them when it stopped."""
    times: dict[str, float] = {}
    for line in path.read_text().splitlines():
        name, _count, median_s, p99_s = line.split()
        times[f"{name}_handler_p50_ms"] = float(median_s) * 1e3
        times[f"{name}_handler_p99_ms"] = float(p99_s) * 1e3
    return times


def run_interleaved(
    echo_socket: Path, eerld_socket: Path, clients: int, blocks: int, block_rounds: int
) -> tuple[list[float], list[float]]:
    """``clients`` processes of :func:`interleaved_client`: the floor's samples and eerld's."""
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(clients)
    results = spawn_clients(
        ctx,
        interleaved_client,
        clients,
        lambda gpu: (str(echo_socket), str(eerld_socket), gpu, blocks, block_rounds, barrier),
    )
    return (
        [sample for samples in results for sample in samples["floor"]],
        [sample for samples in results for sample in samples["eerld"]],
    )


def latency(
    clients: int, rounds: int, backend: str, repeats: int, *, handler_times: bool = False
) -> dict[str, Any]:
    """Floor and eerld interleaved in blocks, ``repeats`` times; percentiles over all runs' round trips.

    Each client makes ``rounds`` round trips on each server, in blocks of about BLOCK_ROUNDS over all
    clients (an even number of blocks, at least two) in ABBA order.
    """
    per_block = max(MIN_BLOCK_ROUNDS, BLOCK_ROUNDS // clients)
    blocks = max(2, 2 * round(rounds / per_block / 2))
    block_rounds = max(1, round(rounds / blocks))
    samples_per_run: list[tuple[list[float], list[float]]] = []
    server_side_runs: list[dict[str, float]] = []
    for _ in range(repeats):
        with tempfile.TemporaryDirectory(prefix="eerl-bench-", dir="/tmp") as d:
            tmp = Path(d)
            echo_sock = tmp / "echo.sock"
            times_file = tmp / "handler-times.txt" if handler_times else None
            echo = start_echo(echo_sock)
            try:
                daemon = start_eerld(tmp, max(clients, 1), backend=backend, handler_times=times_file)
                try:
                    floor, measured = run_interleaved(
                        echo_sock, tmp / "w.sock", clients, blocks, block_rounds
                    )
                finally:
                    stop_process(daemon)
            finally:
                stop_process(echo)
            server_side = read_handler_times(times_file) if times_file is not None else {}
        samples_per_run.append((measured, floor))
        server_side_runs.append(server_side)
    result: dict[str, Any] = {
        "backend": backend,
        "clients": clients,
        "round_trips_per_run": blocks * block_rounds * clients,
        "blocks": blocks,
        "repeats": repeats,
    }
    result.update(pooled_figures(samples_per_run))
    for key in server_side_runs[0]:
        result[key] = statistics.median(r[key] for r in server_side_runs)
    return result


def pooled_figures(samples_per_run: list[tuple[list[float], list[float]]]) -> dict[str, Any]:
    """Percentiles and ratios over the round trips of all runs pooled, and each run's own ratios.

    ``samples_per_run`` holds (eerld's round trips, the floor's) of each run, in seconds.
    """
    runs = [percentiles_and_ratios(measured, floor) for measured, floor in samples_per_run]
    figures: dict[str, Any] = dict(
        percentiles_and_ratios(
            [t for measured, _ in samples_per_run for t in measured],
            [t for _, floor in samples_per_run for t in floor],
        )
    )
    figures["ratio_p50_runs"] = [round(r["ratio_p50"], 2) for r in runs]
    figures["ratio_p99_runs"] = [round(r["ratio_p99"], 2) for r in runs]
    return figures


def percentiles_and_ratios(measured: list[float], floor: list[float]) -> dict[str, float]:
    """p50 and p99 (ms) of eerld's and the floor's round trips, and eerld's as a ratio to the floor's."""
    figures = {
        "eerld_p50_ms": percentile(measured, 0.5) * 1e3,
        "eerld_p99_ms": percentile(measured, 0.99) * 1e3,
        "floor_p50_ms": percentile(floor, 0.5) * 1e3,
        "floor_p99_ms": percentile(floor, 0.99) * 1e3,
    }
    figures["ratio_p50"] = figures["eerld_p50_ms"] / figures["floor_p50_ms"]
    figures["ratio_p99"] = figures["eerld_p99_ms"] / figures["floor_p99_ms"]
    return figures


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
    """Seconds from a client's SIGKILL to its GPU's reset, ``kills`` times (``mode``: stream or lease)."""
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
            stop_process(daemon)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m perf.phase_latency", description=__doc__.splitlines()[0])
    parser.add_argument("--clients", default="1,32")
    parser.add_argument(
        "--rounds", type=int, default=5000, help="round trips per run and per server, split over clients"
    )
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument(
        "--backends",
        default="sim,fake",
        help="what to measure: sim (eerld as shipped) and the variants of perf.daemon_variant "
        "(fake: no simulator, nolog: no INFO log lines, noop: eerld's gRPC surface alone, "
        "spin: noop busy-waiting as long as eerld's handlers take)",
    )
    parser.add_argument(
        "--handler-times",
        action="store_true",
        help="also report each RPC's duration inside the server (the median of the runs' p50 and p99)",
    )
    parser.add_argument("--repeats", type=int, default=3, help="runs per setting (each interleaves both)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    latencies: list[dict[str, Any]] = []
    kill_to_reset_s: dict[str, dict[str, float]] = {}
    for backend in args.backends.split(","):
        for clients in (int(c) for c in args.clients.split(",")):
            rounds = max(20, args.rounds // clients)
            r = latency(clients, rounds, backend, args.repeats, handler_times=args.handler_times)
            latencies.append(r)
            if not args.json:
                print(
                    f"{backend:>4} {clients:>3} client process(es): "
                    f"eerld p50 {r['eerld_p50_ms']:.2f} ms p99 {r['eerld_p99_ms']:.2f} ms"
                    f" | floor p50 {r['floor_p50_ms']:.2f} ms p99 {r['floor_p99_ms']:.2f} ms"
                    f" | ratio p50 {r['ratio_p50']:.2f}x p99 {r['ratio_p99']:.2f}x"
                    f" (all {r['repeats']} runs of {r['round_trips_per_run']} round trips pooled,"
                    f" each in {r['blocks']} blocks per server; the runs' own ratios:"
                    f" p50 {r['ratio_p50_runs']}, p99 {r['ratio_p99_runs']})",
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
        kill_to_reset_s[mode] = {"median": statistics.median(times), "max": max(times), "ttl_s": ttl}
        if not args.json:
            print(
                f"SIGKILL to reset ({mode}{f', TTL {ttl:.0f} s' if mode == 'lease' else ''}): "
                f"median {statistics.median(times) * 1e3:.0f} ms, max {max(times) * 1e3:.0f} ms"
                f" over {len(times)} kills",
                flush=True,
            )
    if args.json:
        print(json.dumps({"latency": latencies, "kill_to_reset_s": kill_to_reset_s}, indent=2))


if __name__ == "__main__":
    main()
