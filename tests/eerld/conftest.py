"""Fixtures for the daemon tests: a short socket directory, an in-process daemon on real Unix sockets, and
the hub alone (:class:`~eerld.daemon.Daemon` with its components, no gRPC) for the components' own tests."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import grpc
import pytest
from eerl.control.simple import create_fixed_controller
from eerl.phases import ExecutionMode, GpuRole, PhaseKind
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.daemon import Daemon
from eerld.sessions import GpuSelector, JobModeSpec, SessionSpec
from eerld.testing import DaemonHandle, FakeGpuBackend, ManualClock, running_daemon

HUB_CLOCK_MHZ = 1200
"""The clock the hub's fixed controller asks for, in every phase."""

REPO_ROOT = Path(__file__).resolve().parents[3]


DaemonFactory = Callable[..., AbstractContextManager[DaemonHandle]]


@pytest.fixture
def start_daemon(sock_dir: Path, fake: FakeGpuBackend, clock: ManualClock) -> DaemonFactory:
    """Start an in-process daemon (fixed controller, manual clock, no reaper thread) in ``sock_dir``."""

    def start(**kwargs: Any) -> AbstractContextManager[DaemonHandle]:
        kwargs.setdefault("backend", fake)
        kwargs.setdefault("clock", clock)
        kwargs.setdefault("reaper", False)
        return running_daemon(sock_dir, **kwargs)

    return start


@pytest.fixture
def daemon(start_daemon: DaemonFactory) -> Iterator[DaemonHandle]:
    """A running daemon with the defaults of ``start_daemon``."""
    with start_daemon() as handle:
        yield handle


@pytest.fixture
def hub(sock_dir: Path, fake: FakeGpuBackend, clock: ManualClock) -> Iterator[Daemon]:
    """The hub alone over the fake GPUs: fixed controller at :data:`HUB_CLOCK_MHZ`, manual clocks (the
    wall clock too), started, no reaper and no gRPC; shut down at the end."""
    hub = Daemon(
        fake,
        sock_dir,
        controller_name="fixed",
        controller_factory=create_fixed_controller,
        fixed_clocks_mhz={PhaseKind.GENERATION: HUB_CLOCK_MHZ, PhaseKind.TRAINING: HUB_CLOCK_MHZ},
        clock=clock,
        wall_clock=clock,
    )
    hub.start()
    yield hub
    if not hub.stopping:
        hub.shutdown()


def gpu_spec(
    *gpus: int, job_id: str = "job", job: JobModeSpec | None = None, lease_ttl_s: float | None = None
) -> SessionSpec:
    """An OpenSession request for GPUs by index (synchronous, both kinds)."""
    selectors = tuple(GpuSelector(f"gpus[{i}]", index=g) for i, g in enumerate(gpus))
    return SessionSpec(job_id, 0, 0, selectors, ExecutionMode.SYNC, GpuRole.BOTH, None, lease_ttl_s, job=job)


@pytest.fixture
def phase(daemon: DaemonHandle) -> Iterator[pb_grpc.PhaseServiceStub]:
    """A PhaseService stub on the worker socket."""
    with grpc.insecure_channel(f"unix:{daemon.socket_path}") as channel:
        yield pb_grpc.PhaseServiceStub(channel)


@pytest.fixture
def admin(daemon: DaemonHandle) -> Iterator[pb_grpc.AdminServiceStub]:
    """An AdminService stub on the admin socket."""
    with grpc.insecure_channel(f"unix:{daemon.admin_socket_path}") as channel:
        yield pb_grpc.AdminServiceStub(channel)


def open_session(
    stub: pb_grpc.PhaseServiceStub, *gpus: int, job_id: str = "job-1", **kwargs: Any
) -> pb.OpenSessionResponse:
    """Open a session on GPUs by index."""
    request = pb.OpenSessionRequest(job_id=job_id, gpus=[pb.GpuRef(index=i) for i in gpus], **kwargs)
    response: pb.OpenSessionResponse = stub.OpenSession(request)
    return response


def begin(
    stub: pb_grpc.PhaseServiceStub, session_id: str, kind: int, iteration: int
) -> pb.BeginPhaseResponse:
    """BeginPhase without hints."""
    response: pb.BeginPhaseResponse = stub.BeginPhase(
        pb.BeginPhaseRequest(session_id=session_id, kind=kind, iteration=iteration)
    )
    return response


def end(
    stub: pb_grpc.PhaseServiceStub, session_id: str, kind: int, iteration: int, tokens: int = 1000
) -> pb.EndPhaseResponse:
    """EndPhase with a simple workload."""
    response: pb.EndPhaseResponse = stub.EndPhase(
        pb.EndPhaseRequest(
            session_id=session_id,
            kind=kind,
            iteration=iteration,
            workload=pb.Workload(tokens=tokens, valid_tokens=tokens // 2, sequences=8),
        )
    )
    return response


GEN = pb.PHASE_KIND_GENERATION
TRAIN = pb.PHASE_KIND_TRAINING
