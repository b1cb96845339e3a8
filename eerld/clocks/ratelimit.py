"""Per-GPU clock-change rate limit: a token bucket that protects the hardware from thrashing.

A buggy or hostile client can call BeginPhase in a tight loop, alternating phase kinds, and make the daemon
re-lock a GPU's clock thousands of times a second. Each change costs a driver call and a clock switch on
the chip, and nothing useful happens faster than a phase. The bucket lets a burst through (an RL loop's
generation/training alternation, a restart) and caps the sustained rate per GPU; a change over the limit is
skipped (the GPU keeps the clock it has), never queued.

Every change takes a token. Session-driven lock changes over the limit are skipped; an admin pin over the
limit is refused (the admin is told to retry); a reset to the default governor is never held back (it is
the fail-safe) but still takes its token, so that a client looping open-lock-close cannot thrash a GPU
through its releases either.

Pure logic: the caller passes the time (monotonic seconds) in.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable
from dataclasses import dataclass

DEFAULT_MAX_CHANGES_PER_S = 10.0
DEFAULT_BURST = 20


@dataclass(slots=True)
class _Bucket:
    tokens: float
    updated_s: float


class ClockChangeLimiter:
    """Token buckets, one per key (a GPU index, a socket): ``rate_per_s`` tokens a second up to ``burst``.

    ``rate_per_s == 0`` disables the limit (every change is allowed). Thread-safe.
    """

    def __init__(self, rate_per_s: float = DEFAULT_MAX_CHANGES_PER_S, burst: int = DEFAULT_BURST) -> None:
        if not math.isfinite(rate_per_s) or rate_per_s < 0:
            raise ValueError(f"rate_per_s: {rate_per_s} is not a non-negative finite number")
        if burst < 1:
            raise ValueError(f"burst: {burst} must be at least 1")
        self._rate_per_s = rate_per_s
        self._burst = float(burst)
        self._buckets: dict[Hashable, _Bucket] = {}
        self._lock = threading.Lock()
        self.denied = 0
        """How many changes were refused since start (for logs and metrics)."""

    @property
    def rate_per_s(self) -> float:
        """Tokens added per second."""
        return self._rate_per_s

    @property
    def enabled(self) -> bool:
        """False when the limit is off."""
        return self._rate_per_s > 0

    def allow(self, key: Hashable, now_s: float) -> bool:
        """Take one token from ``key``'s bucket (a GPU index, a socket) at ``now_s``; False if empty."""
        if not self.enabled:
            return True
        with self._lock:
            bucket = self._refilled(key, now_s)
            if bucket.tokens >= 1.0:
                bucket.tokens -= 1.0
                return True
            self.denied += 1
            return False

    def take(self, key: Hashable, now_s: float) -> None:
        """Take a token for a change that is made anyway (a reset), going into debt (down to -burst) if
        there is none: what resets spend, the next locks wait for."""
        if self.enabled:
            with self._lock:
                bucket = self._refilled(key, now_s)
                bucket.tokens = max(-self._burst, bucket.tokens - 1.0)

    def available(self, key: Hashable, now_s: float) -> bool:
        """Whether a change on ``key`` would be allowed now (nothing taken)."""
        if not self.enabled:
            return True
        with self._lock:
            return self._refilled(key, now_s).tokens >= 1.0

    def _refilled(self, key: Hashable, now_s: float) -> _Bucket:
        bucket = self._buckets.get(key)
        if bucket is None:
            bucket = self._buckets[key] = _Bucket(self._burst, now_s)
        elapsed_s = max(0.0, now_s - bucket.updated_s)
        bucket.tokens = min(self._burst, bucket.tokens + elapsed_s * self._rate_per_s)
        bucket.updated_s = max(bucket.updated_s, now_s)
        return bucket

    def forget(self, key: Hashable) -> None:
        """Drop ``key``'s bucket (a revoked grant's), so that the buckets stay bounded."""
        with self._lock:
            self._buckets.pop(key, None)


__all__ = ["DEFAULT_BURST", "DEFAULT_MAX_CHANGES_PER_S", "ClockChangeLimiter"]
