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
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import structlog

from eerld.errors import ConfigError, PermissionDenied, Unavailable
from eerld.files import atomic_write_json, check_private_dir, read_json_object, set_aside
from eerld.sessions import GpuSelector

log = structlog.get_logger("eerld.grants")

GRANTS_FILE = "grants.json"
GRANT_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
SHARED_NAME = "shared"
MAX_GRANTS = 256
TICKET_TTL_S = 30.0
MAX_TICKETS = 256
MAX_TICKETS_PER_GRANT = 32
"""Outstanding tickets of one socket: a job asks for one per other socket at each open."""
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
    """Outstanding claim tickets; each used once, expiring after :data:`TICKET_TTL_S`, bounded twice.

    Per grant (socket), at most ``per_grant_limit``: a socket over it loses its own oldest ticket, so that a
    socket that issues as fast as it may only ever evicts its own. In all, at most ``limit``: a full book
    evicts the oldest ticket of the grant that holds the most, so that many sockets of one user together
    still evict theirs before a job's lone ticket. A ticket carries its grant, job binding included.
    """

    ttl_s: float = TICKET_TTL_S
    limit: int = MAX_TICKETS
    per_grant_limit: int = MAX_TICKETS_PER_GRANT
    _tickets: dict[str, ClaimTicket] = field(default_factory=dict)
    """Oldest first (insertion order)."""
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def issue(self, grant: Grant, now_s: float) -> ClaimTicket:
        """A fresh ticket for ``grant``, making room by the bounds above."""
        ticket = ClaimTicket(secrets.token_urlsafe(24), grant, now_s + self.ttl_s)
        with self._lock:
            self._expire(now_s)
            own = [k for k, t in self._tickets.items() if t.grant.name == grant.name]
            for key in own[: max(0, len(own) - self.per_grant_limit + 1)]:
                del self._tickets[key]
            while self._tickets and len(self._tickets) >= self.limit:
                del self._tickets[self._oldest_of_largest_holder()]
            self._tickets[ticket.ticket] = ticket
        return ticket

    def check(self, tickets: Sequence[str], job_id: str, now_s: float) -> list[Grant]:
        """The grants of ``tickets`` if a session of ``job_id`` may use them all; nothing is used up.

        PermissionDenied for an unknown, used or expired ticket, or one of a grant for another job.
        """
        with self._lock:
            self._expire(now_s)
            return self._grants_of(tickets, job_id)

    def redeem(self, tickets: Sequence[str], job_id: str, now_s: float) -> list[Grant]:
        """:meth:`check`, then every ticket used up at once; a refusal uses up none of them."""
        with self._lock:
            self._expire(now_s)
            grants = self._grants_of(tickets, job_id)
            for key in tickets:
                del self._tickets[key]
        return grants

    def forget(self, grant_name: str) -> None:
        """Drop the outstanding tickets of a revoked grant."""
        with self._lock:
            for key in [k for k, t in self._tickets.items() if t.grant.name == grant_name]:
                del self._tickets[key]

    def _grants_of(self, tickets: Sequence[str], job_id: str) -> list[Grant]:
        if len(set(tickets)) != len(tickets):
            raise PermissionDenied("claim_tickets: a ticket is listed twice (each is used once)")
        found = [self._tickets.get(t) for t in tickets]
        if any(t is None for t in found):
            raise PermissionDenied("claim_tickets: unknown, used or expired ticket (they last 30 s, once)")
        grants = [t.grant for t in found if t is not None]
        for grant in grants:
            if grant.job_id and grant.job_id != job_id:
                raise PermissionDenied(
                    f"claim_tickets: the ticket of {grant.name} is for job {grant.job_id!r}, not {job_id!r}"
                )
        return grants

    def _oldest_of_largest_holder(self) -> str:
        counts = Counter(t.grant.name for t in self._tickets.values())
        largest = max(counts.values())
        return next(k for k, t in self._tickets.items() if counts[t.grant.name] == largest)

    def _expire(self, now_s: float) -> None:
        for key in [k for k, t in self._tickets.items() if t.expires_s <= now_s]:
            del self._tickets[key]


class GrantStore:
    """Admin grants (kind ``grant``) persisted in the state directory; a new grant is on disk before use.

    The file decides at each start who gets a socket that claims which GPUs, so it is read as untrusted
    input: one that eerld would not have written (a symlink, another owner, group or other write, not JSON,
    another version, a wrong type or an absurd value in any grant, two grants of one name or one GPU, more
    than :data:`MAX_GRANTS`) is set aside whole, with one ``grants_set_aside`` line, and no grant is
    restored (fail closed). A write that fails changes nothing (:meth:`put`), except a removal, which takes
    effect at once (the safe direction) and is written by :meth:`flush` once the disk lets it.
    """

    def __init__(self, state_dir: Path, grant_dir: Path) -> None:
        check_private_dir(state_dir, "--state-dir")
        self._path = state_dir / GRANTS_FILE
        self._grant_dir = grant_dir
        self._lock = threading.Lock()
        self._dirty = False
        """Memory differs from the file: a removal that could not be written."""
        self._grants: dict[str, Grant] = self._load()

    def _load(self) -> dict[str, Grant]:
        try:
            return parse_grants(read_json_object(self._path, private=True), self._path, self._grant_dir)
        except ConfigError as e:
            try:
                moved = set_aside(self._path)
            except OSError as failed:
                log.error("grants_unreadable", error=str(e), set_aside_failed=failed.strerror or str(failed))
            else:
                log.error(
                    "grants_set_aside", error=str(e), moved_to=str(moved), effect="no grant is restored"
                )
            return {}

    def all(self) -> Mapping[str, Grant]:
        """A copy of every stored grant, by name."""
        with self._lock:
            return dict(self._grants)

    def put(self, grant: Grant, replacing: Iterable[str] = ()) -> None:
        """Add ``grant`` and take out ``replacing`` in one durable write; Unavailable (nothing changes) when
        it cannot be written."""
        with self._lock:
            wanted = {k: v for k, v in self._grants.items() if k not in set(replacing)}
            wanted[grant.name] = grant
            try:
                self._write(wanted)
            except OSError as e:
                raise Unavailable(
                    f"cannot record the grant in {self._path}: {e.strerror or e}; nothing changed"
                ) from e

    def remove(self, names: Iterable[str], restored: Iterable[Grant] = ()) -> None:
        """Take out grants (and put back ``restored``, a replace undone). Takes effect even when the file
        cannot be written (logged); :meth:`flush` and the next change write it."""
        with self._lock:
            wanted = {k: v for k, v in self._grants.items() if k not in set(names)}
            wanted.update({g.name: g for g in restored})
            if wanted == self._grants and not self._dirty:
                return
            try:
                self._write(wanted)
            except OSError as e:
                self._grants = wanted
                self._failed(e)

    def flush(self) -> bool:
        """Write the grants if memory and file differ; True when they agree afterwards."""
        with self._lock:
            if not self._dirty:
                return True
            try:
                self._write(dict(self._grants))
            except OSError as e:
                self._failed(e)
                return False
            log.info("grants_written", path=str(self._path), grants=len(self._grants))
            return True

    def _failed(self, error: OSError) -> None:
        """A write that left the file behind memory (lock held): logged once until a write succeeds."""
        if not self._dirty:
            log.warning(
                "grants_write_failed",
                path=str(self._path),
                reason=error.strerror or str(error),
                effect="revoked grants stay listed in the file until it can be written; a restart before "
                "then restores them",
            )
        self._dirty = True

    def _write(self, grants: dict[str, Grant]) -> None:
        """Write ``grants``; memory follows once they are on disk (lock held)."""
        atomic_write_json(self._path, {"version": 1, "grants": [_grant_to_json(g) for g in grants.values()]})
        self._grants = grants
        self._dirty = False


# -- the file's form ----------------------------------------------------------------------------------------

GRANTS_VERSION = 1
MAX_GPUS_PER_GRANT = 1024
MAX_JOB_ID_CHARS = 256
MAX_REASON_CHARS = 1024
MAX_UNIX_S = 1e11
"""Year ~5138: a timestamp beyond it is not a time."""


def parse_grants(data: Mapping[str, object], path: Path, grant_dir: Path) -> dict[str, Grant]:
    """The grants of a grants file's JSON object, by name; ConfigError naming the file and the field for
    anything eerld would not have written (see :class:`GrantStore`)."""
    version = data.get("version", GRANTS_VERSION)
    if version != GRANTS_VERSION or isinstance(version, bool):
        raise ConfigError(f"{path}: version: expected {GRANTS_VERSION}, got {version!r:.40}")
    items = data.get("grants", [])
    if not isinstance(items, list):
        raise ConfigError(f"{path}: grants: expected a list, got {type(items).__name__}")
    if len(items) > MAX_GRANTS:
        raise ConfigError(f"{path}: grants: {len(items)} listed (a daemon holds at most {MAX_GRANTS})")
    grants: dict[str, Grant] = {}
    granted: dict[str, str] = {}
    for n, item in enumerate(items):
        try:
            grant = _grant_from_json(item, grant_dir)
        except ValueError as e:
            raise ConfigError(f"{path}: grants[{n}]: {e}") from None
        if grant.name in grants:
            raise ConfigError(f"{path}: grants[{n}]: a second grant named {grant.name!r}")
        for uuid in grant.gpu_uuids:
            if uuid in granted:
                raise ConfigError(f"{path}: grants[{n}]: {uuid} is granted to {granted[uuid]!r} too")
            granted[uuid] = grant.name
        grants[grant.name] = grant
    return grants


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


def _grant_from_json(item: object, grant_dir: Path) -> Grant:
    """One stored grant; ValueError naming the field for a wrong type or an absurd value."""
    if not isinstance(item, dict):
        raise ValueError(f"expected an object, got {'null' if item is None else type(item).__name__}")
    name = _text(item, "name", 64, required=True)
    if not is_grant_name(name):
        raise ValueError(f"name: {name!r} is not a grant name ({NAME_RULE})")
    uuids = item.get("gpu_uuids")
    if not isinstance(uuids, list) or not 0 < len(uuids) <= MAX_GPUS_PER_GRANT:
        raise ValueError(f"gpu_uuids: expected a list of 1-{MAX_GPUS_PER_GRANT} GPU UUIDs")
    if not all(isinstance(u, str) and 0 < len(u) <= 256 and u.isprintable() for u in uuids):
        raise ValueError("gpu_uuids: expected GPU UUIDs (printable strings)")
    if len(set(uuids)) != len(uuids):
        raise ValueError("gpu_uuids: a GPU is listed twice")
    uid, gid = _unix_id(item, "uid"), _unix_id(item, "gid")
    if uid is None and gid is None:
        raise ValueError("uid, gid: neither is set (the socket's owner decides who may connect)")
    own_directory = item.get("own_directory", False)
    if not isinstance(own_directory, bool):
        raise ValueError(f"own_directory: expected true or false, got {own_directory!r:.40}")
    return Grant(
        name=name,
        kind=GrantKind.GRANT,
        socket_path=grant_socket_path(grant_dir, name, own_directory=own_directory),
        gpu_uuids=tuple(uuids),
        uid=uid,
        gid=gid,
        job_id=_text(item, "job_id", MAX_JOB_ID_CHARS, required=False),
        created_at_unix_s=_unix_time(item, "created_at_unix_s"),
        expires_at_unix_s=_unix_time(item, "expires_at_unix_s"),
        reason=_text(item, "reason", MAX_REASON_CHARS, required=False),
        own_directory=own_directory,
    )


def _text(item: Mapping[str, object], key: str, maximum: int, *, required: bool) -> str:
    value = item.get(key, "")
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected a string, got {type(value).__name__}")
    if required and not value:
        raise ValueError(f"{key}: required")
    if len(value) > maximum or not value.isprintable():
        raise ValueError(f"{key}: expected at most {maximum} printable characters")
    return value


def _unix_id(item: Mapping[str, object], key: str) -> int | None:
    value = item.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_UNIX_ID:
        raise ValueError(f"{key}: expected null or an id 0-{MAX_UNIX_ID}, got {value!r:.40}")
    return value


def _unix_time(item: Mapping[str, object], key: str) -> float:
    value = item.get(key, 0.0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{key}: expected a number, got {type(value).__name__}")
    # Range first: an integer too large for a float would make math.isfinite raise OverflowError.
    if not 0 <= value <= MAX_UNIX_S or not math.isfinite(value):
        raise ValueError(f"{key}: expected a unix time, got {value!r:.40}")
    return float(value)
