"""Drains: GPUs an administrator took out of service for new claims (``eerlctl drain``).

A drained GPU refuses every OpenSession that would claim it, with a message naming the drain, until it is
undrained or its time is up; the sessions that held it when it was drained were closed (or, with
``keep_sessions``, keep it until they close). Drains are keyed by GPU UUID like pins, and live in memory:
a restart of eerld ends them (the Slurm prolog and epilog never touch them). The drains in force are
kept by the claim gate (:mod:`eerld.daemon.gate`), which orders them against the claims in flight.
"""

from __future__ import annotations

import datetime as dt
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


__all__ = ["Drain", "utc_text"]
