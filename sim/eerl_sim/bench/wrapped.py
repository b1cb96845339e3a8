"""A controller that hands every call to the EE-RL controller it wraps: the base of the bench's spies."""

from __future__ import annotations

from collections.abc import Sequence

from eerl.control.base import ControllerSettings, Decision, PhaseObservation, PhaseSnapshot
from eerl.control.eerl import create_eerl_controller
from eerl.phases import ControllerState, PhaseKind, Workload


class WrappedController:
    """The EE-RL controller behind every call; a subclass overrides the calls it watches or changes."""

    def __init__(self, settings: ControllerSettings) -> None:
        self.inner = create_eerl_controller(settings)

    def decide(self, kind: PhaseKind, iteration: int, hints: Workload | None, now_s: float) -> Decision:
        return self.inner.decide(kind, iteration, hints, now_s)

    def observe(self, observation: PhaseObservation, now_s: float) -> Decision | None:
        return self.inner.observe(observation, now_s)

    def snapshot(self) -> Sequence[PhaseSnapshot]:
        return self.inner.snapshot()

    def state_of(self, kind: PhaseKind) -> ControllerState | None:
        return self.inner.state_of(kind)

    def decisions(self) -> Sequence[Decision]:
        return self.inner.decisions()
