"""``eerl-sidecar``: holds a job's daemon session and takes its phase events over local HTTP.

The sidecar is a process beside the job (a native sidecar container, an ``srun`` step, or the job's own
parent with ``-- command``). It opens the job's session with :func:`eerl.connect`, so it inherits the
client's promises: it never waits for the daemon beyond a bound, reconnects on its own, and its session
is bound to an ``Attach`` stream, so the sidecar's death (even SIGKILL) makes the daemon reset the job's
GPUs. The job talks to it in plain HTTP/1.1 with JSON bodies, from any language::

    POST /v1/phases/begin  {"kind": "generation", "iteration": 3}
    POST /v1/phases/end    {"kind": "generation", "iteration": 3, "tokens": 123456, "sequences": 64}
    GET  /v1/status
    GET  /healthz

A begin answers the clock now applied and an end what the daemon metered, each waiting at most
``--answer-timeout-s`` (default 0.5 s) for the daemon, and only while a session is open: with the daemon
absent every call answers at once (``"clock": "unknown"``, ``"metered": false``). A request that is not
right gets a 4xx and a one-line JSON error naming the field, and nothing is forwarded. The threads that
serve connections are bounded (``--max-connections``); a connection beyond them gets a 503 at once.

The API has no authentication: it listens on a loopback address (inside a pod, the pod's own) or on a
Unix socket of mode 0600 (``--socket-mode`` to share it with another user of a shared volume).

With ``--job-nodes`` the sidecar is one node of a multi-node job: the same API, served by
:class:`eerl.sidecar.job.JobSidecar` through the job-level control instead of a session of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import http.server
import logging
import os
import signal
import socket
import socketserver
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from typing import Any, Protocol

import eerl
from eerl._version import __version__
from eerl.config import ClientConfig
from eerl.errors import ConfigError
from eerl.gpus import GpuId, parse_gpu_list
from eerl.session import Phase, Session
from eerl.sidecar._address import DEFAULT_PORT, SidecarAddress, parse_address
from eerl.sidecar._api import (
    MAX_BODY_BYTES,
    ApiError,
    BeginRequest,
    EndRequest,
    begin_answer,
    encode,
    end_answer,
    parse_begin,
    parse_end,
    stats_fields,
)
from eerl.sidecar._book import OpenPhases, Tallies
from eerl.sidecar.job import add_job_arguments, job_sidecar

logger = logging.getLogger("eerl.sidecar")

DEFAULT_ANSWER_TIMEOUT_S = 0.5
"""How long a begin or an end waits at most for the daemon's answer (only while a session is open)."""
DEFAULT_MAX_CONNECTIONS = 16
"""Connections served at once; one beyond gets a 503 and is closed."""
IDLE_TIMEOUT_S = 30.0
"""A kept-alive connection idle this long is closed (its thread is freed)."""
CONNECT_WAIT_S = 2.0
"""With ``-- command``: how long the job's start waits at most for the daemon session."""
JOB_CONNECT_WAIT_S = 60.0
"""The same with ``--job-nodes``: the side group forms once every node's sidecar is up."""


class PhaseService(Protocol):
    """What the HTTP handler serves: :class:`Sidecar` (one session of its own) or, with ``--job-nodes``,
    :class:`eerl.sidecar.job.JobSidecar` (one node of a multi-node job)."""

    @property
    def job_id(self) -> str | None: ...

    def begin(self, request: BeginRequest) -> dict[str, Any]: ...

    def end(self, request: EndRequest) -> dict[str, Any]: ...

    def status(self) -> dict[str, Any]: ...

    def refused(self) -> None: ...

    def wait_until_ready(self, timeout_s: float) -> bool: ...

    def close(self) -> None: ...


class Sidecar:
    """The phase state machine behind the HTTP API: one :class:`eerl.Session`, the phases now open.

    Thread-safe: requests are served one at a time (a job's phase events are sequential), each waiting at
    most ``answer_timeout_s`` for the daemon. :meth:`status` does not wait for them.
    """

    def __init__(self, session: Session, *, answer_timeout_s: float = DEFAULT_ANSWER_TIMEOUT_S) -> None:
        self._session = session
        self._answer_timeout_s = answer_timeout_s
        self._lock = threading.Lock()
        self._open: OpenPhases[Phase] = OpenPhases()
        self._tallies = Tallies()
        self._started_s = time.monotonic()
        self._refused = 0

    @property
    def session(self) -> Session:
        """The job's session with the daemon."""
        return self._session

    @property
    def job_id(self) -> str | None:
        return self._session.job_id or None

    def refused(self) -> None:
        """Counts a request refused with a 4xx (for :meth:`status`)."""
        self._refused += 1

    def wait_until_ready(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for the daemon session (before ``-- command`` starts the job)."""
        return self._session.wait_until_connected(timeout_s)

    def close(self) -> None:
        """Closes the session: the daemon resets the job's GPUs."""
        self._session.close()

    def begin(self, request: BeginRequest) -> dict[str, Any]:
        """Begins a phase: queues its begin, waits (bounded) for the clock; raises ApiError (409)."""
        session = self._session
        with self._lock:
            self._open.check_new(request.kind, request.iteration)
            connected = session.stats().connected
            phase = session.phase(
                request.kind,
                request.iteration,
                hints=request.hints,
                wait_for_clock_s=self._answer_timeout_s if connected else 0.0,
            )
            phase.__enter__()
            _forget_on_this_thread(session, phase)
            self._open.add(request.kind, phase.iteration, phase)
            answer = session.answer(phase, begin=True)
            self._tallies.note(request.kind, answer)
            return begin_answer(request.kind, phase.iteration, session.stats().connected, answer)

    def end(self, request: EndRequest) -> dict[str, Any]:
        """Ends a phase begun before: queues its end, waits (bounded) for what the daemon metered."""
        session = self._session
        with self._lock:
            _, phase = self._open.pop(request.kind, request.iteration)
            phase.report_workload(request.workload)
            phase.__exit__(None, None, None)
            if session.stats().connected:
                session.flush(self._answer_timeout_s)  # FIFO: the end was handled once the flush is
            answer = session.answer(phase, begin=False)
            self._tallies.note(request.kind, answer)
            return end_answer(request.kind, phase.iteration, session.stats().connected, answer)

    def status(self) -> dict[str, Any]:
        """``GET /v1/status``: the session, the phases open, the controller's state per kind, the tallies."""
        session = self._session
        stats = session.stats()
        return {
            "version": __version__,
            "job_id": session.job_id,
            "gpus": [str(gpu) for gpu in session.gpus],
            "enabled": session.enabled,
            "connected": stats.connected,
            "attached": stats.attached,
            "session": stats.session_id[:8] if stats.session_id else None,
            "uptime_s": round(time.monotonic() - self._started_s, 3),
            "open_phases": self._open.listing(),
            "phases": self._tallies.as_json(),
            "refused_requests": self._refused,
            "client": stats_fields(stats),
        }


def _forget_on_this_thread(session: Session, phase: Phase) -> None:
    """Takes ``phase`` off the session's stack of this thread: its end may come on another connection's
    thread, and :meth:`Session.current_phase` means nothing here (so no thread keeps phases alive)."""
    stack: list[Phase] | None = getattr(session._local, "stack", None)
    if stack and stack[-1] is phase:
        stack.pop()


# -- HTTP ----------------------------------------------------------------------------------------------------


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"eerl-sidecar/{__version__}"
    sys_version = ""
    timeout = IDLE_TIMEOUT_S
    server: _Serving

    def setup(self) -> None:
        super().setup()
        if self.connection.family in (socket.AF_INET, socket.AF_INET6):
            # The headers and the body go out in two writes: without this, Nagle holds the body back until
            # the client's delayed ACK (40 ms on Linux) of the headers.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/healthz":
            self._reply(200, {"ok": True})
        elif path == "/v1/status":
            self._reply(200, self.server.sidecar.status())
        elif path in ("/v1/phases/begin", "/v1/phases/end"):
            self._reply(405, {"error": f"method: {path} takes POST"}, allow="POST")
        else:
            self._reply(404, {"error": f"path: {path} is not an endpoint of the sidecar"})

    def do_POST(self) -> None:
        path = self.path.split("?", 1)[0]
        sidecar = self.server.sidecar
        if path not in ("/v1/phases/begin", "/v1/phases/end"):
            self._discard_body()
            if path in ("/healthz", "/v1/status"):
                self._reply(405, {"error": f"method: {path} takes GET"}, allow="GET")
            else:
                self._reply(404, {"error": f"path: {path} is not an endpoint of the sidecar"})
            return
        try:
            body = self._body()
            if path == "/v1/phases/begin":
                reply = sidecar.begin(parse_begin(body))
            else:
                reply = sidecar.end(parse_end(body))
        except ApiError as e:
            sidecar.refused()
            self._reply(e.status, {"error": e.message})
            return
        self._reply(200, reply)

    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            raise ApiError(411, "body: send it with a Content-Length (no chunked encoding)")
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            raise ApiError(411, "body: a Content-Length is required")
        try:
            length = int(length_text)
        except ValueError:
            self.close_connection = True
            raise ApiError(400, f"body: Content-Length {length_text!r} is not a number") from None
        if length < 0 or length > MAX_BODY_BYTES:
            self.close_connection = True  # the body is not read: the connection cannot go on
            raise ApiError(413, f"body: {length} bytes, more than {MAX_BODY_BYTES}")
        return self.rfile.read(length)

    def _discard_body(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if 0 <= length <= MAX_BODY_BYTES:
            self.rfile.read(length)
        else:
            self.close_connection = True

    def _reply(self, status: int, value: dict[str, Any], *, allow: str = "") -> None:
        data = encode(value)
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        if allow:
            self.send_header("Allow", allow)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)

    def address_string(self) -> str:
        address = self.client_address
        return str(address[0]) if isinstance(address, tuple) and address else "unix"

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug("eerl-sidecar: %s %s", self.address_string(), format % args)


class _Serving(socketserver.BaseServer):
    """What the handler needs of its server (both kinds below)."""

    sidecar: PhaseService


class _BoundedThreads:
    """One thread per connection, at most ``max_connections`` at once; one more gets a 503 and is closed."""

    daemon_threads = True
    sidecar: PhaseService
    _slots: threading.BoundedSemaphore

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self._slots.acquire(blocking=False):
            with contextlib.suppress(OSError):
                request.settimeout(0.5)
                body = encode({"error": "connections: the sidecar serves too many at once, try again"})
                request.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
                    + body
                )
            self.shutdown_request(request)  # type: ignore[attr-defined]
            return
        thread = threading.Thread(
            target=self._serve_one, args=(request, client_address), name="eerl-sidecar-conn", daemon=True
        )
        thread.start()

    def _serve_one(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)  # type: ignore[attr-defined]
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)  # type: ignore[attr-defined]
            self._slots.release()

    def handle_error(self, request: Any, client_address: Any) -> None:
        logger.debug("eerl-sidecar: a connection failed", exc_info=True)


class _TcpServer(_BoundedThreads, socketserver.TCPServer):
    allow_reuse_address = True


class _Tcp6Server(_TcpServer):
    address_family = socket.AF_INET6


class _UnixServer(_BoundedThreads, socketserver.UnixStreamServer):
    pass


def serve(
    sidecar: PhaseService,
    address: SidecarAddress,
    *,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    socket_mode: int = 0o600,
) -> tuple[socketserver.BaseServer, SidecarAddress]:
    """Binds the API on ``address`` (port 0: any free one) and returns the server (not yet serving: call
    ``serve_forever``) and the address it is bound to. Raises OSError if it cannot bind."""
    server: _TcpServer | _UnixServer
    if address.path:
        _remove_stale_socket(address.path)
        old_umask = os.umask(0o777 & ~socket_mode)
        try:
            server = _UnixServer(address.path, _Handler)
        finally:
            os.umask(old_umask)
        os.chmod(address.path, socket_mode)
        bound = address
    else:
        server_type = _Tcp6Server if ":" in address.host else _TcpServer
        server = server_type((address.host, address.port), _Handler)
        bound = SidecarAddress(host=address.host, port=int(server.server_address[1]))
    server.sidecar = sidecar
    server._slots = threading.BoundedSemaphore(max_connections)
    return server, bound


def _remove_stale_socket(path: str) -> None:
    """Removes a socket file left by an earlier sidecar; refuses to touch anything else."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise OSError(f"{path} exists and is not a socket")
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


# -- the command ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eerl-sidecar",
        description="Holds a job's eerld session and takes its phase events over local HTTP "
        "(docs/sidecar.md). With `-- command ...` it runs the job itself, with EERL_SIDECAR set.",
    )
    parser.add_argument("--job-id", help="the job id (default: EERL_JOB_ID, SLURM_JOB_ID, else host-pid)")
    parser.add_argument(
        "--gpus",
        help="GPU indices or UUIDs, comma-separated (default: EERL_GPUS, else CUDA_VISIBLE_DEVICES; "
        "none on a scoped socket)",
    )
    parser.add_argument(
        "--listen",
        default=f"127.0.0.1:{DEFAULT_PORT}",
        help=f"host:port (loopback only) or unix:/path (default 127.0.0.1:{DEFAULT_PORT}; port 0: any)",
    )
    parser.add_argument(
        "--socket",
        help="eerld's worker socket(s), colon-separated; the first is the session's, each other gives a "
        "claim ticket (default: EERL_SOCKET, else discovered under EERL_RUN_DIR)",
    )
    parser.add_argument(
        "--scoped",
        action="store_true",
        help="the --socket is scoped (a grant's, a GPU's): no GPU need be named, it claims the socket's",
    )
    parser.add_argument("--mode", default="sync", choices=["sync", "async"])
    parser.add_argument("--role", default="both", choices=["both", "generation", "training"])
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--world-size", type=int, default=0)
    parser.add_argument("--threshold", type=float, help="minimum throughput as a fraction of the default's")
    parser.add_argument(
        "--answer-timeout-s",
        type=float,
        default=DEFAULT_ANSWER_TIMEOUT_S,
        help=f"the longest a begin or end waits for the daemon (default {DEFAULT_ANSWER_TIMEOUT_S})",
    )
    parser.add_argument("--max-connections", type=int, default=DEFAULT_MAX_CONNECTIONS)
    parser.add_argument(
        "--connect-wait-s",
        type=float,
        help="with -- command: how long to wait at most for the daemon session (with --job-nodes: for "
        f"the job's side group) before the job starts (default {CONNECT_WAIT_S:g}, with --job-nodes "
        f"{JOB_CONNECT_WAIT_S:g}; the job starts anyway)",
    )
    parser.add_argument(
        "--socket-mode", default="0600", help="mode of a unix: socket, octal (default 0600: this user only)"
    )
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    add_job_arguments(parser)
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- command ...: run the job, then exit")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
    )
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    try:
        address = parse_address(args.listen, what="--listen")
        gpus = parse_gpu_list(args.gpus, source="--gpus") if args.gpus is not None else None
        socket_mode = int(args.socket_mode, 8)
    except (ConfigError, ValueError) as e:
        parser.error(str(e))
    if not address.loopback:
        parser.error(f"--listen: {args.listen!r} is not a loopback address (the API has no authentication)")
    if args.answer_timeout_s < 0 or args.max_connections < 1:
        parser.error("--answer-timeout-s must not be negative, --max-connections must be positive")
    config = _client_config(args)
    try:
        job = job_sidecar(args, config, gpus, os.environ)
    except ConfigError as e:
        parser.error(str(e))
    sidecar: PhaseService = job or Sidecar(
        _connect(args, gpus, config), answer_timeout_s=args.answer_timeout_s
    )
    try:
        server, bound = serve(sidecar, address, max_connections=args.max_connections, socket_mode=socket_mode)
    except OSError as e:
        sidecar.close()
        if not command:
            print(f"eerl-sidecar: cannot listen on {args.listen}: {e}", file=sys.stderr)
            return 1
        logger.warning("eerl-sidecar: cannot listen on %s (%s); the job runs without eerl", args.listen, e)
        return subprocess.call(command)
    print(f"eerl-sidecar: listening on {bound.url}", flush=True)
    if job is not None:
        job.agent.start()  # the side group forms in the background
    thread = threading.Thread(target=server.serve_forever, name="eerl-sidecar-http", daemon=True)
    thread.start()
    stop = threading.Event()
    child: subprocess.Popen[bytes] | None = None

    def on_signal(signum: int, _frame: object) -> None:
        if child is not None and child.poll() is None:
            with contextlib.suppress(OSError):
                child.send_signal(signum)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    code = 0
    try:
        if command:
            wait_s = args.connect_wait_s
            if wait_s is None:
                wait_s = CONNECT_WAIT_S if job is None else JOB_CONNECT_WAIT_S
            sidecar.wait_until_ready(max(0.0, wait_s))  # bounded: fail-open
            env = {**os.environ, "EERL_SIDECAR": bound.url}
            if sidecar.job_id:
                env.setdefault("EERL_JOB_ID", sidecar.job_id)
            try:
                child = subprocess.Popen(command, env=env)
            except OSError as e:
                print(f"eerl-sidecar: cannot run {command[0]}: {e}", file=sys.stderr)
                return 127
            code = child.wait()
        else:
            while not stop.wait(1.0):
                pass
    finally:
        server.shutdown()
        server.server_close()
        sidecar.close()  # the daemon resets the job's GPUs
        if bound.path:
            with contextlib.suppress(OSError):
                os.unlink(bound.path)
    return code if code >= 0 else 128 - code


def _client_config(args: argparse.Namespace) -> ClientConfig:
    """How to reach the node's daemon, fail-open: a configuration the client cannot read gives a disabled
    one (the API still answers)."""
    env = {name: value for name, value in os.environ.items() if name != "EERL_SIDECAR"}  # not itself
    try:
        config = ClientConfig.from_env(env)
        if args.socket:
            paths = [part.strip() for part in args.socket.split(":") if part.strip()]
            if not paths:
                raise ConfigError(f"--socket: {args.socket!r} names no socket")
            sockets = ClientConfig.uds(*paths, scoped=args.scoped)
            config = dataclasses.replace(
                sockets, job_id=config.job_id, gpus=config.gpus, client_name="eerl-sidecar"
            )
        elif not config.disabled:
            config = dataclasses.replace(config, client_name="eerl-sidecar")
    except ConfigError as e:
        logger.warning("eerl-sidecar: %s; eerl is off for this job (the API still answers)", e)
        config = ClientConfig.disabled_config()
    return config


def _connect(args: argparse.Namespace, gpus: tuple[GpuId, ...] | None, config: ClientConfig) -> Session:
    """The job's session with :func:`eerl.connect` (the plain sidecar's)."""
    try:
        return eerl.connect(
            gpus=list(gpus) if gpus is not None else None,
            job_id=args.job_id,
            config=config,
            mode=args.mode,
            role=args.role,
            rank=args.rank,
            world_size=args.world_size,
            threshold=args.threshold,
        )
    except ConfigError as e:
        raise SystemExit(f"eerl-sidecar: {e}") from None


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
