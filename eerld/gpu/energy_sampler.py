"""Energy counters sampled in the background, so that a phase event never waits on a counter read.

Measured on an H200 (driver 580, ``perf/real_gpu.py``): one ``nvmlDeviceGetTotalEnergyConsumption``
call takes about 3 ms (p99 16 ms) while clock, power and utilisation reads take 5-10 µs, and the
counter itself changes only every ~100 ms. Read on the RPC path, it made BeginPhase + EndPhase cost
~9 ms on one GPU, and it grows with every GPU of a session (reads are per GPU).

Here one thread per GPU reads the counter every ``period_s``; :meth:`total_energy_mj` answers at once.
The counter advances in steps (on an H200 several reads in a row can return the same value), so what
is kept is when the counter *changed*: each change is dated midway between the read that still saw the
old value and the one that saw the new. The answer is the newest change plus the mean power between the
changes of the last ``WINDOW_S`` times the time since. It never goes below one already given for that
GPU (so no phase can see a false counter reset) unless the counter really restarted (driver reload). A
GPU whose last read is older than ``stale_after_s`` (a stuck read) is read directly, as without sampling.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from eerld.errors import GpuError
from eerld.gpu.base import GpuBackend
from eerld.gpu.delegating import DelegatingBackend

DEFAULT_PERIOD_S = 0.02
WINDOW_S = 0.5
"""The mean power of the extrapolation is taken over the counter's changes of about this long."""


@dataclass(frozen=True, slots=True)
class EnergySample:
    """A counter value and when the counter took it."""

    time_s: float
    energy_mj: int


def estimate_energy_mj(changes: Sequence[EnergySample], now_s: float) -> int | None:
    """The counter at ``now_s``: the newest change plus the mean power between changes since (pure).

    Only changes since the last restart of the counter (a decrease) count; with fewer than two of them,
    or when ``now_s`` is not after the newest, the newest value is the estimate. None without changes.
    """
    if not changes:
        return None
    start = 0
    for i in range(1, len(changes)):
        if changes[i].energy_mj < changes[i - 1].energy_mj:
            start = i
    run = changes[start:]
    newest = run[-1]
    span_s = newest.time_s - run[0].time_s
    if len(run) < 2 or span_s <= 0.0 or now_s <= newest.time_s:
        return newest.energy_mj
    power_mj_per_s = (newest.energy_mj - run[0].energy_mj) / span_s
    return newest.energy_mj + round(power_mj_per_s * (now_s - newest.time_s))


class _Counter:
    """The recent changes of one GPU's counter, its last read, and the last value handed out."""

    def __init__(self, period_s: float) -> None:
        self.period_s = period_s
        self.lock = threading.Lock()
        self.changes: deque[EnergySample] = deque(maxlen=256)
        self.last_read_s: float | None = None
        self.last_mj: int | None = None
        self.floor_mj = 0

    def add(self, read_s: float, value_mj: int) -> None:
        """Record a read; a new value is a change, dated midway since the read before."""
        with self.lock:
            if self.last_mj is None or value_mj != self.last_mj:
                # The first read has no read before it: date it as if there were one a period earlier,
                # so that every change carries the same offset and the slope between them stays true.
                since_s = self.last_read_s if self.last_read_s is not None else read_s - self.period_s
                changed_s = (since_s + read_s) / 2.0
                if self.last_mj is not None and value_mj < self.last_mj:
                    self.floor_mj = 0  # the counter restarted: earlier answers are no floor any more
                    self.changes.clear()
                self.changes.append(EnergySample(changed_s, value_mj))
                while len(self.changes) > 2 and changed_s - self.changes[0].time_s > WINDOW_S:
                    self.changes.popleft()
            self.last_read_s = read_s
            self.last_mj = value_mj


class SampledEnergyBackend(DelegatingBackend):
    """Answers ``total_energy_mj`` from background samples; every other call goes to ``inner``."""

    def __init__(
        self,
        inner: GpuBackend,
        *,
        period_s: float = DEFAULT_PERIOD_S,
        stale_after_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        start: bool = True,
    ) -> None:
        super().__init__(inner)
        if period_s <= 0.0:
            raise ValueError(f"period_s must be positive, got {period_s}")
        self._period_s = period_s
        self._stale_after_s = stale_after_s if stale_after_s is not None else max(0.5, 20 * period_s)
        self._clock = clock
        self._stop = threading.Event()
        self._counters = {gpu.index: _Counter(period_s) for gpu in inner.inventory()}
        for index in self._counters:
            self.sample(index)
        self._threads = [
            threading.Thread(target=self._run, args=(index,), name=f"eerld-energy-{index}", daemon=True)
            for index in self._counters
        ]
        if start:
            for thread in self._threads:
                thread.start()

    def sample(self, index: int) -> None:
        """Take one sample of GPU ``index`` (the threads call this; tests may too)."""
        before = self._clock()
        try:
            value = self._inner.total_energy_mj(index)
        except GpuError:
            return  # no sample: a stale counter falls back to direct reads, which raise
        self._counters[index].add((before + self._clock()) / 2.0, value)

    def _run(self, index: int) -> None:
        while not self._stop.wait(self._period_s):
            self.sample(index)

    def total_energy_mj(self, index: int) -> int:
        counter = self._counters.get(index)
        if counter is None:
            return self._inner.total_energy_mj(index)
        now_s = self._clock()
        with counter.lock:
            changes = list(counter.changes)
            last_read_s = counter.last_read_s
        if last_read_s is None or now_s - last_read_s > self._stale_after_s:
            counter.add(now_s, self._inner.total_energy_mj(index))
            with counter.lock:
                changes = list(counter.changes)
        estimate = estimate_energy_mj(changes, now_s)
        assert estimate is not None
        with counter.lock:
            value = max(estimate, counter.floor_mj)
            counter.floor_mj = value
        return value

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=1.0)
        super().close()
