"""NodeLink (eerl.job.node) against a real in-process eerld: job-mode sessions, directives, never raising."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from eerl import ClientConfig
from eerl.directives import Directive, DirectivePurpose, DirectiveVerdict
from eerl.job import NodeReport
from eerl.job.node import NodeLink, _intersection
from eerl.phases import ExecutionMode, GpuRole, PhaseKind, Workload
from eerl.v1 import eerl_pb2

from eerld.testing import FAKE_SM_CLOCKS_MHZ, DaemonHandle, running_daemon

GEN, TRAIN = PhaseKind.GENERATION, PhaseKind.TRAINING
WORK = Workload(tokens=4096, valid_tokens=2048, sequences=16)


def wait_until(predicate, timeout_s: float = 3.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


@pytest.fixture
def daemon(sock_dir: Path) -> Iterator[DaemonHandle]:
    with running_daemon(sock_dir, controller="off", fixed_clocks="") as handle:
        yield handle


def link_to(path: Path, **kwargs: object) -> NodeLink:
    options: dict[str, object] = {"job_id": "job-1", "node_rank": 0, "incarnation": 7, "gpus": [0, 1]}
    options.update(kwargs)
    return NodeLink(ClientConfig.uds(path), reopen_initial_s=0.01, reopen_max_s=0.05, **options)  # type: ignore[arg-type]


def directive(iteration: int, kind: PhaseKind, clock: int | None, *, epoch: int = 1) -> Directive:
    purpose = DirectivePurpose.CONTROL if clock is None else DirectivePurpose.COMMITTED
    return Directive(
        incarnation=7, epoch=epoch, iteration=iteration, kind=kind, sm_clock_mhz=clock, purpose=purpose
    )


def test_opens_a_job_mode_session_with_the_grid(daemon: DaemonHandle) -> None:
    with link_to(daemon.socket_path) as link:
        assert link.connect()
        assert link.session_epoch == 1
        assert link.gpu_count == 2
        # The GPUs' grid, from the daemon's job floor up (auto: 40 % of the top clock).
        grid = link.supported_sm_clocks_mhz
        assert grid == tuple(c for c in FAKE_SM_CLOCKS_MHZ if c >= grid[0])
        assert grid[-1] == FAKE_SM_CLOCKS_MHZ[-1]
        assert grid[0] >= 0.4 * FAKE_SM_CLOCKS_MHZ[-1]
        (session,) = daemon.daemon.reads.sessions()
        assert session.job_id == "job-1"
        assert session.gpu_indices == (0, 1)
        assert session.attached


def test_a_pool_s_link_opens_an_async_session_with_the_pool_s_role(daemon: DaemonHandle) -> None:
    """A node of one pool (disaggregated placement): async, its role; the daemon refuses the other kind."""
    with link_to(daemon.socket_path, role=GpuRole.TRAINING) as link:
        began = link.begin(directive(0, TRAIN, 1200), TRAIN, 0)
        assert began.verdict is DirectiveVerdict.ACCEPTED
        (session,) = daemon.daemon.reads.sessions()
        assert (session.mode, session.role) == (ExecutionMode.ASYNC, GpuRole.TRAINING)
        link.end(TRAIN, 0, WORK)
        refused = link.begin(directive(1, GEN, 1200), GEN, 1)
        assert refused.verdict is DirectiveVerdict.MISSING
        assert not refused.reached
        assert daemon.backend.locked() == {}


def test_a_directive_clocks_the_phase_and_the_end_reports_the_metering(daemon: DaemonHandle) -> None:
    with link_to(daemon.socket_path) as link:
        began = link.begin(directive(0, GEN, 1200), GEN, 0)
        assert began.reached
        assert began.verdict is DirectiveVerdict.ACCEPTED
        assert began.sm_clock_mhz == 1200
        assert began.applied_epoch == 1
        assert daemon.backend.locked() == {0: 1200, 1: 1200}
        time.sleep(0.05)
        report = link.end(GEN, 0, WORK)
        assert isinstance(report, NodeReport)
        assert report.verdict is DirectiveVerdict.ACCEPTED
        assert report.sm_clock_mhz == 1200
        assert report.applied_epoch == 1
        assert report.session_epoch == 1
        assert report.gpus == 2
        assert report.duration_s > 0.04
        assert report.energy_j > 0
        began = link.begin(directive(0, TRAIN, None, epoch=2), TRAIN, 0)
        assert began.verdict is DirectiveVerdict.ACCEPTED
        assert began.sm_clock_mhz is None
        assert daemon.backend.locked() == {}


def test_no_directive_is_missing_and_falls_back(daemon: DaemonHandle) -> None:
    with link_to(daemon.socket_path) as link:
        link.begin(directive(0, GEN, 1200), GEN, 0)
        link.end(GEN, 0, WORK)
        began = link.begin(None, GEN, 1)
        assert began.reached
        assert began.verdict is DirectiveVerdict.MISSING
        # The last accepted committed clock of that kind, never a trial.
        assert began.sm_clock_mhz == 1200
        report = link.end(GEN, 1, WORK)
        assert report.verdict is DirectiveVerdict.MISSING


def test_an_absent_daemon_costs_little_and_never_raises(
    sock_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    link = NodeLink(
        ClientConfig.uds(sock_dir / "nothing.sock"),
        job_id="job-1",
        node_rank=0,
        incarnation=7,
        gpus=[0, 1],
        timeout_s=0.3,
        reopen_initial_s=60.0,
    )
    opens: list[object] = []
    real_open = link._open
    monkeypatch.setattr(link, "_open", lambda: opens.append(None) or real_open())
    began = link.begin(directive(0, GEN, 1200), GEN, 0)
    report = link.end(GEN, 0, WORK)
    again = link.begin(directive(1, GEN, 1200), GEN, 1)
    # One bounded open attempt: the end does not retry, and the next begin waits out the back-off.
    assert len(opens) == 1
    assert not again.reached
    assert not began.reached
    assert began.verdict is DirectiveVerdict.MISSING
    assert report.verdict is DirectiveVerdict.MISSING
    assert report.gpus == 0
    assert link.session_epoch == 0
    link.close()


def test_end_without_its_begin_is_missing(daemon: DaemonHandle) -> None:
    with link_to(daemon.socket_path) as link:
        link.begin(directive(0, GEN, 1200), GEN, 0)
        report = link.end(TRAIN, 0, WORK)
        assert report.verdict is DirectiveVerdict.MISSING
        assert report.duration_s == 0.0


def test_a_restarted_daemon_gets_a_new_session_epoch(sock_dir: Path) -> None:
    with running_daemon(sock_dir, controller="off", fixed_clocks="") as first:
        link = link_to(first.socket_path)
        assert link.begin(directive(0, GEN, 1200), GEN, 0).reached
        assert link.session_epoch == 1
    # The daemon stopped (its stream ended): the phase's end is missing, the next begin reopens.
    assert wait_until(lambda: not link.connected)
    assert link.end(GEN, 0, WORK).verdict is DirectiveVerdict.MISSING
    with running_daemon(sock_dir, controller="off", fixed_clocks="") as second:
        assert wait_until(lambda: link.begin(directive(1, GEN, 1200, epoch=1), GEN, 1).reached)
        assert link.session_epoch == 2
        assert link.end(GEN, 1, WORK).session_epoch == 2
        assert len(second.daemon.reads.sessions()) == 1
        link.close()


def test_the_holder_s_death_resets_the_node(daemon: DaemonHandle) -> None:
    link = link_to(daemon.socket_path)
    link.begin(directive(0, GEN, 1200), GEN, 0)
    assert daemon.backend.locked() == {0: 1200, 1: 1200}
    # What a dying agent leaves: its stream and channel end, no CloseSession.
    link_state = link._link
    assert link_state is not None
    assert link_state.cancel_attach is not None
    link_state.cancel_attach()
    link_state.link.close()
    assert wait_until(lambda: daemon.backend.locked() == {}, 2.0)
    assert wait_until(lambda: not daemon.daemon.reads.sessions(), 2.0)


def test_close_returns_the_gpus_to_default(daemon: DaemonHandle) -> None:
    link = link_to(daemon.socket_path)
    link.begin(directive(0, GEN, 1200), GEN, 0)
    link.close()
    link.close()
    assert daemon.backend.locked() == {}
    assert not daemon.daemon.reads.sessions()
    assert link.begin(directive(1, GEN, 1200), GEN, 1).verdict is DirectiveVerdict.MISSING


def test_a_disabled_or_gpu_less_link_does_nothing() -> None:
    off = NodeLink(ClientConfig.disabled_config(), job_id="j", node_rank=3, incarnation=1)
    assert not off.enabled
    assert not off.connect()
    assert off.begin(None, GEN, 0).node_rank == 3
    assert off.end(GEN, 0).verdict is DirectiveVerdict.MISSING
    gpu_less = NodeLink(
        ClientConfig.uds("/nonexistent.sock"), job_id="j", node_rank=0, incarnation=1, gpus=[]
    )
    assert not gpu_less.enabled


def test_a_sidecar_config_is_refused_with_one_warning_naming_the_socket(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A sidecar holds a one-node session: a node agent given EERL_SIDECAR says so and stays off."""
    link = NodeLink(
        ClientConfig.sidecar("http://127.0.0.1:9"), job_id="j", node_rank=1, incarnation=1, gpus=[0]
    )
    assert not link.enabled
    assert not link.connect()
    assert link.begin(None, GEN, 0).verdict is DirectiveVerdict.MISSING
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert "EERL_SIDECAR" in warnings[0]
    assert "EERL_SOCKET" in warnings[0]


def test_a_bug_inside_never_reaches_the_job(daemon: DaemonHandle, monkeypatch: pytest.MonkeyPatch) -> None:
    with link_to(daemon.socket_path) as link:
        monkeypatch.setattr(link, "_begin", lambda *a: 1 / 0)
        assert link.begin(None, GEN, 0).verdict is DirectiveVerdict.MISSING


def test_supported_clocks_are_the_intersection_over_the_gpus() -> None:
    gpus = [
        eerl_pb2.GpuInfo(index=0, supported_sm_clocks_mhz=[600, 900, 1200, 1500]),
        eerl_pb2.GpuInfo(index=1, supported_sm_clocks_mhz=[900, 1200, 1980]),
    ]
    assert _intersection(gpus) == (900, 1200)
    assert _intersection([eerl_pb2.GpuInfo(index=0)]) == ()
