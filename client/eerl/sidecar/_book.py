"""The sidecar's bookkeeping of the job's phases: which are open, and what was metered per kind.

Shared by the two ways a sidecar drives its node (:class:`eerl.sidecar.server.Sidecar`, one session of its
own; :class:`eerl.sidecar.job.JobSidecar`, one node of a multi-node job), so that both refuse the same
requests with the same words and show the same ``open_phases`` and ``phases`` in ``GET /v1/status``.
Not thread-safe: its owner serves one request at a time under its own lock.
"""

from __future__ import annotations

import contextlib
import logging
import time
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from eerl._answers import PhaseAnswer
from eerl.phases import PhaseKind
from eerl.sidecar._api import ApiError

logger = logging.getLogger("eerl.sidecar")

MAX_OPEN_PHASES = 8
"""Phases begun and not ended that the sidecar remembers; the oldest is forgotten beyond (never ended)."""

T = TypeVar("T")


class OpenPhases(Generic[T]):
    """The phases begun and not yet ended, oldest first, each with what its owner keeps for its end."""

    def __init__(self) -> None:
        self._open: dict[tuple[PhaseKind, int], tuple[T, float]] = {}

    def check_new(self, kind: PhaseKind, iteration: int | None) -> None:
        """Raises ApiError (409) when the phase is open already."""
        if iteration is not None and (kind, iteration) in self._open:
            raise ApiError(409, f"iteration: the {kind} phase {iteration} is already open")

    def add(self, kind: PhaseKind, iteration: int, value: T) -> None:
        """Opens a phase; beyond :data:`MAX_OPEN_PHASES`, forgets the oldest (with a warning)."""
        self._open[(kind, iteration)] = (value, time.monotonic())
        while len(self._open) > MAX_OPEN_PHASES:
            old_kind, old_iteration = next(iter(self._open))
            del self._open[(old_kind, old_iteration)]
            logger.warning(
                "eerl-sidecar: forgot the %s phase %d, begun and never ended", old_kind, old_iteration
            )

    def pop(self, kind: PhaseKind, iteration: int | None) -> tuple[int, T]:
        """Closes the phase an end names (iteration None: the last begun of its kind) and returns its
        iteration and value; raises ApiError (409)."""
        if iteration is not None:
            if (kind, iteration) not in self._open:
                raise ApiError(409, f"iteration: no {kind} phase {iteration} is open (begin it first)")
        else:
            found = [key for key in self._open if key[0] is kind]
            if not found:
                raise ApiError(409, f"kind: no {kind} phase is open (begin it first)")
            iteration = found[-1][1]
        value, _ = self._open.pop((kind, iteration))
        return iteration, value

    def listing(self) -> list[dict[str, Any]]:
        """``open_phases`` of the status; safe to call while a request changes the table (then empty)."""
        now_s = time.monotonic()
        items: list[tuple[tuple[PhaseKind, int], tuple[T, float]]] = []
        with contextlib.suppress(RuntimeError):  # the dict changed size (another request): none listed
            items = list(self._open.items())
        return [
            {"kind": kind.value, "iteration": iteration, "open_s": round(now_s - since_s, 3)}
            for (kind, iteration), (_, since_s) in items
        ]


@dataclass(slots=True)
class _Tally:
    """What the sidecar saw of one phase kind: the last clock, and what was metered so far."""

    metered: int = 0
    duration_s: float = 0.0
    energy_j: float = 0.0
    sm_clock_mhz: int | None = None
    state: str | None = None


class Tallies:
    """Per phase kind: the last clock answered, and the phases metered with their duration and energy."""

    def __init__(self) -> None:
        self._tallies = {kind: _Tally() for kind in PhaseKind}

    def note(self, kind: PhaseKind, answer: PhaseAnswer | None) -> None:
        """Takes in a begin's or an end's answer (None: there was none)."""
        if answer is None:
            return
        tally = self._tallies[kind]
        if not answer.begin:
            tally.metered += 1
            tally.duration_s += answer.duration_s
            tally.energy_j += answer.energy_j
        tally.sm_clock_mhz = answer.sm_clock_mhz or None
        tally.state = answer.state.value if answer.state is not None else tally.state

    def as_json(self) -> dict[str, Any]:
        """``phases`` of the status."""
        return {
            kind.value: {
                "state": tally.state,
                "sm_clock_mhz": tally.sm_clock_mhz,
                "metered": tally.metered,
                "duration_s": round(tally.duration_s, 6),
                "energy_j": round(tally.energy_j, 6),
            }
            for kind, tally in self._tallies.items()
        }
