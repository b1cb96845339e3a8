"""The HTTP server of ``/metrics``: bounded, because every local user can reach it while eerld runs as root.

The endpoint is reachable by every local user (and, on ``0.0.0.0``, by the monitoring network), so a
connection must cost a descriptor and a buffer, never a thread: a selector loop and two worker threads; at
most :data:`METRICS_MAX_CONNECTIONS` open, each with a deadline to send its request and one in all. The
thread-per-connection server of prometheus_client spent one thread per idle connection, with no cap and no
timeout. It serves any WSGI application; :mod:`eerld.metrics.server` gives it prometheus_client's.
"""

from __future__ import annotations

import contextlib
import enum
import io
import logging
import queue
import selectors
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler

from eerld.errors import ConfigError

if TYPE_CHECKING:
    from wsgiref.types import WSGIApplication

__all__ = [
    "DEFAULT_METRICS_ADDRESS",
    "DEFAULT_METRICS_PORT",
    "METRICS_CONNECTION_TIMEOUT_S",
    "METRICS_MAX_CONNECTIONS",
    "METRICS_MAX_REQUEST_BYTES",
    "METRICS_REQUEST_TIMEOUT_S",
    "BoundedHttpServer",
    "Limits",
    "parse_address",
]

_log = logging.getLogger("eerld.metrics")

DEFAULT_METRICS_PORT = 9478
DEFAULT_METRICS_ADDRESS = f"127.0.0.1:{DEFAULT_METRICS_PORT}"
"""Loopback by default (the library default is every interface; 9400 is dcgm-exporter's port and 9100
node-exporter's)."""
METRICS_MAX_CONNECTIONS = 16
"""Connections ``/metrics`` holds open at once; each costs a descriptor and a buffer, never a thread."""
METRICS_REQUEST_TIMEOUT_S = 5.0
"""Time a connection has, from being accepted, to send its request line and headers."""
METRICS_CONNECTION_TIMEOUT_S = 10.0
"""Time a connection may stay open in all, its answer included."""
METRICS_MAX_REQUEST_BYTES = 8192
"""Request line plus headers; a longer request is answered 431. No request body is ever read."""


def parse_address(address: str) -> tuple[str, int]:
    """Split ``"host:port"`` (``"[::1]:9478"`` for IPv6); port 0 picks a free port.

    Raises :class:`ConfigError` naming the flag's expected form.
    """
    host, sep, port_text = address.rpartition(":")
    if not sep or not host or not port_text.isdigit():
        raise ConfigError(f"--metrics-address: expected HOST:PORT, got {address!r}")
    port = int(port_text)
    if port > 65535:
        raise ConfigError(f"--metrics-address: port {port} is out of range")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    return host, port


_WORKERS = 2
"""Threads that build answers; a scrape takes milliseconds and Prometheus scrapes every few seconds."""
_ACCEPT_BACKLOG = 1024
"""Connections the kernel queues before the loop accepts them: kernel memory, at no cost to the daemon;
a deep queue keeps a burst of connections from dropping (and so delaying by a second) a scrape's SYN."""
_RECV_BYTES = 4096
_STOP_JOIN_S = 1.0
"""How long :meth:`BoundedHttpServer.close` waits for a worker inside a slow scrape (daemon threads)."""


def _plain_reply(status: str, text: str) -> bytes:
    """A whole HTTP/1.0 answer with a text body, for the answers the loop gives without the app."""
    body = text.encode()
    head = f"HTTP/1.0 {status}\r\nContent-Type: text/plain\r\nContent-Length: {len(body)}\r\n\r\n"
    return head.encode() + body


_BUSY = _plain_reply("503 Service Unavailable", "/metrics is busy; retry later.\n")
_TOO_LARGE = _plain_reply("431 Request Header Fields Too Large", "Request line and headers are too large.\n")


@dataclass(frozen=True, slots=True)
class Limits:
    """What one connection may cost; see :func:`eerld.metrics.start_metrics_server`."""

    max_connections: int
    request_timeout_s: float
    connection_timeout_s: float
    max_request_bytes: int

    def __post_init__(self) -> None:
        for name in ("max_connections", "request_timeout_s", "connection_timeout_s", "max_request_bytes"):
            if not getattr(self, name) > 0:
                raise ConfigError(f"metrics: {name} must be positive, got {getattr(self, name)!r}")


class _State(enum.Enum):
    READING = "reading"
    """Registered for reading, until the request line and headers are in."""
    ANSWERING = "answering"
    """Queued for, or in, a worker; not registered."""
    WRITING = "writing"
    """Registered for writing, until the answer is out."""
    CLOSED = "closed"


@dataclass(eq=False, slots=True)
class _Connection:
    """One client connection; only the loop thread touches it (workers read ``state`` as a hint)."""

    sock: socket.socket
    peer: tuple[Any, ...]
    read_deadline: float
    deadline: float
    state: _State = _State.READING
    request: bytearray = field(default_factory=bytearray)
    answer: bytes = b""
    sent: int = 0

    def expires_at(self) -> float:
        return min(self.read_deadline, self.deadline) if self.state is _State.READING else self.deadline


class BoundedHttpServer:
    """HTTP/1.0 for ``/metrics`` where a connection costs a descriptor and a buffer, never a thread.

    One thread (``eerl-metrics``) runs a selector loop that never blocks on a client: it accepts, reads each
    request line and headers without blocking, enforces the limits and deadlines, and writes each answer
    without blocking. :data:`_WORKERS` threads run the WSGI app on a request read in full (wsgiref's own
    request handler on in-memory buffers, so status line, headers, gzip and error pages are what the
    thread-per-connection server it replaces sent). One request per connection, then close (HTTP/1.0).
    """

    def __init__(self, host: str, port: int, app: WSGIApplication, limits: Limits) -> None:
        self._limits = limits
        self._app = app
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((host, port))
            listener.listen(_ACCEPT_BACKLOG)
            listener.setblocking(False)
        except OSError:
            listener.close()
            raise
        self._listener = listener
        bound_host, self.port = listener.getsockname()[:2]
        # What wsgiref's WSGIServer.setup_environ puts in every request's environment.
        self._base_environ = {
            "SERVER_NAME": socket.getfqdn(bound_host),
            "GATEWAY_INTERFACE": "CGI/1.1",
            "SERVER_PORT": str(self.port),
            "REMOTE_HOST": "",
            "CONTENT_LENGTH": "",
            "SCRIPT_NAME": "",
        }
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._selector.register(listener, selectors.EVENT_READ, _Listener.ACCEPT)
        self._selector.register(self._wake_r, selectors.EVENT_READ, _Listener.WAKE)
        self._connections: dict[int, _Connection] = {}
        self._accept_paused_until: float | None = None
        self._accept_failing = False
        self._accepts_per_turn = max(1, limits.max_connections // 2)
        self._jobs: queue.Queue[tuple[_Connection, bytes] | None] = queue.Queue(limits.max_connections)
        self._answers: queue.SimpleQueue[tuple[_Connection, bytes]] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._loop = threading.Thread(target=self._run, name="eerl-metrics", daemon=True)
        self._workers = [
            threading.Thread(target=self._work, name=f"eerl-metrics-worker-{i}", daemon=True)
            for i in range(_WORKERS)
        ]

    def start(self) -> None:
        for worker in self._workers:
            worker.start()
        self._loop.start()

    def close(self) -> None:
        """Stop the loop and the workers, close every connection and the port; idempotent."""
        self._stopping.set()
        self._wake()
        for _ in self._workers:
            with contextlib.suppress(queue.Full):
                self._jobs.put_nowait(None)
        if self._loop.ident is None:  # never started
            self._shut()
        elif self._loop is not threading.current_thread():
            self._loop.join()
        give_up_at = time.monotonic() + _STOP_JOIN_S
        for worker in self._workers:
            if worker.ident is not None and worker is not threading.current_thread():
                worker.join(max(0.0, give_up_at - time.monotonic()))
        self._wake_w.close()

    # ----------------------------------------------------------------------- the loop thread

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                ready = self._selector.select(self._timeout_s())
                accept = False
                for key, events in ready:
                    if key.data is _Listener.ACCEPT:
                        accept = True
                    elif key.data is _Listener.WAKE:
                        self._drain_wake()
                    else:
                        self._serve(key.data, events)
                self._take_answers()
                if accept:  # after reading: a request already in must not be evicted by newcomers
                    self._accept()
                self._expire()
        except Exception:
            _log.exception("metrics: the HTTP server failed; /metrics is down")
        finally:
            self._shut()

    def _timeout_s(self) -> float | None:
        deadlines = [c.expires_at() for c in self._connections.values()]
        if self._accept_paused_until is not None:
            deadlines.append(self._accept_paused_until)
        return max(0.0, min(deadlines) - time.monotonic()) if deadlines else None

    def _accept(self) -> None:
        for _ in range(self._accepts_per_turn):
            try:
                sock, peer = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except ConnectionAbortedError:
                continue
            except OSError as e:  # EMFILE, ENFILE, ENOBUFS: stop listening a moment rather than spin
                if not self._accept_failing:
                    _log.warning("metrics: cannot accept connections: %s", e)
                self._accept_failing = True
                self._selector.unregister(self._listener)
                self._accept_paused_until = time.monotonic() + 0.1
                return
            self._accept_failing = False
            self._admit(sock, peer)

    def _admit(self, sock: socket.socket, peer: tuple[Any, ...]) -> None:
        sock.setblocking(False)
        if len(self._connections) >= self._limits.max_connections:
            waiting = [c for c in self._connections.values() if c.state is _State.READING]
            if not waiting:  # every slot is being answered: refuse at once
                with contextlib.suppress(OSError):  # a request left unread would reset the 503
                    sock.recv(self._limits.max_request_bytes)
                with contextlib.suppress(OSError):
                    sock.send(_BUSY)
                    sock.shutdown(socket.SHUT_WR)
                sock.close()
                return
            self._close(min(waiting, key=lambda c: c.read_deadline))
        now = time.monotonic()
        conn = _Connection(
            sock,
            peer,
            read_deadline=now + self._limits.request_timeout_s,
            deadline=now + self._limits.connection_timeout_s,
        )
        self._connections[sock.fileno()] = conn
        self._selector.register(sock, selectors.EVENT_READ, conn)
        self._serve(conn, selectors.EVENT_READ)  # the request is often in already

    def _serve(self, conn: _Connection, events: int) -> None:
        try:
            if conn.state is _State.READING and events & selectors.EVENT_READ:
                self._read(conn)
            elif conn.state is _State.WRITING and events & selectors.EVENT_WRITE:
                self._write(conn)
        except OSError:  # reset by the peer, or any other failure of this one connection
            self._close(conn)

    def _read(self, conn: _Connection) -> None:
        limit = self._limits.max_request_bytes
        while True:
            try:
                chunk = conn.sock.recv(_RECV_BYTES)
            except BlockingIOError:
                return
            if not chunk:
                self._close(conn)
                return
            conn.request += chunk
            end = _end_of_headers(conn.request)
            if end is not None and end <= limit:
                self._dispatch(conn, bytes(conn.request[:end]))
                return
            if len(conn.request) > limit:
                self._reply(conn, _TOO_LARGE)
                return

    def _dispatch(self, conn: _Connection, request: bytes) -> None:
        self._selector.unregister(conn.sock)
        conn.state = _State.ANSWERING
        conn.request = bytearray()
        try:
            self._jobs.put_nowait((conn, request))
        except queue.Full:  # the workers are stuck (a hung GPU read): answer at once rather than queue
            self._reply(conn, _BUSY)

    def _take_answers(self) -> None:
        while True:
            try:
                conn, answer = self._answers.get_nowait()
            except queue.Empty:
                return
            if conn.state is _State.ANSWERING:
                self._reply(conn, answer)

    def _reply(self, conn: _Connection, answer: bytes) -> None:
        if not answer:
            self._close(conn)
            return
        if conn.state is _State.READING:
            self._selector.unregister(conn.sock)
        conn.state, conn.answer, conn.sent = _State.WRITING, answer, 0
        self._selector.register(conn.sock, selectors.EVENT_WRITE, conn)
        self._serve(conn, selectors.EVENT_WRITE)

    def _write(self, conn: _Connection) -> None:
        view = memoryview(conn.answer)
        while conn.sent < len(view):
            try:
                conn.sent += conn.sock.send(view[conn.sent :])
            except BlockingIOError:
                return
        with contextlib.suppress(OSError):
            conn.sock.shutdown(socket.SHUT_WR)
        self._close(conn)

    def _expire(self) -> None:
        now = time.monotonic()
        for conn in [c for c in self._connections.values() if c.expires_at() <= now]:
            self._close(conn)
        if self._accept_paused_until is not None and now >= self._accept_paused_until:
            self._accept_paused_until = None
            self._selector.register(self._listener, selectors.EVENT_READ, _Listener.ACCEPT)

    def _close(self, conn: _Connection) -> None:
        if conn.state is _State.CLOSED:
            return
        if conn.state is not _State.ANSWERING:
            self._selector.unregister(conn.sock)
        del self._connections[conn.sock.fileno()]
        conn.state = _State.CLOSED
        conn.sock.close()

    def _drain_wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            while self._wake_r.recv(_RECV_BYTES):
                pass

    def _shut(self) -> None:
        for conn in list(self._connections.values()):
            self._close(conn)
        self._selector.close()
        self._listener.close()
        self._wake_r.close()

    # ----------------------------------------------------------------------- the worker threads

    def _work(self) -> None:
        while not self._stopping.is_set():
            job = self._jobs.get()
            if job is None:
                return
            conn, request = job
            if conn.state is not _State.ANSWERING:  # timed out while queued
                continue
            try:
                answer = _BufferedHandler(request, conn.peer, self._base_environ, self._app).answer()
            except Exception:
                _log.exception("metrics: answering a scrape failed")
                answer = b""
            self._answers.put((conn, answer))
            self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(OSError):  # BlockingIOError: a wake-up is pending anyway; closed: stopped
            self._wake_w.send(b"\0")


class _Listener(enum.Enum):
    """Selector keys that are not connections."""

    ACCEPT = "accept"
    WAKE = "wake"


def _end_of_headers(request: bytearray) -> int | None:
    """Where the request line and headers end, or None while they have not all come.

    They end at the first empty line, ``\\r\\n`` or a bare ``\\n``, as :mod:`http.client` reads them.
    """
    ends = [i + len(mark) for mark in (b"\n\r\n", b"\n\n") if (i := request.find(mark)) >= 0]
    return min(ends) if ends else None


class _Gateway:
    """What wsgiref's request handler asks of its server: the base environment and the application."""

    def __init__(self, base_environ: dict[str, str], app: WSGIApplication) -> None:
        self.base_environ = base_environ
        self._app = app

    def get_app(self) -> WSGIApplication:
        return self._app


class _BufferedHandler(WSGIRequestHandler):
    """wsgiref's request handler on a request read in full, answering into memory instead of a socket."""

    def __init__(
        self, request: bytes, peer: tuple[Any, ...], base_environ: dict[str, str], app: WSGIApplication
    ) -> None:
        # Not BaseRequestHandler.__init__, which would read from and write to the socket itself.
        self.client_address = peer
        self.server = _Gateway(base_environ, app)  # type: ignore[assignment]  # uses only these two
        self.rfile = io.BytesIO(request)
        self._out = self.wfile = io.BytesIO()

    def answer(self) -> bytes:
        """Handle the request; the bytes to send (status line, headers, body)."""
        self.handle()
        return self._out.getvalue()

    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes every few seconds would flood stderr with access-log lines."""
