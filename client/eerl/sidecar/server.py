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
right gets a 4xx and a one-line JSON error naming the field, and nothing is forwarded. Connections are
bounded (``--max-connections``) and served by one event loop (:mod:`eerl.sidecar._http`).

The API belongs to the job's user. By default it listens on a Unix socket in a directory only that user may
use (:mod:`eerl.sidecar._paths`), serves only peers the kernel says run as that user (or root), and the
clients check the same of the sidecar (:mod:`eerl.sidecar._owner`). A TCP address (loopback only) must be
asked for, and then every request must carry the sidecar's secret.

With ``--job-nodes`` the sidecar is one node of a multi-node job: the same API, served by
:class:`eerl.sidecar.job.JobSidecar` through the job-level control instead of a session of its own.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import socket
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
from eerl.reports import SessionReport
from eerl.session import Phase, Session
from eerl.sidecar._address import SidecarAddress, parse_address
from eerl.sidecar._api import (
    ApiError,
    BeginRequest,
    EndRequest,
    begin_answer,
    end_answer,
    parse_begin,
    parse_end,
    stats_fields,
)
from eerl.sidecar._book import OpenPhases, Tallies
from eerl.sidecar._http import HttpServer, Request, Response
from eerl.sidecar._owner import TOKEN_ENV, job_environment, new_token, read_token_file, write_token_file
from eerl.sidecar._paths import default_address, env_job_id, make_socket_dir
from eerl.sidecar.job import add_job_arguments, job_sidecar

logger = logging.getLogger("eerl.sidecar")

DEFAULT_ANSWER_TIMEOUT_S = 0.5
"""How long a begin or an end waits at most for the daemon's answer (only while a session is open)."""
DEFAULT_MAX_CONNECTIONS = 64
"""Connections open at once (:mod:`eerl.sidecar._http`: a stranger's is closed to make room for the job's)."""
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

    def close(self) -> SessionReport | None: ...


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

    def close(self) -> SessionReport | None:
        """Closes the session: the daemon resets the job's GPUs; its report of the session, if it gave one."""
        return self._session.close()

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

_PHASE_PATHS = ("/v1/phases/begin", "/v1/phases/end")


def route(sidecar: PhaseService, request: Request) -> Response:
    """The API's answer to one request (on a worker thread of the server; a begin or an end may wait for the
    daemon, bounded)."""
    path = request.path
    if request.method == "GET":
        if path == "/healthz":
            return Response(200, {"ok": True})
        if path == "/v1/status":
            return Response(200, sidecar.status())
        if path in _PHASE_PATHS:
            return Response(405, {"error": f"method: {path} takes POST"}, allow="POST")
        return Response(404, {"error": f"path: {path} is not an endpoint of the sidecar"})
    if path in ("/healthz", "/v1/status"):
        return Response(405, {"error": f"method: {path} takes GET"}, allow="GET")
    if path not in _PHASE_PATHS:
        return Response(404, {"error": f"path: {path} is not an endpoint of the sidecar"})
    try:
        if path == "/v1/phases/begin":
            return Response(200, sidecar.begin(parse_begin(request.body)))
        return Response(200, sidecar.end(parse_end(request.body)))
    except ApiError as e:
        sidecar.refused()
        return Response(e.status, {"error": e.message})


def serve(
    sidecar: PhaseService,
    address: SidecarAddress,
    *,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    socket_mode: int = 0o600,
    token: str | None = None,
) -> tuple[HttpServer, SidecarAddress]:
    """Binds the API on ``address`` (port 0: any free one) and returns the server (not yet serving: call
    ``serve_forever``) and the address it is bound to. ``token``: the secret a TCP address demands (see
    :mod:`eerl.sidecar._http`). Raises OSError if it cannot bind."""
    server = HttpServer(
        lambda request: route(sidecar, request),
        max_connections=max_connections,
        token=token,
        socket_mode=socket_mode,
    )
    bound = server.bind(address)
    return server, bound


# -- the command ---------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eerl-sidecar",
        description="Holds a job's eerld session and takes its phase events over local HTTP "
        "(docs/sidecar.md). With `-- command ...` it runs the job itself, with EERL_SIDECAR set.",
    )
    parser.add_argument("--version", action="version", version=f"eerl-sidecar {__version__}")
    parser.add_argument("--job-id", help="the job id (default: EERL_JOB_ID, SLURM_JOB_ID, else host-pid)")
    parser.add_argument(
        "--gpus",
        help="GPU indices or UUIDs, comma-separated (default: EERL_GPUS, else CUDA_VISIBLE_DEVICES; "
        "none on a scoped socket)",
    )
    parser.add_argument(
        "--listen",
        help="unix:/path, or host:port on loopback (port 0: any; a TCP sidecar demands a secret: "
        "--token-file or -- command). Default: a Unix socket in a directory only you may use "
        "($EERL_JOBS_DIR/<job>/, $XDG_RUNTIME_DIR, else $TMPDIR/eerl-<uid>/); stdout's first line says "
        "where",
    )
    parser.add_argument(
        "--token-file",
        help="with a TCP --listen: the file that holds the secret every request must carry (a file of yours "
        "there is used, else a new secret is written there, mode 0600); clients read EERL_SIDECAR_TOKEN_FILE",
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
        "--socket-mode",
        default="0600",
        help="mode of a unix: socket, octal (default 0600: this user only; with group or other bits, the "
        "users the mode admits are served too)",
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
        gpus = parse_gpu_list(args.gpus, source="--gpus") if args.gpus is not None else None
        socket_mode = int(args.socket_mode, 8)
        address = parse_address(args.listen, what="--listen") if args.listen is not None else None
    except (ConfigError, ValueError) as e:
        parser.error(str(e))
    if address is not None and not address.loopback:
        parser.error(f"--listen: {args.listen!r} is not a loopback address (the API is for this node's job)")
    if not 0 <= socket_mode <= 0o777:
        parser.error(f"--socket-mode: {args.socket_mode!r} is not a file mode (0600, 0660, ...)")
    if args.answer_timeout_s < 0 or args.max_connections < 1:
        parser.error("--answer-timeout-s must not be negative, --max-connections must be positive")
    tcp = address is not None and not address.path
    if args.token_file is not None and not tcp:
        parser.error("--token-file: only a TCP --listen takes a secret (a Unix socket's peers are checked)")
    if tcp and args.token_file is None and not command:
        parser.error(
            "--listen host:port: any local user reaches a TCP port, so a TCP sidecar demands a secret: give "
            "--token-file PATH (the job's processes read it through EERL_SIDECAR_TOKEN_FILE), or run the job "
            "with -- command (it gets EERL_SIDECAR_TOKEN); or leave --listen out for a private Unix socket"
        )
    config = _client_config(args)
    try:
        job = job_sidecar(args, config, gpus, os.environ)
    except ConfigError as e:
        parser.error(str(e))
    sidecar: PhaseService = job or Sidecar(
        _connect(args, gpus, config), answer_timeout_s=args.answer_timeout_s
    )
    where = args.listen or "the default address"
    try:
        if address is None:
            address = default_address(_address_job_id(args, sidecar), os.environ, create=True)
            where = address.url
        elif address.path:
            make_socket_dir(address.path)
        token = _token(args.token_file) if tcp else None
        server, bound = serve(
            sidecar, address, max_connections=args.max_connections, socket_mode=socket_mode, token=token
        )
    except (OSError, ConfigError) as e:
        sidecar.close()
        if not command:
            print(f"eerl-sidecar: cannot listen on {where}: {e}", file=sys.stderr)
            return 1
        logger.warning("eerl-sidecar: cannot listen on %s (%s); the job runs without eerl", where, e)
        return subprocess.call(command)
    if bound.path:
        _warn_if_shared_directory(bound.path)
    print(f"eerl-sidecar: listening on {bound.url}", flush=True)
    if job is not None:
        job.seat.start()  # the side group forms in the background
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
            env = {k: v for k, v in os.environ.items() if k != TOKEN_ENV}  # never a stale secret
            env.update(job_environment(bound.url, token))
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
        report = sidecar.close()  # the daemon resets the job's GPUs
        if report is not None:  # stderr: the command's stdout stays the command's
            print(f"eerl-sidecar: {report.summary()}", file=sys.stderr, flush=True)
        if bound.path:
            with contextlib.suppress(OSError):
                os.unlink(bound.path)
    return code if code >= 0 else 128 - code


def _address_job_id(args: argparse.Namespace, sidecar: PhaseService) -> str:
    """The job id that names the default socket: the one the sidecar serves, else the environment's."""
    return sidecar.job_id or args.job_id or env_job_id(os.environ) or f"{socket.gethostname()}-{os.getpid()}"


def _token(token_file: str | None) -> str:
    """A TCP sidecar's secret: the one in ``--token-file`` if that is a file of ours, else a new one (written
    there when a file is named)."""
    if token_file is None:
        return new_token()
    try:
        info = os.lstat(token_file)
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISREG(info.st_mode) and info.st_uid == os.geteuid():
        return read_token_file(token_file, what="--token-file")
    token = new_token()
    write_token_file(token_file, token)
    return token


def _warn_if_shared_directory(path: str) -> None:
    """One warning for a socket in a directory other users may write (``/tmp``): one of them could take the
    path before this sidecar does, next time (the client would then refuse to talk to it)."""
    with contextlib.suppress(OSError):
        if os.stat(os.path.dirname(path)).st_mode & 0o002:
            logger.warning(
                "eerl-sidecar: %s is in a directory every user may write: another user could take the path "
                "first next time; leave --listen out for a private directory",
                path,
            )


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
