"""What a hook needs of what it reports to: an :class:`eerl.Session` (one node) or a job object
(:class:`eerl.ray.RayJob`, :class:`eerl.dist.DistJob`: every node of the job), so that adopting job mode
is one changed line."""

from __future__ import annotations

from types import TracebackType
from typing import Protocol

from eerl.phases import PhaseKind, Workload


class PhaseLike(Protocol):
    """One open phase: a context manager that adds up reported workload."""

    def report(
        self,
        tokens: int = 0,
        valid_tokens: int = 0,
        sequences: int = 0,
        max_response_tokens: int = 0,
        prompt_tokens: int = 0,
        *,
        max_worker_kv_tokens: int = 0,
    ) -> None: ...

    def report_workload(self, workload: Workload) -> None: ...

    def __enter__(self) -> PhaseLike: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...


class PhaseSource(Protocol):
    """``phase(kind, iteration=...)``: what :class:`eerl.Session` and the job objects share."""

    def phase(
        self,
        kind: str | PhaseKind,
        iteration: int | None = None,
        *,
        hints: Workload | None = None,
        wait_for_clock_s: float = 0.0,
    ) -> PhaseLike: ...
