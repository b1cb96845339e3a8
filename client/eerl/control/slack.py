"""Async slack: a pool that waits for its peer pool may slow down until the wait is used up.

In async mode a session runs one phase kind; the daemon (or the bench) also feeds it the peer pool's
observations. The iteration lasts as long as the slower pool, so this pool's time budget is the larger of
its own default time over the threshold and the peer's current time, a little less. The peer's time is the
lower quartile of its last few phases (the second shortest of five: one slow peer phase moves nothing, and
the pool rarely gates an iteration whose peer phase is short).

The peer's time already holds the peer's own slowdown: a budget of the peer's time *over the threshold*
counted the threshold twice, and two pools of about the same length each stretched to the other's slowed
time, round after round (``regime-switch-async-h100`` at 0.98: both pools at 1035–1170 MHz, the iteration
at 0.90 of the default's throughput). A pool that waits stretches to its peer's time less a margin for its
own noise: the iteration lasts the longer of two noisy phases, and a waiter level with its peer gates half
of the iterations.
"""

from __future__ import annotations

from collections import deque

PEER_HISTORY = 5
"""Peer phases the peer's time is the median of."""
PAIRING_HISTORY = 8
"""Iterations whose one pool's phase waits for the other's to pair up (the pools report in any order)."""


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
        """The peer's time this pool may stretch to: the second shortest of its last five phases (its lower
        quartile; the shortest while it has fewer than four); None before its first phase.

        The iteration lasts as long as the slower pool *in that iteration*. A pool stretched to its peer's
        median gates every iteration whose peer phase is shorter than the median: on
        `async-blocks-h100` (short answers, two pools of about 17 s, training 14-19 s from batch to batch)
        generation planned a throughput of 1.000 at 1215 MHz, its phases read 0.96 of the default's, and
        the run ended at 0.968 against 0.98 (0.982 with the lower quartile). One unusually short peer phase
        still moves nothing; one long one never did."""
        if not self._durations_s:
            return None
        ordered = sorted(self._durations_s)
        return float(ordered[1] if len(ordered) >= 4 else ordered[0])

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


class PeerOverrun:
    """Per iteration, how far the peer pool's phase ran past this pool's: time the iteration lasted beyond
    this pool's phase, which the pool's own ledger must count as taken.

    The iteration lasts as long as the slower pool. A pool that gates it judged its throughput on its own
    phases alone, but a waiting peer planned a noise margin under it, not over it, and in some iterations
    it still runs longer: on ``regime-switch-async-h100`` at 0.98 the gating pool believed 0.985 of the
    default's throughput while the iterations delivered 0.975. Counting the overrun against its own
    default time is conservative: the iteration's default was at least this pool's.
    """

    def __init__(self) -> None:
        self._own: dict[int, float] = {}
        self._peer: dict[int, float] = {}

    def own(self, iteration: int, duration_s: float) -> float:
        """This pool's phase of ``iteration``; the peer's overrun of it, if the peer's came first."""
        return self._pair(iteration, own_s=duration_s, peer_s=self._peer.pop(iteration, None), keep=self._own)

    def peer(self, iteration: int, duration_s: float) -> float:
        """The peer's phase of ``iteration``; its overrun of this pool's, if this pool's came first."""
        own_s = self._own.pop(iteration, None)
        return self._pair(iteration, own_s=own_s, peer_s=duration_s, keep=self._peer)

    @staticmethod
    def _pair(iteration: int, *, own_s: float | None, peer_s: float | None, keep: dict[int, float]) -> float:
        if own_s is None or peer_s is None:
            waiting = own_s if peer_s is None else peer_s
            if waiting is not None and waiting > 0:
                keep[iteration] = waiting
                while len(keep) > PAIRING_HISTORY:
                    del keep[min(keep)]
            return 0.0
        return max(0.0, peer_s - own_s) if own_s > 0 else 0.0
