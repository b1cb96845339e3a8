"""Resource exhaustion from outside: what a flood costs a real eerld, and what it leaves for everyone else.

One function per case, each returning its figures as a dict; :func:`main` runs the cases selected on the
command line (all of them, at their default sizes, when none is).

- metrics connections: n idle TCP connections to ``/metrics`` that never send a byte. Figures: the
  daemon's threads and RSS before and with the flood, and the median latency of a legitimate scrape
  (20 scrapes, each on a fresh connection) without and with the flood held open.
- idle streams: another process holds n reflection and health-watch streams open on the worker socket
  without sending; a victim job's phase events (BeginPhase + EndPhase) beside it.
- gRPC connections: n connections to the worker socket that send the HTTP/2 preface and then nothing;
  the victim beside them; the daemon's threads, RSS and open descriptors.
- flapping clients: k processes that open a session, run one phase, close and disconnect, in a loop as fast
  as they can; the victim beside them; how many cycles the flappers got through and how many were refused.

For the gRPC cases the victim is a session opened before the attack, running ``VICTIM_ROUND_TRIPS``
BeginPhase + EndPhase round trips alone and then with the attack held; its p50/p99 and the round trips
that missed the client's own deadline (2 s) are the figures.

Usage: python -m soak.exhaust [--metrics-connections 4000] [--streams 200] [--grpc-connections 2000]
[--flappers 4] [--json out/exhaust.json]. The exit code is 1 when a case broke its promise (a scrape or a
victim's call failed, or a flood cost the daemon threads).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing as mp
import os
import resource
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from functools import partial
from multiprocessing.queues import Queue
from multiprocessing.synchronize import Event
from pathlib import Path
from typing import Any

import grpc
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from perf.stats import percentile
from soak.daemon import GEN, REPO, TRAIN, DaemonProcess, wait_for
from soak.proc import cpu_s, fds, rss_mib, threads

SCRAPES = 20
SCRAPE_TIMEOUT_S = 60.0
CONNECT_PATIENCE_S = 300.0
"""How long the flood may take to open (a thread-per-connection server accepts slowly)."""
CONNECT_TRY_S = 0.05
SETTLE_S = 10.0
"""The daemon's thread count must hold still this long before the flood's figures are read."""
THREAD_SLACK = 10
"""Threads a flood may add before the case counts as failed (the metrics server's promise is zero)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def raise_fd_limit() -> int:
    """Raise this process's (and so the daemon's) descriptor limit to the hard limit; the new soft limit."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


@contextlib.contextmanager
def daemon_with_metrics() -> Iterator[tuple[DaemonProcess, int]]:
    """A sim-backend eerld serving /metrics on a free loopback port; stopped on exit."""
    directory = Path(tempfile.mkdtemp(prefix="eerl-ex-", dir="/tmp"))
    port = free_port()
    daemon = DaemonProcess(directory, gpus=2, extra_args=[f"--metrics-address=127.0.0.1:{port}"])
    try:
        daemon.start()
        wait_for(lambda: _answers(port), "/metrics to answer")
        yield daemon, port
    finally:
        daemon.stop()
        shutil.rmtree(directory, ignore_errors=True)


def _answers(port: int) -> bool:
    try:
        scrape(port)
    except OSError:
        return False
    return True


def scrape(port: int) -> float:
    """One scrape on a fresh connection; its latency in seconds (OSError when it fails)."""
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=SCRAPE_TIMEOUT_S) as reply:
        body = reply.read()
        if reply.status != 200 or b"eerl_build_info" not in body:
            raise OSError(f"scrape answered {reply.status} without the metrics")
    return time.perf_counter() - t0


def scrape_latencies(port: int, count: int = SCRAPES) -> tuple[list[float], int]:
    """``count`` scrapes one after the other: the latencies of those that answered, and how many failed."""
    latencies, failed = [], 0
    for _ in range(count):
        try:
            latencies.append(scrape(port))
        except OSError:
            failed += 1
    return latencies, failed


def open_idle(port: int, n: int) -> tuple[list[socket.socket], float]:
    """Open ``n`` connections one after the other, as fast as the daemon accepts them.

    One at a time, because a burst of SYNs overflows the kernel's queues and some handshakes then
    complete on the client's side only (SYN cookies): connections the daemon never sees. A SYN the full
    accept queue dropped is sent again after :data:`CONNECT_TRY_S` instead of the kernel's 1 s. Returns
    the connected (non-blocking) sockets and the seconds it took.
    """
    t0 = time.monotonic()
    connected: list[socket.socket] = []
    while len(connected) < n and time.monotonic() - t0 < CONNECT_PATIENCE_S:
        sock = socket.socket()
        sock.settimeout(CONNECT_TRY_S)
        try:
            sock.connect(("127.0.0.1", port))
        except OSError:
            sock.close()
            continue
        sock.setblocking(False)
        connected.append(sock)
    return connected, time.monotonic() - t0


def closed_by_peer(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the other side has closed so far (orderly or reset); may be asked again."""
    closed = 0
    for sock in socks:
        try:
            closed += sock.recv(1) == b""
        except BlockingIOError:
            pass
        except OSError:
            closed += 1
    return closed


def settled(measure: Callable[[], int], still_s: float = SETTLE_S, patience_s: float = 180.0) -> int:
    """Sample ``measure`` until it has held still for ``still_s``; its peak.

    Long, because a slow acceptor leaves connections half-open in the kernel (the client sees them up) and
    takes them one SYN-ACK retransmission (1, 2, 4, 8 s ...) at a time.
    """
    peak = last = measure()
    still_since, end = time.monotonic(), time.monotonic() + patience_s
    while time.monotonic() < end and time.monotonic() - still_since < still_s:
        time.sleep(0.2)
        value = measure()
        peak = max(peak, value)
        if value != last:
            last, still_since = value, time.monotonic()
    return peak


def metrics_connections(n: int) -> dict[str, Any]:
    """n idle connections to /metrics: the daemon's threads and RSS, a scrape's latency, without and with."""
    fd_limit = raise_fd_limit()
    with daemon_with_metrics() as (daemon, port):
        scrape(port)  # warm-up: first scrape imports and builds what later ones reuse
        quiet, quiet_failed = scrape_latencies(port)
        threads_before, rss_before = threads(daemon.pid), rss_mib(daemon.pid)
        flood, open_s = open_idle(port, n)
        try:
            loud, loud_failed = scrape_latencies(port)  # at once: the flood holds every slot it can
            closed_at_once = closed_by_peer(flood)
            threads_with = settled(lambda: threads(daemon.pid))
            rss_with = rss_mib(daemon.pid)
            closed_later = closed_by_peer(flood)  # an end of stream reads again as one
        finally:
            for sock in flood:
                sock.close()
    return {
        "case": "metrics_connections",
        "connections": n,
        "connected": len(flood),
        "open_s": open_s,
        "closed_by_daemon_at_once": closed_at_once,
        "closed_by_daemon_after_settling": closed_later,
        "fd_limit": fd_limit,
        "threads_before": threads_before,
        "threads_with_flood": threads_with,
        "rss_before_mib": rss_before,
        "rss_with_flood_mib": rss_with,
        "scrape_p50_ms": statistics.median(quiet) * 1000 if quiet else None,
        "scrape_p50_with_flood_ms": statistics.median(loud) * 1000 if loud else None,
        "scrapes": SCRAPES,
        "scrapes_failed": quiet_failed,
        "scrapes_failed_with_flood": loud_failed,
        "ok": loud_failed == 0 and quiet_failed == 0 and threads_with <= threads_before + THREAD_SLACK,
    }


VICTIM_ROUND_TRIPS = 1000
CLIENT_DEADLINE_S = 2.0
"""The eerl client's own RPC deadline: a victim's call slower than this would have been lost."""
VICTIM_TIMEOUT_S = 5.0
GIVE_UP_AFTER = 5
"""Victim round trips that fail before the case stops waiting (a starved daemon would take hours)."""
ATTACKER = REPO / "tests/security/attacker.py"
WORK = pb.Workload(tokens=2, valid_tokens=1, sequences=1)


@contextlib.contextmanager
def grpc_daemon(gpus: int = 8, *extra: str) -> Iterator[DaemonProcess]:
    """A sim-backend eerld, shared socket in single-tenant mode, no clock-change limit; stopped on exit."""
    directory = Path(tempfile.mkdtemp(prefix="eerl-ex-", dir="/tmp"))
    daemon = DaemonProcess(directory, gpus=gpus, extra_args=["--max-clock-changes-per-s=0", *extra])
    try:
        daemon.start()
        yield daemon
    finally:
        daemon.stop()
        shutil.rmtree(directory, ignore_errors=True)


class Victim:
    """Another job's session on GPU 0, opened before any attack, measured alone and under attack."""

    def __init__(self, socket_path: Path) -> None:
        self._channel = grpc.insecure_channel(f"unix:{socket_path}")
        self._stub = pb_grpc.PhaseServiceStub(self._channel)
        request = pb.OpenSessionRequest(job_id="victim", gpus=[pb.GpuRef(index=0)])
        self._sid = self._stub.OpenSession(request, timeout=30).session_id
        self._iteration = 0

    def round_trips(self, n: int = VICTIM_ROUND_TRIPS) -> dict[str, Any]:
        """n BeginPhase + EndPhase round trips: p50 and p99 in ms, and how many missed the client deadline."""
        latencies, late, failed = [], 0, 0
        for done in range(n):
            if failed >= GIVE_UP_AFTER:  # starved: count the rest as failed rather than wait for each
                failed += n - done
                break
            kind = GEN if self._iteration % 2 == 0 else TRAIN
            start = time.perf_counter()
            try:
                self._stub.BeginPhase(
                    pb.BeginPhaseRequest(session_id=self._sid, kind=kind, iteration=self._iteration),
                    timeout=VICTIM_TIMEOUT_S,
                )
                self._stub.EndPhase(
                    pb.EndPhaseRequest(
                        session_id=self._sid, kind=kind, iteration=self._iteration, workload=WORK
                    ),
                    timeout=VICTIM_TIMEOUT_S,
                )
            except grpc.RpcError:
                failed += 1
            elapsed = time.perf_counter() - start
            latencies.append(elapsed * 1000)
            late += elapsed > CLIENT_DEADLINE_S
            self._iteration += 1
        return {
            "p50_ms": percentile(latencies, 0.5),
            "p99_ms": percentile(latencies, 0.99),
            "late": late,
            "failed": failed,
        }

    def close(self) -> None:
        with contextlib.suppress(grpc.RpcError):
            self._stub.CloseSession(pb.CloseSessionRequest(session_id=self._sid), timeout=10)
        self._channel.close()


def _victim_ok(*figures: dict[str, Any]) -> bool:
    return all(f["late"] == 0 and f["failed"] == 0 for f in figures)


def idle_streams(n: int) -> dict[str, Any]:
    """Another process holds n idle streams on the worker socket; the victim's round trips beside them."""
    with grpc_daemon() as daemon:
        victim = Victim(daemon.socket_path)
        alone = victim.round_trips()
        threads_before = threads(daemon.pid)
        spec = {"uid": os.getuid(), "gid": os.getgid(), "target": f"unix:{daemon.socket_path}"}
        spec["hold"] = {"streams": n, "channels": max(1, n // 8)}
        proc = subprocess.Popen(
            [sys.executable, str(ATTACKER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert proc.stdin is not None
        assert proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(spec) + "\n")
            proc.stdin.flush()
            ready = json.loads(proc.stdout.readline() or "{}")
            threads_with = threads(daemon.pid)
            under = victim.round_trips()
        finally:
            proc.stdin.close()
            proc.wait(timeout=120)
            proc.stdout.close()
        victim.close()
    ended = ready.get("ended_at_once", {})
    return {
        "case": "idle_streams",
        "streams": n,
        "ended_at_once": ended,
        "held_open": n - sum(ended.values()),
        "threads_before": threads_before,
        "threads_with": threads_with,
        "victim_alone": alone,
        "victim_under_attack": under,
        "ok": bool(ready) and _victim_ok(alone, under),
    }


def grpc_connections(n: int) -> dict[str, Any]:
    """n connections to the worker socket that say the HTTP/2 preface and nothing more; the victim beside."""
    raise_fd_limit()
    with grpc_daemon() as daemon:
        victim = Victim(daemon.socket_path)
        alone = victim.round_trips()
        threads_before, rss_before, fds_before = threads(daemon.pid), rss_mib(daemon.pid), fds(daemon.pid)
        flood, refused = [], 0
        try:
            for _ in range(n):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(5)
                flood.append(sock)
                try:
                    sock.connect(str(daemon.socket_path))
                    sock.sendall(H2_PREFACE)
                except OSError:
                    refused += 1
            time.sleep(1.0)
            closed = closed_by_peer(flood)
            threads_with, rss_with, fds_with = threads(daemon.pid), rss_mib(daemon.pid), fds(daemon.pid)
            under = victim.round_trips()
        finally:
            for sock in flood:
                sock.close()
        victim.close()
    return {
        "case": "grpc_connections",
        "connections": n,
        "refused_at_connect": refused,
        "closed_by_daemon": closed,
        "threads_before": threads_before,
        "threads_with": threads_with,
        "rss_before_mib": rss_before,
        "rss_with_mib": rss_with,
        "fds_before": fds_before,
        "fds_with": fds_with,
        "victim_alone": alone,
        "victim_under_attack": under,
        "ok": _victim_ok(alone, under) and threads_with <= threads_before + THREAD_SLACK,
    }


H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _flapper(socket_path: str, gpu: int, stop: Event, out: Queue[tuple[int, int]]) -> None:
    """Open a session, one phase, close, disconnect; again, as fast as the daemon lets it."""
    cycles = refused = 0
    while not stop.is_set():
        with grpc.insecure_channel(f"unix:{socket_path}") as channel:
            stub = pb_grpc.PhaseServiceStub(channel)
            try:
                request = pb.OpenSessionRequest(job_id=f"flap-{gpu}", gpus=[pb.GpuRef(index=gpu)])
                sid = stub.OpenSession(request, timeout=10).session_id
                stub.BeginPhase(pb.BeginPhaseRequest(session_id=sid, kind=GEN, iteration=0), timeout=10)
                stub.EndPhase(
                    pb.EndPhaseRequest(session_id=sid, kind=GEN, iteration=0, workload=WORK), timeout=10
                )
                stub.CloseSession(pb.CloseSessionRequest(session_id=sid), timeout=10)
                cycles += 1
            except grpc.RpcError:
                refused += 1
    out.put((cycles, refused))


def flapping(k: int) -> dict[str, Any]:
    """k flapping client processes on GPUs 1..k; the victim's round trips alone and beside them."""
    with grpc_daemon() as daemon:
        victim = Victim(daemon.socket_path)
        cpu_before, t0 = cpu_s(daemon.pid), time.monotonic()
        alone = victim.round_trips()
        daemon_cores_alone = (cpu_s(daemon.pid) - cpu_before) / (time.monotonic() - t0)
        ctx = mp.get_context("spawn")
        stop = ctx.Event()
        out: Queue[tuple[int, int]] = ctx.Queue()
        procs = [
            ctx.Process(target=_flapper, args=(str(daemon.socket_path), g + 1, stop, out)) for g in range(k)
        ]
        for p in procs:
            p.start()
        time.sleep(2.0)
        cpu_before, t0 = cpu_s(daemon.pid), time.monotonic()
        under = victim.round_trips()
        daemon_cores = (cpu_s(daemon.pid) - cpu_before) / (time.monotonic() - t0)
        stop.set()
        counts = [out.get(timeout=60) for _ in procs]
        for p in procs:
            p.join(timeout=30)
        victim.close()
    return {
        "case": "flapping",
        "flappers": k,
        "cycles": sum(c for c, _ in counts),
        "refused": sum(r for _, r in counts),
        "daemon_cores_alone": daemon_cores_alone,
        "daemon_cores_under_attack": daemon_cores,
        "victim_alone": alone,
        "victim_under_attack": under,
        "ok": _victim_ok(alone, under),
    }


def _victim_text(r: dict[str, Any]) -> str:
    a, u = r["victim_alone"], r["victim_under_attack"]
    return (
        f"victim p50/p99 {a['p50_ms']:.2f}/{a['p99_ms']:.2f} ms alone -> "
        f"{u['p50_ms']:.2f}/{u['p99_ms']:.2f} ms "
        f"(x{u['p50_ms'] / a['p50_ms']:.2f} p50), {u['late']} over the {CLIENT_DEADLINE_S:g} s deadline, "
        f"{u['failed']} failed"
    )


def idle_streams_line(r: dict[str, Any]) -> str:
    return (
        f"idle streams: {r['streams']} held by another process ({r['held_open']} stay open, ended at once: "
        f"{r['ended_at_once']}); threads {r['threads_before']} -> {r['threads_with']}; {_victim_text(r)}"
    )


def grpc_connections_line(r: dict[str, Any]) -> str:
    return (
        f"gRPC connections: {r['connections']} idle ({r['refused_at_connect']} refused at connect, "
        f"{r['closed_by_daemon']} closed by eerld); threads {r['threads_before']} -> {r['threads_with']}, "
        f"RSS {r['rss_before_mib']:.1f} -> {r['rss_with_mib']:.1f} MiB, fds {r['fds_before']} -> "
        f"{r['fds_with']}; {_victim_text(r)}"
    )


def flapping_line(r: dict[str, Any]) -> str:
    return (
        f"flapping: {r['flappers']} clients, {r['cycles']} open-phase-close cycles, {r['refused']} refused; "
        f"daemon {r['daemon_cores_alone']:.2f} -> {r['daemon_cores_under_attack']:.2f} cores (serving the "
        f"victim too); {_victim_text(r)}"
    )


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f} ms"


def metrics_connections_line(r: dict[str, Any]) -> str:
    return (
        f"metrics: {r['connections']} idle connections ({r['connected']} up in {r['open_s']:.1f} s; "
        f"eerld closed {r['closed_by_daemon_at_once']} at once, {r['closed_by_daemon_after_settling']} "
        f"after {SETTLE_S:.0f} s): threads {r['threads_before']} -> "
        f"{r['threads_with_flood']}, RSS {r['rss_before_mib']:.1f} -> {r['rss_with_flood_mib']:.1f} MiB; "
        f"scrape p50 {_ms(r['scrape_p50_ms'])} -> {_ms(r['scrape_p50_with_flood_ms'])} "
        f"({r['scrapes_failed_with_flood']}/{r['scrapes']} failed with the flood)"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m soak.exhaust", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--metrics-connections", type=int, metavar="N", help="idle connections to /metrics (default 4000)"
    )
    parser.add_argument("--streams", type=int, metavar="N", help="idle streams on the worker socket (200)")
    parser.add_argument("--grpc-connections", type=int, metavar="N", help="idle gRPC connections (2000)")
    parser.add_argument("--flappers", type=int, metavar="K", help="flapping client processes (4)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    chosen = {
        "metrics": (args.metrics_connections, 4000, metrics_connections, metrics_connections_line),
        "streams": (args.streams, 200, idle_streams, idle_streams_line),
        "connections": (args.grpc_connections, 2000, grpc_connections, grpc_connections_line),
        "flapping": (args.flappers, 4, flapping, flapping_line),
    }
    none = all(size is None for size, *_ in chosen.values())  # none selected: every case, default sizes
    cases: list[tuple[Callable[[], dict[str, Any]], Callable[[dict[str, Any]], str]]] = [
        (partial(fn, size if size is not None else default), line)
        for size, default, fn, line in chosen.values()
        if size is not None or none
    ]
    results = []
    for run, line in cases:
        result = run()
        print(line(result), flush=True)
        results.append(result)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2, sort_keys=True))
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
