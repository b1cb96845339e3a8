"""The sidecar link: HTTP/1.1 to the job's sidecar (over its Unix socket or a loopback TCP port).

:class:`SidecarHttp` is one kept-alive connection to the sidecar, with a deadline on every request; ``eerl
phase`` uses it as it is. On a Unix socket it talks only to a sidecar of its own user (or root: the kernel
names the peer, :mod:`eerl.sidecar._owner`); a TCP sidecar gets the job's secret with every request.

:class:`SidecarLink` is the same connection as a :class:`eerl.link.DaemonLink`, for the phase events of a
:class:`eerl.Session` that forwards to a sidecar (``EERL_SIDECAR``): the sidecar holds the daemon session,
so the link opens none. A begin or an end is posted (``/v1/phases/begin``, ``/v1/phases/end``) and its JSON
answer read back as the daemon's reply (None while the sidecar's daemon has not answered); a heartbeat asks
``/v1/status``. What each answer said about the sidecar's own session is kept in :attr:`SidecarLink.status`.
A failure is a :class:`SidecarLinkError`: UNAVAILABLE when the sidecar cannot be reached (``foreign`` when
its socket is another user's), and for an HTTP refusal the code that fits, with the HTTP status.
"""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass
from typing import Any

from eerl.link.base import AttachStream, Code, LinkError
from eerl.phases import WORKLOAD_FIELDS, ControllerState
from eerl.sidecar._address import SidecarAddress
from eerl.sidecar._owner import SidecarNotOurs, check_sidecar_peer
from eerl.v1 import eerl_pb2
from eerl.wire.enums import KIND_FROM_PB, STATE_TO_PB

__all__ = [
    "SidecarForeign",
    "SidecarHttp",
    "SidecarLink",
    "SidecarLinkError",
    "SidecarStatus",
    "SidecarUnreachable",
]


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


def _describe(error: BaseException) -> str:
    if isinstance(error, TimeoutError | socket.timeout):
        return "timed out"
    text = str(error) or type(error).__name__
    return " ".join(text.split())[:120]


_HTTP_CODES = {
    400: Code.INVALID_ARGUMENT,
    401: Code.UNAUTHENTICATED,
    403: Code.PERMISSION_DENIED,
    404: Code.NOT_FOUND,
    409: Code.FAILED_PRECONDITION,
    413: Code.OUT_OF_RANGE,
    429: Code.RESOURCE_EXHAUSTED,
    503: Code.UNAVAILABLE,
}


class SidecarLinkError(LinkError):
    """A sidecar call that failed: unreachable (``http_status`` None; ``foreign``: its socket is another
    user's), or refused with ``http_status`` (``details``: the sidecar's one-line error)."""

    def __init__(
        self, code: Code, details: str, *, http_status: int | None = None, foreign: bool = False
    ) -> None:
        super().__init__(code, details)
        self.http_status = http_status
        self.foreign = foreign


@dataclass(frozen=True, slots=True)
class SidecarStatus:
    """What the sidecar last said of its daemon session: open (``connected``), its id, bound to a stream."""

    connected: bool = False
    session: str | None = None
    attached: bool = False


class SidecarLink:
    """A :class:`eerl.link.DaemonLink` to a sidecar (see the module docstring); not thread-safe."""

    def __init__(self, address: SidecarAddress, timeout_s: float, *, token: str | None = None) -> None:
        self._http = SidecarHttp(address, timeout_s, token=token)
        self.status = SidecarStatus()

    def _call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        try:
            code, reply = self._http.request(method, path, body)
        except SidecarForeign as e:
            raise SidecarLinkError(Code.UNAVAILABLE, str(e), foreign=True) from None
        except SidecarUnreachable as e:
            raise SidecarLinkError(Code.UNAVAILABLE, str(e)) from None
        if code != 200:
            error = reply.get("error", "?")
            raise SidecarLinkError(_HTTP_CODES.get(code, Code.UNKNOWN), str(error), http_status=code)
        self._note(reply)
        return reply

    def _note(self, body: dict[str, Any]) -> None:
        status = self.status
        if "session" in body:
            session = body.get("session")
            status = SidecarStatus(
                status.connected, session if isinstance(session, str) else None, bool(body.get("attached"))
            )
        self.status = SidecarStatus(bool(body.get("connected")), status.session, status.attached)

    def open_session(
        self, request: eerl_pb2.OpenSessionRequest, timeout_s: float
    ) -> eerl_pb2.OpenSessionResponse:
        """The sidecar holds the session: this only asks whether it is open (its id, if it says)."""
        self._call("GET", "/v1/status")
        return eerl_pb2.OpenSessionResponse(session_id=self.status.session or "")

    def begin_phase(
        self, request: eerl_pb2.BeginPhaseRequest, timeout_s: float
    ) -> eerl_pb2.BeginPhaseResponse | None:
        body: dict[str, Any] = {"kind": KIND_FROM_PB[request.kind].value, "iteration": request.iteration}
        if request.HasField("hints"):
            body["hints"] = _workload_fields(request.hints)
        return _begin_reply(self._call("POST", "/v1/phases/begin", body))

    def end_phase(
        self, request: eerl_pb2.EndPhaseRequest, timeout_s: float
    ) -> eerl_pb2.EndPhaseResponse | None:
        body: dict[str, Any] = {"kind": KIND_FROM_PB[request.kind].value, "iteration": request.iteration}
        if request.HasField("workload"):
            body.update(_workload_fields(request.workload))
        return _end_reply(self._call("POST", "/v1/phases/end", body))

    def heartbeat(self, session_id: str, timeout_s: float) -> None:
        """Asks the sidecar how its session is (:attr:`status`)."""
        self._call("GET", "/v1/status")

    def close_session(self, session_id: str, timeout_s: float) -> None:
        """Nothing: the sidecar's session outlives this process (the sidecar prints its report)."""

    def attach(self, session_id: str) -> AttachStream:
        raise SidecarLinkError(Code.UNIMPLEMENTED, "a sidecar holds the session's stream itself")

    def issue_claim_ticket(self, timeout_s: float) -> str:
        raise SidecarLinkError(Code.UNIMPLEMENTED, "a sidecar issues no claim tickets")

    def close(self) -> None:
        self._http.close()


def _workload_fields(workload: eerl_pb2.Workload) -> dict[str, int]:
    return {name: getattr(workload, name) for name in WORKLOAD_FIELDS}


def _state(value: object) -> eerl_pb2.ControllerState.ValueType:
    try:
        return (
            STATE_TO_PB[ControllerState(value)]
            if isinstance(value, str)
            else eerl_pb2.CONTROLLER_STATE_UNSPECIFIED
        )
    except ValueError:
        return eerl_pb2.CONTROLLER_STATE_UNSPECIFIED


def _source(value: object) -> eerl_pb2.ClockSource.ValueType:
    if not isinstance(value, str) or not value:
        return eerl_pb2.CLOCK_SOURCE_UNSPECIFIED
    try:
        return eerl_pb2.ClockSource.Value(f"CLOCK_SOURCE_{value.upper()}")
    except ValueError:
        return eerl_pb2.CLOCK_SOURCE_UNSPECIFIED


def _begin_reply(reply: dict[str, Any]) -> eerl_pb2.BeginPhaseResponse | None:
    """A sidecar's begin answer as the daemon's reply (None: the daemon had not answered)."""
    if not reply.get("answered"):
        return None
    return eerl_pb2.BeginPhaseResponse(
        target_sm_clock_mhz=int(reply.get("sm_clock_mhz") or 0),
        state=_state(reply.get("state")),
        resynced=bool(reply.get("resynced")),
        clocks=[
            eerl_pb2.GpuClock(
                index=int(gpu.get("index") or 0),
                uuid=str(gpu.get("uuid") or ""),
                sm_clock_mhz=int(gpu.get("sm_clock_mhz") or 0),
                requested_sm_clock_mhz=int(gpu.get("requested_sm_clock_mhz") or 0),
                source=_source(gpu.get("source")),
            )
            for gpu in reply.get("gpus") or ()
            if isinstance(gpu, dict)
        ],
    )


def _end_reply(reply: dict[str, Any]) -> eerl_pb2.EndPhaseResponse | None:
    """A sidecar's end answer as the daemon's reply (None: the daemon had not metered it)."""
    if not reply.get("metered"):
        return None
    return eerl_pb2.EndPhaseResponse(
        sm_clock_mhz=int(reply.get("sm_clock_mhz") or 0),
        state=_state(reply.get("state")),
        duration_s=float(reply.get("duration_s") or 0.0),
        energy_mj=float(reply.get("energy_j") or 0.0) * 1000.0,
        mean_power_w=float(reply.get("mean_power_w") or 0.0),
        gpus=int(reply.get("gpus") or 0),
    )
