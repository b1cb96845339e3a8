"""A Ray job's GPU pools (disaggregated placement): which nodes run which phase kind, and when an iteration
of both pools is over.

``pools`` maps a phase kind to where its pool runs: a placement group, a list of them, or a list of node ids.
Each pool's nodes get node agents of their own (ranks 0…n-1 within the pool, sessions in async mode with the
pool's role), each pool's phases go to its nodes only, and one job-level controller per pool
(:class:`eerl.job.pools.PoolControllers`) plans them. See docs/multinode.md, "Pools".
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from eerl.errors import ConfigError
from eerl.phases import PhaseKind

__all__ = ["PoolPlace", "PoolProgress", "parse_pools"]

_KEPT = 64
"""Iterations whose progress is remembered (an iteration a pool never ends is forgotten beyond this)."""


@dataclass(frozen=True, slots=True)
class PoolPlace:
    """Where one pool runs: its placement groups, or else its node ids."""

    kind: PhaseKind
    placement_groups: tuple[Any, ...] = ()
    node_ids: tuple[str, ...] = ()


def parse_pools(pools: Mapping[Any, Any]) -> list[PoolPlace]:
    """``pools`` as :class:`PoolPlace` s, in kind order; ConfigError for a kind named twice, an unknown
    kind or an empty pool."""
    places: dict[PhaseKind, PoolPlace] = {}
    for key, where in pools.items():
        kind = PhaseKind.parse(key)
        if kind in places:
            raise ConfigError(f"pools: {kind.value} is named twice")
        items: Sequence[Any] = list(where) if isinstance(where, list | tuple) else [where]
        if not items:
            raise ConfigError(f"pools: the {kind.value} pool is empty")
        if all(isinstance(item, str) for item in items):
            places[kind] = PoolPlace(kind, node_ids=tuple(dict.fromkeys(items)))
        elif any(isinstance(item, str) for item in items):
            raise ConfigError(f"pools: the {kind.value} pool mixes node ids and placement groups")
        else:
            places[kind] = PoolPlace(kind, placement_groups=tuple(items))
    return [places[kind] for kind in PhaseKind if kind in places]


@dataclass(slots=True)
class _Progress:
    start_s: float
    ended: set[PhaseKind] = field(default_factory=set)
    valid_tokens: int = 0


class PoolProgress:
    """When every pool has ended its phase of an iteration: the pools' phases overlap (one pool's next
    iteration may begin before the other's ends), so an iteration is over when each pool has ended it,
    not when some phase of the next one begins."""

    def __init__(self, kinds: Sequence[PhaseKind]) -> None:
        self._kinds = frozenset(kinds)
        self._iterations: dict[int, _Progress] = {}

    def begun(self, iteration: int, now_s: float) -> None:
        """A pool's phase of ``iteration`` began at ``now_s``."""
        if iteration not in self._iterations:
            self._iterations[iteration] = _Progress(now_s)
            for old in sorted(self._iterations)[:-_KEPT]:
                del self._iterations[old]

    def ended(
        self, kind: PhaseKind, iteration: int, valid_tokens: int, now_s: float
    ) -> tuple[float, int] | None:
        """A pool's phase ended; the iteration's (wall time, valid tokens) once every pool has ended it."""
        progress = self._iterations.get(iteration)
        if progress is None:
            return None
        progress.ended.add(kind)
        progress.valid_tokens += valid_tokens
        if progress.ended < self._kinds:
            return None
        del self._iterations[iteration]
        return max(0.0, now_s - progress.start_s), progress.valid_tokens
