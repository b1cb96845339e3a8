"""Builds the gRPC channel to the daemon from a :class:`ClientConfig`."""

from __future__ import annotations

import grpc

from eerl.config import ClientConfig

# gRPC's own reconnect back-off grows to two minutes by default; the sender does its own back-off and
# wants a fresh attempt to really try, so the channel's is kept short. No client keepalive pings: a
# server that does not allow them answers with GOAWAY.
_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
]


def make_channel(config: ClientConfig) -> grpc.Channel:
    """A new channel to the configured daemon (Unix socket, or TCP with mutual TLS)."""
    if config.transport == "tcp":
        credentials = grpc.ssl_channel_credentials(
            root_certificates=config.root_cert_pem,
            private_key=config.private_key_pem,
            certificate_chain=config.cert_chain_pem,
        )
        return grpc.secure_channel(config.target, credentials, options=_CHANNEL_OPTIONS)
    return grpc.insecure_channel(config.target, options=_CHANNEL_OPTIONS)
