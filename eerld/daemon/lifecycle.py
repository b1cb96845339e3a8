"""The daemon's life cycle: running or stopping, and the reaper thread that ticks while it runs.

:class:`LifeCycle` is the one flag every mutating path checks first (:meth:`LifeCycle.check_running`:
``Unavailable("eerld is stopping")`` once shutdown began) and the background thread that calls the hub's
tick every interval until stopped. Setting the flag is not enough to order a claim in flight against
shutdown: the hub then settles the claim gate (:meth:`eerld.daemon.gate.ClaimGate.settle`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import structlog

from eerld.errors import Unavailable

log = structlog.get_logger("eerld.daemon")


class LifeCycle:
    """Running until :meth:`stop`; the reaper thread, when started."""

    def __init__(self) -> None:
        self._stopping = False
        self._reaper: threading.Thread | None = None
        self._reaper_stop = threading.Event()

    @property
    def stopping(self) -> bool:
        """True once shutdown began."""
        return self._stopping

    def check_running(self) -> None:
        """Unavailable once shutdown began (every mutating path calls this first)."""
        if self._stopping:
            raise Unavailable("eerld is stopping")

    def start_reaper(self, tick: Callable[[], None], interval_s: float) -> None:
        """Run ``tick`` in a background thread every ``interval_s`` until :meth:`stop`; one that raises is
        logged (``reaper_error``) and the next tick runs all the same."""

        def run() -> None:
            while not self._reaper_stop.wait(interval_s):
                try:
                    tick()
                except Exception:
                    log.exception("reaper_error")

        self._reaper = threading.Thread(target=run, name="eerld-reaper", daemon=True)
        self._reaper.start()

    def stop(self) -> None:
        """Refuse new calls from now on and stop the reaper (waits up to 5 s for its tick to end)."""
        self._stopping = True
        self._reaper_stop.set()
        if self._reaper is not None:
            self._reaper.join(timeout=5)


__all__ = ["LifeCycle"]
