"""systemd's readiness protocol (``sd_notify``) without libsystemd: one datagram to ``$NOTIFY_SOCKET``.

With ``Type=notify`` systemd waits for ``READY=1`` before it counts eerld as started, so units ordered
after eerld (and ``systemctl start`` itself) wait until the sockets really answer. Outside systemd
``NOTIFY_SOCKET`` is unset and every call is a cheap no-op returning False.

    sd_notify("READY=1")          # once both gRPC servers serve
    sd_notify("STOPPING=1")       # when a graceful stop begins
    sd_notify("STATUS=2 sessions")
"""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping

__all__ = ["sd_notify"]


def sd_notify(state: str, *, environ: Mapping[str, str] | None = None) -> bool:
    """Send ``state`` (newline-separated ``KEY=VALUE`` lines) to systemd; True when it was sent.

    Never raises: readiness reporting must not take the daemon down. An ``@`` prefix names a socket in
    the abstract namespace, as systemd documents.
    """
    env = os.environ if environ is None else environ
    address = env.get("NOTIFY_SOCKET", "")
    if not address or not state:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    elif not address.startswith("/"):
        return False  # vsock and other forms are not used on a GPU node
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError:
        return False
    return True
