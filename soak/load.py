"""Load: many concurrent client processes send eerld phase events; nothing may be lost or misattributed.

Each client process opens a session on its own simulated GPU and sends ``events`` phase events
(BeginPhase and EndPhase alternately, phase kinds alternating), every EndPhase carrying a valid-token count
unique to the client. Before closing, the harness compares what each client sent with what the daemon
booked for that session (phases per kind, valid tokens); the CloseSession totals are compared again. The
round trip (BeginPhase + EndPhase) is timed and set beside a no-op gRPC echo (:mod:`perf.echo_server`, two
pings of the same sizes) measured at the same concurrency in the same run. Daemon RSS and CPU are sampled.
"""

from __future__ import annotations

import multiprocessing as mp
import tempfile
import threading
import time
from multiprocessing.context import ForkServerContext
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import grpc
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from perf import phase_latency
from perf.stats import percentile
from soak.daemon import GEN, TRAIN, DaemonProcess, stop_process
from soak.proc import cpu_s, rss_mib

FLOOR_ROUND_TRIPS = 200
"""Echo round trips per client for the floor: enough for a p99 at 64 clients (12 800 samples)."""


def _wait_alive(stub: pb_grpc.PhaseServiceStub, sid: str, event: Event) -> None:
    """Wait for ``event`` while heartbeating, as a real client does (the lease must not run out)."""
    while not event.wait(1.0):
        stub.Heartbeat(pb.HeartbeatRequest(session_id=sid), timeout=60)


def _client(  # noqa: PLR0917 - a process target: its arguments come by position
    socket_path: str,
    rank: int,
    events: int,
    ready: Queue[int],
    go: Event,
    closing: Event,
    out: Queue[tuple[Any, ...]],
) -> None:
    """One client process: open, wait for the start, send ``events`` events, report, wait, close."""
    channel = grpc.insecure_channel(f"unix:{socket_path}")
    stub = pb_grpc.PhaseServiceStub(channel)
    sid = stub.OpenSession(
        pb.OpenSessionRequest(job_id=f"load-{rank}", rank=rank, gpus=[pb.GpuRef(index=rank)]), timeout=60
    ).session_id
    ready.put(rank)
    _wait_alive(stub, sid, go)
    tag = rank + 1
    sent = {GEN: 0, TRAIN: 0}
    valid_tokens = 0
    samples: list[float] = []
    errors: list[str] = []
    for i in range(events // 2):
        kind = GEN if i % 2 == 0 else TRAIN
        iteration = i // 2
        workload = pb.Workload(tokens=2 * tag, valid_tokens=tag, sequences=1)
        t0 = time.perf_counter()
        try:
            stub.BeginPhase(pb.BeginPhaseRequest(session_id=sid, kind=kind, iteration=iteration), timeout=60)
            end = pb.EndPhaseRequest(session_id=sid, kind=kind, iteration=iteration, workload=workload)
            stub.EndPhase(end, timeout=60)
        except grpc.RpcError as e:
            errors.append(f"{e.code().name}: {e.details()}")
            continue
        samples.append(time.perf_counter() - t0)
        sent[kind] += 1
        valid_tokens += tag
    out.put(("sent", rank, sid, sent[GEN], sent[TRAIN], valid_tokens, samples, errors))
    _wait_alive(stub, sid, closing)
    closed = stub.CloseSession(pb.CloseSessionRequest(session_id=sid), timeout=60)
    out.put(("closed", rank, sid, closed.valid_tokens))
    channel.close()


def _sample_rss(daemon: DaemonProcess, stop: threading.Event, peak: list[float]) -> None:
    while not stop.wait(0.1):
        peak[0] = max(peak[0], rss_mib(daemon.pid))


def eerld_load(clients: int, events: int, tmp: Path) -> dict[str, Any]:
    """Run the load against a fresh daemon; return the figures and the mismatches found."""
    # rate limit off: every BeginPhase changes the lock, the worst case for latency
    daemon = DaemonProcess(tmp, gpus=clients, sim_state=False, extra_args=["--max-clock-changes-per-s=0"])
    daemon.start()
    ctx = _context()
    ready: Queue[int] = ctx.Queue()
    out: Queue[tuple[Any, ...]] = ctx.Queue()
    go, closing = ctx.Event(), ctx.Event()
    procs = [
        ctx.Process(
            target=_client, args=(str(daemon.socket_path), rank, events, ready, go, closing, out), daemon=True
        )
        for rank in range(clients)
    ]
    try:
        for p in procs:
            p.start()
        for _ in procs:
            ready.get(timeout=300)
        daemon_pid = daemon.pid
        rss_before = rss_mib(daemon_pid)
        peak = [rss_before]
        stop = threading.Event()
        sampler = threading.Thread(target=_sample_rss, args=(daemon, stop, peak), daemon=True)
        sampler.start()
        cpu0, t0 = cpu_s(daemon_pid), time.monotonic()
        go.set()
        sent = [out.get(timeout=600) for _ in procs]
        wall_s = time.monotonic() - t0
        cpu_used_s = cpu_s(daemon_pid) - cpu0
        stop.set()
        sampler.join()
        booked = {s.session_id: s for s in daemon.sessions()}
        closing.set()
        closed = {msg[2]: msg[3] for msg in (out.get(timeout=300) for _ in procs)}
        for p in procs:
            p.join(timeout=60)
        left = daemon.sessions()
        exit_code = daemon.stop()
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        daemon.stop()
    mismatches: list[str] = []
    samples: list[float] = []
    errors: list[str] = []
    events_sent = 0
    for _tag, rank, sid, gen, train, valid, client_samples, client_errors in sent:
        samples.extend(client_samples)
        errors.extend(client_errors)
        events_sent += 2 * (gen + train)
        info = booked.get(sid)
        if info is None:
            mismatches.append(f"client {rank}: session missing at the daemon")
            continue
        by_kind = {p.kind: p for p in info.phases}
        daemon_gen = by_kind[GEN].phases if GEN in by_kind else 0
        daemon_train = by_kind[TRAIN].phases if TRAIN in by_kind else 0
        daemon_valid = sum(p.valid_tokens for p in info.phases)
        if (daemon_gen, daemon_train, daemon_valid) != (gen, train, valid):
            mismatches.append(
                f"client {rank}: sent gen={gen} train={train} valid={valid}, daemon booked "
                f"gen={daemon_gen} train={daemon_train} valid={daemon_valid}"
            )
        if info.job_id != f"load-{rank}" or list(info.gpu_indices) != [rank]:
            where = f"{info.job_id} on {list(info.gpu_indices)}"
            mismatches.append(f"client {rank}: session {sid[:8]} is {where}")
        if closed.get(sid) != valid:
            booked_valid = closed.get(sid)
            mismatches.append(f"client {rank}: CloseSession booked {booked_valid} valid tokens, sent {valid}")
    return {
        "clients": clients,
        "events_per_client": events,
        "events_sent": events_sent,
        "rpc_errors": len(errors),
        "first_errors": errors[:5],
        "mismatches": mismatches,
        "sessions_left_after_close": len(left),
        "daemon_exit_code": exit_code,
        "round_trips": len(samples),
        "p50_ms": percentile(samples, 0.5) * 1e3,
        "p99_ms": percentile(samples, 0.99) * 1e3,
        "wall_s": wall_s,
        "events_per_s": events_sent / wall_s,
        "daemon_cpu_s": cpu_used_s,
        "daemon_cpu_percent": 100.0 * cpu_used_s / wall_s,
        "daemon_rss_start_mib": rss_before,
        "daemon_rss_peak_mib": peak[0],
    }


def _context() -> ForkServerContext:
    """Client processes forked from a server that has imported grpc but opened no channel.

    Spawning 64 interpreters that each import grpc costs minutes of CPU on two cores; forking them from a
    preloaded forkserver costs seconds, and no gRPC state crosses the fork.
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["grpc", "eerl.v1.eerl_pb2_grpc", "perf.phase_latency", "soak.load"])
    return ctx


def _run_echo_clients(sock: Path, clients: int, round_trips: int) -> list[float]:
    """phase_latency's echo clients, started from the forkserver like the eerld clients."""
    return phase_latency.run_clients(
        phase_latency.echo_client,
        sock,
        clients,
        round_trips,
        ctx=_context(),
        start_delay_s=2.0 + 0.05 * clients,
    )


def echo_floor(clients: int, round_trips: int, tmp: Path) -> dict[str, float]:
    """The no-op gRPC floor: two pings per round trip, same concurrency, same socket kind."""
    sock = tmp / "echo.sock"
    echo = phase_latency.start_echo(sock)
    try:
        samples = _run_echo_clients(sock, clients, round_trips)
    finally:
        stop_process(echo)
    return {"floor_p50_ms": percentile(samples, 0.5) * 1e3, "floor_p99_ms": percentile(samples, 0.99) * 1e3}


def run_load(clients: int, events: int) -> dict[str, Any]:
    """Figures of one load run (eerld, then the echo floor at the same concurrency)."""
    with tempfile.TemporaryDirectory(prefix="eerl-load-", dir="/tmp") as d:
        result = eerld_load(clients, events, Path(d))
        result.update(echo_floor(clients, min(events // 2, FLOOR_ROUND_TRIPS), Path(d)))
    result["ratio_p50"] = result["p50_ms"] / result["floor_p50_ms"]
    result["ratio_p99"] = result["p99_ms"] / result["floor_p99_ms"]
    return result
