"""What every hook shares: the set-up warning, the framework's version, and phases that never raise.

A hook is attached once, at set-up, and then runs inside the framework's training loop. At set-up it may
warn (:class:`HookWarning`, through :mod:`warnings` and the ``eerl`` logger) when it finds nothing it
knows how to wrap; inside the loop it never raises: a failure of eerl's own (a phase that would not open, a
batch it cannot count) is logged once and the framework's call goes on exactly as without the hook.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable
from importlib import metadata

from eerl.integrations._source import PhaseLike, PhaseSource
from eerl.phases import PhaseKind, Workload

logger = logging.getLogger("eerl")

__all__ = ["GuardedPhases", "HookWarning", "framework_version", "warn_setup"]


class HookWarning(UserWarning):
    """A hook found nothing (or not everything) it knows how to wrap on the object it was given."""


def framework_version(distribution: str) -> str:
    """The installed version of ``distribution`` (e.g. ``"verl"``), or ``"not installed"``; never raises."""
    try:
        return metadata.version(distribution)
    except Exception:
        return "not installed"


def warn_setup(message: str) -> None:
    """The set-up warning: to :mod:`warnings` (category :class:`HookWarning`) and to the ``eerl`` logger."""
    logger.warning("eerl: %s", message)
    warnings.warn(message, HookWarning, stacklevel=3)


class GuardedPhases:
    """Opens, reports to and closes phases of a :class:`PhaseSource` so that nothing of eerl's raises.

    ``begin`` returns None when the phase could not be opened; ``report`` and ``end`` accept None.
    """

    def __init__(self, source: PhaseSource, framework: str) -> None:
        self._source = source
        self._framework = framework
        self._warned: set[str] = set()

    def begin(self, kind: PhaseKind, iteration: int | None) -> PhaseLike | None:
        try:
            phase = self._source.phase(kind, iteration=iteration)
            phase.__enter__()
        except Exception:
            self._warn_once("begin", f"the {kind.value} phase could not begin")
            return None
        return phase

    def report(self, phase: PhaseLike | None, count: Callable[[], Workload]) -> None:
        if phase is None:
            return
        try:
            phase.report_workload(count())
        except Exception:
            self._warn_once("report", "could not count the tokens of a batch; the phase reports none")

    def end(self, phase: PhaseLike | None) -> None:
        if phase is None:
            return
        try:
            phase.__exit__(None, None, None)
        except Exception:
            self._warn_once("end", "a phase could not end")

    def count(self, count: Callable[[], Workload]) -> Workload:
        """``count()``, or an empty workload (logged once) when it raises."""
        try:
            return count()
        except Exception:
            self._warn_once("report", "could not count the tokens of a batch; the phase reports none")
            return Workload()

    def _warn_once(self, key: str, message: str) -> None:
        text = f"eerl: {self._framework} hook: {message}; training goes on"
        if key in self._warned:
            logger.debug(text, exc_info=True)
            return
        self._warned.add(key)
        logger.warning(text, exc_info=True)
