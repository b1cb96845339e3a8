"""The sidecar's HTTP/1.1 server: small, bounded, and owned by the job's user.

Why not :mod:`http.server`: it gives every connection a thread from the moment it is accepted, so whoever can
connect can hold every thread with half a request (a slowloris) or an idle kept-alive connection, and the
job's own events get a 503 until they leave. Here one asyncio loop holds every connection, and only a request
that is complete and allowed takes a worker thread (the handler may wait for the daemon). A connection that
has not proved it is the job's (TCP only: a stranger) must send a request's head within ``head_timeout_s``,
and strangers have a table of their own (:data:`MAX_STRANGERS`) whose oldest is closed to make room for a
new one; the job's connections have theirs (``max_connections``), and only when that one is full is a new
connection of the job's turned away (503).

Who is the job's: on a Unix socket, a peer the kernel says runs as the sidecar's user or root
(``SO_PEERCRED``; a socket mode that shares it with a group or others admits those too), checked when it
connects; on TCP, a request that carries the sidecar's secret (:mod:`eerl.sidecar._owner`). A request
without it gets a 401 and its connection is closed; ``GET /healthz`` alone is open to anyone.

The head's parsing (:func:`parse_head`) is pure; the rest is the loop's I/O.
"""

from __future__ import annotations

import asyncio
import contextlib
import http
import logging
import os
import socket
import stat
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from eerl.sidecar._address import SidecarAddress
from eerl.sidecar._api import MAX_BODY_BYTES, encode
from eerl.sidecar._owner import peer_credentials, token_matches, trusted_uid

logger = logging.getLogger("eerl.sidecar")

MAX_HEAD_BYTES = 16 * 1024
"""The longest request line and headers together (431 beyond)."""
MAX_HEADERS = 64
HEAD_TIMEOUT_S = 5.0
"""How long a connection that has not proved it is the job's may take to send a request's head."""
IDLE_TIMEOUT_S = 30.0
"""How long the job's own kept-alive connection may stay idle."""
MAX_STRANGERS = 512
"""Connections that have not yet proved they are the job's (TCP only), open at once; the oldest is closed to
make room for a new one, so a flood must open this many within the moment it takes the job's request to
arrive to push it out."""
WRITE_TIMEOUT_S = 5.0
"""How long an answer may wait for a peer that does not read it."""
LINGER_S = 0.5
"""How long a refused connection's bytes are read after its answer, before it closes."""
WORKER_THREADS = 4
"""Requests handled at once (the sidecar's phase state serialises them anyway)."""
OPEN_PATHS = frozenset({"/healthz"})
"""What a TCP sidecar answers without its secret."""


class HttpError(Exception):
    """A request refused before it reaches the handler: its status and a message naming what is wrong."""

    def __init__(self, status: int, message: str, *, close: bool = True) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.close = close


@dataclass(frozen=True, slots=True)
class Head:
    """A request's line and headers (names in lower case)."""

    method: str
    path: str
    version: str
    headers: Mapping[str, str]

    @property
    def keep_alive(self) -> bool:
        connection = self.headers.get("connection", "").lower()
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return "close" not in connection


@dataclass(frozen=True, slots=True)
class Request:
    """A complete request, as the handler gets it."""

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class Response:
    """What the handler answers: a status and a JSON object; ``allow`` for a 405."""

    status: int
    body: Mapping[str, Any]
    allow: str = ""


Handler = Callable[[Request], Response]

_TOKEN_CHARS = frozenset("!#$%&'*+-.^_`|~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")
_SINGLE = frozenset({"content-length", "transfer-encoding", "authorization", "host", "connection"})


def parse_head(data: bytes) -> Head:
    """A request's head (its bytes up to and without the blank line); raises :class:`HttpError`."""
    lines = data.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3 or not parts[0] or not set(parts[0]) <= _TOKEN_CHARS:
        raise HttpError(400, f"request: {lines[0][:80]!r} is not 'METHOD /path HTTP/1.1'")
    method, target, version = parts
    if version not in ("HTTP/1.1", "HTTP/1.0"):
        status = 505 if version.startswith("HTTP/") else 400
        raise HttpError(status, f"request: {version[:20]!r} is not HTTP/1.1")
    if not target.startswith("/"):
        raise HttpError(400, f"request: the path {target[:80]!r} does not start with /")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep or not name or not set(name) <= _TOKEN_CHARS:
            raise HttpError(400, f"headers: {line[:80]!r} is not 'Name: value'")
        key, value = name.lower(), value.strip(" \t")
        if key in headers:
            if key in _SINGLE and headers[key] != value:
                raise HttpError(400, f"headers: {name} given twice, differently")
            value = headers[key] if key in _SINGLE else f"{headers[key]}, {value}"
        headers[key] = value
        if len(headers) > MAX_HEADERS:
            raise HttpError(431, f"headers: more than {MAX_HEADERS}")
    return Head(method, target.split("?", 1)[0], version, headers)


def body_length(head: Head) -> int:
    """How many body bytes follow ``head``; raises :class:`HttpError` (411, 413, 400)."""
    if "transfer-encoding" in head.headers:
        raise HttpError(411, "body: send it with a Content-Length (no chunked encoding)")
    text = head.headers.get("content-length")
    if text is None:
        if head.method == "POST":
            raise HttpError(411, "body: a Content-Length is required")
        return 0
    if not text.isdigit():
        raise HttpError(400, f"body: Content-Length {text[:20]!r} is not a number")
    length = int(text)
    if length > MAX_BODY_BYTES:
        raise HttpError(413, f"body: {length} bytes, more than {MAX_BODY_BYTES}")
    return length


def response_bytes(status: int, body: Mapping[str, Any], *, close: bool, allow: str = "") -> bytes:
    """One HTTP/1.1 answer with a JSON body."""
    data = encode(dict(body))
    try:
        reason = http.HTTPStatus(status).phrase
    except ValueError:
        reason = "Status"
    lines = [
        f"HTTP/1.1 {status} {reason}",
        "Server: eerl-sidecar",
        "Content-Type: application/json",
        f"Content-Length: {len(data)}",
        "Cache-Control: no-store",
    ]
    if allow:
        lines.append(f"Allow: {allow}")
    if status == 401:
        lines.append('WWW-Authenticate: Bearer realm="eerl-sidecar"')
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + data


@dataclass(eq=False)
class _Connection:
    writer: asyncio.StreamWriter
    trusted: bool = False
    task: asyncio.Task[None] | None = field(default=None, repr=False)

    def drop(self) -> None:
        """Closes the connection and ends its task."""
        self.writer.close()
        if self.task is not None:
            self.task.cancel()


class HttpServer:
    """The sidecar's server on one address. :meth:`bind` (in the caller's thread: an error raises there),
    then :meth:`serve_forever` on a thread of its own until :meth:`shutdown`; :meth:`server_close` last.

    ``token``: the secret every request but ``GET /healthz`` must carry (a TCP sidecar's; None on a Unix
    socket, whose peers the kernel names). ``max_connections``: connections open at once.
    """

    def __init__(
        self,
        handler: Handler,
        *,
        max_connections: int,
        token: str | None = None,
        socket_mode: int = 0o600,
        head_timeout_s: float = HEAD_TIMEOUT_S,
        idle_timeout_s: float = IDLE_TIMEOUT_S,
    ) -> None:
        self._handler = handler
        self._max_connections = max_connections
        self._token = token
        self._socket_mode = socket_mode
        self._head_timeout_s = head_timeout_s
        self._idle_timeout_s = idle_timeout_s
        self._listener: socket.socket | None = None
        self._unix_path = ""
        self._trusted: dict[_Connection, None] = {}  # the job's connections
        self._strangers: dict[_Connection, None] = {}  # in the order they came: the oldest first
        self._workers = ThreadPoolExecutor(WORKER_THREADS, thread_name_prefix="eerl-sidecar-request")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._started = threading.Event()
        self._stopped = threading.Event()
        self.refused_peers = 0
        """Unix peers of another user turned away (the kernel let them connect: a shared socket mode)."""

    # -- binding ----------------------------------------------------------------------------------------

    def bind(self, address: SidecarAddress) -> SidecarAddress:
        """Binds and listens; returns the address bound (a TCP port 0 becomes the port taken). OSError."""
        if address.path:
            _remove_stale_socket(address.path)
            listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            old_umask = os.umask(0o777 & ~self._socket_mode)
            try:
                listener.bind(address.path)
            except OSError:
                listener.close()
                raise
            finally:
                os.umask(old_umask)
            os.chmod(address.path, self._socket_mode)
            self._unix_path = address.path
            bound = address
        else:
            family = socket.AF_INET6 if ":" in address.host else socket.AF_INET
            listener = socket.socket(family, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind((address.host, address.port))
            except OSError:
                listener.close()
                raise
            bound = SidecarAddress(host=address.host, port=int(listener.getsockname()[1]))
        listener.listen(128)
        listener.setblocking(False)
        self._listener = listener
        return bound

    # -- running ----------------------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Serves until :meth:`shutdown` (on this thread's own event loop)."""
        try:
            asyncio.run(self._serve())
        finally:
            self._stopped.set()

    def shutdown(self) -> None:
        """Stops serving (from any thread) and waits for :meth:`serve_forever` to return (at most 5 s)."""
        if not self._started.is_set():
            self._stopped.set()
            return
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop already closed
                loop.call_soon_threadsafe(stop.set)
        self._stopped.wait(5.0)

    def server_close(self) -> None:
        """Closes the listening socket and the workers (after :meth:`shutdown`)."""
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        self._workers.shutdown(wait=False, cancel_futures=True)

    async def _serve(self) -> None:
        assert self._listener is not None, "bind() first"
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        limit = MAX_HEAD_BYTES + 1024
        if self._unix_path:
            server = await asyncio.start_unix_server(self._accepted, sock=self._listener, limit=limit)
        else:
            server = await asyncio.start_server(self._accepted, sock=self._listener, limit=limit)
        self._started.set()
        try:
            await self._stop.wait()
        finally:
            server.close()
            for connection in [*self._trusted, *self._strangers]:
                connection.drop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(server.wait_closed(), 1.0)

    # -- one connection ---------------------------------------------------------------------------------

    async def _accepted(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connection = _Connection(writer, task=asyncio.current_task())
        try:
            if self._unix_path:
                if not self._unix_peer_allowed(writer):
                    self.refused_peers += 1
                    await self._refuse(connection, reader, _FOREIGN_PEER)
                    return
                if not self._trust(connection):
                    await self._refuse(connection, reader, _TOO_MANY)
                    return
            else:
                self._admit_stranger(connection)
            await self._serve_requests(connection, reader)
        except (ConnectionError, asyncio.IncompleteReadError, TimeoutError, asyncio.CancelledError):
            pass
        except Exception:  # a bug here must not end the loop: log it, drop the one connection
            logger.debug("eerl-sidecar: a connection failed", exc_info=True)
        finally:
            self._trusted.pop(connection, None)
            self._strangers.pop(connection, None)
            writer.close()

    def _unix_peer_allowed(self, writer: asyncio.StreamWriter) -> bool:
        if self._socket_mode & 0o077:
            return True  # the owner shared the socket on purpose: the kernel's check of its mode decides
        sock = writer.get_extra_info("socket")
        try:
            uid = peer_credentials(sock).uid
        except (OSError, AttributeError):
            return False
        return trusted_uid(uid)

    def _admit_stranger(self, connection: _Connection) -> None:
        """Adds a connection not yet proved the job's; when they are too many, closes the oldest."""
        if len(self._strangers) >= MAX_STRANGERS:
            oldest = next(iter(self._strangers))
            self._strangers.pop(oldest)
            oldest.drop()
        self._strangers[connection] = None

    def _trust(self, connection: _Connection) -> bool:
        """Moves ``connection`` to the job's table; False (and nothing moved) when that is full."""
        if connection.trusted:
            return True
        if len(self._trusted) >= self._max_connections:
            return False
        self._strangers.pop(connection, None)
        self._trusted[connection] = None
        connection.trusted = True
        return True

    async def _serve_requests(self, connection: _Connection, reader: asyncio.StreamReader) -> None:
        loop = asyncio.get_running_loop()
        while True:
            timeout_s = self._idle_timeout_s if connection.trusted else self._head_timeout_s
            try:
                raw = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout_s)
            except asyncio.LimitOverrunError:
                await self._refuse(
                    connection, reader, HttpError(431, f"head: longer than {MAX_HEAD_BYTES} bytes")
                )
                return
            except asyncio.IncompleteReadError:
                return  # the peer closed
            try:
                if len(raw) > MAX_HEAD_BYTES:
                    raise HttpError(431, f"head: longer than {MAX_HEAD_BYTES} bytes")
                head = parse_head(raw[:-4])
                length = body_length(head)
                if head.method not in ("GET", "POST"):
                    raise HttpError(501, f"method: {head.method} is not served (GET or POST)")
            except HttpError as e:
                await self._refuse(connection, reader, e)
                return
            body = await asyncio.wait_for(reader.readexactly(length), timeout_s) if length else b""
            if self._token is not None and head.path not in OPEN_PATHS:
                if not token_matches(head.headers.get("authorization"), self._token):
                    await self._refuse(connection, reader, _UNAUTHORIZED)
                    return
                if not self._trust(connection):
                    await self._refuse(connection, reader, _TOO_MANY)
                    return
            request = Request(head.method, head.path, head.headers, body)
            response = await loop.run_in_executor(self._workers, self._handle, request)
            keep = head.keep_alive
            data = response_bytes(response.status, response.body, close=not keep, allow=response.allow)
            connection.writer.write(data)
            await asyncio.wait_for(connection.writer.drain(), WRITE_TIMEOUT_S)
            if not keep:
                return

    def _handle(self, request: Request) -> Response:
        try:
            return self._handler(request)
        except Exception:
            logger.exception("eerl-sidecar: a request failed")
            return Response(500, {"error": "sidecar: an internal error (logged); nothing was forwarded"})

    async def _refuse(self, connection: _Connection, reader: asyncio.StreamReader, error: HttpError) -> None:
        """Answers ``error`` and closes, lingering: what the peer already sent is read (and dropped) for a
        moment after the answer, so that closing on unread bytes (a TCP reset) does not destroy the answer
        before the peer reads it."""
        writer = connection.writer
        with contextlib.suppress(ConnectionError, TimeoutError, OSError):
            writer.write(response_bytes(error.status, {"error": error.message}, close=True))
            await asyncio.wait_for(writer.drain(), WRITE_TIMEOUT_S)
            if writer.can_write_eof():
                writer.write_eof()
            deadline = asyncio.get_running_loop().time() + LINGER_S
            read = 0
            while read < MAX_HEAD_BYTES:
                remaining = deadline - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                chunk = await asyncio.wait_for(reader.read(4096), remaining)
                if not chunk:
                    break
                read += len(chunk)


_FOREIGN_PEER = HttpError(403, "peer: this sidecar serves its own user only")
_TOO_MANY = HttpError(503, "connections: the sidecar serves too many at once, try again")
_UNAUTHORIZED = HttpError(
    401,
    "authorization: this sidecar answers only requests that carry its secret "
    "(Authorization: Bearer <EERL_SIDECAR_TOKEN, or the contents of EERL_SIDECAR_TOKEN_FILE>)",
)


def _remove_stale_socket(path: str) -> None:
    """Removes a socket file an earlier sidecar of ours left; refuses anything else, loudly."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise OSError(f"{path} exists and is not a socket")
    if info.st_uid != os.geteuid():
        raise OSError(
            f"{path} is a socket of uid {info.st_uid}, not yours: another user took the path first, so this "
            "sidecar does not listen there (listen in a directory only you may write: the default does)"
        )
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(0.5)
        probe.connect(path)
    except OSError:
        os.unlink(path)  # nobody listens: stale
        return
    finally:
        probe.close()
    raise OSError(f"{path}: another sidecar listens there")
