"""Fixtures for the daemon tests: a short socket directory, an in-process daemon on real Unix sockets."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import grpc
import pytest
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.testing import DaemonHandle, FakeGpuBackend, ManualClock, running_daemon

REPO_ROOT = Path(__file__).resolve().parents[2]


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
