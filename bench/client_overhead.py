"""What one phase event costs the training thread: median caller time with the daemon present and absent.

The caller's side of a phase is ``Phase.__enter__`` (queue a begin) and ``Phase.__exit__`` (queue an end);
the background sender does the RPCs. This script times both calls around an empty phase body, with the
phases paced (``--gap-ms``) as a real job's are, so that the sender keeps up and competes for the GIL as
it would. Target: under 50 µs per event.

    .venv/bin/python bench/client_overhead.py [--phases 2000] [--gap-ms 1] [--daemon fake|eerld]

``--daemon eerld`` runs the real daemon in-process (``eerld.testing.running_daemon``, fake GPU backend);
``fake`` (default) uses the client's recording fake (``eerl.testing.FakeDaemon``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import eerl
from eerl import ClientConfig
from eerl.testing import FakeDaemon


def measure(config: ClientConfig, phases: int, gap_s: float) -> tuple[list[int], eerl.ClientStats]:
    """Per-phase caller cost (begin + end) in nanoseconds, and the sender's stats afterwards."""
    costs_ns: list[int] = []
    clock = time.perf_counter_ns
    with eerl.connect(gpus=[0], job_id="bench", config=config) as session:
        session.wait_until_connected(2.0)
        for i in range(phases):
            kind = "generation" if i % 2 == 0 else "training"
            phase = session.phase(kind, iteration=i // 2)
            start_ns = clock()
            phase.__enter__()
            phase.report(tokens=100, valid_tokens=80, sequences=4)
            phase.__exit__(None, None, None)
            costs_ns.append(clock() - start_ns)
            time.sleep(gap_s)
        session.flush(5.0)
        stats = session.stats()
    return costs_ns, stats


@contextlib.contextmanager
def daemon(kind: str, directory: Path) -> Iterator[ClientConfig]:
    """A daemon to talk to, and the client config that reaches it."""
    if kind == "eerld":
        from eerld.testing import running_daemon  # noqa: PLC0415 - only this mode needs the daemon package

        with running_daemon(directory) as handle:
            yield ClientConfig.uds(handle.socket_path)
        return
    with FakeDaemon(directory / "eerld.sock") as fake:
        yield fake.config


def report(label: str, costs_ns: list[int], stats: eerl.ClientStats) -> None:
    per_phase_us = statistics.median(costs_ns) / 1000
    p99_us = statistics.quantiles(costs_ns, n=100)[98] / 1000
    print(
        f"{label:<16} median {per_phase_us:6.1f} µs/phase = {per_phase_us / 2:5.1f} µs/event"
        f"   p99 {p99_us:6.1f} µs/phase   sent {stats.sent_events}, dropped {stats.dropped_events},"
        f" stale {stats.stale_events}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--phases", type=int, default=2000)
    parser.add_argument("--gap-ms", type=float, default=1.0)
    parser.add_argument("--daemon", choices=["fake", "eerld"], default="fake")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    gap_s = args.gap_ms / 1000
    with tempfile.TemporaryDirectory(prefix="eerl-bench-", dir="/tmp") as tmp:
        directory = Path(tmp)
        with daemon(args.daemon, directory) as config:
            costs_ns, stats = measure(config, args.phases, gap_s)
        report(f"present ({args.daemon})", costs_ns, stats)
        absent = dataclasses.replace(ClientConfig.uds(directory / "nobody.sock"), close_timeout_s=0.5)
        costs_ns, stats = measure(absent, args.phases, gap_s)
        report("absent", costs_ns, stats)
    return 0


if __name__ == "__main__":
    sys.exit(main())
