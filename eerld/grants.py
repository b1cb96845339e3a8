"""Grants: which worker socket may claim which GPUs, and who may connect to it.

On a shared node a claim is authorized by something the kernel checks, never by an identity the client
declares (gRPC Python exposes no peer credentials on Unix sockets). Every worker socket is a :class:`Grant`:
its file's owner, group and mode decide who may connect, and sessions opened through it may claim only its
GPUs. Three kinds:

- ``shared``: the one worker socket (``--socket``). With ``tenancy = "single"`` it may claim every GPU (one
  tenant: whoever may connect is trusted with the node); with ``tenancy = "multi"`` it claims nothing and
  says so.
- ``grant``: made by an admin or a Slurm prolog (``eerlctl grant --gpus 0,1 --uid U``): a socket owned by
  that user (mode 0600) or group (0660) under the grant directory, persisted in the state directory so that
  it outlives a restart, removed by ``eerlctl revoke``, an epilog or its expiry (its sessions are closed and
  their GPUs reset).
- ``gpu``: one socket per GPU (``gpu_socket_dir``) in a directory only root may enter; a Kubernetes CDI
  spec mounts into a container the sockets of exactly the GPUs it was given.

A session's *authority* is the set of GPUs it proved it may claim: its socket's, plus those of the claim
tickets it presented (a job whose GPUs each come with their own socket). Async peers, which feed each other
observations, must be of the same job *and* share authority, so that a session of another tenant cannot feed
a job's controller by claiming its job id. This module is pure bookkeeping; sockets are opened by the
server, persistence goes through :class:`GrantStore`.
"""

from __future__ import annotations

import enum
import math
import re
import secrets
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from eerld.errors import ConfigError, PermissionDenied
from eerld.files import atomic_write_json, read_json_object, set_aside
from eerld.sessions import GpuSelector

log = structlog.get_logger("eerld.grants")

GRANTS_FILE = "grants.json"
GRANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SHARED_NAME = "shared"
MAX_GRANTS = 256
TICKET_TTL_S = 30.0
MAX_TICKETS = 256
MAX_UNIX_ID = 2**32 - 2
MAX_SOCKET_PATH_BYTES = 107
GRANT_DIR_MODE = 0o711
"""The grant directory and a grant's own directory: anyone may reach a socket in it by name (its own mode
then decides); nobody may list or write it."""
OWN_DIRECTORY_SOCKET = "eerld.sock"
"""The socket's name in a grant's own directory (``own_directory``), as in a per-GPU socket's directory."""
GRANT_SOCKET_OWNER_MODE = 0o600
GRANT_SOCKET_GROUP_MODE = 0o660
GPU_SOCKET_MODE = 0o666
"""Per-GPU sockets sit in a root-only directory: only a container it is mounted into can reach one."""
MULTI_TENANT_REFUSAL = (
    "this node is multi-tenant: the shared worker socket admits no GPU claims; a job needs a socket of "
    "its own (eerlctl grant, the Slurm prolog, or per-GPU sockets in Kubernetes), see docs/security.md"
)


class GrantKind(enum.StrEnum):
    """Where a worker socket comes from."""

    SHARED = "shared"
    GRANT = "grant"
    GPU = "gpu"


@dataclass(frozen=True, slots=True)
class Grant:
    """One worker socket and what its sessions may claim; GPUs by UUID (indices move across boots)."""

    name: str
    kind: GrantKind
    socket_path: Path
    gpu_uuids: tuple[str, ...]
    uid: int | None = None
    gid: int | None = None
    job_id: str = ""
    created_at_unix_s: float = 0.0
    expires_at_unix_s: float = 0.0
    """0 means until revoked."""
    reason: str = ""
    own_directory: bool = False
    """The socket is ``<grant dir>/<name>/eerld.sock``, in a directory of its own (eerl-csi mounts it)."""

    @property
    def socket_mode(self) -> int:
        """The socket file's mode: who may connect is decided by it and the file's owner and group."""
        if self.kind is GrantKind.GPU:
            return GPU_SOCKET_MODE
        if self.kind is GrantKind.SHARED:
            return GRANT_SOCKET_GROUP_MODE
        return GRANT_SOCKET_OWNER_MODE if self.gid is None else GRANT_SOCKET_GROUP_MODE

    def expired(self, now_unix_s: float) -> bool:
        """Whether the grant has run out at ``now_unix_s``."""
        return self.expires_at_unix_s > 0 and now_unix_s >= self.expires_at_unix_s

    def admits_job(self, job_id: str) -> None:
        """Raise PermissionDenied unless sessions of ``job_id`` may open through this grant."""
        if self.job_id and job_id != self.job_id:
            raise PermissionDenied(
                f"job_id: this socket ({self.name}) is granted to job {self.job_id!r}, not {job_id!r}"
            )


NAME_RULE = "letters, digits, '.', '_' and '-', at most 64, not 'shared'"


def is_grant_name(name: str) -> bool:
    """Whether ``name`` can name a grant (and its socket file)."""
    return bool(GRANT_NAME.fullmatch(name)) and name != SHARED_NAME and not name.startswith("gpu-")


def grant_socket_path(grant_dir: Path, name: str, *, own_directory: bool) -> Path:
    """Where a grant's socket lives: ``<grant_dir>/<name>.sock`` (where clients look for a job's grant), or
    with ``own_directory`` ``<grant_dir>/<name>/eerld.sock``, so that a bind mount of the directory follows
    the socket across eerld's restarts (a mount of the file would hold the dead socket's inode)."""
    return grant_dir / name / OWN_DIRECTORY_SOCKET if own_directory else grant_dir / f"{name}.sock"


def default_name(job_id: str) -> str:
    """The name of a job's grant, where its clients look for it: ``job-<job_id>``."""
    return f"job-{job_id}"


@dataclass(frozen=True, slots=True)
class GrantSpec:
    """A validated Grant request; GPUs not yet resolved."""

    name: str | None
    gpus: tuple[GpuSelector, ...]
    uid: int | None
    gid: int | None
    job_id: str
    duration_s: float
    reason: str
    replace: bool
    own_directory: bool = False


@dataclass(frozen=True, slots=True)
class ClaimTicket:
    """A one-time proof that its holder could connect to a grant's socket."""

    ticket: str
    grant: Grant
    expires_s: float


@dataclass(slots=True)
class TicketBook:
    """Outstanding claim tickets; bounded, each used once, expiring after :data:`TICKET_TTL_S`."""

    ttl_s: float = TICKET_TTL_S
    limit: int = MAX_TICKETS
    _tickets: dict[str, ClaimTicket] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def issue(self, grant: Grant, now_s: float) -> ClaimTicket:
        """A fresh ticket for ``grant``; the oldest outstanding one is dropped beyond the limit."""
        ticket = ClaimTicket(secrets.token_urlsafe(24), grant, now_s + self.ttl_s)
        with self._lock:
            self._expire(now_s)
            while len(self._tickets) >= self.limit:
                del self._tickets[next(iter(self._tickets))]
            self._tickets[ticket.ticket] = ticket
        return ticket

    def redeem(self, tickets: Iterable[str], now_s: float) -> list[Grant]:
        """The grants of ``tickets``, each used up; PermissionDenied for an unknown or expired one."""
        with self._lock:
            self._expire(now_s)
            found = [self._tickets.pop(t, None) for t in tickets]
        if any(t is None for t in found):
            raise PermissionDenied("claim_tickets: unknown, used or expired ticket (they last 30 s, once)")
        return [t.grant for t in found if t is not None]

    def forget(self, grant_name: str) -> None:
        """Drop the outstanding tickets of a revoked grant."""
        with self._lock:
            for key in [k for k, t in self._tickets.items() if t.grant.name == grant_name]:
                del self._tickets[key]

    def _expire(self, now_s: float) -> None:
        for key in [k for k, t in self._tickets.items() if t.expires_s <= now_s]:
            del self._tickets[key]


class GrantStore:
    """Admin grants (kind ``grant``) persisted in the state directory; every change written before use."""

    def __init__(self, state_dir: Path, grant_dir: Path) -> None:
        self._path = state_dir / GRANTS_FILE
        self._grant_dir = grant_dir
        self._lock = threading.Lock()
        self._grants: dict[str, Grant] = self._load()

    def _load(self) -> dict[str, Grant]:
        """The stored grants; a file that is not what eerld wrote is set aside (fail closed: no grant)."""
        try:
            data = read_json_object(self._path)
            items = data.get("grants", [])
            if not isinstance(items, list):
                raise ConfigError(f"{self._path}: 'grants' must be a list")
            grants: dict[str, Grant] = {}
            for item in items:
                grant = _grant_from_json(item, self._path, self._grant_dir)
                grants[grant.name] = grant
        except ConfigError as e:
            moved = set_aside(self._path)
            log.error("grants_set_aside", error=str(e), moved_to=str(moved), effect="no grant is restored")
            return {}
        return grants

    def all(self) -> Mapping[str, Grant]:
        """A copy of every stored grant, by name."""
        with self._lock:
            return dict(self._grants)

    def put(self, grant: Grant) -> None:
        """Add or replace a grant, durably."""
        with self._lock:
            grants = {**self._grants, grant.name: grant}
            self._write(grants)
            self._grants = grants

    def remove(self, names: Iterable[str]) -> None:
        """Remove grants, durably (a no-op for unknown names)."""
        with self._lock:
            grants = {k: v for k, v in self._grants.items() if k not in set(names)}
            if len(grants) != len(self._grants):
                self._write(grants)
                self._grants = grants

    def _write(self, grants: Mapping[str, Grant]) -> None:
        atomic_write_json(self._path, {"version": 1, "grants": [_grant_to_json(g) for g in grants.values()]})


def _grant_to_json(g: Grant) -> dict[str, object]:
    return {
        "name": g.name,
        "gpu_uuids": list(g.gpu_uuids),
        "uid": g.uid,
        "gid": g.gid,
        "job_id": g.job_id,
        "created_at_unix_s": g.created_at_unix_s,
        "expires_at_unix_s": g.expires_at_unix_s,
        "reason": g.reason,
        "own_directory": g.own_directory,
    }


def _grant_from_json(item: object, path: Path, grant_dir: Path) -> Grant:
    """One stored grant, every field type-checked (a wrong type is one clear line, never a traceback)."""
    if not isinstance(item, dict):
        raise ConfigError(f"{path}: malformed grant {item!r}")

    def get(key: str, kinds: type | tuple[type, ...], default: object = None) -> object:
        value = item.get(key, default)
        if not isinstance(value, kinds) or isinstance(value, bool):
            raise ConfigError(f"{path}: grant {item.get('name')!r}: {key} has the wrong type")
        return value

    uuids = get("gpu_uuids", list)
    assert isinstance(uuids, list)
    if not uuids or not all(isinstance(u, str) and u for u in uuids):
        raise ConfigError(f"{path}: grant {item.get('name')!r}: gpu_uuids must list GPU UUIDs")
    uid, gid = item.get("uid"), item.get("gid")
    for key, value in (("uid", uid), ("gid", gid)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
            raise ConfigError(f"{path}: grant {item.get('name')!r}: {key} has the wrong type")
    created = float(get("created_at_unix_s", (int, float), 0.0))  # type: ignore[arg-type]
    expires = float(get("expires_at_unix_s", (int, float), 0.0))  # type: ignore[arg-type]
    if not (math.isfinite(created) and math.isfinite(expires)) or (uid is None and gid is None):
        raise ConfigError(f"{path}: malformed grant {item!r}")
    assert uid is None or isinstance(uid, int)
    assert gid is None or isinstance(gid, int)
    name = str(get("name", str))
    if not is_grant_name(name):
        raise ConfigError(f"{path}: {name!r} is not a grant name ({NAME_RULE})")
    own_directory = item.get("own_directory", False)
    if not isinstance(own_directory, bool):
        raise ConfigError(f"{path}: grant {name!r}: own_directory has the wrong type")
    return Grant(
        name=name,
        kind=GrantKind.GRANT,
        socket_path=grant_socket_path(grant_dir, name, own_directory=own_directory),
        gpu_uuids=tuple(uuids),
        uid=uid,
        gid=gid,
        job_id=str(get("job_id", str, "")),
        created_at_unix_s=created,
        expires_at_unix_s=expires,
        reason=str(get("reason", str, "")),
        own_directory=own_directory,
    )
