"""Resource exhaustion from outside: what a flood costs a real eerld, and what it leaves for everyone else.

One function per case, each returning its figures as a dict; :func:`main` runs the cases selected on the
command line (all of them, at their default sizes, when none is).

- metrics connections: n idle TCP connections to ``/metrics`` that never send a byte. Figures: the
  daemon's threads and RSS before and with the flood, and the median latency of a legitimate scrape
  (20 scrapes, each on a fresh connection) without and with the flood held open.

Usage: python bench/soak_exhaust.py [--metrics-connections 4000] [--json out/exhaust.json]. The exit code
is 1 when a case broke its promise (a scrape failed, or the flood cost the daemon threads).
"""

from __future__ import annotations

import argparse
import contextlib
import resource
import shutil
import socket
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from soak_common import DaemonProcess, rss_mib, wait_for, write_json

SCRAPES = 20
SCRAPE_TIMEOUT_S = 60.0
CONNECT_PATIENCE_S = 300.0
"""How long the flood may take to open (a thread-per-connection server accepts slowly)."""
CONNECT_TRY_S = 0.05
SETTLE_S = 10.0
"""The daemon's thread count must hold still this long before the flood's figures are read."""
THREAD_SLACK = 10
"""Threads a flood may add before the case counts as failed (the metrics server's promise is zero)."""


def threads(pid: int) -> int:
    """Threads of a process (from /proc, Linux)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("Threads:"):
            return int(line.split()[1])
    return 0


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
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--metrics-connections", type=int, metavar="N", help="idle connections to /metrics (default 4000)"
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the figures as JSON")
    args = parser.parse_args(argv)
    cases: list[tuple[Callable[[], dict[str, Any]], Callable[[dict[str, Any]], str]]] = []
    if args.metrics_connections is not None:
        cases.append((lambda: metrics_connections(args.metrics_connections), metrics_connections_line))
    if not cases:  # none selected: every case at its default size
        cases.append((lambda: metrics_connections(4000), metrics_connections_line))
    results = []
    for run, line in cases:
        result = run()
        print(line(result), flush=True)
        results.append(result)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        write_json(args.json, results)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
