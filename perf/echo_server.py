"""A no-op gRPC server in Python: the latency floor that :mod:`perf.phase_latency` compares eerld against.

Serves ``/bench.Echo/Ping`` (bytes in, the same bytes out) on a Unix socket with the same thread-pool
size and options as eerld's worker server, so that the difference is eerld's own work.
Usage: python -m perf.echo_server SOCKET_PATH (prints ``ready``; SIGTERM stops it).
"""

from __future__ import annotations

import signal
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import grpc

METHOD = "/bench.Echo/Ping"


def _identity(data: bytes) -> bytes:
    return data


def serve(socket_path: str, max_workers: int = 128) -> None:
    """Serve until SIGTERM/SIGINT."""
    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Ping": grpc.unary_unary_rpc_method_handler(
                lambda request, _context: request,
                request_deserializer=_identity,
                response_serializer=_identity,
            )
        },
    )
    server = grpc.server(ThreadPoolExecutor(max_workers=max_workers), handlers=[handler])
    server.add_insecure_port(f"unix:{socket_path}")
    server.start()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print("ready", flush=True)
    stop.wait()
    server.stop(0).wait()


if __name__ == "__main__":
    serve(sys.argv[1])
