"""Proto ↔ domain: every request field is validated here (naming the field) before the domain sees it.

Decoders raise :class:`~eerld.errors.ValidationError` and never touch state, so a bad request changes
nothing. Bounds reject the absurd (a token count no phase can reach, a NaN) rather than the unusual.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from eerl.directives import DirectiveVerdict
from eerl.job.admission import ReceivedDirective
from eerl.phases import ControllerState, ExecutionMode, GpuRole, PhaseKind, Workload
from eerl.v1 import eerl_pb2 as pb
from eerl.wire.enums import (
    KIND_FROM_PB,
    KIND_TO_PB,
    MODE_FROM_PB,
    MODE_TO_PB,
    PURPOSE_FROM_PB,
    PURPOSE_TO_PB,
    ROLE_FROM_PB,
    ROLE_TO_PB,
    STATE_TO_PB,
    VERDICT_TO_PB,
    workload_from_pb,
)
from eerl.wire.limits import MAX_ITERATION, WORKLOAD_LIMITS

from eerld.clocks.arbiter import AppliedClock, ClockSource
from eerld.clocks.pins import Pin
from eerld.daemon import (
    DaemonView,
    DecisionView,
    GpuInfoView,
    GpuPinView,
    GpuStatusView,
    GrantView,
    PhaseStatusView,
    SessionView,
)
from eerld.daemon.drains import Drain
from eerld.errors import ValidationError
from eerld.grants import MAX_UNIX_ID, NAME_RULE, GrantSpec, is_grant_name
from eerld.sessions import GpuSelector, JobModeSpec, SessionSpec

MAX_SESSION_ID_CHARS = 128
MAX_TEXT_CHARS = 256
MAX_REASON_CHARS = 1024
MAX_GPUS_PER_REQUEST = 64
MAX_LEASE_TTL_S = 3600.0
MIN_LEASE_TTL_S = 1.0
MAX_PIN_DURATION_S = 366 * 24 * 3600.0
MAX_CLOCK_MHZ = 10_000
MAX_DECISIONS_LIMIT = 100_000
MAX_GRANT_DURATION_S = 366 * 24 * 3600.0
MAX_INCARNATION = 2**63 - 1
MAX_EPOCH = 2**63 - 1
MAX_NODE_RANK = 10**6

_TOKEN = re.compile(r"[A-Za-z0-9_-]+")

_SOURCES_OUT = {
    ClockSource.DEFAULT: pb.CLOCK_SOURCE_DEFAULT,
    ClockSource.SESSION: pb.CLOCK_SOURCE_SESSION,
    ClockSource.ADMIN_PIN: pb.CLOCK_SOURCE_ADMIN_PIN,
}


# -- decoding -----------------------------------------------------------------------------------------


def session_id(value: str, field: str = "session_id") -> str:
    """A syntactically valid session token (whether it exists is the domain's question)."""
    return _token(value, field, "a session id")


def _token(value: str, field: str, what: str) -> str:
    if not value:
        raise ValidationError(field, "required")
    if len(value) > MAX_SESSION_ID_CHARS or not _TOKEN.fullmatch(value):
        raise ValidationError(field, f"not {what}")
    return value


def optional_session_id(value: str, field: str = "session_id") -> str | None:
    """A session token, or None when empty."""
    return session_id(value, field) if value else None


def phase_kind(value: int, field: str = "kind") -> PhaseKind:
    """A required phase kind."""
    if value == pb.PHASE_KIND_UNSPECIFIED:
        raise ValidationError(field, "required (PHASE_KIND_GENERATION or PHASE_KIND_TRAINING)")
    if value not in KIND_FROM_PB:
        raise ValidationError(field, f"unknown phase kind {value}")
    return KIND_FROM_PB[pb.PhaseKind.ValueType(value)]


def optional_phase_kind(value: int, field: str = "kind") -> PhaseKind | None:
    """A phase kind, or None for UNSPECIFIED."""
    return None if value == pb.PHASE_KIND_UNSPECIFIED else phase_kind(value, field)


def iteration(value: int, field: str = "iteration") -> int:
    """An iteration number below an absurd bound."""
    if value > MAX_ITERATION:
        raise ValidationError(field, f"{value} is out of range (at most {MAX_ITERATION})")
    return value


def _count(value: int, field: str, name: str, maximum: int) -> int:
    if value > maximum:
        raise ValidationError(
            f"{field}.{name}", f"{value} is absurd (at most {maximum}); negative values arrive this way too"
        )
    return value


def workload(msg: pb.Workload, field: str) -> Workload:
    """A phase workload with every count within its limit (the client's table, :data:`WORKLOAD_LIMITS`)
    and valid tokens within tokens."""
    checked = workload_from_pb(msg)
    for name, limit, _ in WORKLOAD_LIMITS:
        _count(getattr(checked, name), field, name, limit)
    if checked.tokens and checked.valid_tokens > checked.tokens:
        raise ValidationError(
            f"{field}.valid_tokens", f"{checked.valid_tokens} exceeds tokens ({checked.tokens})"
        )
    return checked


def _finite(value: float, field: str, minimum: float, maximum: float) -> float:
    if not math.isfinite(value):
        raise ValidationError(field, f"must be a finite number, got {value}")
    if not minimum <= value <= maximum:
        raise ValidationError(field, f"must be between {minimum:g} and {maximum:g}, got {value:g}")
    return value


def _text(value: str, field: str, maximum: int, *, required: bool = False) -> str:
    if required and not value.strip():
        raise ValidationError(field, "required")
    if len(value) > maximum:
        raise ValidationError(field, f"too long ({len(value)} characters, at most {maximum})")
    if any(not ch.isprintable() for ch in value):
        raise ValidationError(field, "contains control characters")
    return value


def gpu_refs(refs: Sequence[pb.GpuRef], field: str = "gpus") -> tuple[GpuSelector, ...]:
    """GPU references; each must name an index or a UUID."""
    if len(refs) > MAX_GPUS_PER_REQUEST:
        raise ValidationError(field, f"{len(refs)} GPUs listed (at most {MAX_GPUS_PER_REQUEST})")
    selectors: list[GpuSelector] = []
    for i, ref in enumerate(refs):
        name = f"{field}[{i}]"
        which = ref.WhichOneof("ref")
        if which == "index":
            selectors.append(GpuSelector.parse(name, ref.index, part=".index"))
        elif which == "uuid":
            selector = GpuSelector.parse(name, ref.uuid, part=".uuid")
            if selector.uuid is None:  # digits in the uuid field: an index sent as a UUID
                raise ValidationError(f"{name}.uuid", f"{ref.uuid!r} is not a GPU UUID (GPU-… or MIG-…)")
            selectors.append(selector)
        else:
            raise ValidationError(name, "set index or uuid")
    return tuple(selectors)


def _targets(refs: Sequence[pb.GpuRef], all_gpus: bool) -> tuple[GpuSelector, ...] | None:
    if all_gpus:
        return None
    if not refs:
        raise ValidationError("gpus", "required unless all is set")
    return gpu_refs(refs)


def open_session(req: pb.OpenSessionRequest) -> SessionSpec:
    """OpenSessionRequest → SessionSpec."""
    job_id = _text(req.job_id, "job_id", MAX_TEXT_CHARS, required=True)
    gpus = gpu_refs(req.gpus)  # none: every GPU of a scoped socket (the daemon checks the socket)
    if len(req.claim_tickets) > MAX_GPUS_PER_REQUEST:
        raise ValidationError(
            "claim_tickets", f"{len(req.claim_tickets)} listed (at most {MAX_GPUS_PER_REQUEST})"
        )
    tickets = tuple(
        _token(t, f"claim_tickets[{i}]", "a claim ticket") for i, t in enumerate(req.claim_tickets)
    )
    if req.mode == pb.EXECUTION_MODE_UNSPECIFIED:
        mode = ExecutionMode.SYNC
    elif req.mode in MODE_FROM_PB:
        mode = MODE_FROM_PB[req.mode]
    else:
        raise ValidationError("mode", f"unknown execution mode {req.mode}")
    if req.role == pb.GPU_ROLE_UNSPECIFIED:
        role = GpuRole.BOTH
    elif req.role in ROLE_FROM_PB:
        role = ROLE_FROM_PB[req.role]
    else:
        raise ValidationError("role", f"unknown GPU role {req.role}")
    if mode is ExecutionMode.ASYNC and role is GpuRole.BOTH:
        raise ValidationError(
            "role", "an async session runs one phase kind: GPU_ROLE_GENERATION or _TRAINING"
        )
    if req.world_size and req.rank >= req.world_size:
        raise ValidationError("rank", f"{req.rank} is not below world_size ({req.world_size})")
    threshold = req.policy.throughput_threshold if req.HasField("policy") else 0.0
    if threshold != 0.0:
        _finite(threshold, "policy.throughput_threshold", 0.0, 1.0)
        if threshold <= 0.0:
            raise ValidationError("policy.throughput_threshold", "must be in (0, 1]")
    ttl = req.lease_ttl_s
    if ttl != 0.0:
        _finite(ttl, "lease_ttl_s", MIN_LEASE_TTL_S, MAX_LEASE_TTL_S)
    job = None
    if req.HasField("job_mode") and req.job_mode.enabled:
        job = JobModeSpec(
            incarnation=_bounded(req.job_mode.incarnation, "job_mode.incarnation", MAX_INCARNATION),
            node_rank=_bounded(req.job_mode.node_rank, "job_mode.node_rank", MAX_NODE_RANK),
        )
    return SessionSpec(
        job_id=job_id,
        rank=req.rank,
        world_size=req.world_size,
        gpus=gpus,
        mode=mode,
        role=role,
        throughput_threshold=threshold or None,
        lease_ttl_s=ttl or None,
        client_name=_text(req.client_name, "client_name", MAX_TEXT_CHARS),
        claim_tickets=tickets,
        job=job,
    )


def _bounded(value: int, field: str, maximum: int) -> int:
    if value > maximum:
        raise ValidationError(field, f"{value} is out of range (at most {maximum})")
    return value


def directive(msg: pb.Directive, field: str = "directive") -> ReceivedDirective:
    """A directive as received: an unknown kind or purpose is kept as None for the daemon's verdict
    (WRONG_PHASE, BAD_PURPOSE), not refused here; only absurd numbers are."""
    kind = KIND_FROM_PB.get(msg.kind)
    return ReceivedDirective(
        incarnation=_bounded(msg.incarnation, f"{field}.incarnation", MAX_INCARNATION),
        epoch=_bounded(msg.epoch, f"{field}.epoch", MAX_EPOCH),
        iteration=iteration(msg.iteration, f"{field}.iteration"),
        kind=kind,
        sm_clock_mhz=msg.sm_clock_mhz or None,
        purpose=PURPOSE_FROM_PB.get(msg.purpose),
    )


def begin_phase(
    req: pb.BeginPhaseRequest,
) -> tuple[str, PhaseKind, int, Workload | None, ReceivedDirective | None]:
    """BeginPhaseRequest → (session, kind, iteration, hints, directive)."""
    hints = workload(req.hints, "hints") if req.HasField("hints") else None
    received = directive(req.directive) if req.HasField("directive") else None
    return session_id(req.session_id), phase_kind(req.kind), iteration(req.iteration), hints, received


def end_phase(req: pb.EndPhaseRequest) -> tuple[str, PhaseKind, int, Workload]:
    """EndPhaseRequest → (session, kind, iteration, workload)."""
    sid, kind, it = session_id(req.session_id), phase_kind(req.kind), iteration(req.iteration)
    if not req.HasField("workload"):
        raise ValidationError("workload", "required (tokens processed by the phase)")
    return sid, kind, it, workload(req.workload, "workload")


@dataclass(frozen=True, slots=True)
class PinArgs:
    """A validated PinRequest."""

    gpus: tuple[GpuSelector, ...] | None
    sm_clock_mhz: int
    mem_clock_mhz: int
    duration_s: float
    reason: str
    replace: bool = False


def pin(req: pb.PinRequest) -> PinArgs:
    """PinRequest → PinArgs (whether the clock is supported is the domain's question)."""
    gpus = _targets(req.gpus, req.all)
    if req.sm_clock_mhz == 0:
        raise ValidationError("sm_clock_mhz", "required")
    if req.sm_clock_mhz > MAX_CLOCK_MHZ:
        raise ValidationError("sm_clock_mhz", f"{req.sm_clock_mhz} MHz is out of range")
    if req.mem_clock_mhz > MAX_CLOCK_MHZ * 4:
        raise ValidationError("mem_clock_mhz", f"{req.mem_clock_mhz} MHz is out of range")
    duration = _finite(req.duration_s, "duration_s", 0.0, MAX_PIN_DURATION_S)
    reason = _text(req.reason, "reason", MAX_REASON_CHARS)
    return PinArgs(gpus, req.sm_clock_mhz, req.mem_clock_mhz, duration, reason, req.replace)


def unpin(req: pb.UnpinRequest) -> tuple[GpuSelector, ...] | None:
    """UnpinRequest → the GPUs (None: all)."""
    return _targets(req.gpus, req.all)


def reset(req: pb.ResetAllRequest) -> tuple[tuple[GpuSelector, ...] | None, str]:
    """ResetAllRequest → (GPUs or None for all, reason); ``keep_pins`` is read as it is."""
    return _targets(req.gpus, req.all), _text(req.reason, "reason", MAX_REASON_CHARS)


@dataclass(frozen=True, slots=True)
class DrainArgs:
    """A validated DrainRequest."""

    gpus: tuple[GpuSelector, ...] | None
    duration_s: float
    reason: str
    keep_sessions: bool


def drain(req: pb.DrainRequest) -> DrainArgs:
    """DrainRequest → DrainArgs."""
    return DrainArgs(
        _targets(req.gpus, req.all),
        _finite(req.duration_s, "duration_s", 0.0, MAX_PIN_DURATION_S),
        _text(req.reason, "reason", MAX_REASON_CHARS),
        req.keep_sessions,
    )


def undrain(req: pb.UndrainRequest) -> tuple[GpuSelector, ...] | None:
    """UndrainRequest → the GPUs (None: all)."""
    return _targets(req.gpus, req.all)


def grant(req: pb.GrantRequest) -> GrantSpec:
    """GrantRequest → GrantSpec (whether the GPUs exist is the domain's question)."""
    name = _text(req.name, "name", 64) or None
    if name is not None and not is_grant_name(name):
        raise ValidationError("name", f"{name!r} is not a grant name ({NAME_RULE})")
    if not req.gpus:
        raise ValidationError("gpus", "at least one GPU is required")
    uid = req.uid if req.HasField("uid") else None
    gid = req.gid if req.HasField("gid") else None
    if uid is None and gid is None:
        raise ValidationError("uid", "set uid, gid or both: the socket's owner decides who may connect")
    for field, value in (("uid", uid), ("gid", gid)):
        if value is not None and value > MAX_UNIX_ID:
            raise ValidationError(field, f"{value} is not a valid id")
    job_id = _text(req.job_id, "job_id", MAX_TEXT_CHARS)
    if name is None and not job_id:
        raise ValidationError("name", "required unless job_id is set (the grant is then job-<job_id>)")
    if name is None and not is_grant_name(f"job-{job_id}"):
        raise ValidationError("job_id", f"job-{job_id!r} is not a grant name ({NAME_RULE}); give a name")
    return GrantSpec(
        name=name,
        gpus=gpu_refs(req.gpus),
        uid=uid,
        gid=gid,
        job_id=job_id,
        duration_s=_finite(req.duration_s, "duration_s", 0.0, MAX_GRANT_DURATION_S),
        reason=_text(req.reason, "reason", MAX_REASON_CHARS),
        replace=req.replace,
        own_directory=req.own_directory,
    )


def revoke(req: pb.RevokeRequest) -> tuple[str | None, str | None, str]:
    """RevokeRequest → (name or None, job id or None, reason); exactly one of name and job id."""
    name = _text(req.name, "name", 64) or None
    job_id = _text(req.job_id, "job_id", MAX_TEXT_CHARS) or None
    if (name is None) == (job_id is None):
        raise ValidationError("name", "set either name or job_id")
    return name, job_id, _text(req.reason, "reason", MAX_REASON_CHARS)


def report(req: pb.ReportRequest) -> str | None:
    """The job whose reports are asked for (None: every report kept)."""
    return _text(req.job_id, "job_id", MAX_TEXT_CHARS) or None


def decisions(req: pb.GetDecisionsRequest) -> tuple[str | None, PhaseKind | None, int]:
    """GetDecisionsRequest → (session or None, kind or None, limit)."""
    limit = req.limit or 1000
    if limit > MAX_DECISIONS_LIMIT:
        raise ValidationError("limit", f"{limit} is out of range (at most {MAX_DECISIONS_LIMIT})")
    return optional_session_id(req.session_id), optional_phase_kind(req.kind), limit


# -- encoding -----------------------------------------------------------------------------------------


def kind_out(kind: PhaseKind | None) -> pb.PhaseKind.ValueType:
    """Domain phase kind → proto enum."""
    return KIND_TO_PB[kind] if kind is not None else pb.PHASE_KIND_UNSPECIFIED


def state_out(state: ControllerState) -> pb.ControllerState.ValueType:
    """Domain controller state → proto enum."""
    return STATE_TO_PB.get(state, pb.CONTROLLER_STATE_UNSPECIFIED)


def clock_out(c: AppliedClock) -> pb.GpuClock:
    """Applied clock → GpuClock."""
    return pb.GpuClock(
        index=c.index,
        uuid=c.uuid,
        sm_clock_mhz=c.sm_clock_mhz,
        requested_sm_clock_mhz=c.requested_sm_clock_mhz or 0,
        source=_SOURCES_OUT[c.source],
        dry_run=c.dry_run,
        degraded_reason=c.degraded_reason,
    )


def gpu_info_out(info: GpuInfoView) -> pb.GpuInfo:
    """GPU facts → GpuInfo."""
    return pb.GpuInfo(
        index=info.index,
        uuid=info.uuid,
        name=info.name,
        pci_bus_id=info.pci_bus_id,
        min_sm_clock_mhz=info.min_sm_clock_mhz,
        max_sm_clock_mhz=info.max_sm_clock_mhz,
        supported_sm_clocks_mhz=list(info.supported_sm_clocks_mhz),
    )


def pin_out(p: Pin) -> pb.AdminPin:
    """Pin → AdminPin."""
    return pb.AdminPin(
        sm_clock_mhz=p.sm_clock_mhz,
        mem_clock_mhz=p.mem_clock_mhz,
        reason=p.reason,
        expires_at_unix_s=p.expires_at_unix_s,
        created_at_unix_s=p.created_at_unix_s,
        set_by=p.set_by,
    )


def gpu_pin_out(v: GpuPinView) -> pb.GpuPin:
    """A pin and its GPU → GpuPin."""
    return pb.GpuPin(index=v.index, uuid=v.pin.uuid, pin=pin_out(v.pin))


def drain_out(d: Drain) -> pb.GpuDrain:
    """Drain → GpuDrain."""
    return pb.GpuDrain(
        reason=d.reason,
        created_at_unix_s=d.created_at_unix_s,
        expires_at_unix_s=d.expires_at_unix_s,
        set_by=d.set_by,
    )


def gpu_status_out(g: GpuStatusView) -> pb.GpuStatus:
    """GPU status → GpuStatus."""
    owner = pb.GpuOwner(session_id=g.session_id or "", job_id=g.job_id or "", rank=g.rank or 0)
    if g.pin is not None:
        owner.pin.CopyFrom(pin_out(g.pin))
    msg = pb.GpuStatus(
        info=gpu_info_out(g.info),
        sm_clock_mhz=g.sm_clock_mhz,
        mem_clock_mhz=g.mem_clock_mhz,
        source=_SOURCES_OUT[g.source],
        owner=owner,
        power_w=g.power_w,
        power_limit_w=g.power_limit_w,
        energy_mj=g.energy_mj,
        utilization_gpu_percent=g.utilization_gpu_percent,
        degraded_reason=g.degraded_reason,
        clock_event_reasons=list(g.clock_event_reasons),
    )
    if g.drain is not None:
        msg.drain.CopyFrom(drain_out(g.drain))
    if g.locked_sm_clock_mhz is not None:
        msg.locked_sm_clock_mhz = g.locked_sm_clock_mhz
    if g.would_lock_sm_clock_mhz is not None:
        msg.would_lock_sm_clock_mhz = g.would_lock_sm_clock_mhz
    return msg


def _phase_status_out(p: PhaseStatusView) -> pb.PhaseStatus:
    return pb.PhaseStatus(
        kind=kind_out(p.kind),
        state=state_out(p.state),
        sm_clock_mhz=p.sm_clock_mhz or 0,
        candidate_sm_clock_mhz=p.candidate_sm_clock_mhz or 0,
        phases=p.phases,
        energy_mj=p.energy_mj,
        valid_tokens=p.valid_tokens,
        energy_per_valid_token_j=p.energy_per_valid_token_j,
        throughput_tokens_per_s=p.throughput_tokens_per_s,
        estimated_savings_fraction=p.estimated_savings_fraction,
        exploration_cost_mj=p.exploration_cost_mj,
        predictor_error_fraction=p.predictor_error_fraction,
    )


def verdict_out(verdict: DirectiveVerdict | None) -> pb.DirectiveVerdict.ValueType:
    """Domain verdict → proto enum (None: UNSPECIFIED)."""
    return VERDICT_TO_PB[verdict] if verdict is not None else pb.DIRECTIVE_VERDICT_UNSPECIFIED


def directive_out(d: ReceivedDirective) -> pb.Directive:
    """Received directive → Directive (an unknown kind or purpose as UNSPECIFIED)."""
    return pb.Directive(
        incarnation=d.incarnation,
        epoch=d.epoch,
        iteration=d.iteration,
        kind=kind_out(d.kind),
        sm_clock_mhz=d.sm_clock_mhz or 0,
        purpose=PURPOSE_TO_PB[d.purpose] if d.purpose is not None else pb.DIRECTIVE_PURPOSE_UNSPECIFIED,
    )


def session_out(s: SessionView) -> pb.SessionInfo:
    """Session view → SessionInfo."""
    msg = pb.SessionInfo(
        session_id=s.session_id,
        job_id=s.job_id,
        rank=s.rank,
        world_size=s.world_size,
        gpu_indices=list(s.gpu_indices),
        mode=MODE_TO_PB[s.mode],
        role=ROLE_TO_PB[s.role],
        current_phase=kind_out(s.current_phase),
        iteration=s.iteration,
        phases=[_phase_status_out(p) for p in s.phases],
        opened_at_unix_s=s.opened_at_unix_s,
        attached=s.attached,
        lease_remaining_s=s.lease_remaining_s,
        throughput_threshold=s.throughput_threshold,
        grant=s.grant,
        held_since_unix_s=s.held_since_unix_s or 0.0,
        held_sm_clock_mhz=s.held_sm_clock_mhz or 0,
    )
    if s.job is not None:
        msg.job_mode.CopyFrom(
            pb.JobMode(enabled=True, incarnation=s.job.incarnation, node_rank=s.job.node_rank)
        )
    return msg


def grant_out(v: GrantView) -> pb.GrantInfo:
    """Grant view → GrantInfo."""
    g = v.grant
    msg = pb.GrantInfo(
        name=g.name,
        kind=g.kind.value,
        socket_path=str(g.socket_path),
        gpus=[gpu_info_out(i) for i in v.gpus],
        job_id=g.job_id,
        created_at_unix_s=g.created_at_unix_s,
        expires_at_unix_s=g.expires_at_unix_s,
        reason=g.reason,
        sessions=v.sessions,
    )
    if g.uid is not None:
        msg.uid = g.uid
    if g.gid is not None:
        msg.gid = g.gid
    return msg


def daemon_out(d: DaemonView) -> pb.DaemonInfo:
    """Daemon view → DaemonInfo."""
    return pb.DaemonInfo(
        version=d.version,
        backend=d.backend,
        controller=d.controller,
        dry_run=d.dry_run,
        uptime_s=d.uptime_s,
        hostname=d.hostname,
    )


def decision_out(v: DecisionView) -> pb.Decision:
    """Decision view → Decision."""
    d = v.decision
    msg = pb.Decision(
        session_id=v.session_id,
        kind=kind_out(d.kind),
        iteration=d.iteration,
        timestamp_unix_s=v.timestamp_unix_s,
        state=state_out(d.state),
        sm_clock_mhz=d.sm_clock_mhz or 0,
        reason=d.reason,
        throughput_ratio=d.throughput_ratio or 0.0,
        energy_ratio=d.energy_ratio or 0.0,
        verdict=verdict_out(v.verdict),
    )
    if v.directive is not None:
        msg.directive.CopyFrom(directive_out(v.directive))
    return msg
