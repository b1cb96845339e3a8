"""Run a server until SIGTERM or SIGINT: the one loop of eerld's and eerl-csi's ``serve()``."""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from types import FrameType

import structlog

log = structlog.get_logger("eerld.signals")

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def serve_until_signal(start: Callable[[], None], stop: Callable[[], None]) -> int:
    """``start()``, wait for SIGTERM or SIGINT, ``stop()`` (also when ``start`` fails or the wait is
    interrupted), put the previous handlers back; return the exit code 0. Main thread only."""
    stopping = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal", signal=signal.Signals(signum).name)
        stopping.set()

    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        start()
        while not stopping.wait(1.0):
            pass
    finally:
        stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0


__all__ = ["STOP_SIGNALS", "serve_until_signal"]
