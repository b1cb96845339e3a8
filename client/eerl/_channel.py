"""Builds the gRPC channel to the daemon from a :class:`ClientConfig` (for :class:`eerl.link.GrpcLink`)."""

from __future__ import annotations

import grpc

from eerl.config import ClientConfig, uds_target

# gRPC's own reconnect back-off grows to two minutes by default; the sender does its own back-off and
# wants a fresh attempt to really try, so the channel's is kept short. No client keepalive pings: a
# server that does not allow them answers with GOAWAY.
#
# A connection of its own per channel (a local subchannel pool): gRPC otherwise shares one connection
# between every channel of a process with the same target and options, and eerld lets one connection
# hold 8 streams, of which each session's Attach stream keeps one. Shared, a process's eighth session
# left no stream for a phase event and its ninth could not open (RST_STREAM). Each session now costs the
# process one connection (eerld allows 256 per socket) and keeps the per-connection bound to itself.
_CHANNEL_OPTIONS: list[tuple[str, int]] = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
    ("grpc.enable_retries", 0),
    ("grpc.use_local_subchannel_pool", 1),
]


def make_channel(config: ClientConfig, *, socket_path: str | None = None) -> grpc.Channel:
    """A new channel to the configured daemon (Unix socket, or TCP with mutual TLS).

    ``socket_path``: another worker socket of the same daemon instead of the session's (a Unix config).
    """
    if config.transport == "tcp":
        credentials = grpc.ssl_channel_credentials(
            root_certificates=config.root_cert_pem,
            private_key=config.private_key_pem,
            certificate_chain=config.cert_chain_pem,
        )
        return grpc.secure_channel(config.target, credentials, options=_CHANNEL_OPTIONS)
    target = config.target if socket_path is None else uds_target(socket_path)
    return grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)
