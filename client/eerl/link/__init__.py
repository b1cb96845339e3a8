"""One link to the daemon: the protocol every part of the client talks through, and its implementations.

:class:`DaemonLink` (:mod:`eerl.link.base`) is the seam, modelled on httpx's transports: one small protocol
for "talk to the daemon", with a gRPC implementation (:class:`GrpcLink`, the daemon's worker socket), a
sidecar one (:class:`eerl.link.sidecar.SidecarLink`, HTTP to the job's sidecar, which holds the session) and
an in-memory one (:class:`eerl.link.memory.MemoryDaemon`, for tests). The session's sender
(:mod:`eerl._sender`), a node's job-mode link (:class:`eerl.job.node.NodeLink`, which the Ray node agents
and the sidecar's job seat hold) and the sidecar relay (:mod:`eerl.sidecar.client`) all use it; what a
failure means (:data:`CONNECTION_LOST`, :data:`SESSION_LOST`) is defined there once.
"""

from eerl.link._grpc import GrpcLink, grpc_connect
from eerl.link.base import (
    CONNECTION_LOST,
    SESSION_LOST,
    AttachStream,
    Code,
    Connect,
    DaemonLink,
    LinkError,
)

__all__ = [
    "CONNECTION_LOST",
    "SESSION_LOST",
    "AttachStream",
    "Code",
    "Connect",
    "DaemonLink",
    "GrpcLink",
    "LinkError",
    "grpc_connect",
]
