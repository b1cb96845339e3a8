"""The daemon's events (:mod:`eerld.daemon.events`): subscribe, publish, unsubscribe; an observer that
raises is logged and fails nothing."""

from __future__ import annotations

from eerl.directives import DirectiveVerdict
from eerl.phases import ControllerState, PhaseKind
from structlog.testing import capture_logs

from eerld.daemon import DirectiveRecord, PhaseRecord
from eerld.daemon.events import Events

PHASE = PhaseRecord(
    session_id="s",
    job_id="j",
    rank=0,
    kind=PhaseKind.GENERATION,
    iteration=1,
    duration_s=1.0,
    energy_mj=1000.0,
    tokens=10,
    valid_tokens=8,
    sm_clock_mhz=1200,
    gpu_indices=(0,),
    state=ControllerState.FIXED,
)
DIRECTIVE = DirectiveRecord("j", 0, PhaseKind.GENERATION, 1, DirectiveVerdict.ACCEPTED, 1200)


def _broken(*_args: object) -> None:
    raise RuntimeError("observer bug")


class TestEvents:
    def test_each_kind_of_event_reaches_its_own_subscribers_in_order(self) -> None:
        events = Events()
        seen: list[object] = []
        events.subscribe(on_rpc=lambda *rpc: seen.append(("first", rpc)), on_phase=seen.append)
        events.subscribe(on_rpc=lambda *rpc: seen.append(("second", rpc)), on_directive=seen.append)
        events.rpc_done("BeginPhase", "OK", 0.5)
        events.phase_ended(PHASE)
        events.directive_judged(DIRECTIVE)
        rpc = ("BeginPhase", "OK", 0.5)
        assert seen == [("first", rpc), ("second", rpc), PHASE, DIRECTIVE]

    def test_the_counts_and_wants_follow_subscriptions_and_unsubscribe_is_idempotent(self) -> None:
        events = Events()
        assert (events.subscribers, events.directive_subscribers) == ((0, 0), 0)
        assert not events.wants_phases
        assert not events.wants_directives
        phases: list[PhaseRecord] = []
        unsubscribe = events.subscribe(on_rpc=lambda *_: None, on_phase=phases.append, on_directive=print)
        assert (events.subscribers, events.directive_subscribers) == ((1, 1), 1)
        assert events.wants_phases
        assert events.wants_directives
        unsubscribe()
        unsubscribe()
        assert (events.subscribers, events.directive_subscribers) == ((0, 0), 0)
        events.phase_ended(PHASE)
        assert phases == []

    def test_unsubscribing_one_of_two_equal_observers_keeps_the_other(self) -> None:
        events = Events()
        phases: list[PhaseRecord] = []
        first = events.subscribe(on_phase=phases.append)
        events.subscribe(on_phase=phases.append)
        first()
        events.phase_ended(PHASE)
        assert phases == [PHASE]

    def test_an_observer_that_raises_is_logged_and_the_others_still_run(self) -> None:
        events = Events()
        seen: list[object] = []
        events.subscribe(on_rpc=_broken, on_phase=_broken, on_directive=_broken)
        events.subscribe(on_rpc=lambda *rpc: seen.append(rpc), on_phase=seen.append, on_directive=seen.append)
        with capture_logs() as logs:
            events.rpc_done("EndPhase", "OK", 0.1)
            events.phase_ended(PHASE)
            events.directive_judged(DIRECTIVE)
        assert seen == [("EndPhase", "OK", 0.1), PHASE, DIRECTIVE]
        assert [e["event"] for e in logs] == [
            "rpc_observer_error",
            "phase_observer_error",
            "directive_observer_error",
        ]
