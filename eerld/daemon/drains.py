"""Drains: GPUs an administrator took out of service for new claims (``eerlctl drain``).

A drained GPU refuses every OpenSession that would claim it, with a message naming the drain, until it is
undrained or its time is up; the sessions that held it when it was drained were closed (or, with
``keep_sessions``, keep it until they close). Drains are keyed by GPU UUID like pins, and live in memory:
a restart of eerld ends them (the Slurm prolog and epilog never touch them).
"""

from __future__ import annotations

import datetime as dt
import threading
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Drain:
    """An administrator's drain of one GPU."""

    uuid: str
    reason: str
    created_at_unix_s: float
    expires_at_unix_s: float
    """0 means until undrained."""
    set_by: str = ""

    def expired(self, now_unix_s: float) -> bool:
        """Whether the drain has run out at ``now_unix_s``."""
        return self.expires_at_unix_s > 0 and now_unix_s >= self.expires_at_unix_s

    def describe(self) -> str:
        """``drained by an admin until 14:30:00Z (maint)``: what a refused claim is told."""
        until = (
            "until undrained" if self.expires_at_unix_s <= 0 else "until " + utc_text(self.expires_at_unix_s)
        )
        why = f": {self.reason}" if self.reason else ""
        by = f", by {self.set_by}" if self.set_by else ""
        return f"drained {until}{by}{why}"


def utc_text(unix_s: float) -> str:
    """``2026-12-01T14:30:00Z``."""
    return dt.datetime.fromtimestamp(unix_s, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class DrainStore:
    """The drains in force, by GPU UUID (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._drains: dict[str, Drain] = {}

    def get(self, uuid: str, now_unix_s: float) -> Drain | None:
        """The drain of one GPU in force at ``now_unix_s``, if any."""
        with self._lock:
            drain = self._drains.get(uuid)
        return drain if drain is not None and not drain.expired(now_unix_s) else None

    def put_many(self, drains: Iterable[Drain]) -> None:
        """Add or replace drains."""
        with self._lock:
            for drain in drains:
                self._drains[drain.uuid] = drain

    def remove_many(self, uuids: Iterable[str]) -> list[Drain]:
        """Remove drains; return those that existed."""
        with self._lock:
            return [d for u in uuids if (d := self._drains.pop(u, None)) is not None]

    def expire(self, now_unix_s: float) -> list[Drain]:
        """Remove and return the drains whose time is up."""
        with self._lock:
            expired = [d for d in self._drains.values() if d.expired(now_unix_s)]
            for drain in expired:
                del self._drains[drain.uuid]
            return expired


__all__ = ["Drain", "DrainStore", "utc_text"]
