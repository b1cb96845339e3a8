"""``eerl``: phase events from a shell script, through the job's sidecar (docs/sidecar.md).

    eerl phase begin generation --iteration 3
    eerl phase end generation --iteration 3 --tokens 123456 --sequences 64
    eerl status

The sidecar is ``--sidecar``, else ``EERL_SIDECAR`` (``unix:/path`` or ``http://127.0.0.1:PORT``), else the
sidecar's default socket for the job (``EERL_JOB_ID`` or ``SLURM_JOB_ID``; :mod:`eerl.sidecar._paths`). A
TCP sidecar's secret comes from ``EERL_SIDECAR_TOKEN`` or ``EERL_SIDECAR_TOKEN_FILE``; a Unix socket is used
only when the kernel says its sidecar runs as this user (or root). Fail-open: whatever happens to the
sidecar (absent, slow, refusing the event, another user's), the command exits 0 after at most ``--timeout``
seconds (default 1), with one line on stderr when the sidecar refused the event, when the socket is another
user's, or when a sidecar it was given cannot be reached; ``--strict`` makes those exit 1 instead.
``EERL_DISABLE=1``: does nothing. Usage errors (an unknown option, a count that is not a number) exit 2,
as the Python client raises ``ConfigError`` only for invalid arguments. ``--json`` prints the sidecar's
answer (the clock now applied; the phase's duration and energy) on stdout.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from eerl._version import __version__
from eerl.errors import ConfigError
from eerl.link.sidecar import SidecarForeign, SidecarHttp, SidecarUnreachable
from eerl.sidecar._address import SidecarAddress, parse_address
from eerl.sidecar._api import WORKLOAD_FIELDS
from eerl.sidecar._owner import token_from_env
from eerl.sidecar._paths import default_address, env_job_id

_TRUE = frozenset({"1", "true", "yes", "on"})
_COUNTS = tuple(name for name, _ in WORKLOAD_FIELDS)


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--sidecar",
        help="the sidecar (default: EERL_SIDECAR, else the job's default socket; docs/sidecar.md)",
    )
    common.add_argument("--timeout", type=float, default=1.0, help="seconds to wait at most (default 1)")
    common.add_argument("--strict", action="store_true", help="exit 1 when the event did not get through")
    common.add_argument("--json", action="store_true", help="print the sidecar's answer")
    parser = argparse.ArgumentParser(prog="eerl", description="eerl phase events through the job's sidecar")
    parser.add_argument("--version", action="version", version=f"eerl {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    phase = commands.add_parser("phase", help="a phase begins or ends")
    edges = phase.add_subparsers(dest="edge", required=True)
    begin = edges.add_parser("begin", parents=[common], help="a phase begins")
    end = edges.add_parser("end", parents=[common], help="a phase ends")
    for sub in (begin, end):
        sub.add_argument("kind", help="generation or training (aliases: gen, rollout, train, update)")
        sub.add_argument("--iteration", "-i", type=int, help="the iteration (default: the sidecar counts)")
    for name in _COUNTS:
        flag = "--" + name.replace("_", "-")
        begin.add_argument(flag, type=int, dest=name, help="a hint known before the phase")
        end.add_argument(flag, type=int, dest=name, help="what the phase processed")
    commands.add_parser("status", parents=[common], help="the sidecar's session and phases")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if os.environ.get("EERL_DISABLE", "").strip().lower() in _TRUE:
        return 0
    given = args.sidecar or os.environ.get("EERL_SIDECAR", "").strip()
    if args.timeout <= 0:
        parser.error("--timeout: must be positive")
    try:
        address = _address(given, "--sidecar" if args.sidecar else "EERL_SIDECAR")
        token = token_from_env(os.environ)
    except ConfigError as e:
        if given:
            parser.error(str(e))
        # The default socket's directory is not usable (another user's): say so, never fail the job.
        print(f"eerl: {e}; the job goes on", file=sys.stderr)
        return 1 if args.strict else 0
    if address is None:  # no sidecar named and no job id to find one by: eerl is not deployed here
        if args.strict:
            print("eerl: no sidecar (EERL_SIDECAR, --sidecar) and no job id to find one by", file=sys.stderr)
        return 1 if args.strict else 0
    if args.command == "status":
        method, path, body = "GET", "/v1/status", None
    else:
        method, path, body = "POST", f"/v1/phases/{args.edge}", _body(args)
    client = SidecarHttp(address, args.timeout, token=token)
    try:
        code, reply = client.request(method, path, body)
    except SidecarForeign as e:
        print(f"eerl: {e}; the job goes on", file=sys.stderr)  # always said: someone took the job's path
        return 1 if args.strict else 0
    except SidecarUnreachable as e:
        if given or args.strict:  # no sidecar at the default address: eerl is simply not deployed here
            print(f"eerl: cannot reach the sidecar at {address.url} ({e}); the job goes on", file=sys.stderr)
        return 1 if args.strict else 0
    finally:
        client.close()
    if code != 200:
        print(f"eerl: the sidecar refused it ({code}): {reply.get('error', '?')}", file=sys.stderr)
        return 1 if args.strict else 0
    if args.json:
        print(json.dumps(reply, separators=(",", ":")))
    elif args.command == "status":
        print("\n".join(status_lines(reply)))
    return 0


def status_lines(reply: Mapping[str, Any]) -> list[str]:
    """``eerl status`` for people: the sidecar's answer (``GET /v1/status``) in a few lines."""
    gpus = ",".join(str(g) for g in reply.get("gpus") or []) or "none named"
    if not reply.get("enabled", True):
        link = "off (eerl is disabled for this job; it runs at the default clocks)"
    elif reply.get("connected"):
        session = reply.get("session")
        link = f"connected to eerld, session {session}" if session else "connected to eerld"
    else:
        link = "not connected to eerld (the job runs at the default clocks)"
    lines = [f"job {reply.get('job_id', '?')} on GPUs {gpus}: {link}"]
    for kind, tally in sorted((reply.get("phases") or {}).items()):
        clock = tally.get("sm_clock_mhz")
        at = f"SM clock {clock} MHz" if clock else "default clocks"
        lines.append(
            f"  {kind}: {tally.get('state') or '-'}, {at}; {tally.get('metered', 0)} phases metered, "
            f"{tally.get('duration_s', 0):.1f} s, {tally.get('energy_j', 0):.1f} J"
        )
    opened = ", ".join(f"{p.get('kind')} {p.get('iteration')}" for p in reply.get("open_phases") or [])
    lines.append(f"  open phases: {opened or 'none'}")
    job = reply.get("job")
    if isinstance(job, Mapping):
        reason = f" ({job['reason']})" if job.get("reason") else ""
        lines.append(
            f"  job mode: node {job.get('node_rank')} of {job.get('nodes')}, {job.get('state')}{reason}"
        )
    return lines


def _address(given: str, what: str) -> SidecarAddress | None:
    """The sidecar named (``given``), else the job's default socket, else None; raises ConfigError."""
    if given:
        return parse_address(given, what=what)
    job_id = env_job_id(os.environ)
    return default_address(job_id, os.environ, create=False) if job_id else None


def _body(args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"kind": args.kind}
    if args.iteration is not None:
        body["iteration"] = args.iteration
    counts = {name: getattr(args, name) for name in _COUNTS if getattr(args, name) is not None}
    if args.edge == "begin":
        if counts:
            body["hints"] = counts
    else:
        body.update(counts)
    return body


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
