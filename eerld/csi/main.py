"""``eerl-csi``: the CSI node plugin that gives each pod's inline ``csi.eerl.dev`` volume the pod's own grant
socket (docs/deployment.md). ``main()`` returns an exit code; a bad flag or directory is one ``Error:`` line.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

from eerld import __version__
from eerld.csi.server import CsiConfig, create_server, serve
from eerld.errors import ConfigError
from eerld.logging import configure_logging

_EXIT_FAILURE = 1
_EXIT_USAGE = 2


def _endpoint(value: str) -> Path:
    """``unix:///path`` (the CSI_ENDPOINT form), ``unix:/path`` or a plain path."""
    for prefix in ("unix://", "unix:"):
        if value.startswith(prefix):
            value = value[len(prefix) :]
            break
    path = Path(value)
    if not path.is_absolute():
        raise argparse.ArgumentTypeError(f"{value!r} is not an absolute path")
    return path


def build_parser() -> argparse.ArgumentParser:
    """The flags; defaults are those of the DaemonSet (deploy/kubernetes/daemonset.yaml)."""
    d = CsiConfig()
    parser = argparse.ArgumentParser(prog="eerl-csi", description=__doc__)
    parser.add_argument("--version", action="version", version=f"eerl-csi {__version__}")
    parser.add_argument(
        "--csi-socket",
        "--endpoint",
        type=_endpoint,
        default=_endpoint(os.environ.get("CSI_ENDPOINT", str(d.csi_socket))),
        help=f"where the kubelet calls (default CSI_ENDPOINT, else {d.csi_socket}); created 0600",
    )
    parser.add_argument(
        "--node-id",
        default=os.environ.get("NODE_NAME") or socket.gethostname(),
        help="the node's name (default NODE_NAME, else the host name)",
    )
    parser.add_argument("--admin-socket", type=Path, default=d.admin_socket, help="eerld's admin socket")
    parser.add_argument(
        "--grant-dir",
        type=Path,
        default=d.grant_dir,
        help="eerld's --grant-dir: a volume published while eerld is away gets its grant's directory there",
    )
    parser.add_argument(
        "--pod-resources-socket",
        type=Path,
        default=d.pod_resources_socket,
        help="the kubelet's pod-resources API",
    )
    parser.add_argument(
        "--kubelet-dir", type=Path, default=d.kubelet_dir, help="the kubelet's root directory"
    )
    parser.add_argument("--state-dir", type=Path, default=d.state_dir, help="the volume records (root only)")
    parser.add_argument(
        "--reconcile-s",
        type=float,
        default=d.reconcile_s,
        help="revoke grants of pods the kubelet no longer lists, this often (0: only at start)",
    )
    parser.add_argument("--log-format", choices=("json", "console"), default=None)
    parser.add_argument("--debug", action="store_true", help="debug logs and tracebacks")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run eerl-csi until SIGTERM; 0 on a clean stop, 1 when it cannot start, 2 for bad usage."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else _EXIT_USAGE
    configure_logging(args.log_format, debug=args.debug)
    config = CsiConfig(
        csi_socket=args.csi_socket,
        node_id=args.node_id,
        admin_socket=args.admin_socket,
        grant_dir=args.grant_dir,
        pod_resources_socket=args.pod_resources_socket,
        kubelet_dir=args.kubelet_dir,
        state_dir=args.state_dir,
        reconcile_s=args.reconcile_s,
    )
    try:
        server = create_server(config)
    except ConfigError as e:
        print(f"Error: {' '.join(str(e).split())}", file=sys.stderr)
        return _EXIT_USAGE
    except OSError as e:
        if args.debug:
            raise
        print(f"Error: {e}", file=sys.stderr)
        return _EXIT_FAILURE
    return serve(server)


if __name__ == "__main__":
    sys.exit(main())
