"""Async slack: a pool that waits for its peer pool may slow down until the wait is used up.

In async mode a session runs one phase kind; the daemon (or the bench) also feeds it the peer pool's
observations. The iteration lasts as long as the slower pool, so this pool's time budget is the larger of
its own default time over the threshold and the peer's current time, a little less. The peer's time is the
median of its last few phases (one slow peer phase moves nothing).

The peer's time already holds the peer's own slowdown: a budget of the peer's time *over the threshold*
counted the threshold twice, and two pools of about the same length each stretched to the other's slowed
time, round after round (``regime-switch-async-h100`` at 0.98: both pools at 1035–1170 MHz, the iteration
at 0.90 of the default's throughput). A pool that waits stretches to its peer's time less a margin for its
own noise: the iteration lasts the longer of two noisy phases, and a waiter level with its peer gates half
of the iterations.
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

    def reference_s(self, threshold: float, noise: float) -> float | None:
        """The peer's time as an iteration's default time: a pool this long may take it over the threshold.

        The peer's typical time, less ``noise`` (this pool's relative phase noise), times the threshold;
        None before the peer's first phase.
        """
        peer = self.peer_duration_s()
        return None if peer is None else peer * (1.0 - noise) * threshold

    def time_cap(self, default_duration_s: float, threshold: float, noise: float) -> float:
        """The largest time ratio this pool may take: its own default over the threshold, or the peer's
        time less ``noise`` if longer."""
        reference = self.reference_s(threshold, noise) or 0.0
        horizon_s = max(default_duration_s, reference)
        return horizon_s / (threshold * max(default_duration_s, 1e-9))
