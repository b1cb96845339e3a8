"""A neighbour on the sidecar's node: starts as root (the interpreter may live where ``nobody`` cannot read),
drops to ``nobody`` with :func:`tests.security.attacker.drop_privileges`, then speaks raw HTTP, or listens.

Input (stdin, one line of JSON), every key optional:

- ``"target"``: ``"unix:/path"`` or ``"host:port"``, the sidecar attacked;
- ``"requests"``: ``[BYTES_AS_LATIN1, ...]``, each sent on a connection of its own; its result is the status
  code of the reply, ``"no reply"``, or the name of the error (``PermissionError``);
- ``"hold"``: N connections opened, each sending half a request line (a slowloris), held until stdin closes;
  with ``"keep_holding": true`` a connection the sidecar closes is opened again at once, until stdin closes
  (``"hold_errors"``: the errors of the connections that could not be opened);
- ``"listen"``: a Unix socket path to bind first (a socket planted where a job's sidecar would listen); every
  request it gets is answered 200 ``{"clock": "locked", ...}`` as a sidecar would, and recorded;
- ``"mkdir"``: directories to make (mode 0700) before anything else, as ``nobody``.

Output (stdout, JSON): one line ``{"euid": U, "results": [...], "held": N, "listening": bool, "made": [...]}``
once the requests are done, the connections held and the socket bound; then, when stdin closes, one line
``{"received": [REQUEST_LINE_AND_BODY, ...], "reopened": N}``.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import socket
import sys
import threading
import time

from tests.security.attacker import drop_privileges

NOBODY = 65534
_OPEN_TRIES = 5
_LOCKED = b'{"kind":"generation","connected":true,"answered":true,"clock":"locked","sm_clock_mhz":360}\n'


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
            # Answered and closed before it read everything: its answer may still be there.
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
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


def _slow(target: str) -> socket.socket:
    sock = _connect(target)
    sock.sendall(b"GET /healthz HT")  # a slow client: half a request line, then nothing
    return sock


class _Holder:
    """Holds N slow connections; with ``keep``, opens again each one the sidecar closes."""

    def __init__(self, target: str, count: int, *, keep: bool) -> None:
        self.target = target
        self.sockets: list[socket.socket] = []
        self.errors: list[str] = []
        for _ in range(count):
            for attempt in range(_OPEN_TRIES):  # a busy listener's backlog may refuse one for a moment
                try:
                    self.sockets.append(_slow(target))
                    break
                except OSError as e:
                    if isinstance(e, PermissionError) or attempt == _OPEN_TRIES - 1:
                        self.errors.append(type(e).__name__)
                        break
                    time.sleep(0.05)
        self.opened = len(self.sockets)
        """How many were open at once before any was opened again (the reopening thread starts after)."""
        self.reopened = 0
        self._lost = 0
        self._keep = keep
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        if keep:
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            readable, _, _ = select.select(list(self.sockets), [], [], 0.05)
            for sock in readable:  # an answer (a 503) or a close: that slot is gone, take another at once
                sock.close()
                self.sockets.remove(sock)
                self._lost += 1
            while self._lost and not self._stop.is_set():
                try:
                    self.sockets.append(_slow(self.target))
                except OSError:
                    break  # tried again on the next round
                self._lost -= 1
                self.reopened += 1

    def close(self) -> None:
        self._stop.set()
        if self._keep:
            self._thread.join(5)
        for sock in self.sockets:
            sock.close()


class _Listener:
    """A socket planted at a path: records what comes, answers as a sidecar would ("locked")."""

    def __init__(self, path: str) -> None:
        self.received: list[str] = []
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._server.bind(path)
        os.chmod(path, 0o666)  # anyone may connect: the planter wants the victim's events
        self._server.listen(16)
        self._server.settimeout(0.1)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(5)
        buffer = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffer:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip() or 0)
                while len(buffer) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buffer += chunk
                body, buffer = buffer[:length], buffer[length:]
                self.received.append(
                    (head.split(b"\r\n", 1)[0] + b" " + body).decode("latin-1", errors="replace")
                )
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(_LOCKED)}\r\n\r\n".encode()
                    + _LOCKED
                )
        except OSError:
            return
        finally:
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._server.close()
        self._thread.join(5)


def main() -> None:
    spec = json.loads(sys.stdin.readline())
    drop_privileges(NOBODY, NOBODY, [])
    made = []
    for directory in spec.get("mkdir", ()):
        os.mkdir(directory, 0o700)
        made.append(directory)
    target = spec.get("target", "")
    listener = _Listener(spec["listen"]) if spec.get("listen") else None
    results = [_request(target, text.encode("latin-1")) for text in spec.get("requests", ())]
    holder = _Holder(target, spec["hold"], keep=bool(spec.get("keep_holding"))) if spec.get("hold") else None
    report = {
        "euid": os.geteuid(),
        "results": results,
        "held": holder.opened if holder else 0,
        "hold_errors": sorted(set(holder.errors)) if holder else [],
        "listening": listener is not None,
        "made": made,
    }
    sys.stdout.write(json.dumps(report) + "\n")
    sys.stdout.flush()
    sys.stdin.read()  # hold until the test closes stdin
    if holder is not None:
        holder.close()
    if listener is not None:
        listener.close()
    done = {"received": listener.received if listener else [], "reopened": holder.reopened if holder else 0}
    sys.stdout.write(json.dumps(done) + "\n")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
