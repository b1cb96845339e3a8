"""eerlctl: the administrator's command line for eerld, over the admin socket.

    eerlctl [--socket PATH] [--json] [--debug] [--timeout S] COMMAND ...

Commands: ``status``, ``pin``, ``unpin``, ``pins``, ``sessions``, ``decisions``, ``report``, ``reset``,
``drain``, ``undrain``, ``grant``, ``revoke``, ``grants``, ``health``, ``version``, ``completion``. Every
time shown is UTC. Tables for people, ``--json`` for scripts. Session tokens are shown as a prefix (a full
token is a credential) unless ``--show-tokens``. A failure prints one ``Error: …`` line on stderr (the
traceback only with ``--debug``) and exits 1; bad usage exits 2.

The socket defaults to ``$EERLCTL_SOCKET`` or ``/run/eerld/admin.sock``. ``health`` also works against
the worker socket, which is what the Kubernetes probes use.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import sys
import time
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import grpc
from eerl.phases import PhaseKind
from eerl.v1 import eerl_pb2, eerl_pb2_grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from eerlctl import __version__
from eerlctl.args import (
    GpuSelection,
    parse_duration_s,
    parse_gid,
    parse_gpus,
    parse_sm_mhz,
    parse_uid,
    parse_until_s,
)
from eerlctl.client import CALLER_METADATA, AdminClient
from eerlctl.completion import COMMANDS, completion_script
from eerlctl.render import (
    decisions_table,
    drain_text,
    grant_text,
    grants_table,
    job_report_text,
    pin_text,
    pins_table,
    reports_table,
    reset_text,
    revoke_text,
    sessions_table,
    status_text,
    undrain_text,
    unpin_text,
)
from eerlctl.replies import (
    clocks_dict,
    decision_dict,
    gpu_pin_dict,
    grant_dict,
    job_report_dict,
    redact_tokens,
    report_dict,
    session_dict,
    status_dict,
)
from eerld.errors import DaemonError, ValidationError

__all__ = ["DEFAULT_ADMIN_SOCKET", "main"]

DEFAULT_ADMIN_SOCKET = "/run/eerld/admin.sock"
_EXIT_OK, _EXIT_ERROR, _EXIT_USAGE = 0, 1, 2


class CtlError(DaemonError):
    """A failure eerlctl reports as one ``Error: …`` line."""


@dataclass(frozen=True, slots=True)
class _Context:
    """What every command needs: the parsed arguments, an admin-client factory, and the output stream."""

    args: argparse.Namespace
    out: TextIO
    connect: Callable[[], AdminClient]


def _gpu_refs(selection: GpuSelection) -> list[eerl_pb2.GpuRef]:
    return [eerl_pb2.GpuRef(index=i) for i in selection.indices] + [
        eerl_pb2.GpuRef(uuid=u) for u in selection.uuids
    ]


def _emit(ctx: _Context, data: Mapping[str, Any], text: str) -> None:
    ctx.out.write((json.dumps(data, indent=2) if ctx.args.json else text) + "\n")


def _shown(ctx: _Context, data: dict[str, Any]) -> dict[str, Any]:
    """``data`` as it may be printed: session tokens cut to a prefix unless ``--show-tokens``."""
    shown: dict[str, Any] = data if ctx.args.show_tokens else redact_tokens(data)
    return shown


def _admin(ctx: _Context) -> eerl_pb2_grpc.AdminServiceStub:
    return ctx.connect().stub


def _caller() -> tuple[tuple[str, str], ...]:
    """Who runs eerlctl, for the record eerld keeps of a pin or drain (eerld cannot ask the kernel)."""
    uid = os.getuid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = f"uid {uid}"
    sudo = os.environ.get("SUDO_USER")
    via = f", sudo from {sudo}" if sudo and uid == 0 and sudo.isprintable() else ""
    return ((CALLER_METADATA, f"{name} (uid {uid}{via})"),)


# --------------------------------------------------------------------------- commands


def _cmd_status(ctx: _Context) -> int:
    reply = ctx.connect().status(timeout_s=ctx.args.timeout)
    data = _shown(ctx, status_dict(reply))
    _emit(ctx, data, status_text(data, time.time()))
    return _EXIT_OK


def _cmd_pin(ctx: _Context) -> int:
    a = ctx.args
    selection = parse_gpus(a.gpus)
    request = eerl_pb2.PinRequest(
        gpus=_gpu_refs(selection),
        all=selection.all,
        sm_clock_mhz=parse_sm_mhz(a.sm_mhz),
        mem_clock_mhz=parse_sm_mhz(a.mem_mhz, flag="--mem-mhz") if a.mem_mhz is not None else 0,
        duration_s=parse_duration_s(a.duration) if a.duration is not None else 0.0,
        reason=a.reason,
        replace=a.replace,
    )
    stub = _admin(ctx)
    deadline = time.monotonic() + a.timeout
    while True:  # a GPU whose clock-change budget is spent takes a pin again within a second or two
        try:
            reply = stub.Pin(request, timeout=max(0.1, deadline - time.monotonic()), metadata=_caller())
            break
        except grpc.RpcError as e:
            if e.code() != grpc.StatusCode.RESOURCE_EXHAUSTED or time.monotonic() + 0.5 > deadline:
                raise
            time.sleep(0.5)
    data = {**clocks_dict(reply.clocks), "replaced": [gpu_pin_dict(r) for r in reply.replaced]}
    _emit(ctx, data, pin_text(data, time.time()))
    return _EXIT_OK


def _cmd_unpin(ctx: _Context) -> int:
    selection = parse_gpus(ctx.args.gpus)
    request = eerl_pb2.UnpinRequest(gpus=_gpu_refs(selection), all=selection.all)
    reply = _admin(ctx).Unpin(request, timeout=ctx.args.timeout)
    data = {
        **clocks_dict(reply.clocks),
        "removed": [gpu_pin_dict(r) for r in reply.removed],
        "not_pinned": list(reply.not_pinned),
    }
    _emit(ctx, data, unpin_text(data, time.time()))
    return _EXIT_OK


def _cmd_pins(ctx: _Context) -> int:
    data = status_dict(ctx.connect().status(timeout_s=ctx.args.timeout))
    pins = [{"index": g["index"], "uuid": g["uuid"], **g["owner"]["pin"]} for g in data["gpus"]
            if g["owner"] is not None and g["owner"]["pin"] is not None]  # fmt: skip
    _emit(ctx, {"pins": pins}, pins_table(pins, time.time()))
    return _EXIT_OK


def _cmd_drain(ctx: _Context) -> int:
    a = ctx.args
    selection = parse_gpus(a.gpus)
    request = eerl_pb2.DrainRequest(
        gpus=_gpu_refs(selection),
        all=selection.all,
        duration_s=parse_duration_s(a.duration) if a.duration is not None else 0.0,
        reason=a.reason,
        keep_sessions=a.keep_sessions,
    )
    reply = _admin(ctx).Drain(request, timeout=a.timeout, metadata=_caller())
    data = _shown(
        ctx,
        {
            "gpu_indices": list(reply.gpu_indices),
            **clocks_dict(reply.clocks),
            "closed_session_ids": list(reply.closed_session_ids),
            "duration_s": request.duration_s or None,
        },
    )
    _emit(ctx, data, drain_text(data, time.time()))
    return _EXIT_OK


def _cmd_undrain(ctx: _Context) -> int:
    selection = parse_gpus(ctx.args.gpus)
    request = eerl_pb2.UndrainRequest(gpus=_gpu_refs(selection), all=selection.all)
    reply = _admin(ctx).Undrain(request, timeout=ctx.args.timeout)
    data = {"undrained": list(reply.undrained), "not_drained": list(reply.not_drained)}
    _emit(ctx, data, undrain_text(data))
    return _EXIT_OK


def _cmd_sessions(ctx: _Context) -> int:
    sessions = ctx.connect().sessions(timeout_s=ctx.args.timeout)
    data = _shown(ctx, {"sessions": [session_dict(s) for s in sessions]})
    _emit(ctx, data, sessions_table(data["sessions"]))
    return _EXIT_OK


def _cmd_decisions(ctx: _Context) -> int:
    a = ctx.args
    kind = PhaseKind(a.phase) if a.phase is not None else None
    if a.limit is not None and a.limit < 0:
        raise ValidationError("--limit", "must not be negative")
    prefix = (a.session or "").rstrip("…")
    # The tables show token prefixes, so --session takes a prefix: filter here, not in the daemon.
    replies = ctx.connect().decisions(kind=kind, limit=0 if prefix else a.limit or 0, timeout_s=a.timeout)
    decisions = [decision_dict(d) for d in replies if d.session_id.startswith(prefix)]
    if prefix and not decisions:
        raise CtlError(f"no decisions of a session whose id starts with {prefix!r}")
    if prefix and a.limit:
        decisions = decisions[-a.limit :]
    data = _shown(ctx, {"decisions": decisions})
    _emit(ctx, data, decisions_table(data["decisions"]))
    return _EXIT_OK


def _cmd_report(ctx: _Context) -> int:
    job_id = ctx.args.job_id or ""
    reports = ctx.connect().reports(job_id=job_id, timeout_s=ctx.args.timeout)
    if not job_id:
        data = _shown(ctx, {"reports": [report_dict(r) for r in reports]})
        _emit(ctx, data, reports_table(data["reports"]))
        return _EXIT_OK
    if not reports:
        raise CtlError(f"no report of job {job_id!r} on this node (eerlctl report lists the ones kept)")
    job = _shown(ctx, job_report_dict(job_id, reports))
    _emit(ctx, job, job_report_text(job))
    return _EXIT_OK


def _cmd_reset(ctx: _Context) -> int:
    selection = parse_gpus(ctx.args.gpus)
    request = eerl_pb2.ResetAllRequest(
        gpus=_gpu_refs(selection), all=selection.all, reason=ctx.args.reason, keep_pins=ctx.args.keep_pins
    )
    reply = _admin(ctx).ResetAll(request, timeout=ctx.args.timeout)
    data = _shown(ctx, {**clocks_dict(reply.clocks), "closed_session_ids": list(reply.closed_session_ids)})
    _emit(ctx, data, reset_text(data, data["closed_session_ids"]))
    return _EXIT_OK


def _cmd_grant(ctx: _Context) -> int:
    a = ctx.args
    selection = parse_gpus(a.gpus)
    if selection.all:
        raise ValidationError("--gpus", "name the GPUs to grant (a grant of 'all' is --tenancy single)")
    if a.duration is not None and a.until is not None:
        raise ValidationError("--until", "give --for or --until, not both")
    now = time.time()
    duration_s = (
        parse_duration_s(a.duration) if a.duration is not None
        else parse_until_s(a.until, now) if a.until is not None else 0.0
    )  # fmt: skip
    request = eerl_pb2.GrantRequest(
        name=a.name or "",
        gpus=_gpu_refs(selection),
        job_id=a.job_id or "",
        duration_s=duration_s,
        reason=a.reason,
        replace=a.replace,
        own_directory=a.own_directory,
    )
    if a.uid is not None:
        request.uid = parse_uid(a.uid)
    if a.gid is not None:
        request.gid = parse_gid(a.gid)
    reply = _admin(ctx).Grant(request, timeout=a.timeout)
    data = {**grant_dict(reply.grant), "revoked": list(reply.revoked)}
    _emit(ctx, data, grant_text(data, now))
    return _EXIT_OK


def _cmd_revoke(ctx: _Context) -> int:
    a = ctx.args
    if (a.name is None) == (a.job_id is None):
        raise ValidationError("NAME", "give a grant name or --job-id, not both")
    request = eerl_pb2.RevokeRequest(name=a.name or "", job_id=a.job_id or "", reason=a.reason)
    reply = _admin(ctx).Revoke(request, timeout=a.timeout)
    data = _shown(
        ctx,
        {
            "revoked": list(reply.revoked),
            **clocks_dict(reply.clocks),
            "closed_session_ids": list(reply.closed_session_ids),
        },
    )
    _emit(ctx, data, revoke_text(data))
    return _EXIT_OK


def _cmd_grants(ctx: _Context) -> int:
    reply = _admin(ctx).ListGrants(eerl_pb2.ListGrantsRequest(), timeout=ctx.args.timeout)
    data = {"grants": [grant_dict(g) for g in reply.grants]}
    _emit(ctx, data, grants_table(data["grants"], time.time()))
    return _EXIT_OK


def _cmd_health(ctx: _Context) -> int:
    stub = health_pb2_grpc.HealthStub(ctx.connect().channel)
    reply = stub.Check(health_pb2.HealthCheckRequest(service=ctx.args.service), timeout=ctx.args.timeout)
    status = health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status)
    _emit(ctx, {"service": ctx.args.service, "status": status}, status)
    return _EXIT_OK if reply.status == health_pb2.HealthCheckResponse.SERVING else _EXIT_ERROR


def _cmd_version(ctx: _Context) -> int:
    if not ctx.args.json:  # the client's version shows even when the daemon cannot be reached
        ctx.out.write(f"eerlctl {__version__}\n")
        ctx.out.flush()
    reply = ctx.connect().status(timeout_s=ctx.args.timeout)
    if ctx.args.json:
        data = {"eerlctl": __version__, "eerld": reply.daemon.version, "backend": reply.daemon.backend}
        ctx.out.write(json.dumps(data, indent=2) + "\n")
    else:
        ctx.out.write(f"eerld {reply.daemon.version} (backend {reply.daemon.backend})\n")
    return _EXIT_OK


def _cmd_completion(ctx: _Context) -> int:
    ctx.out.write(completion_script(ctx.args.shell))
    return _EXIT_OK


_COMMANDS: dict[str, tuple[Callable[[_Context], int], str]] = {
    "status": (_cmd_status, "GPUs, clocks, owners and sessions of the node"),
    "pin": (_cmd_pin, "pin GPUs to an SM clock (beats any session; a pinned GPU needs --replace)"),
    "unpin": (_cmd_unpin, "remove pins"),
    "pins": (_cmd_pins, "the admin pins in force: clock, reason, who set them, expiry"),
    "sessions": (_cmd_sessions, "open sessions and their controllers"),
    "decisions": (_cmd_decisions, "the controllers' decision history (times in UTC)"),
    "report": (_cmd_report, "what finished jobs used: energy (kWh), tokens, savings, throughput, threshold"),
    "reset": (
        _cmd_reset,
        "return GPUs to default clocks (closes the sessions holding them; removes pins unless --keep-pins)",
    ),
    "drain": (_cmd_drain, "no new claims of GPUs until undrained (closes the sessions holding them)"),
    "undrain": (_cmd_undrain, "end drains: the GPUs may be claimed again"),
    "grant": (_cmd_grant, "create a worker socket for a user or group that may claim these GPUs"),
    "revoke": (_cmd_revoke, "remove grants: close their sessions and sockets (GPUs back to default)"),
    "grants": (_cmd_grants, "the worker sockets and the GPUs each may claim"),
    "health": (_cmd_health, "gRPC health check; exit 0 when SERVING (for probes)"),
    "version": (_cmd_version, "eerlctl and eerld versions"),
    "completion": (_cmd_completion, "print a bash or zsh completion script"),
}
assert set(_COMMANDS) == set(COMMANDS), "completion table and commands disagree"


# --------------------------------------------------------------------------- parsing


def _common_options(*, suppress: bool) -> argparse.ArgumentParser:
    """Global options, accepted before or after the command (``eerlctl status --json`` works)."""
    parser = argparse.ArgumentParser(add_help=False)

    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument(
        "--socket",
        default=default(None),
        help=f"admin socket (default: $EERLCTL_SOCKET or {DEFAULT_ADMIN_SOCKET})",
    )
    parser.add_argument("--json", action="store_true", default=default(False), help="JSON output for scripts")
    parser.add_argument("--debug", action="store_true", default=default(False), help="tracebacks on errors")
    parser.add_argument(
        "--show-tokens",
        action="store_true",
        default=default(False),
        help="print session tokens in full (they are credentials; default: a prefix)",
    )
    parser.add_argument(
        "--timeout", type=float, default=default(10.0), help="seconds to wait for eerld (default 10)"
    )
    return parser


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="eerlctl",
        description="Administer eerld, the energy-efficient RL clock daemon of this node.",
        parents=[_common_options(suppress=False)],
    )
    parser.add_argument("--version", action="version", version=f"eerlctl {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    common = _common_options(suppress=True)
    parsers = {
        name: sub.add_parser(name, help=help_text, description=help_text, parents=[common])
        for name, (_, help_text) in _COMMANDS.items()
    }
    gpus_help = "GPU indices or UUIDs, comma-separated, or 'all'"
    p = parsers["pin"]
    p.add_argument("--gpus", required=True, help=gpus_help)
    p.add_argument("--sm-mhz", required=True, metavar="MHZ", help="SM clock to pin (a supported clock)")
    p.add_argument("--mem-mhz", metavar="MHZ", help="memory clock to pin too (where supported)")
    p.add_argument(
        "--for", dest="duration", metavar="DURATION", help="expire after e.g. 30m, 2h (default never)"
    )
    p.add_argument("--reason", default="", help="why (shown in status and logs)")
    p.add_argument("--replace", action="store_true", help="replace pins already on these GPUs")
    parsers["unpin"].add_argument("--gpus", required=True, help=gpus_help)
    p = parsers["drain"]
    p.add_argument("--gpus", required=True, help=gpus_help)
    p.add_argument(
        "--for", dest="duration", metavar="DURATION", help="end after e.g. 30m, 2h (default: until undrain)"
    )
    p.add_argument("--reason", default="", help="why (shown in status and to a refused claim)")
    p.add_argument(
        "--keep-sessions", action="store_true", help="let the sessions holding the GPUs run until they close"
    )
    parsers["undrain"].add_argument("--gpus", required=True, help=gpus_help)
    p = parsers["decisions"]
    p.add_argument("--session", metavar="ID", help="only this session (a prefix of its id is enough)")
    p.add_argument("--phase", choices=[k.value for k in PhaseKind], help="only this phase kind")
    p.add_argument("--limit", type=int, help="at most this many, newest last (default: the daemon's 1000)")
    parsers["report"].add_argument(
        "job_id", nargs="?", metavar="JOB_ID", help="one job's report (default: every finished session kept)"
    )
    p = parsers["reset"]
    p.add_argument("--gpus", default="all", help=gpus_help + " (default all)")
    p.add_argument("--reason", default="eerlctl reset", help="why (logged)")
    p.add_argument(
        "--keep-pins", action="store_true", help="leave admin pins in place (the Slurm prolog and epilog)"
    )
    p = parsers["grant"]
    p.add_argument("--gpus", required=True, help="GPU indices or UUIDs, comma-separated")
    p.add_argument("--uid", metavar="USER", help="the socket's owner: a user name or uid (mode 0600)")
    p.add_argument("--gid", metavar="GROUP", help="the socket's group: a group name or gid (mode 0660)")
    p.add_argument("--job-id", metavar="JOB", help="admit only this job id (the grant is then job-JOB)")
    p.add_argument("--name", help="grant name (default job-JOB); the socket is <grant dir>/NAME.sock")
    p.add_argument("--for", dest="duration", metavar="DURATION", help="expire after e.g. 30m, 2h")
    p.add_argument("--until", metavar="TIME", help="expire at an ISO time (2026-12-01T18:00) or Unix seconds")
    p.add_argument("--reason", default="", help="why (shown in grants and logs)")
    p.add_argument("--replace", action="store_true", help="revoke grants on the same GPUs or name first")
    p.add_argument(
        "--own-directory",
        action="store_true",
        help="the socket in a directory of its own, <grant dir>/<name>/eerld.sock (to bind-mount it)",
    )
    p = parsers["revoke"]
    p.add_argument("name", nargs="?", help="the grant to revoke")
    p.add_argument("--job-id", metavar="JOB", help="revoke every grant of this job")
    p.add_argument("--reason", default="eerlctl revoke", help="why (logged)")
    parsers["health"].add_argument("--service", default="", help="service name (default: the whole server)")
    parsers["completion"].add_argument("shell", choices=("bash", "zsh"))
    return parser


_VALUE_OPTIONS = frozenset(
    {"--for", "--until", "--sm-mhz", "--mem-mhz", "--reason", "--limit", "--timeout", "--gpus"}
)


def _join_dash_values(argv: Sequence[str]) -> list[str]:
    """``--for -5m`` as ``--for=-5m``: argparse takes a value that starts with ``-`` for an option and says
    only "expected one argument"; joined, the value reaches its parser, which says what is wrong."""
    out: list[str] = []
    items = list(argv)
    i = 0
    while i < len(items):
        item = items[i]
        following = items[i + 1] if i + 1 < len(items) else None
        if (
            item in _VALUE_OPTIONS
            and following is not None
            and following.startswith("-")
            and (not following.startswith("--"))
        ):
            out.append(f"{item}={following}")
            i += 2
            continue
        out.append(item)
        i += 1
    return out


def _explain_rpc_error(error: grpc.RpcError, socket: str, timeout_s: float) -> str:
    """One line that says what went wrong and what to do about it."""
    code: grpc.StatusCode = error.code()
    details: str = error.details() or ""
    if code == grpc.StatusCode.UNAVAILABLE:
        path = Path(socket.removeprefix("unix:"))
        if not socket.startswith(("dns:", "ipv4:", "ipv6:", "unix-abstract:")):
            if not path.exists():
                return f"no eerld socket at {path}: is eerld running? (set --socket or EERLCTL_SOCKET)"
            if not os.access(path, os.R_OK | os.W_OK):
                return f"permission denied on {path}: the admin socket is for root or the eerl admin group"
        return f"cannot reach eerld at {socket}: {details}"
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return f"eerld did not answer within {timeout_s:g} s"
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return f"eerld at {socket} does not offer this call (is it the worker socket, or an older eerld?)"
    return details or code.name.lower().replace("_", " ")


def main(argv: Sequence[str] | None = None, *, out: TextIO | None = None, err: TextIO | None = None) -> int:
    """Run eerlctl; return the exit status (0 ok, 1 failure, 2 usage)."""
    out = out if out is not None else sys.stdout
    err = err if err is not None else sys.stderr
    parser = _parser()
    try:
        args = parser.parse_args(_join_dash_values(sys.argv[1:] if argv is None else argv))
    except SystemExit as e:  # argparse already printed usage or help
        return e.code if isinstance(e.code, int) else _EXIT_USAGE
    socket = args.socket or os.environ.get("EERLCTL_SOCKET") or DEFAULT_ADMIN_SOCKET
    clients: list[AdminClient] = []

    def connect() -> AdminClient:
        client = AdminClient(socket)
        clients.append(client)
        return client

    handler, _ = _COMMANDS[args.command]
    try:
        return handler(_Context(args=args, out=out, connect=connect))
    except grpc.RpcError as e:
        message = _explain_rpc_error(e, socket, args.timeout)
        if args.debug:
            traceback.print_exc(file=err)
    except DaemonError as e:
        message = str(e)
        if args.debug:
            traceback.print_exc(file=err)
    except Exception as e:  # an unexpected bug: still one line unless debugging
        message = f"unexpected {type(e).__name__}: {e} (run with --debug for the traceback)"
        if args.debug:
            traceback.print_exc(file=err)
    finally:
        for client in clients:
            client.close()
    err.write(f"Error: {message}\n")
    return _EXIT_ERROR


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
