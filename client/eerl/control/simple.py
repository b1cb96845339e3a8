"""The two controllers that need no learning: ``fixed`` (configured clocks per phase) and ``off`` (meters).

``fixed`` serves a user who already knows good clocks; ``off`` lets eerld meter energy per phase with the
default governor in charge. Both are pure, like every controller (see :mod:`eerl.control.base`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from eerl.clocks import nearest_supported_mhz
from eerl.control.base import ControllerSettings, Decision, PhaseObservation, PhaseSnapshot
from eerl.phases import ControllerState, PhaseKind, Workload

HISTORY_LIMIT = 1000


class _HistoryController:
    """Shared bookkeeping: one state per kind, a bounded decision history, phase counts."""

    def __init__(self, settings: ControllerSettings, state: ControllerState) -> None:
        self._settings = settings
        self._state = state
        self._history: deque[Decision] = deque(maxlen=HISTORY_LIMIT)
        self._phases: dict[PhaseKind, int] = dict.fromkeys(settings.kinds, 0)

    def _clock_for(self, kind: PhaseKind) -> int | None:
        raise NotImplementedError

    def _reason(self, kind: PhaseKind, clock_mhz: int | None) -> str:
        raise NotImplementedError

    def decide(self, kind: PhaseKind, iteration: int, hints: Workload | None, now_s: float) -> Decision:
        """The configured clock for the phase (None: default governor)."""
        clock_mhz = self._clock_for(kind) if kind in self._settings.kinds else None
        decision = Decision(kind, iteration, clock_mhz, self._state, self._reason(kind, clock_mhz), now_s)
        self._history.append(decision)
        return decision

    def observe(self, observation: PhaseObservation, now_s: float) -> Decision | None:
        """Count the phase; nothing is learned, so no verdict."""
        if observation.kind in self._phases:
            self._phases[observation.kind] += 1
        return None

    def snapshot(self) -> Sequence[PhaseSnapshot]:
        """State and clock per phase kind."""
        return [
            PhaseSnapshot(kind=k, state=self._state, sm_clock_mhz=self._clock_for(k), phases=self._phases[k])
            for k in self._settings.kinds
        ]

    def state_of(self, kind: PhaseKind) -> ControllerState | None:
        """The one state of this controller, for the kinds it decides for."""
        return self._state if kind in self._phases else None

    def decisions(self) -> Sequence[Decision]:
        """Decision history, oldest first."""
        return list(self._history)


class FixedController(_HistoryController):
    """Applies the configured clock of each phase kind, snapped to the nearest supported clock."""

    def __init__(self, settings: ControllerSettings) -> None:
        super().__init__(settings, ControllerState.FIXED)
        supported = settings.supported_sm_clocks_mhz
        self._clocks: dict[PhaseKind, int] = {
            kind: nearest_supported_mhz(supported, mhz) if supported else mhz
            for kind, mhz in settings.fixed_clocks_mhz.items()
        }

    def _clock_for(self, kind: PhaseKind) -> int | None:
        return self._clocks.get(kind)

    def _reason(self, kind: PhaseKind, clock_mhz: int | None) -> str:
        if clock_mhz is None:
            return f"no fixed clock configured for {kind.value}: default governor"
        return f"fixed clock {clock_mhz} MHz for {kind.value}"


class OffController(_HistoryController):
    """Never locks: the default governor holds and eerld only meters."""

    def __init__(self, settings: ControllerSettings) -> None:
        super().__init__(settings, ControllerState.OFF)

    def _clock_for(self, kind: PhaseKind) -> int | None:
        return None

    def _reason(self, kind: PhaseKind, clock_mhz: int | None) -> str:
        return "controller off: default governor, metering only"


def create_fixed_controller(settings: ControllerSettings) -> FixedController:
    """Factory for ``--controller fixed``."""
    return FixedController(settings)


def create_off_controller(settings: ControllerSettings) -> OffController:
    """Factory for ``--controller off``."""
    return OffController(settings)
