"""The sender behind ``EERL_SIDECAR``: a session's pump, with the job's sidecar in the daemon's place.

:class:`SidecarSender` is what :func:`eerl.connect` gives a :class:`eerl.Session` when ``EERL_SIDECAR`` is set
(or ``config=ClientConfig.sidecar(url)``): the pump of :mod:`eerl._pump` (the same fail-open contract and the
same rules as the daemon's sender) over a :class:`eerl.link.sidecar.SidecarLink`. The sidecar holds the daemon
session, so this sender opens none: it asks the sidecar now and then whether its session is open
(``connected``), and posts the events. When the sidecar cannot be reached, the sender backs off
(``reconnect_initial_s`` to ``reconnect_max_s``) and drops the events of that time.

The HTTP client itself (:class:`SidecarHttp`, which ``eerl phase`` uses) lives in :mod:`eerl.link.sidecar`.
"""

from __future__ import annotations

import logging
import threading
import time

from eerl._pump import BackgroundSender, Event
from eerl.config import ClientConfig
from eerl.link.base import DaemonLink, LinkError
from eerl.link.sidecar import SidecarLink, SidecarLinkError
from eerl.sidecar._address import parse_address

__all__ = ["SidecarSender"]

logger = logging.getLogger("eerl")

_STATUS_PERIOD_S = 5.0
"""How often an idle sender asks the sidecar whether its daemon session is open."""


class SidecarSender(BackgroundSender):
    """A :class:`eerl.Session`'s sender that posts phase events to the job's sidecar (see the module).

    :meth:`close` posts what is queued (bounded by ``close_timeout_s``) and stops; the sidecar's session
    stays.
    """

    _THREAD_NAME = "eerl-sidecar-sender"

    def __init__(self, config: ClientConfig) -> None:
        assert config.sidecar_url is not None
        super().__init__(config)
        self._url = config.sidecar_url
        self._link = SidecarLink(
            parse_address(config.sidecar_url), config.rpc_timeout_s, token=config.sidecar_token
        )
        self._poll_now = threading.Event()
        self._reachable = False
        self._retry_at_s = 0.0
        self._backoff_s = config.reconnect_initial_s
        self._next_status_s = 0.0

    # -- caller side (what Session uses; the rest is BackgroundSender's) -------------------------------

    def wait_until_connected(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for the sidecar to say its daemon session is open (``connected``: the
        sidecar answers and its session is open)."""
        deadline_s = time.monotonic() + timeout_s
        while not self._connected.is_set() and not self._closing.is_set():
            remaining_s = deadline_s - time.monotonic()
            if remaining_s <= 0:
                break
            self._poll_now.set()
            self._queue.wake()
            self._connected.wait(min(remaining_s, 0.05))
        return self._connected.is_set()

    def _session_view(self) -> tuple[str | None, bool]:
        """The sidecar's session (shortened) while its session is open."""
        connected = self.connected
        status = self._link.status
        return (status.session if connected else None), connected and status.attached

    def _route(self) -> tuple[DaemonLink, str] | None:
        if not self._reachable and time.monotonic() < self._retry_at_s:
            return None  # the sidecar was not there a moment ago: no wait per event (counted stale)
        return self._link, ""

    # -- the background thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._closing.is_set():
                self._step()
            deadline_s = time.monotonic() + self._config.close_timeout_s
            while time.monotonic() < deadline_s and (event := self._pop()) is not None:
                self._handle(event, self._config.rpc_timeout_s)
        except Exception:  # never reach the job
            logger.exception(
                "eerl: the sidecar sender stopped on an unexpected error; eerl is off for this job"
            )
        finally:
            self._link.close()
            self._queue.release_all(close=True)
            self._connected.clear()

    def _step(self) -> None:
        event = self._pop()
        if event is not None:
            self._handle(event, self._config.rpc_timeout_s)
            return
        now_s = time.monotonic()
        if self._poll_now.is_set() or now_s >= self._next_status_s:
            self._poll_now.clear()
            if now_s >= self._retry_at_s:
                self._poll_status()
        wait_s = max(0.01, min(self._next_status_s, max(self._retry_at_s, now_s + 0.01)) - now_s)
        self._queue.wait(min(wait_s, 1.0))

    def _poll_status(self) -> None:
        self._next_status_s = time.monotonic() + _STATUS_PERIOD_S
        try:
            self._link.heartbeat("", self._config.rpc_timeout_s)
        except SidecarLinkError as e:
            if e.http_status is None:
                self._unreachable(e)
            elif e.http_status in (401, 403):
                self._refused_owner(e)
            return
        self._reached()

    def _on_sent(self) -> None:
        self._reached()

    def _on_link_error(self, error: LinkError, rpc: str, event: Event | None) -> None:
        http_status = error.http_status if isinstance(error, SidecarLinkError) else None
        if http_status is None or not isinstance(error, SidecarLinkError):
            self._unreachable(error)
        elif http_status in (401, 403):
            self._refused_owner(error)
        else:
            kind = event.kind if event is not None else "?"
            edge = "begin" if event is not None and event.begin else "end"
            self._warn_once(
                f"the sidecar at {self._url} refused a {kind} {edge} ({http_status}: {error.details})",
                f"refused:{http_status}",
            )

    def _reached(self) -> None:
        if not self._reachable:
            self._reachable = True
            self._counters.opens += 1
            if "connection" in self._warned:
                logger.info("eerl: reached the sidecar at %s", self._url)
        self._backoff_s = self._config.reconnect_initial_s
        self._retry_at_s = 0.0
        if self._link.status.connected:
            self._connected.set()
        else:
            self._connected.clear()

    def _unreachable(self, error: LinkError) -> None:
        self._back_off()
        if isinstance(error, SidecarLinkError) and error.foreign:
            self._warn_once(
                f"{error.details}; the job runs on without clock control (eerl checks again now and then)",
                "foreign",
            )
            return
        self._warn_once(
            f"cannot reach the sidecar at {self._url} ({error.details}); the job runs on without clock "
            "control and eerl keeps retrying"
        )

    def _refused_owner(self, error: SidecarLinkError) -> None:
        """The sidecar will not take this process's events (no or a wrong secret, another user)."""
        self._back_off()
        self._warn_once(
            f"the sidecar at {self._url} refused this process ({error.http_status}: {error.details}); the "
            "job runs on without clock control",
            f"refused:{error.http_status}",
        )

    def _back_off(self) -> None:
        self._reachable = False
        self._connected.clear()
        self._counters.connect_failures += 1
        self._retry_at_s = time.monotonic() + self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, self._config.reconnect_max_s)
