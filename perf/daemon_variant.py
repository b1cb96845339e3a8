"""eerld with parts of its work taken out, to see where a phase event's time goes.

:mod:`perf.phase_latency` runs these beside the real daemon (``--backends sim,fake,nolog,noop,spin``):

- ``sim``: eerld as shipped, on the sim backend (what ``python -m eerld.main --backend=sim`` runs);
- ``fake``: the in-memory fake backend instead of the simulator (the daemon's cost without the physics);
- ``nolog``: the sim backend with log lines below WARNING dropped (the cost of the lock's log line);
- ``noop``: the same gRPC servers, interceptor, health and reflection, but BeginPhase and EndPhase answer
  at once (the cost of eerld's gRPC surface alone);
- ``spin``: ``noop`` whose BeginPhase and EndPhase run an empty loop instead, by default as long as
  eerld's take in the server on this VM (``EERL_SPIN_US=BEGIN,END`` in µs, default 185,60): a control
  with the same CPU time in the handler and none of eerld's code, data or threads. If it costs what
  ``sim`` costs, the round trip is set by the handler's CPU time, not by what the daemon does with it.

With ``EERL_HANDLER_TIMES=FILE`` the process writes, when it stops, the median and p99 of each RPC's
duration as the server saw it (the span the ``eerl_rpc_duration_seconds`` histogram observes).

Usage: python -m perf.daemon_variant sim|fake|nolog|noop|spin GPUS [eerld flags...]  (--backend is ignored)
"""

from __future__ import annotations

import atexit
import collections
import logging
import os
import statistics
import sys
import timeit

import structlog
from eerl.phases import ControllerState

from eerld.api.server import create_server, serve
from eerld.config import load_config
from eerld.daemon import BeganPhase, Daemon, EndedPhase
from eerld.daemon.phases import PhasePath
from eerld.gpu.base import GpuBackend
from eerld.logging import configure_logging
from eerld.testing import FakeGpuBackend
from perf.stats import percentile

VARIANTS = ("sim", "fake", "nolog", "noop", "spin")
DEFAULT_SPIN_US = "185,60"
BEGAN = BeganPhase((), ControllerState.FIXED, 1200)
ENDED = EndedPhase(1.0, 1000.0, 1.0, ControllerState.FIXED)
"""What the noop and spin variants answer."""


def answer_at_once() -> None:
    """BeginPhase/EndPhase return constants: what is left is eerld's gRPC surface."""
    PhasePath.begin_phase = lambda self, *args: BEGAN  # type: ignore[method-assign]
    PhasePath.end_phase = lambda self, *args: ENDED  # type: ignore[method-assign]


def spin_instead(begin_us: float, end_us: float) -> None:
    """BeginPhase/EndPhase hold the CPU (and the GIL) for about the given time, then return constants.

    A fixed amount of work (loop turns calibrated at start, the median of 21 tries), not a deadline: when
    the machine slows down, it stretches as the daemon's own work would.
    """

    def work(turns: int) -> None:
        for _ in range(turns):
            pass

    calibration_turns = 100_000
    typical_s = statistics.median(timeit.repeat(lambda: work(calibration_turns), number=1, repeat=21))
    begin_turns = round(calibration_turns * begin_us * 1e-6 / typical_s)
    end_turns = round(calibration_turns * end_us * 1e-6 / typical_s)

    def begin(self: PhasePath, *args: object) -> BeganPhase:
        work(begin_turns)
        return BEGAN

    def end(self: PhasePath, *args: object) -> EndedPhase:
        work(end_turns)
        return ENDED

    PhasePath.begin_phase = begin  # type: ignore[method-assign,assignment]
    PhasePath.end_phase = end  # type: ignore[method-assign,assignment]


def record_handler_times(daemon: Daemon, path: str) -> None:
    durations: dict[str, list[float]] = collections.defaultdict(list)
    daemon.events.subscribe(on_rpc=lambda name, _code, seconds: durations[name].append(seconds))

    def write() -> None:
        with open(path, "w") as out:
            for name, values in sorted(durations.items()):
                out.write(f"{name} {len(values)} {statistics.median(values)} {percentile(values, 0.99)}\n")

    atexit.register(write)


def main() -> int:
    variant, gpus = sys.argv[1], int(sys.argv[2])
    if variant not in VARIANTS:
        sys.exit(f"Error: variant must be one of {', '.join(VARIANTS)}, not {variant!r}")
    config = load_config([*sys.argv[3:], "--backend=sim"])
    configure_logging(config.log_format)
    if variant == "nolog":
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    if variant == "noop":
        answer_at_once()
    if variant == "spin":
        begin_us, end_us = (float(us) for us in os.environ.get("EERL_SPIN_US", DEFAULT_SPIN_US).split(","))
        spin_instead(begin_us, end_us)
    backend: GpuBackend | None = FakeGpuBackend(gpus) if variant == "fake" else None
    server = create_server(config, backend=backend)
    if os.environ.get("EERL_HANDLER_TIMES"):
        record_handler_times(server.daemon, os.environ["EERL_HANDLER_TIMES"])
    return serve(server)


if __name__ == "__main__":
    sys.exit(main())
