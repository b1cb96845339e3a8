"""Build eerl-csi's gRPC server apart from running it: a root-only Unix socket for the kubelet, the
Identity and Node services, and a reconcile at start and every ``reconcile_s``.

The socket is the kubelet's way in, and NodePublishVolume makes grants with eerld's admin authority, so
only root may reach it: created 0600 under a 0700 directory (the node-driver-registrar and the kubelet run
as root). A stale socket file of a dead eerl-csi is replaced; a live one is an error.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import socket
import stat
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import grpc
import structlog

from eerld import files
from eerld.api.csi import csi_pb2_grpc as pb_grpc
from eerld.api.podresources import KubeletPodResources
from eerld.csi.eerld_admin import EerldAdmin
from eerld.csi.node import NodePlugin
from eerld.csi.records import VolumeRecords
from eerld.csi.servicers import IdentityServicer, NodeServicer
from eerld.errors import ConfigError

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
        """Stop serving (published volumes and their grants stay: the pods still run)."""
        self._stop.set()
        self.server.stop(grace_s).wait(grace_s + 1)
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
    _remove_stale(config.csi_socket)
    plugin = NodePlugin(
        KubeletPodResources(config.pod_resources_socket),
        EerldAdmin(config.admin_socket),
        records,
        kubelet_dir=config.kubelet_dir,
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


def _remove_stale(path: Path) -> None:
    """Remove a dead eerl-csi's socket; ConfigError for a live one or anything that is not a socket."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"--csi-socket: {path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.connect(str(path))
    except OSError as e:
        if e.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise ConfigError(f"--csi-socket: cannot probe {path}: {e.strerror}") from None
    else:
        raise ConfigError(f"--csi-socket: another eerl-csi serves on {path}")
    finally:
        probe.close()
    path.unlink()


def serve(server: CsiServer) -> int:
    """Run until SIGTERM or SIGINT; return 0."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("signal", signal=signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        server.start()
        while not stop.wait(1.0):
            pass
    finally:
        server.stop()
        for s, handler in previous.items():
            signal.signal(s, handler)
    return 0


__all__ = ["CsiConfig", "CsiServer", "create_server", "serve"]
