"""The seam between the client and the daemon: :class:`DaemonLink`, and what its failures mean.

One link is one connection to one worker socket of the daemon (or to a relay in its place). It carries the
phase service's messages (``eerl.v1`` requests in, replies out) and nothing else: no retries, no back-off,
no session state. Who holds a session (the session's sender, a node's job-mode link, the sidecar's relay)
decides what to do with a failure, and reads its meaning from the sets below, defined here once:

* :data:`CONNECTION_LOST`: the daemon, or the path to it, is gone. Drop the session, reconnect with
  back-off.
* :data:`SESSION_LOST`: the connection works but the daemon no longer knows the session, or no longer lets
  this caller use it (a daemon restarted, a lease that expired). ``NOT_FOUND`` belongs here, not above: the
  daemon answered, so the path is fine, and a fresh session can open at once.
* anything else: the daemon refused this one request (order, range) or it ran past its deadline.

Every failure is a :class:`LinkError` carrying a :class:`Code` (gRPC's status codes by name, so that a link
that is not gRPC speaks the same words). The implementations: :class:`eerl.link.GrpcLink` (the daemon's
socket), :class:`eerl.link.sidecar.SidecarLink` (HTTP to the job's sidecar, for phase events) and
:class:`eerl.link.memory.MemoryLink` (an in-memory daemon for tests), so callers and tests never know which.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterator
from typing import Protocol

from eerl.v1 import eerl_pb2


class Code(enum.Enum):
    """Why a call failed: gRPC's status codes, by the same names."""

    CANCELLED = "CANCELLED"
    UNKNOWN = "UNKNOWN"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ABORTED = "ABORTED"
    OUT_OF_RANGE = "OUT_OF_RANGE"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    INTERNAL = "INTERNAL"
    UNAVAILABLE = "UNAVAILABLE"
    DATA_LOSS = "DATA_LOSS"
    UNAUTHENTICATED = "UNAUTHENTICATED"


CONNECTION_LOST = frozenset({Code.UNAVAILABLE, Code.CANCELLED})
"""The daemon (or the path to it) is gone: drop the session, reconnect with back-off."""
SESSION_LOST = frozenset({Code.NOT_FOUND, Code.PERMISSION_DENIED})
"""The daemon no longer knows the session (restart, lease expiry) or this caller: reopen at once."""


class LinkError(Exception):
    """A call over a link failed: its :class:`Code` and the far end's words (``details``)."""

    def __init__(self, code: Code, details: str = "", *, foreign: bool = False) -> None:
        super().__init__(f"{code.name}: {details}" if details else code.name)
        self.code = code
        self.details = details
        self.foreign = foreign
        """True when the far end is not ours to talk to (a sidecar socket another user serves)."""

    def describe(self) -> str:
        """``CODE: details`` (or the code alone), for a log line."""
        return str(self)

    @property
    def connection_lost(self) -> bool:
        return self.code in CONNECTION_LOST

    @property
    def session_lost(self) -> bool:
        return self.code in SESSION_LOST


class AttachStream(Protocol):
    """The ``Attach`` stream that binds a session's life to this connection.

    Iterating yields the daemon's events until the stream ends; an end other than the daemon's (the
    connection lost, the stream cancelled, no ``Attach`` offered) raises :class:`LinkError` there.
    """

    def __iter__(self) -> Iterator[eerl_pb2.SessionEvent]: ...

    def cancel(self) -> None:
        """Ends the stream from this side (the daemon then ends the session); idempotent."""


class DaemonLink(Protocol):
    """One connection to the daemon's phase service; every call raises :class:`LinkError` on failure.

    ``timeout_s`` is the call's deadline. A relay that takes a phase event without the daemon's answer
    (a sidecar whose daemon has not answered yet) returns None from :meth:`begin_phase`/:meth:`end_phase`.
    """

    def open_session(
        self, request: eerl_pb2.OpenSessionRequest, timeout_s: float
    ) -> eerl_pb2.OpenSessionResponse: ...

    def begin_phase(
        self, request: eerl_pb2.BeginPhaseRequest, timeout_s: float
    ) -> eerl_pb2.BeginPhaseResponse | None: ...

    def end_phase(
        self, request: eerl_pb2.EndPhaseRequest, timeout_s: float
    ) -> eerl_pb2.EndPhaseResponse | None: ...

    def heartbeat(self, session_id: str, timeout_s: float) -> None: ...

    def close_session(self, session_id: str, timeout_s: float) -> eerl_pb2.CloseSessionResponse | None:
        """Ends the session; the daemon's totals and report (None: a link that has none)."""

    def attach(self, session_id: str) -> AttachStream:
        """Opens the session's ``Attach`` stream (errors are raised while reading it)."""

    def issue_claim_ticket(self, timeout_s: float) -> str:
        """A claim ticket for this socket's GPUs (``""``: none)."""

    def close(self) -> None:
        """Closes the connection; idempotent. A session bound to it ends at the daemon."""


Connect = Callable[[str | None], DaemonLink]
"""Makes a new link (a connection of its own): to the session's socket (None) or to another worker socket
of the same daemon (its path, for a claim ticket)."""
