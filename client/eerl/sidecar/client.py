"""Talking to a sidecar: a small HTTP/1.1 client, and the sender behind ``EERL_SIDECAR``.

:class:`SidecarHttp` is one kept-alive connection to the sidecar (TCP or a Unix socket), with a deadline
on every request; ``eerl phase`` uses it. :class:`SidecarSender` is what :func:`eerl.connect` gives a
:class:`eerl.Session` when ``EERL_SIDECAR`` is set (or ``config=ClientConfig.sidecar(url)``): the same
fail-open contract as the daemon's sender (:mod:`eerl._sender`), with the sidecar in the daemon's place. The
training thread only queues an event; a background thread posts it. The rules that keep the numbers honest
are the same: the queue is bounded, a begin that waited longer than ``stale_after_s`` is dropped with its
end, an end is sent only if the sidecar took its begin, nothing is retried, and every workload and iteration
is checked first (a bad value is clamped or dropped, one warning per kind) so that the sidecar, which
refuses what the daemon would, gets only what it accepts. When the sidecar cannot be reached, the sender
backs off (``reconnect_initial_s`` to ``reconnect_max_s``) and drops the events of that time.
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from typing import Any

from eerl._sender import _ANSWERS_KEPT, BackgroundSender, Event, GpuClockReading, PhaseAnswer
from eerl.config import ClientConfig
from eerl.phases import ControllerState, Workload
from eerl.sidecar._address import SidecarAddress, parse_address
from eerl.sidecar._api import WORKLOAD_FIELDS
from eerl.sidecar._owner import SidecarNotOurs, check_sidecar_peer

logger = logging.getLogger("eerl")

_STATUS_PERIOD_S = 5.0
"""How often an idle sender asks the sidecar whether its daemon session is open."""


class SidecarUnreachable(Exception):
    """The sidecar did not answer: not there, not listening, or past the deadline."""


class SidecarForeign(SidecarUnreachable):
    """The Unix socket is served by another user: not this job's sidecar, so nothing was sent there."""


class _UnixConnection(http.client.HTTPConnection):
    """HTTP over a Unix socket, to a peer the kernel says runs as our user or root (else
    :class:`eerl.sidecar._owner.SidecarNotOurs`, before a byte is sent)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
            check_sidecar_peer(sock, self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class SidecarHttp:
    """One kept-alive HTTP connection to a sidecar; not thread-safe (one per thread).

    On a Unix socket it talks only to a sidecar of its own user (or root); ``token``: the secret a TCP
    sidecar demands (sent with every request; never to a Unix socket, whose peer the kernel names).
    """

    def __init__(self, address: SidecarAddress, timeout_s: float, *, token: str | None = None) -> None:
        self.address = address
        self.timeout_s = timeout_s
        self._token = token if not address.path else None
        self._connection: http.client.HTTPConnection | None = None

    def request(
        self, method: str, path: str, body: dict[str, Any] | bytes | None = None
    ) -> tuple[int, dict[str, Any]]:
        """The status and JSON body of one request (``body``: a JSON object, or bytes sent as they are);
        raises :class:`SidecarUnreachable`.

        A kept-alive connection that the sidecar closed meanwhile is reopened once, for that request.
        """
        data = json.dumps(body, separators=(",", ":")).encode() if isinstance(body, dict) else body
        reused = self._connection is not None
        try:
            return self._once(method, path, data)
        except SidecarNotOurs as e:
            self.close()
            raise SidecarForeign(str(e)) from None
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError) as e:
            self.close()
            if not reused:
                raise SidecarUnreachable(_describe(e)) from None
        except (OSError, http.client.HTTPException, ValueError) as e:
            self.close()
            raise SidecarUnreachable(_describe(e)) from None
        try:
            return self._once(method, path, data)
        except SidecarNotOurs as e:
            self.close()
            raise SidecarForeign(str(e)) from None
        except (OSError, http.client.HTTPException, ValueError) as e:
            self.close()
            raise SidecarUnreachable(_describe(e)) from None

    def _once(self, method: str, path: str, data: bytes | None) -> tuple[int, dict[str, Any]]:
        connection = self._connection
        if connection is None:
            if self.address.path:
                connection = _UnixConnection(self.address.path, self.timeout_s)
            else:
                connection = http.client.HTTPConnection(
                    self.address.host, self.address.port, timeout=self.timeout_s
                )
            self._connection = connection
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if self._token is not None:
            headers["Authorization"] = f"Bearer {self._token}"
        connection.request(method, path, body=data, headers=headers)
        response = connection.getresponse()
        payload = response.read()
        if response.will_close:
            self.close()
        value = json.loads(payload) if payload else {}
        return response.status, value if isinstance(value, dict) else {"value": value}

    def close(self) -> None:
        """Closes the connection (the next request opens a new one)."""
        if self._connection is not None:
            self._connection.close()
            self._connection = None


class SidecarSender(BackgroundSender[PhaseAnswer]):
    """A :class:`eerl.Session`'s sender that posts phase events to the job's sidecar (see the module).

    :meth:`close` posts what is queued (bounded by ``close_timeout_s``) and stops; the sidecar's session
    stays.
    """

    _THREAD_NAME = "eerl-sidecar-sender"

    def __init__(self, config: ClientConfig) -> None:
        assert config.sidecar_url is not None
        super().__init__(config)
        self._url = config.sidecar_url
        self._http = SidecarHttp(
            parse_address(config.sidecar_url), config.rpc_timeout_s, token=config.sidecar_token
        )
        self._poll_now = threading.Event()
        self._begun: set[int] = set()
        self._reachable = False
        self._retry_at_s = 0.0
        self._backoff_s = config.reconnect_initial_s
        self._next_status_s = 0.0
        self._session: str | None = None
        self._attached = False

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
        return (self._session if connected else None), connected and self._attached

    def _answer_from(self, reply: PhaseAnswer) -> PhaseAnswer:
        return reply

    # -- the background thread -------------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._closing.is_set():
                self._step()
            deadline_s = time.monotonic() + self._config.close_timeout_s
            while time.monotonic() < deadline_s and (event := self._pop()) is not None:
                self._handle(event)
        except Exception:  # never reach the job
            logger.exception(
                "eerl: the sidecar sender stopped on an unexpected error; eerl is off for this job"
            )
        finally:
            self._http.close()
            self._queue.release_all(close=True)
            self._connected.clear()

    def _pop(self) -> Event | None:
        return self._queue.pop()

    def _step(self) -> None:
        event = self._pop()
        if event is not None:
            self._handle(event)
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
            code, body = self._http.request("GET", "/v1/status")
        except SidecarUnreachable as e:
            self._unreachable(e)
            return
        if code == 200:
            self._reached(body)
        elif code in (401, 403):
            self._refused_owner(code, body)

    def _handle(self, event: Event) -> None:
        try:
            self._send(event)
        except Exception:
            self._on_bug()
        finally:
            if event.done is not None:
                event.done.set()

    def _send(self, event: Event) -> None:
        kind = event.kind
        if kind is None:
            return
        iteration = self._admit(event, self._begun)
        if iteration is None:
            return
        if not self._reachable and time.monotonic() < self._retry_at_s:
            self._counters.stale += 1  # the sidecar was not there a moment ago: no wait per event
            return
        body: dict[str, Any] = {"kind": kind.value, "iteration": iteration}
        workload = self._checked_workload(event)
        if event.begin:
            if workload is not None:
                body["hints"] = _workload_fields(workload)
        elif workload is not None:
            body.update(_workload_fields(workload))
        try:
            code, reply = self._http.request(
                "POST", "/v1/phases/begin" if event.begin else "/v1/phases/end", body
            )
        except SidecarUnreachable as e:
            self._counters.failed += 1
            self._unreachable(e)
            return
        if code in (401, 403):
            self._counters.failed += 1
            self._refused_owner(code, reply)
            return
        if code != 200:
            self._counters.failed += 1
            self._warn_once(
                f"the sidecar at {self._url} refused a {kind} {'begin' if event.begin else 'end'} "
                f"({code}: {reply.get('error', '?')})",
                f"refused:{code}",
            )
            return
        self._counters.sent += 1
        self._reached(reply)
        if event.begin:
            self._begun.add(event.phase_id)
            if len(self._begun) > _ANSWERS_KEPT:  # ends that never came
                self._begun.discard(min(self._begun))
            if reply.get("resynced"):
                self._counters.resyncs += 1
        answer = _answer(event.begin, reply)
        if answer is not None:
            self._remember(event.phase_id, event.begin, answer)

    def _reached(self, body: dict[str, Any]) -> None:
        if not self._reachable:
            self._reachable = True
            self._counters.opens += 1
            if "connection" in self._warned:
                logger.info("eerl: reached the sidecar at %s", self._url)
        self._backoff_s = self._config.reconnect_initial_s
        self._retry_at_s = 0.0
        if "session" in body:
            session = body.get("session")
            self._session = session if isinstance(session, str) else None
            self._attached = bool(body.get("attached"))
        if body.get("connected"):
            self._connected.set()
        else:
            self._connected.clear()

    def _unreachable(self, error: SidecarUnreachable) -> None:
        self._back_off()
        if isinstance(error, SidecarForeign):
            self._warn_once(
                f"{error}; the job runs on without clock control (eerl checks again now and then)",
                "foreign",
            )
            return
        self._warn_once(
            f"cannot reach the sidecar at {self._url} ({error}); the job runs on without clock control and "
            "eerl keeps retrying"
        )

    def _refused_owner(self, code: int, reply: dict[str, Any]) -> None:
        """The sidecar will not take this process's events (no or a wrong secret, another user)."""
        self._back_off()
        self._warn_once(
            f"the sidecar at {self._url} refused this process ({code}: {reply.get('error', '?')}); the job "
            "runs on without clock control",
            f"refused:{code}",
        )

    def _back_off(self) -> None:
        self._reachable = False
        self._connected.clear()
        self._counters.connect_failures += 1
        self._retry_at_s = time.monotonic() + self._backoff_s
        self._backoff_s = min(self._backoff_s * 2, self._config.reconnect_max_s)


def _workload_fields(workload: Workload) -> dict[str, int]:
    return {name: getattr(workload, name) for name, _ in WORKLOAD_FIELDS}


def _answer(begin: bool, reply: dict[str, Any]) -> PhaseAnswer | None:
    """A sidecar's begin or end answer as a :class:`PhaseAnswer` (None: the daemon had not answered)."""
    if not reply.get("answered" if begin else "metered"):
        return None
    state_text = reply.get("state")
    try:
        state = ControllerState(state_text) if isinstance(state_text, str) else None
    except ValueError:
        state = None
    clocks = (
        tuple(
            GpuClockReading(
                index=int(gpu.get("index") or 0),
                uuid=str(gpu.get("uuid") or ""),
                sm_clock_mhz=int(gpu.get("sm_clock_mhz") or 0),
                requested_sm_clock_mhz=int(gpu.get("requested_sm_clock_mhz") or 0),
                source=str(gpu.get("source") or ""),
            )
            for gpu in reply.get("gpus") or ()
            if isinstance(gpu, dict)
        )
        if begin
        else ()
    )
    return PhaseAnswer(
        begin=begin,
        sm_clock_mhz=int(reply.get("sm_clock_mhz") or 0),
        state=state,
        clocks=clocks,
        resynced=bool(reply.get("resynced")),
        duration_s=float(reply.get("duration_s") or 0.0),
        energy_j=float(reply.get("energy_j") or 0.0),
        mean_power_w=float(reply.get("mean_power_w") or 0.0),
        gpus=int(reply.get("gpus") or 0) if not begin else 0,
    )


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError | socket.timeout):
        return "timed out"
    text = str(error) or type(error).__name__
    return " ".join(text.split())[:120]
