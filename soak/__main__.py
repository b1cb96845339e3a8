"""``python -m soak`` (``make soak``): every promise of docs/reliability.md at full size, with figures.

Sections (each prints its figures as it ends; all are written to a JSON file):

- load: 64 concurrent client processes x 1000 phase events over the Unix socket; events booked vs sent,
  p50/p99 round trip beside a no-op gRPC echo floor at the same concurrency, daemon RSS and CPU;
- client kills: 50 clients SIGKILLed mid-phase; time to reset, leaked locks;
- daemon kills: 20 SIGKILLs of the daemon under load; ledger intact, no GPU locked without an owner,
  clients back on their own;
- ledger-write kills: 20 SIGKILLs of a process rewriting the ledger in a tight loop;
- NVML faults: each typed error at each backend call site, injected while serving and before start;
  an energy counter reset mid-phase;
- fuzz: >= 10 000 hypothesis-drawn requests to every RPC;
- privilege: tests/reliability/test_privilege.py (sockets as another uid, tokens, TLS, rate limit);
- exhaustion: idle streams, idle gRPC and /metrics connections, flapping clients, each with another
  client's latency beside it (:mod:`soak.exhaust`), and the attack suite tests/security.

Usage: python -m soak [--quick] [--only SECTION,…] [--json out/soak.json], from the repository root.
``--quick`` uses the counts of the fast part. The exit code is 1 if any promise failed.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from soak import exhaust, faults, fuzz, kills, load
from soak.daemon import REPO

FULL = {
    "clients": 64,
    "events": 1000,
    "client_kills": 50,
    "daemon_kills": 20,
    "ledger_kills": 20,
    "fuzz": 10_000,
    "streams": 200,
    "grpc_connections": 2000,
    "metrics_connections": 4000,
    "flappers": 4,
}
QUICK = {
    "clients": 8,
    "events": 100,
    "client_kills": 5,
    "daemon_kills": 3,
    "ledger_kills": 3,
    "fuzz": 1000,
    "streams": 50,
    "grpc_connections": 300,
    "metrics_connections": 500,
    "flappers": 2,
}


def _load(n: dict[str, int]) -> tuple[bool, dict[str, Any], str]:
    r = load.run_load(n["clients"], n["events"])
    ok = not r["mismatches"] and r["rpc_errors"] == 0 and r["sessions_left_after_close"] == 0
    line = (
        f"{r['clients']} clients x {r['events_per_client']} events: {r['events_sent']} sent, "
        f"{len(r['mismatches'])} lost or misattributed, {r['rpc_errors']} RPC errors; "
        f"round trip p50 {r['p50_ms']:.1f} ms p99 {r['p99_ms']:.1f} ms vs echo floor "
        f"p50 {r['floor_p50_ms']:.1f} ms p99 {r['floor_p99_ms']:.1f} ms "
        f"(ratio p50 {r['ratio_p50']:.2f}x, p99 {r['ratio_p99']:.2f}x); {r['events_per_s']:.0f} events/s; "
        f"daemon CPU {r['daemon_cpu_s']:.1f} s ({r['daemon_cpu_percent']:.0f}% of one core), "
        f"RSS {r['daemon_rss_start_mib']:.0f} -> peak {r['daemon_rss_peak_mib']:.0f} MiB"
    )
    return ok, r, line


def _client_kills(n: dict[str, int]) -> tuple[bool, dict[str, Any], str]:
    r = kills.client_kills(n["client_kills"])
    ok = (
        not r["problems"]
        and r["over_bound"] == 0
        and r["leaked_locks"] == 0
        and r["ledger_entries_left"] == 0
    )
    line = (
        f"{r['kills']} SIGKILLs mid-phase: reset median {r['reset_median_s'] * 1e3:.0f} ms, "
        f"max {r['reset_max_s'] * 1e3:.0f} ms (bound {r['bound_s']:.0f} s, {r['over_bound']} over); "
        f"{r['leaked_locks']} leaked locks, {r['ledger_entries_left']} ledger entries left"
    )
    return ok, r, line


def _daemon_kills(n: dict[str, int]) -> tuple[bool, dict[str, Any], str]:
    r = kills.daemon_kills(n["daemon_kills"])
    ok = (
        not r["problems"]
        and r["workers_alive_at_end"] == r["clients"]
        and r["leaked_locks_at_end"] == 0
        and r["ledger_entries_at_end"] == 0
    )
    line = (
        f"{r['kills']} daemon SIGKILLs under {r['clients']} workers: {len(r['problems'])} problems "
        f"(corrupt ledger, lock not in ledger, GPU locked without owner); {r['gpus_locked_at_kill_total']} "
        f"GPUs locked at the kills, {r['gpus_reset_from_ledger_total']} reset from the ledger at restart; "
        f"clients back in median {r['reconnect_median_s']:.2f} s, max {r['reconnect_max_s']:.2f} s; "
        f"{r['workers_alive_at_end']}/{r['clients']} workers alive; {r['leaked_locks_at_end']} locks left"
    )
    return ok, r, line


def _ledger_kills(n: dict[str, int]) -> tuple[bool, dict[str, Any], str]:
    r = kills.ledger_write_kills(n["ledger_kills"])
    return r["corrupt"] == 0, r, f"{r['kills']} SIGKILLs mid ledger rewrite: {r['corrupt']} corrupt ledgers"


def _faults(_n: dict[str, int]) -> tuple[bool, dict[str, Any], str]:
    methods, errors = faults.BACKEND_METHODS, faults.ERRORS
    serving = faults.fault_matrix(methods, errors, at_start=False)
    at_start = faults.fault_matrix(methods, errors, at_start=True)
    energy = faults.energy_counter_reset()
    reset = energy["with_reset"]
    energy_ok = 0 <= reset["measured_j"] <= reset["true_j"]
    r = {"serving": serving, "at_start": at_start, "energy_counter_reset": energy}
    ok = not serving["problems"] and not at_start["problems"] and energy_ok
    line = (
        f"{len(errors)} errors x {len(methods)} call sites: {serving['failed_cases']}/{serving['cases']} "
        f"cases failed while serving, {at_start['failed_cases']}/{at_start['cases']} injected before start; "
        f"counter reset mid-phase booked {reset['measured_j']:.0f} J of a true {reset['true_j']:.0f} J "
        f"(lower bound, never negative); next phase {energy['without_reset']['measured_j']:.0f} J vs "
        f"true {energy['without_reset']['true_j']:.0f} J"
    )
    return ok, r, line


def _fuzz(n: dict[str, int]) -> tuple[bool, dict[str, Any], str]:
    r = fuzz.run_fuzz(n["fuzz"])
    line = (
        f"{r['requests']} fuzzed requests over {r['rpcs']} RPCs: {r['problem_count']} crashes, undocumented "
        f"codes or state changes; codes {r['codes']}"
    )
    return r["problem_count"] == 0, r, line


def _exhaustion(n: dict[str, int]) -> tuple[bool, dict[str, Any], str]:
    cases = (
        (exhaust.idle_streams, n["streams"], exhaust.idle_streams_line),
        (exhaust.grpc_connections, n["grpc_connections"], exhaust.grpc_connections_line),
        (exhaust.metrics_connections, n["metrics_connections"], exhaust.metrics_connections_line),
        (exhaust.flapping, n["flappers"], exhaust.flapping_line),
    )
    results = {}
    lines = []
    for run, size, describe in cases:
        r = run(size)
        results[r["case"]] = r
        lines.append(describe(r))
    ok, suite, suite_line = _pytest(REPO / "tests" / "security")
    results["attack_suite"] = suite
    return (
        all(r["ok"] for r in results.values() if "ok" in r) and ok,
        results,
        "\n  ".join([*lines, suite_line]),
    )


def _privilege(_n: dict[str, int]) -> tuple[bool, dict[str, Any], str]:
    return _pytest(REPO / "tests" / "reliability" / "test_privilege.py")


def _pytest(test: Path) -> tuple[bool, dict[str, Any], str]:
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    summary = proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else proc.stderr[-300:]
    return proc.returncode == 0, {"pytest": summary}, f"{test.relative_to(REPO)}: {summary}"


SECTIONS: list[tuple[str, Callable[[dict[str, int]], tuple[bool, dict[str, Any], str]]]] = [
    ("load", _load),
    ("client_kills", _client_kills),
    ("daemon_kills", _daemon_kills),
    ("ledger_write_kills", _ledger_kills),
    ("nvml_faults", _faults),
    ("fuzz", _fuzz),
    ("privilege", _privilege),
    ("exhaustion", _exhaustion),
]


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m soak", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the fast part's counts")
    parser.add_argument("--json", type=Path, default=REPO / "out" / "soak.json")
    parser.add_argument("--only", help="comma-separated sections to run")
    args = parser.parse_args()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.CRITICAL))
    counts = QUICK if args.quick else FULL
    wanted = set(args.only.split(",")) if args.only else {name for name, _ in SECTIONS}
    results: dict[str, Any] = {"counts": counts}
    failed: list[str] = []
    t_start = time.monotonic()
    for name, run in SECTIONS:
        if name not in wanted:
            continue
        t0 = time.monotonic()
        try:
            ok, figures, line = run(counts)
        except Exception as e:  # a section that blows up is a failed promise, and the others still run
            ok, figures, line = False, {"error": repr(e)}, f"ERROR {e!r}"
        figures["ok"], figures["wall_s"] = ok, time.monotonic() - t0
        results[name] = figures
        if not ok:
            failed.append(name)
        print(f"[{'ok' if ok else 'FAIL'}] {name} ({figures['wall_s']:.0f} s): {line}", flush=True)
    results["total_wall_s"] = time.monotonic() - t_start
    results["failed"] = failed
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(results, indent=2, sort_keys=True))
    print(
        f"soak: {len(failed)} failed {failed}; total {results['total_wall_s']:.0f} s; figures in {args.json}"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
