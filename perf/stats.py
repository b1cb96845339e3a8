"""The benchmarks' one quantile: nearest rank, so that every p50 and p99 they report is a measured sample."""

from __future__ import annotations

from collections.abc import Sequence


def percentile(samples: Sequence[float], q: float) -> float:
    """The q-quantile (nearest rank) of ``samples`` (at least one)."""
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]
