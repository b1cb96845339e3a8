"""Bad input: a hypothesis-driven fuzz of every RPC of both services over the real Unix sockets.

Requests are drawn from the proto descriptors: every field gets random values of its type and beyond
(huge and empty strings, NaN, infinities, negatives, unknown enum numbers, the largest integers),
session ids are sometimes the live session's so that the checks deeper than the first one are reached, and
some requests are plain random bytes sent through a raw channel with identity serializers, or messages
larger than the daemon's limit. What must hold for each request: the daemon answers (no crash), with a
status code that docs/operations.md documents (never INTERNAL or UNKNOWN), and a rejected request leaves
the daemon's state (sessions, their phase counts, locks, pins, degraded GPUs) exactly as it was.
"""

from __future__ import annotations

import contextlib
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import grpc
from eerl.v1 import eerl_pb2 as pb
from eerl_sim.gpu import VirtualClock, create_sim_backend
from eerl_sim.profiles import builtin_profile
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from eerld.errors import NotFound
from eerld.testing import ManualClock, running_daemon

GPUS = 4
MAX_MESSAGE_BYTES = 64 * 1024
ALLOWED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
"""Documented answers to a bad request (UNAVAILABLE only for GPU errors, which no GPU here has)."""
SERVICES = {
    "PhaseService": pb.DESCRIPTOR.services_by_name["PhaseService"],
    "AdminService": pb.DESCRIPTOR.services_by_name["AdminService"],
}
METHODS = [(service, m) for service, d in SERVICES.items() for m in d.methods]
HUGE = "x" * (MAX_MESSAGE_BYTES + 1024)

_INT_RANGES = {
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
}


def _ints(lo: int, hi: int) -> st.SearchStrategy[int]:
    edges = [v for v in (lo, hi, 0, 1, 2, 3, -1, 10**6, 2**31 - 1, 2**32 - 1) if lo <= v <= hi]
    return st.one_of(st.sampled_from(edges), st.integers(lo, hi), st.integers(max(lo, 0), min(hi, 5000)))


def _strings(session_ids: list[str]) -> st.SearchStrategy[str]:
    return st.one_of(
        st.integers(0, 2).map(lambda i: session_ids[i]),  # looked up late: the live session changes
        st.text(max_size=40),
        st.sampled_from(
            ["", "GPU-", "MIG-x", "\x00", "../../etc/passwd", "generation", "a" * 5000, "b" * 60000]
        ),
    )


def _width(t: int) -> int:
    return 64 if t == FieldDescriptor.TYPE_DOUBLE else 32


def field_value(field: FieldDescriptor, session_ids: list[str], depth: int) -> st.SearchStrategy[Any]:
    """A strategy for one (non-repeated) value of ``field``."""
    t = field.type
    if t in _INT_RANGES:
        lo, hi = _INT_RANGES[t]
        if t == FieldDescriptor.TYPE_ENUM:
            assert field.enum_type is not None  # an enum field always names its enum
            known = [v.number for v in field.enum_type.values]
            return st.one_of(st.sampled_from(known), _ints(lo, hi))
        return _ints(lo, hi)
    if t in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return st.one_of(
            st.floats(
                allow_nan=True, allow_infinity=True, width=64 if t == FieldDescriptor.TYPE_DOUBLE else 32
            ),
            st.sampled_from([0.0, -1.0, 0.5, 1.0, 1e308, -1e308, float("nan"), float("inf"), 5.0, 3600.0]),
        )
    if t == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if t == FieldDescriptor.TYPE_STRING:
        return _strings(session_ids)
    if t == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=64)
    if t == FieldDescriptor.TYPE_MESSAGE:
        assert field.message_type is not None  # a message field always names its message
        return message(field.message_type, session_ids, depth + 1)
    raise AssertionError(f"no strategy for field type {t}")


def message(descriptor: Descriptor, session_ids: list[str], depth: int = 0) -> st.SearchStrategy[Any]:
    """A strategy for a message of ``descriptor``: any subset of its fields set to random values."""
    cls = getattr(pb, descriptor.name, None)
    if cls is None or depth > 3:
        return st.none()
    parts: dict[str, st.SearchStrategy[Any]] = {}
    for f in descriptor.fields:
        value = field_value(f, session_ids, depth)
        if f.is_repeated:
            parts[f.name] = st.lists(value, max_size=4)
        else:
            parts[f.name] = st.one_of(st.none(), value)

    def build(values: dict[str, Any]) -> Any:
        msg = cls()
        for name, v in values.items():
            if v is None:
                continue
            f = descriptor.fields_by_name[name]
            try:
                if f.is_repeated:
                    target = getattr(msg, name)
                    for item in v:
                        if item is None:
                            continue
                        if f.type == FieldDescriptor.TYPE_MESSAGE:
                            target.add().CopyFrom(item)
                        else:
                            target.append(item)
                elif f.type == FieldDescriptor.TYPE_MESSAGE:
                    getattr(msg, name).CopyFrom(v)
                else:
                    setattr(msg, name, v)
            except (ValueError, TypeError):  # e.g. a closed enum refusing a number: leave the field unset
                continue
        return msg

    return st.fixed_dictionaries(parts).map(build)


def _counts(phases: Any) -> tuple[tuple[Any, int], ...]:
    return tuple((p.kind, p.phases) for p in phases)


def _identity(data: bytes) -> bytes:
    return data


class Fuzzer:
    """The daemon under test, a baseline state (one session mid-way, one pin) and the checks."""

    def __init__(self, directory: Path) -> None:
        backend = create_sim_backend(builtin_profile("h100-sxm"), GPUS, clock=VirtualClock())
        self.clock = ManualClock()
        self._ctx = running_daemon(directory, backend=backend, clock=self.clock, reaper=False)
        self.handle = self._ctx.__enter__()
        self.worker = grpc.insecure_channel(f"unix:{self.handle.socket_path}")
        self.admin = grpc.insecure_channel(f"unix:{self.handle.admin_socket_path}")
        self.session_ids: list[str] = ["", "", ""]
        self.requests = 0
        self.codes: dict[str, int] = {}
        self.problems: list[str] = []
        self.restores = 0
        self._baseline()

    def close(self) -> None:
        self.worker.close()
        self.admin.close()
        self._ctx.__exit__(None, None, None)

    # -- state ---------------------------------------------------------------------------------------

    def _call(self, service: str, method: str, data: bytes, timeout_s: float) -> grpc.StatusCode:
        channel = self.worker if service == "PhaseService" else self.admin
        is_stream = SERVICES[service].methods_by_name[method].server_streaming
        path = f"/eerl.v1.{service}/{method}"
        try:
            if is_stream:
                call = channel.unary_stream(
                    path, request_serializer=_identity, response_deserializer=_identity
                )
                for _ in call(data, timeout=timeout_s):
                    pass
            else:
                unary = channel.unary_unary(
                    path, request_serializer=_identity, response_deserializer=_identity
                )
                unary(data, timeout=timeout_s)
        except grpc.RpcError as e:
            code: grpc.StatusCode = e.code()
            return code
        return grpc.StatusCode.OK

    def _baseline(self) -> None:
        """Back to the known state: one session on GPU 0 inside a generation phase, a pin on GPU 3."""
        daemon = self.handle.daemon
        for s in daemon.reads.sessions():
            with contextlib.suppress(NotFound):  # an ended Attach stream may be closing it right now
                daemon.book.close_session(s.session_id)
        deadline = time.monotonic() + 10
        while daemon.reads.sessions() and time.monotonic() < deadline:
            time.sleep(0.01)
        daemon.admin.unpin(None)
        daemon.admin.undrain(None)  # an accepted Drain would refuse the baseline's session
        self.clock.advance(60.0)  # a fresh start: the socket's session-open budget refills
        phase = pb.OpenSessionRequest(job_id="fuzz", gpus=[pb.GpuRef(index=0)])
        code, sid = self._open(phase)
        assert code is grpc.StatusCode.OK, code
        begin = pb.BeginPhaseRequest(session_id=sid, kind=pb.PHASE_KIND_GENERATION, iteration=5)
        assert self._call("PhaseService", "BeginPhase", begin.SerializeToString(), 10) is grpc.StatusCode.OK
        pin = pb.PinRequest(gpus=[pb.GpuRef(index=3)], sm_clock_mhz=1500, reason="fuzz baseline")
        assert self._call("AdminService", "Pin", pin.SerializeToString(), 10) is grpc.StatusCode.OK
        self.session_ids[:] = [sid, sid[:-1] + ("A" if sid[-1] != "A" else "B"), ""]
        self.restores += 1

    def _open(self, request: pb.OpenSessionRequest) -> tuple[grpc.StatusCode, str]:
        unary = self.worker.unary_unary(
            "/eerl.v1.PhaseService/OpenSession",
            request_serializer=pb.OpenSessionRequest.SerializeToString,
            response_deserializer=pb.OpenSessionResponse.FromString,
        )
        try:
            return grpc.StatusCode.OK, unary(request, timeout=10).session_id
        except grpc.RpcError as e:
            return e.code(), ""

    def snapshot(self) -> tuple[Any, ...]:
        """What a rejected request must not change (volatile readings such as power left out)."""
        daemon = self.handle.daemon
        sessions = tuple(
            sorted(
                (
                    s.session_id,
                    s.iteration,
                    s.current_phase,
                    s.gpu_indices,
                    tuple((p.kind, p.phases) for p in s.phases),
                )
                for s in daemon.reads.sessions()
            )
        )
        gpus = tuple(
            (
                g.locked_sm_clock_mhz,
                g.source,
                g.session_id,
                g.pin.sm_clock_mhz if g.pin else None,
                g.degraded_reason,
            )
            for g in daemon.reads.gpu_status()
        )
        return sessions, gpus

    # -- one request ---------------------------------------------------------------------------------

    def send(self, service: str, method: str, data: bytes) -> None:
        """Send one request, check the answer and the state."""
        before = self.snapshot()
        streaming = SERVICES[service].methods_by_name[method].server_streaming
        code = self._call(service, method, data, 0.3 if streaming else 10)
        self.requests += 1
        self.codes[code.name] = self.codes.get(code.name, 0) + 1
        if code is grpc.StatusCode.DEADLINE_EXCEEDED and streaming:
            code = grpc.StatusCode.OK  # a valid Attach streams until the deadline: that is its job
        if code not in ALLOWED:
            self.problems.append(f"{method}({data[:60]!r}…): {code.name}")
        if code is grpc.StatusCode.OK:
            self._baseline()  # an accepted request may change state legitimately: start over
        elif self.snapshot() != before:
            self.problems.append(f"{method} rejected with {code.name} but changed the state")


def run_fuzz(examples: int, seed: int = 0) -> dict[str, Any]:
    """Fuzz ``examples`` requests (three kinds, interleaved) and return the figures."""
    with tempfile.TemporaryDirectory(prefix="eerl-z-", dir="/tmp") as d:
        fuzzer = Fuzzer(Path(d))
        t0 = time.monotonic()
        try:
            kinds: list[st.SearchStrategy[tuple[str, str, bytes]]] = []
            for service, m in METHODS:
                typed = message(m.input_type, fuzzer.session_ids).map(partial(_serialized, service, m.name))
                raw = st.binary(max_size=512).map(partial(_raw, service, m.name))
                kinds += [typed, typed, raw]
            strategy = st.one_of(kinds)

            @settings(
                max_examples=examples,
                database=None,
                deadline=None,
                derandomize=True,
                suppress_health_check=list(HealthCheck),
                phases=[p for p in settings().phases if p.name != "shrink"],
            )
            @given(strategy)
            def one(request: tuple[str, str, bytes]) -> None:
                fuzzer.send(*request)

            one()
            # oversized (each costs a reconnect, so not drawn at random) and empty, on every RPC
            for service, m in METHODS:
                fuzzer.send(service, m.name, b"\x0a" + _varint(len(HUGE)) + HUGE.encode())
                fuzzer.send(service, m.name, b"")
        finally:
            wall_s = time.monotonic() - t0
            fuzzer.close()
    return {
        "requests": fuzzer.requests,
        "rpcs": len(METHODS),
        "codes": dict(sorted(fuzzer.codes.items())),
        "baseline_restores": fuzzer.restores - 1,
        "problems": fuzzer.problems[:20],
        "problem_count": len(fuzzer.problems),
        "wall_s": wall_s,
    }


def _serialized(service: str, method: str, message: Any) -> tuple[str, str, bytes]:
    """A typed request as what :meth:`Fuzzer.send` takes."""
    return service, method, message.SerializeToString()


def _raw(service: str, method: str, data: bytes) -> tuple[str, str, bytes]:
    """Random bytes as what :meth:`Fuzzer.send` takes."""
    return service, method, data


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)
