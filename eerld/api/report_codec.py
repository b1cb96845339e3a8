"""The finished sessions' reports on the wire: :class:`SessionReport` out (the request in:
:func:`eerld.api.codec.report`). Beside :mod:`eerld.api.codec`, which is near its size limit; an unknown
figure goes out as 0 (proto3's "unset")."""

from __future__ import annotations

from eerl.reports import KindReport, SessionReport
from eerl.v1 import eerl_pb2 as pb

from eerld.api import codec


def _kind_out(k: KindReport) -> pb.PhaseReport:
    return pb.PhaseReport(
        kind=codec.kind_out(k.kind),
        phases=k.phases,
        energy_j=k.energy_j,
        valid_tokens=k.valid_tokens,
        duration_s=k.duration_s,
        estimated_savings_fraction=k.estimated_savings_fraction,
        exploration_cost_j=k.exploration_cost_j,
        sm_clock_mhz=k.sm_clock_mhz or 0,
        default_energy_j=k.default_energy_j,
        default_s=k.default_s,
        actual_s=k.actual_s,
        pinned_phases=k.pinned_phases,
    )


def report_out(r: SessionReport) -> pb.SessionReport:
    """One finished session's report."""
    return pb.SessionReport(
        job_id=r.job_id,
        session_id=r.session_id,
        rank=r.rank,
        gpu_indices=list(r.gpu_indices),
        opened_at_unix_s=r.opened_at_unix_s,
        closed_at_unix_s=r.closed_at_unix_s,
        reason=r.reason,
        threshold=r.threshold,
        phases=[_kind_out(k) for k in r.kinds],
        energy_j=r.energy_j,
        valid_tokens=r.valid_tokens,
        energy_per_valid_token_j=r.energy_per_valid_token_j or 0.0,
        estimated_savings_fraction=r.estimated_savings_fraction,
        throughput_ratio=r.throughput_ratio or 0.0,
        under_threshold=r.under_threshold,
        exploration_cost_j=r.exploration_cost_j,
    )
