"""The claim gate: the drains in force, and the claims in flight that a new drain or shutdown waits for.

A session's claim of its GPUs and an administrator's drain of them race: the claim checks the drains,
then adds its session; the drain records itself, then closes the sessions holding its GPUs. The gate
orders the two with its own lock and no lock held across calls into another component:

- the open path claims through :meth:`ClaimGate.claim`: under the gate's lock the daemon must be running
  and none of the GPUs drained, and the claim is counted in flight until the ``with`` block (adding the
  session, redeeming its tickets) ends;
- :meth:`ClaimGate.drain` records the drains under the lock, then waits until no claim of those GPUs is in
  flight: when it returns, every claim either added its session already (the admin's eviction sees it) or
  will see the drain;
- :meth:`ClaimGate.settle` does the same for shutdown, after :meth:`~eerld.daemon.lifecycle.LifeCycle.stop`.

Drains are keyed by GPU UUID like pins and live in memory (:mod:`eerld.daemon.drains`).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

from eerld.daemon.drains import Drain
from eerld.daemon.inventory import Inventory
from eerld.daemon.lifecycle import LifeCycle
from eerld.errors import Conflict


class ClaimGate:
    """The drains in force by GPU UUID, and the claims in flight by GPU index (thread-safe)."""

    def __init__(self, inventory: Inventory, life: LifeCycle, *, wall_clock: Callable[[], float]) -> None:
        self._inventory = inventory
        self._life = life
        self._wall = wall_clock
        self._changed = threading.Condition(threading.Lock())
        self._drains: dict[str, Drain] = {}
        self._in_flight: Counter[int] = Counter()

    def drain_of(self, index: int) -> Drain | None:
        """The drain in force on the GPU at ``index``, if any."""
        with self._changed:
            drain = self._drains.get(self._inventory.uuid(index))
        return drain if drain is not None and not drain.expired(self._wall()) else None

    def check(self, indices: Sequence[int]) -> None:
        """Conflict naming the drain when one of the GPUs is drained (no new claims)."""
        with self._changed:
            self._check_locked(indices)

    @contextmanager
    def claim(self, indices: Sequence[int]) -> Iterator[None]:
        """Admit a claim of the GPUs (Unavailable when stopping, Conflict when drained), in flight until the
        block ends: a drain of these GPUs, or shutdown, recorded meanwhile waits for it."""
        with self._changed:
            self._life.check_running()
            self._check_locked(indices)
            self._in_flight.update(indices)
        try:
            yield
        finally:
            with self._changed:
                self._in_flight.subtract(indices)
                self._in_flight += Counter()  # drop the zeros
                self._changed.notify_all()

    def drain(self, drains: Sequence[tuple[int, Drain]]) -> None:
        """Record drains of the GPUs (index, drain) — from now on no claim of them is admitted — and wait
        until no claim of them admitted before is still in flight."""
        indices = {index for index, _ in drains}
        with self._changed:
            for _, drain in drains:
                self._drains[drain.uuid] = drain
            self._changed.wait_for(lambda: not any(self._in_flight[i] for i in indices))

    def settle(self) -> None:
        """Wait until no claim is in flight (shutdown, once the life cycle refuses new ones)."""
        with self._changed:
            self._changed.wait_for(lambda: not self._in_flight)

    def undrain(self, indices: Sequence[int]) -> list[Drain]:
        """Remove the drains of the GPUs; return those that existed."""
        uuids = [self._inventory.uuid(i) for i in indices]
        with self._changed:
            return [d for u in uuids if (d := self._drains.pop(u, None)) is not None]

    def expire(self) -> list[Drain]:
        """Remove and return the drains whose time is up."""
        now_unix_s = self._wall()
        with self._changed:
            expired = [d for d in self._drains.values() if d.expired(now_unix_s)]
            for drain in expired:
                del self._drains[drain.uuid]
            return expired

    def _check_locked(self, indices: Sequence[int]) -> None:
        now_unix_s = self._wall()
        for index in indices:
            drain = self._drains.get(self._inventory.uuid(index))
            if drain is not None and not drain.expired(now_unix_s):
                raise Conflict(
                    f"gpus: GPU {index} is {drain.describe()}; no session may claim it until an admin "
                    "undrains it (eerlctl undrain) or the drain ends"
                )


__all__ = ["ClaimGate"]
