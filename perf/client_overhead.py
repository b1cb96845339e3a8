"""What one phase event costs the training thread: median caller time with the daemon present and absent.

The caller's side of a phase is ``Phase.__enter__`` (queue a begin) and ``Phase.__exit__`` (queue an end);
the background sender does the RPCs. This script times both calls around an empty phase body, with the
phases paced (``--gap-ms``) as a real job's are, so that the sender keeps up and competes for the GIL as
it would. Target: under 50 µs per event. The last row, a disabled session (no queue, no thread), is the
floor that the interpreter and the machine set for the same calls; on a loaded machine it rises, and so do
the other rows with it.

    .venv/bin/python -m perf.client_overhead [--phases 1000] [--gap-ms 5] [--daemon fake|eerld]

The daemon runs in its own process, as in production (in-process, its server threads would take the
caller's GIL): ``--daemon eerld`` is the real daemon (``eerld.testing.running_daemon``, fake GPU backend),
``fake`` (default) the client's recording fake (``eerl.testing.FakeDaemon``).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import multiprocessing
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import eerl
from eerl import ClientConfig
from eerl.testing import FakeDaemon


def work(duration_s: float) -> None:
    """Stands in for the training thread's work between phase events: busy in native code.

    It keeps the CPU busy (a thread that sleeps wakes up on cold caches and a parked vCPU, which would be
    measured too) and gives up the GIL often, as PyTorch does inside its kernels and synchronisations.
    """
    deadline_s = time.perf_counter() + duration_s
    while time.perf_counter() < deadline_s:
        time.sleep(0)


def measure(configs: dict[str, ClientConfig], phases: int, gap_s: float) -> dict[str, list[int]]:
    """Per-phase caller cost (begin + end) in nanoseconds for each config, measured interleaved.

    One session per config is open at once and every round times one phase on each, in rotating order,
    so that all of them see the same load on a shared machine.
    """
    clock = time.perf_counter_ns
    sessions = {
        label: eerl.connect(gpus=[0], job_id="bench", config=config) for label, config in configs.items()
    }
    costs_ns: dict[str, list[int]] = {label: [] for label in sessions}
    try:
        for session in sessions.values():
            session.wait_until_connected(1.0)
        order = list(sessions.items())
        for i in range(phases):
            kind = "generation" if i % 2 == 0 else "training"
            for label, session in order[i % len(order) :] + order[: i % len(order)]:
                phase = session.phase(kind, iteration=i // 2)
                start_ns = clock()
                phase.__enter__()
                phase.report(tokens=100, valid_tokens=80, sequences=4)
                phase.__exit__(None, None, None)
                costs_ns[label].append(clock() - start_ns)
                work(gap_s)
        for label, session in sessions.items():
            session.flush(5.0)
            stats = session.stats()
            report(label, costs_ns[label], stats)
    finally:
        for session in sessions.values():
            session.close()
    return costs_ns


def serve(kind: str, directory: str, ready: Any, stop: Any) -> None:
    """Runs in a child process: the daemon to talk to, until ``stop`` is set."""
    logging.basicConfig(level=logging.ERROR)
    server: contextlib.AbstractContextManager[Any]
    if kind == "eerld":
        from eerld.testing import running_daemon  # noqa: PLC0415 - only this mode needs the daemon package

        server = running_daemon(Path(directory))
    else:
        server = FakeDaemon(Path(directory) / "eerld.sock")
    with server:
        ready.set()
        stop.wait()


@contextlib.contextmanager
def daemon(kind: str, directory: Path) -> Iterator[ClientConfig]:
    """A daemon in its own process (as in production: it must not share the caller's GIL), and its config."""
    context = multiprocessing.get_context("spawn")
    ready, stop = context.Event(), context.Event()
    child = context.Process(target=serve, args=(kind, str(directory), ready, stop), daemon=True)
    child.start()
    try:
        if not ready.wait(60):
            raise RuntimeError("the daemon did not start")
        yield ClientConfig.uds(directory / "eerld.sock")
    finally:
        stop.set()
        child.join(10)


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
        prog="python -m perf.client_overhead",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--phases", type=int, default=1000)
    parser.add_argument("--gap-ms", type=float, default=5.0)
    parser.add_argument("--daemon", choices=["fake", "eerld"], default="fake")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.ERROR)
    gap_s = args.gap_ms / 1000
    with tempfile.TemporaryDirectory(prefix="eerl-bench-", dir="/tmp") as tmp:
        directory = Path(tmp)
        with daemon(args.daemon, directory) as present:
            absent = dataclasses.replace(ClientConfig.uds(directory / "nobody.sock"), close_timeout_s=0.5)
            configs = {
                f"present ({args.daemon})": present,
                "absent": absent,
                "disabled (base)": ClientConfig.disabled_config(),
            }
            measure(configs, args.phases, gap_s)
    return 0


if __name__ == "__main__":
    sys.exit(main())
