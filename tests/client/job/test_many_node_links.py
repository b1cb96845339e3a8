"""Many NodeLinks in one process on one socket (issue 32, item 4): each job-mode session works.

eerld lets one connection hold 8 streams and each session keeps one (its Attach stream); a process whose
channels shared one connection (gRPC's default for the same target and options) had no stream left for a
phase event from its eighth session on. Every link's channel now has a connection of its own.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from eerl import ClientConfig
from eerl.directives import Directive, DirectivePurpose, DirectiveVerdict
from eerl.job.node import NodeLink
from eerl.phases import PhaseKind, Workload

from eerld.testing import DaemonHandle, FakeGpuBackend, running_daemon

LINKS = 16
"""Twice the streams eerld lets one connection hold."""
GEN = PhaseKind.GENERATION


@pytest.fixture
def daemon(sock_dir: Path) -> Iterator[DaemonHandle]:
    with running_daemon(sock_dir, backend=FakeGpuBackend(LINKS), controller="off", fixed_clocks="") as handle:
        yield handle


def committed(clock: int) -> Directive:
    return Directive(
        incarnation=1, epoch=1, iteration=0, kind=GEN, sm_clock_mhz=clock, purpose=DirectivePurpose.COMMITTED
    )


def test_one_process_holds_sixteen_job_mode_sessions_on_one_socket(daemon: DaemonHandle) -> None:
    config = ClientConfig.uds(daemon.socket_path)
    links = [
        NodeLink(config, job_id=f"job-{i}", node_rank=0, incarnation=1, gpus=[i], timeout_s=10.0)
        for i in range(LINKS)
    ]
    try:
        assert [link.connect() for link in links] == [True] * LINKS
        began = [link.begin(committed(1200), GEN, 0) for link in links]
        assert [(b.reached, b.verdict, b.sm_clock_mhz) for b in began] == [
            (True, DirectiveVerdict.ACCEPTED, 1200)
        ] * LINKS
        assert daemon.backend.locked() == dict.fromkeys(range(LINKS), 1200)  # type: ignore[attr-defined]
        ended = [link.end(GEN, 0, Workload(tokens=100)) for link in links]
        assert [e.verdict for e in ended] == [DirectiveVerdict.ACCEPTED] * LINKS
        assert all(session.attached for session in daemon.daemon.reads.sessions())
        assert len(daemon.daemon.reads.sessions()) == LINKS
    finally:
        for link in links:
            link.close()
