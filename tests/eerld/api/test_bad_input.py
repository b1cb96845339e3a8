"""Bad input on every RPC: the right status code, a message naming the field, and no state change."""

from __future__ import annotations

import math

import grpc
import pytest
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from tests.eerld.conftest import GEN, begin, open_session

SID = "<session>"
UNKNOWN_SID = "A" * 32
ABSURD = 10**15
NEGATIVE_5_AS_UINT64 = 2**64 - 5
INVALID = grpc.StatusCode.INVALID_ARGUMENT
NOT_FOUND = grpc.StatusCode.NOT_FOUND


def ref(i: int) -> pb.GpuRef:
    return pb.GpuRef(index=i)


def open_req(**kwargs) -> pb.OpenSessionRequest:
    kwargs.setdefault("job_id", "job-2")
    kwargs.setdefault("gpus", [ref(1)])
    return pb.OpenSessionRequest(**kwargs)


def work(**kwargs) -> pb.Workload:
    kwargs.setdefault("tokens", 100)
    return pb.Workload(**kwargs)


CASES = [
    # (service, method, request, code, text the message must contain)
    ("phase", "OpenSession", open_req(job_id=""), INVALID, "job_id"),
    ("phase", "OpenSession", open_req(gpus=[]), INVALID, "gpus"),
    ("phase", "OpenSession", open_req(gpus=[pb.GpuRef()]), INVALID, "gpus[0]"),
    ("phase", "OpenSession", open_req(gpus=[ref(1), ref(9)]), NOT_FOUND, "gpus[1]"),
    ("phase", "OpenSession", open_req(gpus=[pb.GpuRef(uuid="GPU-nope")]), NOT_FOUND, "gpus[0]"),
    ("phase", "OpenSession", open_req(gpus=[pb.GpuRef(uuid="nope")]), INVALID, "gpus[0].uuid"),
    ("phase", "OpenSession", open_req(gpus=[pb.GpuRef(uuid="3")]), INVALID, "gpus[0].uuid"),
    ("phase", "OpenSession", open_req(gpus=[pb.GpuRef(index=5000)]), INVALID, "gpus[0].index"),
    ("phase", "OpenSession", open_req(gpus=[ref(1), ref(1)]), INVALID, "gpus[1]"),
    ("phase", "OpenSession", open_req(gpus=[ref(0)]), grpc.StatusCode.FAILED_PRECONDITION, "GPU 0"),
    ("phase", "OpenSession", open_req(lease_ttl_s=math.nan), INVALID, "lease_ttl_s"),
    ("phase", "OpenSession", open_req(lease_ttl_s=-1.0), INVALID, "lease_ttl_s"),
    (
        "phase",
        "OpenSession",
        open_req(policy=pb.Policy(throughput_threshold=1.5)),
        INVALID,
        "throughput_threshold",
    ),
    (
        "phase",
        "OpenSession",
        open_req(policy=pb.Policy(throughput_threshold=math.inf)),
        INVALID,
        "throughput",
    ),
    ("phase", "OpenSession", open_req(mode=9), INVALID, "mode"),
    ("phase", "OpenSession", open_req(role=9), INVALID, "role"),
    ("phase", "OpenSession", open_req(mode=pb.EXECUTION_MODE_ASYNC), INVALID, "role"),
    ("phase", "OpenSession", open_req(rank=4, world_size=4), INVALID, "rank"),
    ("phase", "OpenSession", open_req(client_name="x" * 1000), INVALID, "client_name"),
    ("phase", "Attach", pb.AttachRequest(), INVALID, "session_id"),
    ("phase", "Attach", pb.AttachRequest(session_id=UNKNOWN_SID), NOT_FOUND, "session_id"),
    ("phase", "BeginPhase", pb.BeginPhaseRequest(kind=GEN, iteration=1), INVALID, "session_id"),
    ("phase", "BeginPhase", pb.BeginPhaseRequest(session_id="bad id!", kind=GEN), INVALID, "session_id"),
    ("phase", "BeginPhase", pb.BeginPhaseRequest(session_id=UNKNOWN_SID, kind=GEN), NOT_FOUND, "session_id"),
    ("phase", "BeginPhase", pb.BeginPhaseRequest(session_id=SID, iteration=1), INVALID, "kind"),
    ("phase", "BeginPhase", pb.BeginPhaseRequest(session_id=SID, kind=7, iteration=1), INVALID, "kind"),
    (
        "phase",
        "BeginPhase",
        pb.BeginPhaseRequest(session_id=SID, kind=GEN, iteration=ABSURD),
        INVALID,
        "iteration",
    ),
    (
        "phase",
        "BeginPhase",
        pb.BeginPhaseRequest(session_id=SID, kind=GEN, iteration=1, hints=work(tokens=ABSURD)),
        INVALID,
        "hints.tokens",
    ),
    ("phase", "EndPhase", pb.EndPhaseRequest(session_id=SID, kind=GEN, iteration=0), INVALID, "workload"),
    (
        "phase",
        "EndPhase",
        pb.EndPhaseRequest(session_id=SID, kind=GEN, iteration=0, workload=work(tokens=NEGATIVE_5_AS_UINT64)),
        INVALID,
        "workload.tokens",
    ),
    (
        "phase",
        "EndPhase",
        pb.EndPhaseRequest(session_id=SID, kind=GEN, iteration=0, workload=work(valid_tokens=101)),
        INVALID,
        "workload.valid_tokens",
    ),
    (
        "phase",
        "EndPhase",
        pb.EndPhaseRequest(session_id=SID, kind=GEN, iteration=0, workload=work(sequences=ABSURD)),
        INVALID,
        "workload.sequences",
    ),
    (
        "phase",
        "EndPhase",
        pb.EndPhaseRequest(
            session_id=SID, kind=GEN, iteration=0, workload=work(max_worker_kv_tokens=NEGATIVE_5_AS_UINT64)
        ),
        INVALID,
        "workload.max_worker_kv_tokens",
    ),
    ("phase", "EndPhase", pb.EndPhaseRequest(session_id=SID, kind=0, workload=work()), INVALID, "kind"),
    ("phase", "Heartbeat", pb.HeartbeatRequest(), INVALID, "session_id"),
    ("phase", "Heartbeat", pb.HeartbeatRequest(session_id=UNKNOWN_SID), NOT_FOUND, "session_id"),
    ("phase", "CloseSession", pb.CloseSessionRequest(), INVALID, "session_id"),
    ("phase", "CloseSession", pb.CloseSessionRequest(session_id=UNKNOWN_SID), NOT_FOUND, "session_id"),
    ("admin", "Pin", pb.PinRequest(sm_clock_mhz=900), INVALID, "gpus"),
    ("admin", "Pin", pb.PinRequest(all=True), INVALID, "sm_clock_mhz"),
    (
        "admin",
        "Pin",
        pb.PinRequest(gpus=[ref(0)], sm_clock_mhz=1234),
        INVALID,
        "nearest supported: 1230, 1245",
    ),
    ("admin", "Pin", pb.PinRequest(all=True, sm_clock_mhz=1234), INVALID, "sm_clock_mhz"),
    (
        "admin",
        "Pin",
        pb.PinRequest(gpus=[ref(0)], sm_clock_mhz=900, mem_clock_mhz=7),
        INVALID,
        "mem_clock_mhz",
    ),
    (
        "admin",
        "Pin",
        pb.PinRequest(gpus=[ref(0)], sm_clock_mhz=900, duration_s=math.nan),
        INVALID,
        "duration_s",
    ),
    ("admin", "Pin", pb.PinRequest(gpus=[ref(0), ref(8)], sm_clock_mhz=900), NOT_FOUND, "gpus[1]"),
    ("admin", "Pin", pb.PinRequest(gpus=[ref(0)], sm_clock_mhz=900, reason="a\x00b"), INVALID, "reason"),
    ("admin", "Unpin", pb.UnpinRequest(), INVALID, "gpus"),
    ("admin", "Unpin", pb.UnpinRequest(gpus=[ref(5000)]), INVALID, "gpus[0].index"),
    ("admin", "GetDecisions", pb.GetDecisionsRequest(limit=10**9), INVALID, "limit"),
    ("admin", "GetDecisions", pb.GetDecisionsRequest(session_id=UNKNOWN_SID), NOT_FOUND, "session_id"),
    ("admin", "GetDecisions", pb.GetDecisionsRequest(kind=9), INVALID, "kind"),
    ("admin", "ResetAll", pb.ResetAllRequest(), INVALID, "gpus"),
    ("admin", "ResetAll", pb.ResetAllRequest(gpus=[ref(9)]), NOT_FOUND, "gpus[0]"),
    ("admin", "ResetAll", pb.ResetAllRequest(all=True, reason="\x1b[2J"), INVALID, "reason"),
]


def snapshot(admin: pb_grpc.AdminServiceStub, fake) -> tuple:
    status = admin.Status(pb.StatusRequest())
    sessions = [(s.session_id, s.current_phase, s.iteration, tuple(s.gpu_indices)) for s in status.sessions]
    pins = [(g.info.index, g.owner.pin.sm_clock_mhz) for g in status.gpus]
    return sessions, pins, fake.locked()


@pytest.mark.parametrize(
    ("service", "method", "request_", "code", "names"),
    CASES,
    ids=[f"{c[1]}-{i}-{c[4]}" for i, c in enumerate(CASES)],
)
def test_bad_input_is_rejected_with_the_right_code_naming_the_field_and_changes_nothing(
    phase, admin, fake, service, method, request_, code, names
):
    session = open_session(phase, 0)
    begin(phase, session.session_id, GEN, 0)
    if getattr(request_, "session_id", None) == SID:
        request_ = type(request_).FromString(request_.SerializeToString())
        request_.session_id = session.session_id
    before = snapshot(admin, fake)
    stub = phase if service == "phase" else admin
    call = getattr(stub, method)
    if method == "Attach":

        def call(request):
            return next(iter(stub.Attach(request)))

    with pytest.raises(grpc.RpcError) as e:
        call(request_)
    assert e.value.code() is code
    assert names in e.value.details()
    assert snapshot(admin, fake) == before


def test_an_oversized_message_is_refused_before_it_reaches_the_daemon(phase, admin, fake):
    before = snapshot(admin, fake)
    with pytest.raises(grpc.RpcError) as e:
        phase.OpenSession(open_req(job_id="j" * 200_000))
    assert e.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert snapshot(admin, fake) == before


def test_admin_rpcs_are_not_served_on_the_worker_socket(daemon):
    with grpc.insecure_channel(f"unix:{daemon.socket_path}") as channel, pytest.raises(grpc.RpcError) as e:
        pb_grpc.AdminServiceStub(channel).ResetAll(pb.ResetAllRequest(all=True))
    assert e.value.code() is grpc.StatusCode.UNIMPLEMENTED


def test_an_unexpected_error_is_internal_with_a_generic_message(daemon, phase, monkeypatch):
    def broken(*_args):
        raise RuntimeError("secret detail")

    monkeypatch.setattr(daemon.daemon.book, "heartbeat", broken)
    session = open_session(phase, 0)
    with pytest.raises(grpc.RpcError) as e:
        phase.Heartbeat(pb.HeartbeatRequest(session_id=session.session_id))
    assert e.value.code() is grpc.StatusCode.INTERNAL
    assert "secret" not in e.value.details()
