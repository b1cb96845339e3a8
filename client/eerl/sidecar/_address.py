"""Where a sidecar listens: ``unix:/path/to/sidecar.sock`` or ``http://127.0.0.1:PORT`` (loopback TCP).

Pure parsing, shared by the sidecar (``--listen``), its HTTP client (``EERL_SIDECAR``, ``eerl phase``) and
:class:`eerl.ClientConfig`; it imports nothing but the standard library and :mod:`eerl.errors`. Where a
sidecar listens when nobody says is :mod:`eerl.sidecar._paths`'s.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from eerl.errors import ConfigError


@dataclass(frozen=True, slots=True)
class SidecarAddress:
    """A TCP ``host`` and ``port``, or a Unix socket ``path`` (then ``host`` is empty and ``port`` 0)."""

    host: str = ""
    port: int = 0
    path: str = ""

    @property
    def url(self) -> str:
        """The address as ``EERL_SIDECAR`` takes it."""
        if self.path:
            return f"unix:{self.path}"
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def loopback(self) -> bool:
        """True for a Unix socket or a loopback TCP address (``localhost`` counts)."""
        if self.path:
            return True
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False


def parse_address(
    text: str, *, what: str = "EERL_SIDECAR", default_port: int | None = None
) -> SidecarAddress:
    """``unix:/path``, ``http://host:port`` or ``host:port`` (``[::1]:port`` for IPv6); raises ConfigError.

    ``default_port``: the port when none is given (None: a port is required). A trailing ``/`` is allowed;
    any other path, a query or credentials are not.
    """
    value = text.strip()
    if value.startswith("unix:"):
        path = value.removeprefix("unix:")
        if path.startswith("//"):  # unix:///run/x.sock, as gRPC spells it
            path = path[2:]
        if not path.startswith("/"):
            raise ConfigError(f"{what}: {text!r}: a Unix socket needs an absolute path (unix:/run/…/x.sock)")
        return SidecarAddress(path=path)
    rest = value.removeprefix("http://")
    if "://" in rest:
        raise ConfigError(f"{what}: {text!r}: only http:// or unix: (the sidecar speaks plain local HTTP)")
    rest = rest.removesuffix("/")
    if not rest or any(c in rest for c in "/?#@"):
        raise ConfigError(f"{what}: {text!r} is not host:port, http://host:port or unix:/path")
    if rest.startswith("["):
        host, sep, port_text = rest[1:].partition("]")
        if not sep or (port_text and not port_text.startswith(":")):
            raise ConfigError(f"{what}: {text!r}: bad IPv6 address")
        port_text = port_text[1:]
    else:
        host, _, port_text = rest.rpartition(":") if ":" in rest else (rest, "", "")
    if not host:
        raise ConfigError(f"{what}: {text!r} names no host")
    if not port_text:
        if default_port is None:
            raise ConfigError(f"{what}: {text!r} names no port")
        return SidecarAddress(host=host, port=default_port)
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"{what}: {text!r}: port {port_text!r} is not in 0..65535")
    return SidecarAddress(host=host, port=int(port_text))
