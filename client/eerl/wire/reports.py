"""A finished session's report from the wire (``CloseSessionResponse.report``, ``ReportResponse``)."""

from __future__ import annotations

from eerl.reports import KindReport, SessionReport
from eerl.v1 import eerl_pb2
from eerl.wire.enums import KIND_FROM_PB

__all__ = ["report_from_pb"]


def report_from_pb(msg: eerl_pb2.SessionReport) -> SessionReport:
    """A report from the wire (``CloseSessionResponse.report``, ``ReportResponse``); a phase report of an
    unknown kind is left out."""
    kinds = []
    for p in msg.phases:
        kind = KIND_FROM_PB.get(p.kind)
        if kind is None:
            continue
        kinds.append(
            KindReport(
                kind=kind,
                phases=p.phases,
                energy_j=p.energy_j,
                valid_tokens=p.valid_tokens,
                duration_s=p.duration_s,
                estimated_savings_fraction=p.estimated_savings_fraction,
                exploration_cost_j=p.exploration_cost_j,
                sm_clock_mhz=p.sm_clock_mhz or None,
                default_energy_j=p.default_energy_j,
                default_s=p.default_s,
                actual_s=p.actual_s,
                pinned_phases=p.pinned_phases,
            )
        )
    return SessionReport(
        job_id=msg.job_id,
        session_id=msg.session_id,
        rank=msg.rank,
        gpu_indices=tuple(msg.gpu_indices),
        opened_at_unix_s=msg.opened_at_unix_s,
        closed_at_unix_s=msg.closed_at_unix_s,
        reason=msg.reason,
        threshold=msg.threshold,
        kinds=tuple(kinds),
    )
