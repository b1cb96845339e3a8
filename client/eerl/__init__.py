"""eerl: the thin, fail-open client of the eerld clock daemon.

Two lines to adopt::

    session = eerl.connect(gpus=[0, 1], job_id="my-job")
    with session.phase("generation", iteration=i) as p:
        ...
        p.report(tokens=generated, sequences=len(batch))

Importing ``eerl`` needs only grpcio and protobuf; the framework hooks live in ``eerl.integrations.*``
and are imported only when asked for.
"""

from eerl._pump import ClientStats
from eerl._version import __version__
from eerl.config import DEFAULT_SOCKET_PATH, ClientConfig
from eerl.errors import ClientError, ConfigError
from eerl.gpus import GpuId, visible_gpus
from eerl.phases import ExecutionMode, GpuRole, PhaseKind, Workload
from eerl.session import Phase, Session, connect

__all__ = [
    "DEFAULT_SOCKET_PATH",
    "ClientConfig",
    "ClientError",
    "ClientStats",
    "ConfigError",
    "ExecutionMode",
    "GpuId",
    "GpuRole",
    "Phase",
    "PhaseKind",
    "Session",
    "Workload",
    "__version__",
    "connect",
    "visible_gpus",
]
