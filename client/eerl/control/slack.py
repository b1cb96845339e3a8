"""Async slack: a pool that waits for its peer pool may slow down until the wait is used up.

In async mode a session runs one phase kind; the daemon (or the bench) also feeds it the peer pool's
observations. The iteration lasts as long as the slower pool, so this pool's time budget is the larger of
its own default time and the peer's current time, over the threshold. The peer's time is the median of its
last few phases (one slow peer phase moves nothing).
"""

from __future__ import annotations

from collections import deque

import numpy as np

PEER_HISTORY = 5
"""Peer phases the peer's time is the median of."""


class PeerSlack:
    """The peer pool's recent phase times, and the time budget they leave this pool."""

    def __init__(self, *, active: bool) -> None:
        self.active = active
        """True for an async session that runs one kind: only then does the peer's time set the budget."""
        self._durations_s: deque[float] = deque(maxlen=PEER_HISTORY)

    def observe_peer(self, duration_s: float) -> None:
        """Take one phase of a kind this controller does not decide for (ignored unless it took time)."""
        if duration_s > 0:
            self._durations_s.append(duration_s)

    def peer_duration_s(self) -> float | None:
        """The peer's typical phase time (median of the last few); None before its first phase."""
        return float(np.median(self._durations_s)) if self._durations_s else None

    def time_cap(self, default_duration_s: float, threshold: float) -> float:
        """The largest time ratio this pool may take: the peer's time (or its own) over the threshold."""
        peer = self.peer_duration_s()
        horizon_s = max(default_duration_s, peer if peer is not None else 0.0)
        return horizon_s / (threshold * max(default_duration_s, 1e-9))
