"""NVML faults: every typed backend error at every backend call site, and an energy counter reset mid-phase.

For each (call site, error) a fresh daemon serves four simulated GPUs on real Unix sockets. The fault is
injected on GPU 1 (persistently), either while the daemon runs or before it starts. A session on GPU 1
and one on GPU 2 then run phases, an admin reads Status and pins and unpins GPU 1. What must hold:
every RPC answers with a documented status code (never INTERNAL), the daemon keeps serving, GPU 1 is
shown degraded with the error's name where the faulty call was made, GPUs 0, 2 and 3 are untouched (the
session on GPU 2 gets its clock and its energy), and once the fault clears GPU 1 recovers and no GPU is
left locked.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import grpc
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc
from eerl_sim.gpu import FAULTABLE_METHODS, INJECTABLE_ERRORS, SimBackend, VirtualClock, create_sim_backend
from eerl_sim.profiles import builtin_profile

from eerld.errors import GpuError
from eerld.testing import ManualClock, running_daemon

GEN, TRAIN = pb.PHASE_KIND_GENERATION, pb.PHASE_KIND_TRAINING
BACKEND_METHODS = sorted(FAULTABLE_METHODS - {"run_segments"})
ERRORS = sorted(INJECTABLE_ERRORS)
RUNTIME_CALLED = frozenset(
    {
        "clocks",
        "lock_sm_clock",
        "lock_mem_clock",
        "reset_sm_clock",
        "total_energy_mj",
        "power_w",
        "power_limit_w",
        "utilization",
        "clock_event_reasons",
    }
)
"""Call sites the scenario reaches while the daemon runs (the rest are called only at start)."""
DOCUMENTED = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.FAILED_PRECONDITION,
        grpc.StatusCode.PERMISSION_DENIED,
        grpc.StatusCode.UNAVAILABLE,
    }
)
GEN_MHZ = 1200
WORK = ([2000.0] * 20, [0.001] * 20)
WORKLOAD = pb.Workload(tokens=100, valid_tokens=50, sequences=2)


def _code(fn: Callable[[], Any]) -> tuple[grpc.StatusCode, Any]:
    try:
        return grpc.StatusCode.OK, fn()
    except grpc.RpcError as e:
        return e.code(), None


def _backend() -> SimBackend:
    return create_sim_backend(builtin_profile("h100-sxm"), 4, clock=VirtualClock())


def exercise(method: str, error_name: str, *, at_start: bool) -> list[str]:
    """Run the scenario with ``error_name`` injected into ``method`` on GPU 1; return what went wrong."""
    problems: list[str] = []
    backend = _backend()
    device = backend.device
    error = INJECTABLE_ERRORS[error_name]
    if at_start:
        backend.inject_fault(1, method, error, once=False)
    clock = ManualClock()
    with tempfile.TemporaryDirectory(prefix="eerl-f-", dir="/tmp") as d:
        try:
            ctx = running_daemon(
                Path(d), backend=backend, clock=clock, reaper=False, fixed_clocks=f"generation={GEN_MHZ}"
            )
            handle = ctx.__enter__()
        except GpuError as e:
            if method == "inventory" and at_start:
                return []  # no inventory, nothing to serve: the start fails with the error (checked)
            return [f"daemon did not start: {type(e).__name__}: {e}"]
        try:
            with (
                grpc.insecure_channel(f"unix:{handle.socket_path}") as wc,
                grpc.insecure_channel(f"unix:{handle.admin_socket_path}") as ac,
            ):
                phase, admin = pb_grpc.PhaseServiceStub(wc), pb_grpc.AdminServiceStub(ac)
                codes: list[tuple[str, grpc.StatusCode]] = []

                def rpc(name: str, fn: Callable[[], Any]) -> Any:
                    code, response = _code(fn)
                    codes.append((name, code))
                    return response

                def open_on(gpu: int) -> str:
                    request = pb.OpenSessionRequest(job_id=f"j{gpu}", gpus=[pb.GpuRef(index=gpu)])
                    opened = rpc(f"OpenSession({gpu})", lambda: phase.OpenSession(request, timeout=30))
                    return opened.session_id if opened is not None else ""

                sid_b = open_on(2)
                sid_a = open_on(1)
                if not at_start:
                    backend.inject_fault(1, method, error, once=False)
                for sid, gpu in ((sid_a, 1), (sid_b, 2)):
                    begin = pb.BeginPhaseRequest(session_id=sid, kind=GEN)
                    began = rpc(f"BeginPhase({gpu})", partial(phase.BeginPhase, begin, timeout=30))
                    if gpu == 2:
                        if began is None or [c.sm_clock_mhz for c in began.clocks] != [GEN_MHZ]:
                            problems.append(f"the healthy GPU 2 did not get its clock: {began}")
                        device.run_segments(2, *WORK)
                    end = pb.EndPhaseRequest(session_id=sid, kind=GEN, workload=WORKLOAD)
                    ended = rpc(f"EndPhase({gpu})", partial(phase.EndPhase, end, timeout=30))
                    if gpu == 2 and (ended is None or not ended.energy_mj > 0):
                        problems.append(f"the healthy GPU 2 got no energy: {ended}")
                mem = device.profile.mem_clock_mhz if method == "lock_mem_clock" else 0
                gpu1 = [pb.GpuRef(index=1)]
                pin = pb.PinRequest(gpus=gpu1, sm_clock_mhz=1500, mem_clock_mhz=mem, reason="t")
                rpc("Pin(1)", lambda: admin.Pin(pin, timeout=30))
                status = rpc("Status", lambda: admin.Status(pb.StatusRequest(), timeout=30))
                rpc("Unpin(1)", lambda: admin.Unpin(pb.UnpinRequest(gpus=[pb.GpuRef(index=1)]), timeout=30))
                if status is None:
                    problems.append("Status failed while a GPU was faulty")
                else:
                    by_index = {g.info.index: g for g in status.gpus}
                    for healthy in (0, 2, 3):
                        if by_index[healthy].degraded_reason:
                            problems.append(f"GPU {healthy} degraded: {by_index[healthy].degraded_reason}")
                for sid, gpu in ((sid_a, 1), (sid_b, 2)):
                    close = pb.CloseSessionRequest(session_id=sid)
                    rpc(f"CloseSession({gpu})", partial(phase.CloseSession, close, timeout=30))
                closed = rpc("Status(closed)", lambda: admin.Status(pb.StatusRequest(), timeout=30))
                if status is not None and closed is not None:
                    # a reset fails only at close: GPU 1 must show the error in one of the two views
                    reasons = [s.gpus[1].degraded_reason for s in (status, closed)]
                    if method in RUNTIME_CALLED and not any(error_name in r for r in reasons):
                        problems.append(f"GPU 1 not shown degraded by {error_name}: {reasons}")
                backend.clear_faults()
                clock.advance(120.0)
                handle.daemon.tick()
                after = rpc("Status(after)", lambda: admin.Status(pb.StatusRequest(), timeout=30))
                for name, code in codes:
                    if code not in DOCUMENTED:
                        problems.append(f"{name} answered {code.name}")
                if ("OpenSession(2)", grpc.StatusCode.OK) not in codes:
                    problems.append("the healthy GPU 2 could not be claimed")
                if after is not None:
                    still = [(g.info.index, g.degraded_reason) for g in after.gpus if g.degraded_reason]
                    if still:
                        problems.append(f"still degraded after the fault cleared: {still}")
                locked = [i for i in range(4) if device.observe(i).sm_lock_mhz is not None]
                if locked:
                    problems.append(f"GPUs {locked} left locked after the sessions closed")
        finally:
            ctx.__exit__(None, None, None)
    return problems


def fault_matrix(methods: list[str], errors: list[str], *, at_start: bool) -> dict[str, Any]:
    """Every (method, error) pair of the lists; returns counts and the problems found."""
    problems: dict[str, list[str]] = {}
    cases = 0
    for method in methods:
        for error_name in errors:
            cases += 1
            found = exercise(method, error_name, at_start=at_start)
            if found:
                problems[f"{method}/{error_name}"] = found
    return {"cases": cases, "failed_cases": len(problems), "problems": problems}


def energy_counter_reset() -> dict[str, Any]:
    """A driver reload mid-phase: the phase's energy is never negative nor above the true energy."""
    backend = _backend()
    device = backend.device
    with (
        tempfile.TemporaryDirectory(prefix="eerl-e-", dir="/tmp") as d,
        running_daemon(Path(d), backend=backend, reaper=False) as handle,
        grpc.insecure_channel(f"unix:{handle.socket_path}") as wc,
    ):
        phase = pb_grpc.PhaseServiceStub(wc)
        sid = phase.OpenSession(pb.OpenSessionRequest(job_id="e", gpus=[pb.GpuRef(index=0)])).session_id
        out: dict[str, Any] = {}
        for iteration, (label, reset) in enumerate((("with_reset", True), ("without_reset", False))):
            phase.BeginPhase(pb.BeginPhaseRequest(session_id=sid, kind=GEN, iteration=iteration))
            true0 = device.true_energy_j(0)
            device.run_segments(0, *WORK)
            if reset:
                backend.reset_energy_counter(0)
            device.run_segments(0, *WORK)
            end = pb.EndPhaseRequest(session_id=sid, kind=GEN, iteration=iteration, workload=WORKLOAD)
            ended = phase.EndPhase(end)
            true_j = device.true_energy_j(0) - true0
            out[label] = {"measured_j": ended.energy_mj / 1000.0, "true_j": true_j}
    return out
