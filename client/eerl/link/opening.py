"""Opening a daemon session over a link, the same way for everyone who holds one (the session's sender and
a node's job-mode link): fresh claim tickets from the other worker sockets, then ``OpenSession`` on a link
of its own, then the ``Attach`` stream read by a thread of its own."""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eerl.link.base import Connect, DaemonLink, LinkError
from eerl.v1 import eerl_pb2

__all__ = ["Tickets", "claim_tickets", "gpu_ref", "open_session", "refused_by_kernel", "watch_attach"]

logger = logging.getLogger("eerl")

_PROBE_TIMEOUT_S = 0.5


@dataclass(frozen=True, slots=True)
class Tickets:
    """The claim tickets the other worker sockets gave, and the sockets that gave none (and why)."""

    tickets: tuple[str, ...]
    missing: tuple[tuple[str, str], ...]


def claim_tickets(connect: Connect, paths: Sequence[str], timeout_s: float) -> Tickets:
    """A fresh ticket from each socket of ``paths`` (each asked once, on a link closed after)."""
    tickets: list[str] = []
    missing: list[tuple[str, str]] = []
    for path in paths:
        link = connect(path)
        try:
            ticket = link.issue_claim_ticket(timeout_s)
        except LinkError as e:
            missing.append((path, e.describe()))
            continue
        finally:
            link.close()
        if ticket:
            tickets.append(ticket)
    return Tickets(tuple(tickets), tuple(missing))


def open_session(
    connect: Connect, request: eerl_pb2.OpenSessionRequest, timeout_s: float
) -> tuple[DaemonLink, eerl_pb2.OpenSessionResponse]:
    """A new link and the session opened on it; raises :class:`LinkError` (the link closed)."""
    link = connect(None)
    try:
        reply = link.open_session(request, timeout_s)
    except LinkError:
        link.close()
        raise
    return link, reply


def watch_attach(
    link: DaemonLink,
    session_id: str,
    *,
    name: str,
    on_event: Callable[[eerl_pb2.SessionEvent], None],
    on_end: Callable[[LinkError | None], None],
) -> Callable[[], None]:
    """Opens the session's ``Attach`` stream and reads it on a daemon thread of its own: ``on_event`` for
    each event, then ``on_end`` once (None: the daemon ended it, else why it failed). Returns what cancels
    the stream. ``on_end`` also runs (on the caller's thread) when the stream cannot even be opened."""
    try:
        stream = link.attach(session_id)
    except LinkError as e:  # pragma: no cover - a gRPC stream reports errors when read
        on_end(e)
        return lambda: None

    def read() -> None:
        ended: LinkError | None = None
        try:
            for event in stream:
                on_event(event)
        except LinkError as e:
            ended = e
        except Exception:  # pragma: no cover - never let this thread die loudly
            logger.debug("eerl: the Attach stream failed", exc_info=True)
        on_end(ended)

    threading.Thread(target=read, name=name, daemon=True).start()
    return stream.cancel


def gpu_ref(gpu: int | str) -> eerl_pb2.GpuRef:
    """A GPU named by index or UUID, as ``OpenSessionRequest.gpus`` carries it."""
    return eerl_pb2.GpuRef(index=gpu) if isinstance(gpu, int) else eerl_pb2.GpuRef(uuid=gpu)


def refused_by_kernel(path: str) -> bool:
    """True when the socket at ``path`` exists but the kernel refuses this process a connection (its owner
    and mode, or a directory on the way, keep this user out); False for any other outcome.

    gRPC reports such a refusal as UNAVAILABLE, like an absent daemon; one plain connect tells them apart.
    """
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(_PROBE_TIMEOUT_S)
    try:
        probe.connect(path)
    except PermissionError:
        return True
    except OSError:
        return False
    finally:
        probe.close()
    return False
