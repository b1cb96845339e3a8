"""A fake AdminService for eerlctl's tests, in-process over a real gRPC channel.

It keeps a tiny model of a node (two GPUs, supported clocks every 15 MHz, pins and one session) so that
eerlctl can be tested over a real gRPC channel before and apart from the daemon.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from concurrent import futures
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from eerl.v1 import eerl_pb2, eerl_pb2_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

SUPPORTED_SM_CLOCKS_MHZ = tuple(range(345, 1981, 15))
SESSION_ID = "s-0123456789abcdef"


@dataclass
class _Pin:
    sm_clock_mhz: int
    reason: str
    expires_at_unix_s: float


@dataclass
class FakeAdmin(eerl_pb2_grpc.AdminServiceServicer):
    """AdminService over a two-GPU model; records the requests it received."""

    pins: dict[int, _Pin] = field(default_factory=dict)
    session_open: bool = True
    requests: list[object] = field(default_factory=list)

    def _index(self, ref: eerl_pb2.GpuRef, context: grpc.ServicerContext) -> int:
        if ref.WhichOneof("ref") == "uuid":
            for index in (0, 1):
                if ref.uuid == _uuid(index):
                    return index
            context.abort(grpc.StatusCode.NOT_FOUND, f"no GPU with UUID {ref.uuid}")
        if ref.index > 1:
            context.abort(grpc.StatusCode.NOT_FOUND, f"no GPU with index {ref.index} (this node has 0-1)")
        return ref.index

    def _targets(
        self, gpus: Iterable[eerl_pb2.GpuRef], all_gpus: bool, context: grpc.ServicerContext
    ) -> list[int]:
        if all_gpus:
            return [0, 1]
        return [self._index(ref, context) for ref in gpus]

    def _gpu(self, index: int) -> eerl_pb2.GpuStatus:
        pin = self.pins.get(index)
        session = self.session_open and index == 0
        locked = pin.sm_clock_mhz if pin else (1410 if session else None)
        owner = eerl_pb2.GpuOwner()
        if session:
            owner.session_id, owner.job_id, owner.rank = SESSION_ID, "job-42", 0
        if pin:
            owner.pin.CopyFrom(
                eerl_pb2.AdminPin(
                    sm_clock_mhz=pin.sm_clock_mhz,
                    reason=pin.reason,
                    expires_at_unix_s=pin.expires_at_unix_s,
                    created_at_unix_s=time.time(),
                )
            )
        source = (
            eerl_pb2.CLOCK_SOURCE_ADMIN_PIN
            if pin
            else eerl_pb2.CLOCK_SOURCE_SESSION
            if session
            else eerl_pb2.CLOCK_SOURCE_DEFAULT
        )
        status = eerl_pb2.GpuStatus(
            info=eerl_pb2.GpuInfo(
                index=index,
                uuid=_uuid(index),
                name="NVIDIA H100 80GB HBM3",
                pci_bus_id=f"00000000:{0x18 + index:02X}:00.0",
                min_sm_clock_mhz=SUPPORTED_SM_CLOCKS_MHZ[0],
                max_sm_clock_mhz=SUPPORTED_SM_CLOCKS_MHZ[-1],
            ),
            sm_clock_mhz=locked or 1980,
            mem_clock_mhz=2619,
            source=source,
            owner=owner,
            power_w=400.0 + index,
            power_limit_w=700.0,
            energy_mj=123_456_789 + index,
            utilization_gpu_percent=97,
        )
        if locked is not None:
            status.locked_sm_clock_mhz = locked
        return status

    def _session(self) -> list[eerl_pb2.SessionInfo]:
        if not self.session_open:
            return []
        return [
            eerl_pb2.SessionInfo(
                session_id=SESSION_ID,
                job_id="job-42",
                rank=0,
                world_size=1,
                gpu_indices=[0],
                mode=eerl_pb2.EXECUTION_MODE_SYNC,
                role=eerl_pb2.GPU_ROLE_BOTH,
                current_phase=eerl_pb2.PHASE_KIND_GENERATION,
                iteration=7,
                attached=True,
                throughput_threshold=0.95,
                phases=[
                    eerl_pb2.PhaseStatus(
                        kind=eerl_pb2.PHASE_KIND_GENERATION,
                        state=eerl_pb2.CONTROLLER_STATE_COMMITTED,
                        sm_clock_mhz=1410,
                        phases=7,
                        energy_mj=3_600_000,
                        valid_tokens=70_000,
                        energy_per_valid_token_j=0.051,
                        throughput_tokens_per_s=8000.0,
                        estimated_savings_fraction=0.12,
                    ),
                    eerl_pb2.PhaseStatus(
                        kind=eerl_pb2.PHASE_KIND_TRAINING,
                        state=eerl_pb2.CONTROLLER_STATE_BASELINE,
                        phases=6,
                    ),
                ],
            )
        ]

    def Status(
        self, request: eerl_pb2.StatusRequest, context: grpc.ServicerContext
    ) -> eerl_pb2.StatusResponse:
        self.requests.append(request)
        return eerl_pb2.StatusResponse(
            daemon=eerl_pb2.DaemonInfo(
                version="0.1.0", backend="sim", controller="eerl", uptime_s=42.0, hostname="node-1"
            ),
            gpus=[self._gpu(0), self._gpu(1)],
            sessions=self._session(),
        )

    def Pin(self, request: eerl_pb2.PinRequest, context: grpc.ServicerContext) -> eerl_pb2.PinResponse:
        self.requests.append(request)
        if request.sm_clock_mhz not in SUPPORTED_SM_CLOCKS_MHZ:
            below = max((c for c in SUPPORTED_SM_CLOCKS_MHZ if c < request.sm_clock_mhz), default=None)
            above = min((c for c in SUPPORTED_SM_CLOCKS_MHZ if c > request.sm_clock_mhz), default=None)
            nearest = " or ".join(str(c) for c in (below, above) if c is not None)
            context.abort(
                grpc.StatusCode.INVALID_ARGUMENT,
                f"sm_clock_mhz: {request.sm_clock_mhz} MHz is not supported; nearest: {nearest} MHz",
            )
        expires = time.time() + request.duration_s if request.duration_s else 0.0
        targets = self._targets(request.gpus, request.all, context)
        for index in targets:
            self.pins[index] = _Pin(request.sm_clock_mhz, request.reason, expires)
        return eerl_pb2.PinResponse(clocks=[self._clock(i) for i in targets])

    def Unpin(self, request: eerl_pb2.UnpinRequest, context: grpc.ServicerContext) -> eerl_pb2.UnpinResponse:
        self.requests.append(request)
        targets = self._targets(request.gpus, request.all, context)
        for index in targets:
            self.pins.pop(index, None)
        return eerl_pb2.UnpinResponse(clocks=[self._clock(i) for i in targets])

    def ListSessions(
        self, request: eerl_pb2.ListSessionsRequest, context: grpc.ServicerContext
    ) -> eerl_pb2.ListSessionsResponse:
        self.requests.append(request)
        return eerl_pb2.ListSessionsResponse(sessions=self._session())

    def GetDecisions(
        self, request: eerl_pb2.GetDecisionsRequest, context: grpc.ServicerContext
    ) -> eerl_pb2.GetDecisionsResponse:
        self.requests.append(request)
        if request.session_id not in ("", SESSION_ID):
            context.abort(grpc.StatusCode.NOT_FOUND, f"no session {request.session_id}")
        return eerl_pb2.GetDecisionsResponse(
            decisions=[
                eerl_pb2.Decision(
                    session_id=SESSION_ID,
                    kind=eerl_pb2.PHASE_KIND_GENERATION,
                    iteration=3,
                    timestamp_unix_s=1_700_000_000.0,
                    state=eerl_pb2.CONTROLLER_STATE_EXPLORING,
                    sm_clock_mhz=1410,
                    reason="candidate 1410 MHz met 0.97 of predicted throughput",
                    throughput_ratio=0.97,
                    energy_ratio=0.88,
                )
            ]
        )

    def ResetAll(
        self, request: eerl_pb2.ResetAllRequest, context: grpc.ServicerContext
    ) -> eerl_pb2.ResetAllResponse:
        self.requests.append(request)
        targets = self._targets(request.gpus, request.all, context)
        closed = []
        for index in targets:
            self.pins.pop(index, None)
            if index == 0 and self.session_open:
                self.session_open = False
                closed.append(SESSION_ID)
        return eerl_pb2.ResetAllResponse(clocks=[self._clock(i) for i in targets], closed_session_ids=closed)

    def _clock(self, index: int) -> eerl_pb2.GpuClock:
        status = self._gpu(index)
        return eerl_pb2.GpuClock(
            index=index,
            uuid=status.info.uuid,
            sm_clock_mhz=status.sm_clock_mhz,
            requested_sm_clock_mhz=status.locked_sm_clock_mhz
            if status.HasField("locked_sm_clock_mhz")
            else 0,
            source=status.source,
        )


def _uuid(index: int) -> str:
    return f"GPU-{index}{index}{index}{index}aaaa-0000-0000-0000-000000000000"


@dataclass
class FakeAdminServer:
    """A running fake: its socket path, the servicer (to inspect requests) and the health servicer."""

    socket_path: Path
    admin: FakeAdmin
    health: health.HealthServicer
    server: grpc.Server

    def stop(self) -> None:
        """Stop at once."""
        self.server.stop(None).wait()


def start_fake_admin(socket_path: Path) -> FakeAdminServer:
    """Serve the fake AdminService and grpc.health.v1 (SERVING) on ``socket_path``."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    admin = FakeAdmin()
    eerl_pb2_grpc.add_AdminServiceServicer_to_server(admin, server)
    health_servicer = health.HealthServicer()
    health_servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    server.add_insecure_port(f"unix:{socket_path}")
    server.start()
    return FakeAdminServer(socket_path=socket_path, admin=admin, health=health_servicer, server=server)
