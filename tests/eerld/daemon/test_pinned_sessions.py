"""A session whose GPUs an admin pins: the controller waits, says why, and resumes at once after unpin.

Before: with GPU 1 pinned, a session on GPUs 0 and 1 stayed in ``baseline`` for its whole life (the
controller was fed phases at the pin's clock, which it had not chosen, and learned nothing from them),
``eerlctl sessions`` showed ``default`` while ``status`` showed GPU 1 locked, and nothing said why.

The rule (docs/operations.md, "Pins and sessions"): while an admin pin holds any GPU of a session, that
session's phases run with the pinned GPUs at the pin's clock and its other GPUs at the default governor;
its controller is not asked and learns nothing; the phases are metered and counted as held by a pin.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from eerl.control.eerl import create_eerl_controller
from eerl.phases import ControllerState, PhaseKind, Workload
from structlog.testing import capture_logs

from eerld.daemon import Daemon
from eerld.testing import FakeGpuBackend, ManualClock
from tests.eerld.conftest import gpu_spec

GEN, TRAIN = PhaseKind.GENERATION, PhaseKind.TRAINING
PIN_MHZ = 990


@pytest.fixture
def eerl_hub(sock_dir, fake: FakeGpuBackend, clock: ManualClock) -> Iterator[Daemon]:
    """The hub with the EE-RL controller (the one a pin used to freeze)."""
    hub = Daemon(
        fake, sock_dir, controller_name="eerl", controller_factory=create_eerl_controller, clock=clock,
        wall_clock=clock,
    )  # fmt: skip
    hub.start()
    yield hub
    if not hub.stopping:
        hub.shutdown()


def _iteration(hub: Daemon, clock: ManualClock, sid: str, i: int) -> list[ControllerState]:
    states = []
    for kind, seconds in ((GEN, 2.0), (TRAIN, 1.0)):
        began = hub.phases.begin_phase(sid, kind, i, None)
        states.append(began.state)
        clock.advance(seconds)
        hub.phases.end_phase(sid, kind, i, Workload(tokens=1000, valid_tokens=500 if kind is TRAIN else 0))
    return states


def _controller_phases(hub: Daemon, sid: str) -> int:
    return sum(s.phases for s in hub.book.registry.get(sid).controller.snapshot())


class TestAPinnedSession:
    def test_the_controller_waits_says_why_and_the_other_gpus_run_the_default_governor(
        self, eerl_hub: Daemon, fake: FakeGpuBackend, clock: ManualClock
    ) -> None:
        sid = eerl_hub.book.open_session(gpu_spec(0, 1, job_id="pinned-job")).session_id
        eerl_hub.admin.pin([gpu_spec(1).gpus[0]], PIN_MHZ, 0, 0.0, "maintenance")
        with capture_logs() as logs:
            states = [s for i in range(3) for s in _iteration(eerl_hub, clock, sid, i)]
        assert set(states) == {ControllerState.PINNED}
        assert fake.locked() == {1: PIN_MHZ}  # GPU 0 at the default governor, GPU 1 at the pin
        assert _controller_phases(eerl_hub, sid) == 0  # nothing learned from phases it did not choose
        view = next(s for s in eerl_hub.reads.sessions() if s.session_id == sid)
        assert {p.state for p in view.phases} == {ControllerState.PINNED}
        decisions = [d.decision for d in eerl_hub.reads.decisions(sid)]
        assert decisions
        assert 'admin pin on GPU 1 (990 MHz, "maintenance")' in decisions[-1].reason
        warnings = [e for e in logs if e["event"] == "session_pinned"]
        assert len(warnings) == 1  # once, not per phase
        assert warnings[0]["gpu_indices"] == [1]

    def test_control_resumes_at_the_next_phase_after_unpin(
        self, eerl_hub: Daemon, fake: FakeGpuBackend, clock: ManualClock
    ) -> None:
        sid = eerl_hub.book.open_session(gpu_spec(0, 1)).session_id
        eerl_hub.admin.pin([gpu_spec(1).gpus[0]], PIN_MHZ, 0, 0.0, "maintenance")
        _iteration(eerl_hub, clock, sid, 0)
        eerl_hub.admin.unpin([gpu_spec(1).gpus[0]])
        with capture_logs() as logs:
            states = _iteration(eerl_hub, clock, sid, 1)
        assert ControllerState.PINNED not in states
        assert _controller_phases(eerl_hub, sid) == 2
        assert [e["event"] for e in logs if e["event"].startswith("session_")].count("session_unpinned") == 1

    def test_the_report_counts_the_phases_a_pin_held(self, eerl_hub: Daemon, clock: ManualClock) -> None:
        sid = eerl_hub.book.open_session(gpu_spec(0, 1, job_id="pinned-job")).session_id
        eerl_hub.admin.pin([gpu_spec(1).gpus[0]], PIN_MHZ, 0, 0.0, "maintenance")
        _iteration(eerl_hub, clock, sid, 0)
        _iteration(eerl_hub, clock, sid, 1)
        eerl_hub.admin.unpin(None)
        _iteration(eerl_hub, clock, sid, 2)
        eerl_hub.book.close_session(sid)
        report = eerl_hub.reports.of_session(sid)
        assert report is not None
        assert [(k.kind, k.phases, k.pinned_phases) for k in report.kinds] == [(GEN, 3, 2), (TRAIN, 3, 2)]
        assert "4 phases held by an admin pin" in report.summary()
