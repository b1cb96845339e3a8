"""Who may talk to a sidecar, and whose sidecar a client talks to: the kernel's word, or a secret.

A sidecar's API steers a job's GPUs (it chooses among the clocks the controller tries on them) and shows its
energy, so it belongs to the job's user. On a Unix socket the kernel tells each side who the other is
(``SO_PEERCRED``: the uid of the process at the other end when it connected), so the sidecar serves only its
own user (and root), and a client talks to a sidecar only if it runs as the client's user (or root) — a socket
another user planted at the path first gets no event. On TCP the kernel says nothing useful (any local user
reaches a loopback port), so a TCP sidecar demands a secret: 256 random bits, in ``Authorization: Bearer``,
which the job's processes get from their environment (``EERL_SIDECAR_TOKEN``: ``/proc/PID/environ`` is
readable only by the same user and root) or from a file of mode 0600 (``EERL_SIDECAR_TOKEN_FILE``).

Linux only, as the rest of eerl; imports nothing but the standard library and :mod:`eerl.errors`.
"""

from __future__ import annotations

import contextlib
import hmac
import os
import secrets
import socket
import stat
import struct
from collections.abc import Mapping
from dataclasses import dataclass

from eerl.errors import ConfigError

TOKEN_ENV = "EERL_SIDECAR_TOKEN"  # noqa: S105 - the variable's name, not a secret
"""The TCP sidecar's secret, as ``-- command`` hands it to the job."""
TOKEN_FILE_ENV = "EERL_SIDECAR_TOKEN_FILE"  # noqa: S105 - the variable's name, not a secret
"""A file holding the TCP sidecar's secret (``--token-file``), for a job started apart from the sidecar."""
MAX_TOKEN_BYTES = 512
"""The longest secret read from a file (a sidecar's is 43 characters)."""

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid


@dataclass(frozen=True, slots=True)
class PeerCredentials:
    """The process at the other end of a Unix socket, as the kernel saw it when it connected."""

    pid: int
    uid: int
    gid: int


class SidecarNotOurs(OSError):
    """The socket's other end runs as another user: not this job's sidecar (or not its client)."""


def peer_credentials(sock: socket.socket) -> PeerCredentials:
    """``SO_PEERCRED`` of a connected Unix socket; raises OSError where the kernel gives none."""
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size)
    pid, uid, gid = _UCRED.unpack(raw)
    return PeerCredentials(pid, uid, gid)


def trusted_uid(uid: int) -> bool:
    """This process's own user, or root (who could read and write anything of ours anyway)."""
    return uid in (os.geteuid(), 0)


def check_sidecar_peer(sock: socket.socket, path: str) -> None:
    """Raises :class:`SidecarNotOurs` unless the sidecar at ``path`` runs as our user or root."""
    uid = peer_credentials(sock).uid
    if not trusted_uid(uid):
        raise SidecarNotOurs(
            f"the socket {path} is served by uid {uid}, not by this job's user ({os.geteuid()}): "
            "not this job's sidecar, so no event goes there"
        )


def new_token() -> str:
    """A fresh secret for a TCP sidecar (256 random bits, URL-safe)."""
    return secrets.token_urlsafe(32)


def token_matches(authorization: str | None, token: str) -> bool:
    """Whether an ``Authorization`` header carries ``token`` (``Bearer <token>``), in constant time."""
    if not authorization:
        return False
    scheme, _, value = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return False
    return hmac.compare_digest(value.strip().encode(), token.encode())


def read_token_file(path: str, *, what: str = TOKEN_FILE_ENV) -> str:
    """The secret in ``path``: a regular file (a symlink to one is followed) of at most
    :data:`MAX_TOKEN_BYTES`, one line; raises ConfigError naming ``what``."""
    try:
        with open(path, "rb") as f:
            info = os.fstat(f.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise ConfigError(f"{what}: {path} is not a regular file")
            data = f.read(MAX_TOKEN_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{what}: cannot read {path}: {e.strerror or e}") from None
    text = data.decode("ascii", errors="replace").strip()
    if len(data) > MAX_TOKEN_BYTES or not text or any(c.isspace() or not c.isprintable() for c in text):
        raise ConfigError(f"{what}: {path} does not hold one token (a line of <= {MAX_TOKEN_BYTES} bytes)")
    return text


def write_token_file(path: str, token: str) -> None:
    """Writes ``token`` to ``path``, mode 0600, replacing a file of ours there (never writing through a
    symlink, never over another user's file); raises ConfigError."""
    directory = os.path.dirname(os.path.abspath(path))
    temp = os.path.join(directory, f".{os.path.basename(path)}.{os.getpid()}.tmp")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        with contextlib.suppress(FileNotFoundError):
            info = os.lstat(path)
            if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
                raise ConfigError(f"--token-file: {path} exists and is not a regular file; not replaced")
            if info.st_uid != os.geteuid():
                raise ConfigError(f"--token-file: {path} belongs to uid {info.st_uid}; not replaced")
        fd = os.open(temp, flags, 0o600)
        try:
            os.write(fd, token.encode() + b"\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temp, path)
    except OSError as e:
        with contextlib.suppress(OSError):
            os.unlink(temp)
        raise ConfigError(f"--token-file: cannot write {path}: {e.strerror or e}") from None


def job_environment(url: str, token: str | None) -> dict[str, str]:
    """What a job of a sidecar needs in its environment: ``EERL_SIDECAR``, and on TCP the secret."""
    env = {"EERL_SIDECAR": url}
    if token is not None:
        env[TOKEN_ENV] = token
    return env


def token_from_env(env: Mapping[str, str]) -> str | None:
    """The TCP sidecar's secret for a client: ``EERL_SIDECAR_TOKEN``, else the file that
    ``EERL_SIDECAR_TOKEN_FILE`` names, else None; raises ConfigError for a file it cannot read."""
    token = env.get(TOKEN_ENV, "").strip()
    if token:
        return token
    path = env.get(TOKEN_FILE_ENV, "").strip()
    return read_token_file(path) if path else None
