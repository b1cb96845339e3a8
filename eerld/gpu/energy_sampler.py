"""Energy counters sampled in the background, so that a phase event never waits on a counter read.

Measured on an H200 (driver 580, ``bench/real_gpu.py``): one ``nvmlDeviceGetTotalEnergyConsumption``
call takes about 3 ms (p99 16 ms) while clock, power and utilisation reads take 5-10 µs, and the
counter itself advances only every ~10 ms. Read on the RPC path, it made BeginPhase + EndPhase cost
~9 ms on one GPU, and it grows with every GPU of a session (reads are per GPU).

Here one thread per GPU reads the counter every ``period_s``; :meth:`total_energy_mj` answers at once
with the newest sample extrapolated to now along the mean power of the last few samples. The answer
never goes below one already given for that GPU (so no phase can see a false counter reset) unless the
counter really restarted (driver reload). A sample older than ``stale_after_s`` (a stuck read) makes
the call read the counter directly, as without the sampler.
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
WINDOW_SAMPLES = 6


@dataclass(frozen=True, slots=True)
class EnergySample:
    """One counter reading and when it was taken (the middle of the call)."""

    time_s: float
    energy_mj: int


def estimate_energy_mj(samples: Sequence[EnergySample], now_s: float) -> int | None:
    """The counter at ``now_s``: the newest sample plus the recent mean power times the time since (pure).

    Only samples since the last restart of the counter (a decrease) count; with fewer than two of them,
    or when ``now_s`` is not after the newest, the newest value is the estimate. None without samples.
    """
    if not samples:
        return None
    start = 0
    for i in range(1, len(samples)):
        if samples[i].energy_mj < samples[i - 1].energy_mj:
            start = i
    run = samples[start:]
    newest = run[-1]
    span_s = newest.time_s - run[0].time_s
    if len(run) < 2 or span_s <= 0.0 or now_s <= newest.time_s:
        return newest.energy_mj
    power_mj_per_s = (newest.energy_mj - run[0].energy_mj) / span_s
    return newest.energy_mj + round(power_mj_per_s * (now_s - newest.time_s))


class _Counter:
    """The recent samples of one GPU and the last value handed out."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.samples: deque[EnergySample] = deque(maxlen=WINDOW_SAMPLES)
        self.floor_mj = 0

    def add(self, sample: EnergySample) -> None:
        with self.lock:
            if self.samples and sample.energy_mj < self.samples[-1].energy_mj:
                self.floor_mj = 0  # the counter restarted: earlier answers are no floor any more
            self.samples.append(sample)


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
        self._counters = {gpu.index: _Counter() for gpu in inner.inventory()}
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
        self._counters[index].add(EnergySample((before + self._clock()) / 2.0, value))

    def _run(self, index: int) -> None:
        while not self._stop.wait(self._period_s):
            self.sample(index)

    def total_energy_mj(self, index: int) -> int:
        counter = self._counters.get(index)
        if counter is None:
            return self._inner.total_energy_mj(index)
        now_s = self._clock()
        with counter.lock:
            samples = list(counter.samples)
        if not samples or now_s - samples[-1].time_s > self._stale_after_s:
            value = self._inner.total_energy_mj(index)
            counter.add(EnergySample(now_s, value))
        else:
            estimate = estimate_energy_mj(samples, now_s)
            assert estimate is not None
            value = estimate
        with counter.lock:
            value = max(value, counter.floor_mj)
            counter.floor_mj = value
        return value

    def close(self) -> None:
        self._stop.set()
        for thread in self._threads:
            if thread.is_alive():
                thread.join(timeout=1.0)
        super().close()
