"""Access: the daemon's grants, which GPUs a session opened through a socket may claim, and claim tickets.

The daemon asks :class:`Access` two questions: *may this open-session request claim these GPUs?*
(:meth:`Access.authorize`) and *which grants change?* (:meth:`Access.create`, :meth:`Access.remove`,
:meth:`Access.expired`). Sockets are opened and closed by a :class:`SocketHost` (the server), so that this
module stays free of gRPC; the daemon closes the sessions of a removed grant. See :mod:`eerld.grants`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import structlog

from eerld.clocks.ratelimit import ClockChangeLimiter
from eerld.errors import (
    ConfigError,
    Conflict,
    DaemonError,
    Exhausted,
    NotFound,
    PermissionDenied,
    Unavailable,
    ValidationError,
)
from eerld.gpu.base import GpuIdentity
from eerld.grants import (
    MAX_GRANTS,
    MULTI_TENANT_REFUSAL,
    NAME_RULE,
    SHARED_NAME,
    ClaimTicket,
    Grant,
    GrantKind,
    GrantSpec,
    GrantStore,
    TicketBook,
    default_name,
    grant_socket_path,
    is_grant_name,
)

log = structlog.get_logger("eerld.access")

TENANCIES = ("single", "multi")
GPU_SOCKET_NAME = "eerld.sock"
OPENS_PER_GPU_PER_S = 1.0
"""Sessions a socket may open per second and GPU it covers, after a burst of two per GPU (plus eight):
enough for every rank of a job to (re)open at once, not for a client that opens and closes in a loop."""


class SocketHost(Protocol):
    """Opens and closes the worker socket of a grant (the server does, with the grant's owner and mode)."""

    def open_socket(self, grant: Grant) -> None:
        """Create, secure and serve the grant's socket; raise DaemonError when it cannot."""

    def close_socket(self, grant: Grant) -> None:
        """Stop serving the grant's socket and remove the file."""


@dataclass(frozen=True, slots=True)
class Authorization:
    """What an open-session request may claim, and the authority the session then holds."""

    gpu_indices: tuple[int, ...]
    authority: frozenset[int]
    granted_by: frozenset[str]
    job_id: str = ""
    tickets: tuple[str, ...] = ()
    """Checked, not yet used up: :meth:`Access.redeem` does, once the session holds its GPUs."""


class Access:
    """Every worker socket's grant; thread-safe. Changes of the set are serialised by one lock."""

    def __init__(
        self,
        identities: Sequence[GpuIdentity],
        state_dir: Path,
        *,
        tenancy: str,
        shared_socket: Path,
        grant_dir: Path | None,
        gpu_socket_dir: Path | None,
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
    ) -> None:
        if tenancy not in TENANCIES:
            raise ConfigError(f"--tenancy: expected single or multi, got {tenancy!r}")
        self._tenancy = tenancy
        self._by_uuid = {g.uuid: g.index for g in identities}
        self._uuid_of = {g.index: g.uuid for g in identities}
        self._clock = clock
        self._wall = wall_clock
        self._grant_dir = grant_dir
        self._lock = threading.RLock()
        self._host: SocketHost | None = None
        self._tickets = TicketBook()
        self._opens: dict[str, ClockChangeLimiter] = {}
        self._store = GrantStore(state_dir, grant_dir) if grant_dir is not None else None
        all_uuids = tuple(g.uuid for g in identities)
        shared = Grant(
            name=SHARED_NAME,
            kind=GrantKind.SHARED,
            socket_path=shared_socket,
            gpu_uuids=all_uuids if tenancy == "single" else (),
            reason=f"tenancy = {tenancy}",
        )
        self._grants: dict[str, Grant] = {SHARED_NAME: shared}
        if gpu_socket_dir is not None:
            for g in identities:
                name = f"gpu-{g.uuid}"
                # A directory per GPU: a CDI spec bind-mounts the directory, so that a container still
                # reaches the socket eerld re-creates in it after a restart (a mounted file would not).
                socket_path = gpu_socket_dir / g.uuid / GPU_SOCKET_NAME
                self._grants[name] = Grant(
                    name, GrantKind.GPU, socket_path, (g.uuid,), reason="per-GPU socket"
                )

    @property
    def tenancy(self) -> str:
        """``single`` or ``multi``."""
        return self._tenancy

    @property
    def grants_enabled(self) -> bool:
        """Whether admins may create grants (a grant directory is configured)."""
        return self._store is not None

    def set_host(self, host: SocketHost) -> None:
        """The server that opens the grants' sockets."""
        self._host = host

    # -- reads --------------------------------------------------------------------------------------

    def all(self) -> list[Grant]:
        """Every grant: the shared socket first, then by name."""
        with self._lock:
            grants = list(self._grants.values())
        return sorted(grants, key=lambda g: (g.kind is not GrantKind.SHARED, g.name))

    def get(self, name: str) -> Grant:
        """The grant of that name; Unavailable when it was revoked meanwhile (its socket is closing)."""
        with self._lock:
            grant = self._grants.get(name)
        if grant is None:
            raise Unavailable(f"the grant {name!r} was revoked; this socket is closing")
        return grant

    def indices(self, grant: Grant) -> tuple[int, ...]:
        """The GPU indices of a grant on this node (GPUs it names that are gone are skipped)."""
        return tuple(sorted(self._by_uuid[u] for u in grant.gpu_uuids if u in self._by_uuid))

    # -- sessions -----------------------------------------------------------------------------------

    def authorize(
        self,
        grant_name: str,
        job_id: str,
        requested: tuple[int, ...],
        tickets: Iterable[str],
    ) -> Authorization:
        """May a session of ``job_id`` opened through ``grant_name`` claim ``requested`` (none: all)?

        Each ticket adds its grant's GPUs, and admits only the job its grant admits (a ticket of a grant
        for job X opens no session of job Y, on any socket). The tickets are checked, not used up: the caller
        redeems them (:meth:`redeem`) once the session holds its GPUs, so that an open refused for any
        reason leaves them as they were.
        """
        grant = self.get(grant_name)
        if grant.kind is GrantKind.SHARED and self._tenancy == "multi":
            raise PermissionDenied(MULTI_TENANT_REFUSAL)
        self._limit_opens(grant)
        grant.admits_job(job_id)
        ticket_list = list(tickets)
        # checked first, used up last: a refused open leaves its tickets as they were
        granted = [grant, *self._tickets.check(ticket_list, job_id, self._clock())]
        with self._lock:
            gone = [g.name for g in granted if self._grants.get(g.name) != g]
        if gone:
            raise PermissionDenied(f"claim_tickets: the grant {gone[0]!r} was revoked since its ticket")
        authority = frozenset(i for g in granted for i in self.indices(g))
        if not requested:
            if grant.kind is GrantKind.SHARED:
                raise ValidationError("gpus", "at least one GPU is required on the shared socket")
            requested = tuple(sorted(authority))
            if not requested:
                raise PermissionDenied(f"gpus: the GPUs of {grant.name!r} are not on this node")
        outside = [i for i in requested if i not in authority]
        if outside:
            may = ", ".join(str(i) for i in sorted(authority)) or "none"
            raise PermissionDenied(
                f"gpus: GPU {outside[0]} is not granted to this socket ({grant.name}); "
                f"it may claim GPU(s) {may}"
            )
        return Authorization(
            requested, authority, frozenset(g.name for g in granted), job_id, tuple(ticket_list)
        )

    def redeem(self, authorization: Authorization) -> None:
        """Uses up an authorization's tickets (all or none); PermissionDenied when one was used meanwhile
        (two opens with the same ticket: the second is refused)."""
        if authorization.tickets:
            self._tickets.redeem(authorization.tickets, authorization.job_id, self._clock())

    def _limit_opens(self, grant: Grant) -> None:
        """Exhausted when ``grant``'s socket opened sessions faster than its bound (session churn)."""
        limiter = self._opens.get(grant.name)
        if limiter is None:
            gpus = max(1, len(grant.gpu_uuids))
            limiter = ClockChangeLimiter(OPENS_PER_GPU_PER_S * gpus, burst=2 * gpus + 8)
            self._opens[grant.name] = limiter
        if not limiter.allow(grant.name, self._clock()):
            raise Exhausted(
                f"this socket ({grant.name}) opened sessions faster than {limiter.rate_per_s:g} a second; "
                "retry later"
            )

    def issue_ticket(self, grant_name: str) -> ClaimTicket:
        """A claim ticket for the GPUs of ``grant_name`` (never for the multi-tenant shared socket)."""
        grant = self.get(grant_name)
        if grant.kind is GrantKind.SHARED and self._tenancy == "multi":
            raise PermissionDenied(MULTI_TENANT_REFUSAL)
        self._limit_opens(grant)
        return self._tickets.issue(grant, self._clock())

    # -- changes ------------------------------------------------------------------------------------

    def restore(self) -> list[str]:
        """Open the per-GPU sockets and the persisted grants (expired ones dropped); the names dropped."""
        host = self._require_host()
        dropped: list[str] = []
        with self._lock:
            for grant in [g for g in self._grants.values() if g.kind is GrantKind.GPU]:
                self._open_or_log(host, grant)
            if self._store is None:
                return dropped
            now = self._wall()
            for grant in self._store.all().values():
                if grant.expired(now) or not self.indices(grant):
                    dropped.append(grant.name)
                    continue
                if self._open_or_log(host, grant):
                    self._grants[grant.name] = grant
                else:
                    dropped.append(grant.name)
            if dropped:
                self._store.remove(dropped)
        if dropped:
            log.info(
                "grants_dropped_at_start", names=dropped, reason="expired, unknown GPUs or unusable socket"
            )
        return dropped

    def _open_or_log(self, host: SocketHost, grant: Grant) -> bool:
        try:
            host.open_socket(grant)
        except (DaemonError, OSError) as e:
            log.error("grant_socket_failed", grant=grant.name, socket=str(grant.socket_path), error=str(e))
            return False
        return True

    def create(self, spec: GrantSpec, indices: tuple[int, ...]) -> tuple[Grant, list[Grant]]:
        """Make a grant (and its socket); with ``replace``, take out the grants in its way first.

        Returns the grant and those it replaced, whose sessions the caller must close.
        """
        host = self._require_host()
        store = self._store
        if store is None or self._grant_dir is None:
            raise Unavailable("grants are off on this daemon (no grant_dir configured)")
        name = spec.name if spec.name is not None else default_name(spec.job_id) if spec.job_id else ""
        if not name:
            raise ValidationError("name", "required unless job_id is set")
        if not is_grant_name(name):
            raise ValidationError(
                "name" if spec.name else "job_id", f"{name!r} is not a grant name ({NAME_RULE})"
            )
        now = self._wall()
        uuids = tuple(self._uuid_of[i] for i in indices)
        grant = Grant(
            name=name,
            kind=GrantKind.GRANT,
            socket_path=grant_socket_path(self._grant_dir, name, own_directory=spec.own_directory),
            gpu_uuids=uuids,
            uid=spec.uid,
            gid=spec.gid,
            job_id=spec.job_id,
            created_at_unix_s=now,
            expires_at_unix_s=now + spec.duration_s if spec.duration_s > 0 else 0.0,
            reason=spec.reason,
            own_directory=spec.own_directory,
        )
        with self._lock:
            in_way = [
                g
                for g in self._grants.values()
                if g.kind is GrantKind.GRANT and (g.name == name or set(g.gpu_uuids) & set(uuids))
            ]
            if in_way and not spec.replace:
                other = in_way[0]
                raise Conflict(
                    f"the grant {other.name!r} already covers GPU(s) "
                    f"{', '.join(str(i) for i in self.indices(other))}; revoke it or grant with replace"
                )
            if len(self._grants) - len(in_way) >= MAX_GRANTS:
                raise Unavailable(f"at most {MAX_GRANTS} grants per daemon")
            # one write of the whole change, before anything else changes: a full disk changes nothing
            store.put(grant, replacing=[g.name for g in in_way])
            try:
                for old in in_way:
                    self._unlist(host, old)
                host.open_socket(grant)
            except BaseException:
                self._put_back(host, grant, in_way)
                raise
            self._grants[name] = grant
        return grant, in_way

    def _put_back(self, host: SocketHost, grant: Grant, replaced: list[Grant]) -> None:
        """Undo a create whose socket did not open (lock held): the grants it replaced are listed, stored
        and served again (their sessions were never closed); one that cannot be is logged and dropped."""
        assert self._store is not None
        host.close_socket(grant)
        back: list[Grant] = []
        for old in replaced:
            if old.name in self._grants:  # never taken out
                back.append(old)
            elif self._open_or_log(host, old):
                self._grants[old.name] = old
                back.append(old)
        self._store.remove([grant.name, *(g.name for g in replaced)], restored=back)
        if back:
            log.warning("grant_replace_undone", grant=grant.name, restored=[g.name for g in back])

    def remove(self, name: str | None, job_id: str | None) -> list[Grant]:
        """Take out grants by name or job id (kind ``grant`` only); NotFound when none matches."""
        host = self._require_host()
        with self._lock:
            if name is not None:
                grant = self._grants.get(name)
                if grant is None or grant.kind is not GrantKind.GRANT:
                    raise NotFound(f"name: no grant named {name!r}")
                matched = [grant]
            else:
                matched = [
                    g for g in self._grants.values() if g.kind is GrantKind.GRANT and g.job_id == job_id
                ]
                if not matched:
                    raise NotFound(f"job_id: no grant for job {job_id!r}")
            self._forget(host, matched)
        return matched

    def expired(self) -> list[Grant]:
        """Take out the grants whose time ran out; the caller closes their sessions. Also writes the grants
        file if an earlier removal could not (each tick calls this)."""
        now = self._wall()
        with self._lock:
            due = [g for g in self._grants.values() if g.kind is GrantKind.GRANT and g.expired(now)]
            host = self._host
            if due and host is not None:
                self._forget(host, due)
            if self._store is not None:
                self._store.flush()
        return due

    def _forget(self, host: SocketHost, grants: list[Grant]) -> None:
        """Unstore (one write; a removal takes effect even when it cannot be written), then unlist and close
        ``grants`` (lock held)."""
        if self._store is not None:
            self._store.remove([g.name for g in grants])
        for grant in grants:
            self._unlist(host, grant)

    def _unlist(self, host: SocketHost, grant: Grant) -> None:
        """Unlist and close one grant, its tickets and its open-rate bucket (lock held; not the store)."""
        del self._grants[grant.name]
        self._tickets.forget(grant.name)
        self._opens.pop(grant.name, None)
        host.close_socket(grant)

    def _require_host(self) -> SocketHost:
        if self._host is None:
            raise Unavailable("the daemon is not serving sockets")
        return self._host
