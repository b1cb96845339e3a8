"""The daemon's events: who is told after every RPC, every metered phase and every judged directive.

:class:`Events` keeps three tuples of observers, replaced whole under a small lock when someone subscribes
or unsubscribes, and read without the lock when an event is published (a tuple is never changed in
place, so a publisher sees a consistent set). Observers run on the publishing thread (an RPC's, the
phase's) and must be quick; one that raises is logged (``rpc_observer_error``, ``phase_observer_error``,
``directive_observer_error``) and never fails the event. :attr:`Events.wants_phases` and
:attr:`Events.wants_directives` let the phase path skip building a record nobody reads (metrics off).
"""

from __future__ import annotations

import threading
from typing import TypeVar

import structlog

from eerld.daemon.views import (
    DirectiveObserver,
    DirectiveRecord,
    PhaseObserver,
    PhaseRecord,
    RpcObserver,
    Unsubscribe,
)

log = structlog.get_logger("eerld.daemon")
_T = TypeVar("_T")


class Events:
    """Subscribe and publish: RPC, phase and directive observers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rpc: tuple[RpcObserver, ...] = ()
        self._phase: tuple[PhaseObserver, ...] = ()
        self._directive: tuple[DirectiveObserver, ...] = ()

    def subscribe(
        self,
        *,
        on_rpc: RpcObserver | None = None,
        on_phase: PhaseObserver | None = None,
        on_directive: DirectiveObserver | None = None,
    ) -> Unsubscribe:
        """Call ``on_rpc`` after every RPC, ``on_phase`` after every metered phase and ``on_directive`` after
        every job-mode BeginPhase (with its verdict), until unsubscribed.

        Subscribers run on the calling thread (an RPC's, the phase's) and must be quick; one that raises is
        logged and never fails the event. The returned callable ends the subscription; idempotent.
        """
        with self._lock:
            if on_rpc is not None:
                self._rpc = (*self._rpc, on_rpc)
            if on_phase is not None:
                self._phase = (*self._phase, on_phase)
            if on_directive is not None:
                self._directive = (*self._directive, on_directive)

        def unsubscribe() -> None:
            with self._lock:
                self._rpc = _without(self._rpc, on_rpc)
                self._phase = _without(self._phase, on_phase)
                self._directive = _without(self._directive, on_directive)

        return unsubscribe

    @property
    def subscribers(self) -> tuple[int, int]:
        """How many RPC and phase subscribers there are (a closed metrics server leaves none behind)."""
        return len(self._rpc), len(self._phase)

    @property
    def directive_subscribers(self) -> int:
        """How many directive subscribers there are (the metrics endpoint subscribes one)."""
        return len(self._directive)

    @property
    def wants_phases(self) -> bool:
        """Whether anyone reads phase records (build one only then)."""
        return bool(self._phase)

    @property
    def wants_directives(self) -> bool:
        """Whether anyone reads directive records (build one only then)."""
        return bool(self._directive)

    def rpc_done(self, method: str, code: str, duration_s: float) -> None:
        """Publish one handled RPC to the RPC subscribers (the API's interceptor calls this)."""
        for observer in self._rpc:
            try:
                observer(method, code, duration_s)
            except Exception:
                log.exception("rpc_observer_error")

    def phase_ended(self, record: PhaseRecord) -> None:
        """Publish one metered phase to the phase subscribers."""
        for observer in self._phase:
            try:
                observer(record)
            except Exception:
                log.exception("phase_observer_error")

    def directive_judged(self, record: DirectiveRecord) -> None:
        """Publish one judged directive to the directive subscribers."""
        for observer in self._directive:
            try:
                observer(record)
            except Exception:
                log.exception("directive_observer_error")


def _without(observers: tuple[_T, ...], observer: _T | None) -> tuple[_T, ...]:
    if observer is None or observer not in observers:
        return observers
    index = observers.index(observer)
    return observers[:index] + observers[index + 1 :]


__all__ = ["Events"]
