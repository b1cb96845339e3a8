"""An attacker on the sidecar's API: starts as root (the interpreter may live where ``nobody`` cannot read),
drops to ``nobody`` with :func:`tests.security.attacker.drop_privileges`, then speaks raw HTTP.

Input (stdin, one line of JSON): ``{"target": "unix:/path" | "host:port", "requests": [BYTES_AS_LATIN1, ...],
"hold": N}``. Each request goes on a connection of its own; its result is the status code of the reply,
or the name of the error (``PermissionError``). With ``hold``, N connections are opened, each sending half
a request line, and held until stdin closes (after the results are written). Output (stdout, one line of
JSON): ``{"euid": U, "results": [...], "held": N}``.
"""

from __future__ import annotations

import json
import os
import socket
import sys

from tests.security.attacker import drop_privileges

NOBODY = 65534


def _connect(target: str) -> socket.socket:
    if target.startswith("unix:"):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address: str | tuple[str, int] = target.removeprefix("unix:")
    else:
        host, port = target.rsplit(":", 1)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        address = (host, int(port))
    sock.settimeout(10)
    try:
        sock.connect(address)
    except OSError:
        sock.close()
        raise
    return sock


def _request(target: str, data: bytes) -> int | str:
    try:
        with _connect(target) as sock:
            sock.sendall(data)
            reply = b""
            while b"\r\n" not in reply:
                chunk = sock.recv(4096)
                if not chunk:
                    break
                reply += chunk
    except OSError as e:
        return type(e).__name__
    status_line = reply.split(b"\r\n", 1)[0].split()
    return int(status_line[1]) if len(status_line) >= 2 and status_line[1].isdigit() else "no reply"


def main() -> None:
    spec = json.loads(sys.stdin.readline())
    drop_privileges(NOBODY, NOBODY, [])
    target = spec["target"]
    results = [_request(target, text.encode("latin-1")) for text in spec.get("requests", ())]
    held = []
    for _ in range(spec.get("hold", 0)):
        sock = _connect(target)
        sock.sendall(b"GET /healthz HT")  # a slow client: half a request line, then nothing
        held.append(sock)
    json.dump({"euid": os.geteuid(), "results": results, "held": len(held)}, sys.stdout)
    sys.stdout.write("\n")
    sys.stdout.flush()
    sys.stdin.read()  # hold until the test closes stdin
    for sock in held:
        sock.close()


if __name__ == "__main__":
    main()
