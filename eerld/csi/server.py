"""Build eerl-csi's gRPC server apart from running it: a root-only Unix socket for the kubelet, the
Identity and Node services, and a reconcile at start and every ``reconcile_s``.

The socket is the kubelet's way in, and NodePublishVolume makes grants with eerld's admin authority, so
only root may reach it: created 0600 under a 0700 directory (the node-driver-registrar and the kubelet run
as root). A stale socket file of a dead eerl-csi is replaced; a live one is an error.
"""

from __future__ import annotations

import contextlib
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import grpc
import structlog

from eerld import files
from eerld.api.podresources import KubeletPodResources
from eerld.config import DEFAULT_GRANT_DIR
from eerld.csi.eerld_admin import EerldAdmin
from eerld.csi.node import NodePlugin
from eerld.csi.proto import csi_pb2_grpc as pb_grpc
from eerld.csi.records import VolumeRecords
from eerld.csi.servicers import IdentityServicer, NodeServicer
from eerld.errors import ConfigError
from eerld.signals import serve_until_signal

log = structlog.get_logger("eerld.csi")

SOCKET_MODE = 0o600
SOCKET_DIR_MODE = 0o700
WORKERS = 4


@dataclass(frozen=True, slots=True)
class CsiConfig:
    """eerl-csi's settings (its flags)."""

    csi_socket: Path = Path("/var/lib/kubelet/plugins/csi.eerl.dev/csi.sock")
    node_id: str = ""
    admin_socket: Path = Path("/run/eerld/admin.sock")
    grant_dir: Path = DEFAULT_GRANT_DIR
    """eerld's --grant-dir: where a volume published while eerld is away gets its grant's directory."""
    pod_resources_socket: Path = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
    kubelet_dir: Path = Path("/var/lib/kubelet")
    state_dir: Path = Path("/var/lib/eerl-csi")
    reconcile_s: float = 60.0


class CsiServer:
    """The bound server and its plugin; :meth:`start` reconciles once and serves, :meth:`stop` stops."""

    def __init__(self, config: CsiConfig, plugin: NodePlugin, server: grpc.Server) -> None:
        self.config = config
        self.plugin = plugin
        self.server = server
        self._stop = threading.Event()
        self._reconciler: threading.Thread | None = None

    def start(self) -> None:
        """Reconcile (grants of pods deleted while eerl-csi was away start their way out), then serve."""
        self.plugin.reconcile()
        self.server.start()
        if self.config.reconcile_s > 0:
            self._reconciler = threading.Thread(
                target=self._reconcile_loop, name="csi-reconcile", daemon=True
            )
            self._reconciler.start()
        log.info("serving", socket=str(self.config.csi_socket), node_id=self.config.node_id)

    def _reconcile_loop(self) -> None:
        while not self._stop.wait(self.config.reconcile_s):
            try:
                self.plugin.reconcile()
            except Exception:  # a bug in one pass must not end the loop
                log.exception("reconcile_failed")

    def stop(self, grace_s: float = 5.0) -> None:
        """Stop serving (published volumes and their grants stay: the pods still run); the channels close
        once a reconcile under way has ended."""
        self._stop.set()
        self.server.stop(grace_s).wait(grace_s + 1)
        if self._reconciler is not None:
            self._reconciler.join(grace_s + 1)
        with contextlib.suppress(FileNotFoundError):
            self.config.csi_socket.unlink()
        self.plugin.close()


def create_server(config: CsiConfig) -> CsiServer:
    """Check the directories, bind the CSI socket (0600 in a 0700 directory); nothing served yet."""
    if not config.node_id:
        raise ConfigError("--node-id: required (the downward API's spec.nodeName, NODE_NAME)")
    if config.reconcile_s < 0:
        raise ConfigError("--reconcile-s: must be 0 (off) or more")
    records = VolumeRecords(config.state_dir)
    directory = config.csi_socket.parent
    files.ensure_private_dir(directory, "--csi-socket", SOCKET_DIR_MODE)
    os.chmod(directory, SOCKET_DIR_MODE)  # the kubelet's plugin directory may come 0755: narrow it
    files.remove_stale_socket(config.csi_socket, "--csi-socket", "eerl-csi")
    plugin = NodePlugin(
        KubeletPodResources(config.pod_resources_socket),
        EerldAdmin(config.admin_socket),
        records,
        kubelet_dir=config.kubelet_dir,
        grant_dir=config.grant_dir,
    )
    server = grpc.server(ThreadPoolExecutor(max_workers=WORKERS, thread_name_prefix="csi"))
    pb_grpc.add_IdentityServicer_to_server(IdentityServicer(), server)
    pb_grpc.add_NodeServicer_to_server(NodeServicer(plugin, config.node_id), server)
    old = os.umask(0o177)
    try:
        server.add_insecure_port(f"unix:{config.csi_socket}")
    finally:
        os.umask(old)
    files.secure_socket(config.csi_socket, SOCKET_MODE, flag="--csi-socket")
    return CsiServer(config, plugin, server)


def serve(server: CsiServer) -> int:
    """Run until SIGTERM or SIGINT; return 0."""
    return serve_until_signal(server.start, server.stop)


__all__ = ["CsiConfig", "CsiServer", "create_server", "serve"]
