# ruff: noqa: N802 - method names are the RPC names of the v1 contract
"""Thin servicers: decode the request (codec), call one method of a daemon component, encode the reply.

Errors are not handled here; :mod:`eerld.api.interceptors` maps them. The worker socket serves only
:class:`PhaseServicer` and the admin socket only :class:`AdminServicer`.
"""

from __future__ import annotations

import os
import pwd
import queue
import stat
from collections.abc import Iterator
from pathlib import Path

import grpc
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc
from eerl.wire.metadata import CALLER_METADATA

from eerld.api import codec, report_codec
from eerld.daemon import Daemon
from eerld.grants import SHARED_NAME

ATTACH_POLL_S = 0.5
MAX_CALLER_CHARS = 80
REPORTED = ", as reported by the client"


class PhaseServicer(pb_grpc.PhaseServiceServicer):
    """The worker API of one worker socket; ``grant`` names the socket (what its sessions may claim)."""

    def __init__(self, daemon: Daemon, grant: str = SHARED_NAME) -> None:
        self._daemon = daemon
        self._grant = grant
        self._simulated_time = daemon.reads.daemon_info().backend == "sim"
        """Phases are timed on the simulator's clock: EndPhase says so (once here, not per call)."""

    def OpenSession(
        self, request: pb.OpenSessionRequest, context: grpc.ServicerContext
    ) -> pb.OpenSessionResponse:
        opened = self._daemon.book.open_session(codec.open_session(request), self._grant)
        return pb.OpenSessionResponse(
            session_id=opened.session_id,
            lease_ttl_s=opened.lease_ttl_s,
            gpus=[codec.gpu_info_out(g) for g in opened.gpus],
        )

    def Attach(self, request: pb.AttachRequest, context: grpc.ServicerContext) -> Iterator[pb.SessionEvent]:
        attachment = self._daemon.book.attach(codec.session_id(request.session_id))
        if not context.add_callback(lambda: self._daemon.book.detach(attachment)):
            self._daemon.book.detach(attachment)
            return
        while context.is_active():
            try:
                timestamp, message = attachment.events.get(timeout=ATTACH_POLL_S)
            except queue.Empty:
                if attachment.ended.is_set():
                    return
                continue
            yield pb.SessionEvent(timestamp_unix_s=timestamp, message=message)

    def BeginPhase(
        self, request: pb.BeginPhaseRequest, context: grpc.ServicerContext
    ) -> pb.BeginPhaseResponse:
        began = self._daemon.phases.begin_phase(*codec.begin_phase(request))
        return pb.BeginPhaseResponse(
            clocks=[codec.clock_out(c) for c in began.clocks],
            state=codec.state_out(began.state),
            target_sm_clock_mhz=began.target_sm_clock_mhz or 0,
            resynced=began.resynced,
            verdict=codec.verdict_out(began.verdict),
            verdict_detail=began.verdict_detail,
            applied_epoch=began.applied_epoch,
        )

    def EndPhase(self, request: pb.EndPhaseRequest, context: grpc.ServicerContext) -> pb.EndPhaseResponse:
        ended = self._daemon.phases.end_phase(*codec.end_phase(request))
        return pb.EndPhaseResponse(
            duration_s=ended.duration_s,
            energy_mj=ended.energy_mj,
            mean_power_w=ended.mean_power_w,
            state=codec.state_out(ended.state),
            sm_clock_mhz=ended.sm_clock_mhz or 0,
            applied_epoch=ended.applied_epoch,
            verdict=codec.verdict_out(ended.verdict),
            gpus=ended.gpus,
            simulated_time=self._simulated_time,
        )

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.HeartbeatResponse:
        return pb.HeartbeatResponse(
            lease_remaining_s=self._daemon.book.heartbeat(codec.session_id(request.session_id))
        )

    def CloseSession(
        self, request: pb.CloseSessionRequest, context: grpc.ServicerContext
    ) -> pb.CloseSessionResponse:
        sid = codec.session_id(request.session_id)
        closed = self._daemon.book.close_session(sid)
        report = self._daemon.reports.of_session(sid)
        return pb.CloseSessionResponse(
            energy_mj=closed.energy_mj,
            valid_tokens=closed.valid_tokens,
            report=report_codec.report_out(report) if report is not None else None,
        )

    def IssueClaimTicket(
        self, request: pb.IssueClaimTicketRequest, context: grpc.ServicerContext
    ) -> pb.IssueClaimTicketResponse:
        ticket = self._daemon.admin.issue_claim_ticket(self._grant)
        return pb.IssueClaimTicketResponse(
            ticket=ticket.ticket,
            gpus=[codec.gpu_info_out(g) for g in ticket.gpus],
            expires_in_s=ticket.expires_in_s,
        )


class AdminServicer(pb_grpc.AdminServiceServicer):
    """The admin API."""

    def __init__(self, daemon: Daemon, admin_socket: Path | None = None) -> None:
        self._daemon = daemon
        self._admin_socket = admin_socket

    def _set_by(self, context: grpc.ServicerContext) -> str:
        """Who asked, in words: the user the client reported, then the admin socket's owner.

        gRPC Python does not expose the peer's credentials (SO_PEERCRED), so the one identity the kernel
        vouches for is the admin socket's: its owner and mode decide who could connect at all.
        """
        parts: list[str] = []
        for key, value in context.invocation_metadata() or ():
            if key == CALLER_METADATA and isinstance(value, str):
                shown = "".join(ch for ch in value if ch.isprintable())[:MAX_CALLER_CHARS]
                if shown:
                    parts.append(f"{shown}{REPORTED}")
                break
        if self._admin_socket is not None:
            parts.append(_socket_owner(self._admin_socket))
        return " via ".join(parts)

    def Status(self, request: pb.StatusRequest, context: grpc.ServicerContext) -> pb.StatusResponse:
        status = self._daemon.reads.status()
        return pb.StatusResponse(
            daemon=codec.daemon_out(status.daemon),
            gpus=[codec.gpu_status_out(g) for g in status.gpus],
            sessions=[codec.session_out(s) for s in status.sessions],
            grants=[codec.grant_out(g) for g in status.grants],
        )

    def Pin(self, request: pb.PinRequest, context: grpc.ServicerContext) -> pb.PinResponse:
        args = codec.pin(request)
        outcome = self._daemon.admin.pin(
            args.gpus,
            args.sm_clock_mhz,
            args.mem_clock_mhz,
            args.duration_s,
            args.reason,
            replace=args.replace,
            set_by=self._set_by(context),
        )
        return pb.PinResponse(
            clocks=[codec.clock_out(c) for c in outcome.clocks],
            replaced=[codec.gpu_pin_out(r) for r in outcome.replaced],
        )

    def Unpin(self, request: pb.UnpinRequest, context: grpc.ServicerContext) -> pb.UnpinResponse:
        outcome = self._daemon.admin.unpin(codec.unpin(request))
        return pb.UnpinResponse(
            clocks=[codec.clock_out(c) for c in outcome.clocks],
            removed=[codec.gpu_pin_out(r) for r in outcome.removed],
            not_pinned=list(outcome.not_pinned),
        )

    def ListSessions(
        self, request: pb.ListSessionsRequest, context: grpc.ServicerContext
    ) -> pb.ListSessionsResponse:
        return pb.ListSessionsResponse(sessions=[codec.session_out(s) for s in self._daemon.reads.sessions()])

    def GetDecisions(
        self, request: pb.GetDecisionsRequest, context: grpc.ServicerContext
    ) -> pb.GetDecisionsResponse:
        views = self._daemon.reads.decisions(*codec.decisions(request))
        return pb.GetDecisionsResponse(decisions=[codec.decision_out(v) for v in views])

    def Report(self, request: pb.ReportRequest, context: grpc.ServicerContext) -> pb.ReportResponse:
        reports = self._daemon.reports.recent(codec.report(request))
        return pb.ReportResponse(reports=[report_codec.report_out(r) for r in reports])

    def ResetAll(self, request: pb.ResetAllRequest, context: grpc.ServicerContext) -> pb.ResetAllResponse:
        gpus, reason = codec.reset(request)
        outcome = self._daemon.admin.reset(gpus, reason or "admin reset", keep_pins=request.keep_pins)
        return pb.ResetAllResponse(
            clocks=[codec.clock_out(c) for c in outcome.clocks],
            closed_session_ids=list(outcome.closed_session_ids),
        )

    def Drain(self, request: pb.DrainRequest, context: grpc.ServicerContext) -> pb.DrainResponse:
        args = codec.drain(request)
        outcome = self._daemon.admin.drain(
            args.gpus,
            args.duration_s,
            args.reason or "admin drain",
            keep_sessions=args.keep_sessions,
            set_by=self._set_by(context),
        )
        return pb.DrainResponse(
            clocks=[codec.clock_out(c) for c in outcome.clocks],
            closed_session_ids=list(outcome.closed_session_ids),
            gpu_indices=list(outcome.gpu_indices),
        )

    def Undrain(self, request: pb.UndrainRequest, context: grpc.ServicerContext) -> pb.UndrainResponse:
        outcome = self._daemon.admin.undrain(codec.undrain(request))
        return pb.UndrainResponse(undrained=list(outcome.undrained), not_drained=list(outcome.not_drained))

    def Grant(self, request: pb.GrantRequest, context: grpc.ServicerContext) -> pb.GrantResponse:
        outcome = self._daemon.admin.grant(codec.grant(request))
        return pb.GrantResponse(grant=codec.grant_out(outcome.grant), revoked=list(outcome.revoked))

    def Revoke(self, request: pb.RevokeRequest, context: grpc.ServicerContext) -> pb.RevokeResponse:
        name, job_id, reason = codec.revoke(request)
        outcome = self._daemon.admin.revoke(name, job_id, reason or "admin revoke")
        return pb.RevokeResponse(
            revoked=list(outcome.revoked),
            clocks=[codec.clock_out(c) for c in outcome.clocks],
            closed_session_ids=list(outcome.closed_session_ids),
        )

    def ListGrants(
        self, request: pb.ListGrantsRequest, context: grpc.ServicerContext
    ) -> pb.ListGrantsResponse:
        return pb.ListGrantsResponse(grants=[codec.grant_out(g) for g in self._daemon.reads.grants()])


def _socket_owner(path: Path) -> str:
    """``the admin socket of root (uid 0, mode 0600)``; what is known when it cannot be read."""
    try:
        st = os.stat(path)
    except OSError:
        return f"the admin socket {path}"
    try:
        name = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        name = f"uid {st.st_uid}"
    mode = stat.S_IMODE(st.st_mode)
    group = f", group gid {st.st_gid}" if mode & 0o060 else ""
    return f"the admin socket of {name} (uid {st.st_uid}, mode {mode:04o}{group})"
