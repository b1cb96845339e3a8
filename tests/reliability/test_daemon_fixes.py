"""Regression tests for daemon bugs the reliability work found."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.errors import GpuLost, NoPermission
from eerld.testing import FakeGpuBackend, ManualClock, running_daemon


def _status(admin_socket: Path) -> pb.StatusResponse:
    with grpc.insecure_channel(f"unix:{admin_socket}") as channel:
        response: pb.StatusResponse = pb_grpc.AdminServiceStub(channel).Status(pb.StatusRequest(), timeout=10)
        return response


def test_status_names_a_failed_power_or_energy_read_as_the_gpus_degraded_reason(sock_dir: Path) -> None:
    clock = ManualClock()
    fake = FakeGpuBackend(2, clock=clock)
    fake.fail(1, "total_energy_mj", GpuLost("fell off the bus", gpu_index=1))
    with running_daemon(sock_dir, backend=fake, clock=clock, reaper=False) as handle:
        gpus = _status(handle.admin_socket_path).gpus
    assert "GpuLost" in gpus[1].degraded_reason
    assert gpus[0].degraded_reason == ""


def test_a_gpu_whose_supported_clocks_cannot_be_read_does_not_keep_the_daemon_from_serving_the_others(
    sock_dir: Path,
) -> None:
    clock = ManualClock()
    fake = FakeGpuBackend(2, clock=clock)
    fake.fail(1, "supported_sm_clocks_mhz", NoPermission("query refused", gpu_index=1))
    with (
        running_daemon(sock_dir, backend=fake, clock=clock, reaper=False) as handle,
        grpc.insecure_channel(f"unix:{handle.socket_path}") as channel,
    ):
        stub = pb_grpc.PhaseServiceStub(channel)
        sid = stub.OpenSession(pb.OpenSessionRequest(job_id="j", gpus=[pb.GpuRef(index=0)])).session_id
        began = stub.BeginPhase(pb.BeginPhaseRequest(session_id=sid, kind=pb.PHASE_KIND_GENERATION))
    assert [c.sm_clock_mhz for c in began.clocks] == [1200]


def test_bytes_that_are_not_a_protobuf_message_get_invalid_argument_not_internal(sock_dir: Path) -> None:
    with (
        running_daemon(sock_dir, reaper=False) as handle,
        grpc.insecure_channel(f"unix:{handle.socket_path}") as channel,
    ):
        raw = channel.unary_unary(
            "/eerl.v1.PhaseService/BeginPhase",
            request_serializer=lambda data: data,
            response_deserializer=lambda data: data,
        )
        with pytest.raises(grpc.RpcError) as raised:
            raw(b"\xff\xff\xff", timeout=10)
    assert raised.value.code() is grpc.StatusCode.INVALID_ARGUMENT
