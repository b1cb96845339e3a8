"""The gRPC metadata keys the two sides share: set by a client (eerlctl), read by eerld's servicers."""

from __future__ import annotations

CALLER_METADATA = "eerl-caller"
"""The metadata key a client reports its user in with a pin or drain (eerld records it with the admin
socket's owner; gRPC Python cannot ask the kernel who the peer is)."""

__all__ = ["CALLER_METADATA"]
