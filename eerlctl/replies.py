"""eerlctl's JSON: protobuf replies as plain JSON-able dicts (the shape ``--json`` prints).

The shape is a contract for scripts (documented in docs/deployment.md): snake_case keys, units in the names,
``null`` for "none" (no lock, no owner, default governor) rather than protobuf's zeros, and energies in
joules. The tables of :mod:`eerlctl.render` are drawn from the same dicts, so both views always agree.
Everything here is pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from eerl.reports import JobReport
from eerl.v1 import eerl_pb2
from eerl.wire.reports import report_from_pb

__all__ = [
    "TOKEN_PREFIX_CHARS",
    "JsonDict",
    "clocks_dict",
    "decision_dict",
    "gpu_dict",
    "gpu_pin_dict",
    "grant_dict",
    "job_report_dict",
    "redact_tokens",
    "report_dict",
    "session_dict",
    "status_dict",
]

JsonDict = dict[str, Any]


def _enum_name(enum_type: Any, value: int, prefix: str) -> str | None:
    """``CONTROLLER_STATE_COMMITTED`` → ``"committed"``; UNSPECIFIED → None."""
    name: str = enum_type.Name(value) if value in enum_type.values() else f"{prefix}{value}"
    short = name.removeprefix(prefix).lower()
    return None if short == "unspecified" else short


def _mhz_or_none(value: int) -> int | None:
    return value or None


def _pin_dict(pin: eerl_pb2.AdminPin) -> JsonDict:
    return {
        "sm_clock_mhz": pin.sm_clock_mhz,
        "mem_clock_mhz": _mhz_or_none(pin.mem_clock_mhz),
        "reason": pin.reason,
        "expires_at_unix_s": pin.expires_at_unix_s or None,
        "created_at_unix_s": pin.created_at_unix_s,
        "set_by": pin.set_by or None,
    }


def gpu_pin_dict(pin: eerl_pb2.GpuPin) -> JsonDict:
    """A pin with its GPU (what a pin replaced, what an unpin removed)."""
    return {"index": pin.index, "uuid": pin.uuid, **_pin_dict(pin.pin)}


def _drain_dict(drain: eerl_pb2.GpuDrain) -> JsonDict:
    return {
        "reason": drain.reason,
        "created_at_unix_s": drain.created_at_unix_s,
        "expires_at_unix_s": drain.expires_at_unix_s or None,
        "set_by": drain.set_by or None,
    }


def gpu_dict(gpu: eerl_pb2.GpuStatus) -> JsonDict:
    """One GPU: ``locked_sm_clock_mhz`` is null on the default governor, ``owner`` null when free."""
    owner: JsonDict | None = None
    has_pin = gpu.owner.HasField("pin") and gpu.owner.pin.sm_clock_mhz > 0
    if gpu.owner.session_id or has_pin:
        owner = {
            "session_id": gpu.owner.session_id or None,
            "job_id": gpu.owner.job_id or None,
            "rank": gpu.owner.rank if gpu.owner.session_id else None,
            "pin": _pin_dict(gpu.owner.pin) if has_pin else None,
        }
    return {
        "index": gpu.info.index,
        "uuid": gpu.info.uuid,
        "name": gpu.info.name,
        "pci_bus_id": gpu.info.pci_bus_id,
        "sm_clock_mhz": gpu.sm_clock_mhz,
        "mem_clock_mhz": gpu.mem_clock_mhz,
        "locked_sm_clock_mhz": (gpu.locked_sm_clock_mhz if gpu.HasField("locked_sm_clock_mhz") else None),
        "would_lock_sm_clock_mhz": (
            gpu.would_lock_sm_clock_mhz if gpu.HasField("would_lock_sm_clock_mhz") else None
        ),
        "min_sm_clock_mhz": gpu.info.min_sm_clock_mhz,
        "max_sm_clock_mhz": gpu.info.max_sm_clock_mhz,
        "source": _enum_name(eerl_pb2.ClockSource, gpu.source, "CLOCK_SOURCE_"),
        "owner": owner,
        "power_w": gpu.power_w,
        "power_limit_w": gpu.power_limit_w,
        "energy_j": gpu.energy_mj / 1000.0,
        "utilization_gpu_percent": gpu.utilization_gpu_percent,
        "degraded": bool(gpu.degraded_reason),
        "degraded_reason": gpu.degraded_reason or None,
        "clock_event_reasons": list(gpu.clock_event_reasons),
        "drain": _drain_dict(gpu.drain) if gpu.HasField("drain") else None,
    }


def _phase_dict(phase: eerl_pb2.PhaseStatus) -> JsonDict:
    return {
        "kind": _enum_name(eerl_pb2.PhaseKind, phase.kind, "PHASE_KIND_"),
        "state": _enum_name(eerl_pb2.ControllerState, phase.state, "CONTROLLER_STATE_"),
        "sm_clock_mhz": _mhz_or_none(phase.sm_clock_mhz),
        "candidate_sm_clock_mhz": _mhz_or_none(phase.candidate_sm_clock_mhz),
        "phases": phase.phases,
        "energy_j": phase.energy_mj / 1000.0,
        "valid_tokens": phase.valid_tokens,
        "energy_per_valid_token_j": phase.energy_per_valid_token_j,
        "throughput_tokens_per_s": phase.throughput_tokens_per_s,
        "estimated_savings_fraction": phase.estimated_savings_fraction,
        "exploration_cost_j": phase.exploration_cost_mj / 1000.0,
        "predictor_error_fraction": phase.predictor_error_fraction,
    }


def session_dict(session: eerl_pb2.SessionInfo) -> JsonDict:
    """One session with its per-phase controller view."""
    return {
        "session_id": session.session_id,
        "job_id": session.job_id,
        "rank": session.rank,
        "world_size": session.world_size,
        "gpu_indices": list(session.gpu_indices),
        "mode": _enum_name(eerl_pb2.ExecutionMode, session.mode, "EXECUTION_MODE_"),
        "role": _enum_name(eerl_pb2.GpuRole, session.role, "GPU_ROLE_"),
        "current_phase": _enum_name(eerl_pb2.PhaseKind, session.current_phase, "PHASE_KIND_"),
        "iteration": session.iteration,
        "attached": session.attached,
        "lease_remaining_s": session.lease_remaining_s,
        "opened_at_unix_s": session.opened_at_unix_s,
        "throughput_threshold": session.throughput_threshold,
        "grant": session.grant or "shared",
        "job_mode": _job_mode_dict(session.job_mode) if session.job_mode.enabled else None,
        "held_since_unix_s": session.held_since_unix_s or None,
        "held_sm_clock_mhz": _mhz_or_none(session.held_sm_clock_mhz),
        "phases": [_phase_dict(p) for p in session.phases],
    }


def _job_mode_dict(job_mode: eerl_pb2.JobMode) -> JsonDict:
    return {"incarnation": job_mode.incarnation, "node_rank": job_mode.node_rank}


def _directive_dict(directive: eerl_pb2.Directive) -> JsonDict:
    return {
        "incarnation": directive.incarnation,
        "epoch": directive.epoch,
        "iteration": directive.iteration,
        "kind": _enum_name(eerl_pb2.PhaseKind, directive.kind, "PHASE_KIND_"),
        "sm_clock_mhz": _mhz_or_none(directive.sm_clock_mhz),
        "purpose": _enum_name(eerl_pb2.DirectivePurpose, directive.purpose, "DIRECTIVE_PURPOSE_"),
    }


def status_dict(reply: eerl_pb2.StatusResponse) -> JsonDict:
    """The whole node: ``daemon``, ``gpus`` and ``sessions``."""
    d = reply.daemon
    return {
        "daemon": {
            "version": d.version,
            "backend": d.backend,
            "controller": d.controller,
            "dry_run": d.dry_run,
            "uptime_s": d.uptime_s,
            "hostname": d.hostname,
        },
        "gpus": [gpu_dict(g) for g in reply.gpus],
        "sessions": [session_dict(s) for s in reply.sessions],
        "grants": [grant_dict(g) for g in reply.grants],
    }


def grant_dict(grant: eerl_pb2.GrantInfo) -> JsonDict:
    """One worker socket and what its sessions may claim."""
    return {
        "name": grant.name,
        "kind": grant.kind,
        "socket_path": grant.socket_path,
        "gpu_indices": [g.index for g in grant.gpus],
        "gpu_uuids": [g.uuid for g in grant.gpus],
        "uid": grant.uid if grant.HasField("uid") else None,
        "gid": grant.gid if grant.HasField("gid") else None,
        "job_id": grant.job_id or None,
        "created_at_unix_s": grant.created_at_unix_s or None,
        "expires_at_unix_s": grant.expires_at_unix_s or None,
        "reason": grant.reason,
        "sessions": grant.sessions,
    }


TOKEN_PREFIX_CHARS = 8


def redact_tokens(data: Any) -> Any:
    """``data`` with every session token cut to a prefix: a full token is a credential for its session."""
    if isinstance(data, dict):
        return {
            k: _prefix(v) if k == "session_id" else [_prefix(t) for t in v] if k.endswith("session_ids")
            else redact_tokens(v)
            for k, v in data.items()
        }  # fmt: skip
    if isinstance(data, list):
        return [redact_tokens(v) for v in data]
    return data


def _prefix(token: Any) -> Any:
    if isinstance(token, str) and len(token) > TOKEN_PREFIX_CHARS:
        return token[:TOKEN_PREFIX_CHARS] + "…"
    return token


def clocks_dict(clocks: Sequence[eerl_pb2.GpuClock]) -> JsonDict:
    """The per-GPU clocks read back after a pin, unpin or reset."""
    return {
        "clocks": [
            {
                "index": c.index,
                "uuid": c.uuid,
                "sm_clock_mhz": c.sm_clock_mhz,
                "requested_sm_clock_mhz": _mhz_or_none(c.requested_sm_clock_mhz),
                "source": _enum_name(eerl_pb2.ClockSource, c.source, "CLOCK_SOURCE_"),
                "dry_run": c.dry_run,
                "degraded_reason": c.degraded_reason or None,
            }
            for c in clocks
        ]
    }


def decision_dict(decision: eerl_pb2.Decision) -> JsonDict:
    """One controller decision; a job-mode phase's carries its ``directive`` and the ``verdict`` on it."""
    return {
        "session_id": decision.session_id,
        "kind": _enum_name(eerl_pb2.PhaseKind, decision.kind, "PHASE_KIND_"),
        "iteration": decision.iteration,
        "timestamp_unix_s": decision.timestamp_unix_s,
        "state": _enum_name(eerl_pb2.ControllerState, decision.state, "CONTROLLER_STATE_"),
        "sm_clock_mhz": _mhz_or_none(decision.sm_clock_mhz),
        "reason": decision.reason,
        "throughput_ratio": decision.throughput_ratio or None,
        "energy_ratio": decision.energy_ratio or None,
        "verdict": _enum_name(eerl_pb2.DirectiveVerdict, decision.verdict, "DIRECTIVE_VERDICT_"),
        "directive": _directive_dict(decision.directive) if decision.HasField("directive") else None,
    }


def report_dict(r: eerl_pb2.SessionReport) -> JsonDict:
    """One finished session's report (:meth:`eerl.reports.SessionReport.to_json`: ``throughput_ratio``
    null when the controller predicted none)."""
    return report_from_pb(r).to_json()


def job_report_dict(job_id: str, sessions: Sequence[eerl_pb2.SessionReport]) -> JsonDict:
    """One job's report on this node (:class:`eerl.reports.JobReport`): its sessions' totals, the savings
    over all of them, its throughput the lowest of its sessions' (a rank that fell behind holds the job
    back)."""
    return JobReport.of(job_id, [report_from_pb(s) for s in sessions]).to_json()
