"""eerlctl's output: protobuf replies as plain JSON-able dicts, and those dicts as tables for people.

The JSON shape is a contract for scripts (documented in docs/deployment.md): snake_case keys, units in
the names, ``null`` for "none" (no lock, no owner, default governor) rather than protobuf's zeros, and
energies in joules. Tables are rendered from the same dicts, so both views always agree. Everything here
is pure: the current time comes in as ``now_unix_s``.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

from eerl.v1 import eerl_pb2

__all__ = [
    "clocks_dict",
    "clocks_text",
    "decision_dict",
    "decisions_table",
    "drain_text",
    "gpu_dict",
    "gpu_pin_dict",
    "pin_text",
    "pins_table",
    "render_table",
    "reset_text",
    "session_dict",
    "sessions_table",
    "status_dict",
    "status_text",
    "undrain_text",
    "unpin_text",
    "utc",
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


# --------------------------------------------------------------------------- tables for people


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns separated by two spaces, like ``kubectl get``."""
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(cell)) for w, cell in zip(widths, row, strict=True)]
    lines = [
        "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in (headers, *rows)
    ]
    return "\n".join(lines)


def _clock(mhz: int | None) -> str:
    return "default" if mhz is None else f"{mhz} MHz"


def _energy(joules: float) -> str:
    for unit, scale in (("MJ", 1e6), ("kJ", 1e3)):
        if abs(joules) >= scale:
            return f"{joules / scale:.1f} {unit}"
    return f"{joules:.1f} J"


def utc(unix_s: float) -> str:
    """``2026-12-01T14:08:39Z``: every time eerlctl prints is UTC."""
    return dt.datetime.fromtimestamp(unix_s, tz=dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _when(unix_s: float | None, now_unix_s: float) -> str:
    if unix_s is None:
        return "no expiry"
    at = dt.datetime.fromtimestamp(unix_s, tz=dt.UTC).strftime("%H:%M:%SZ")
    left_s = max(unix_s - now_unix_s, 0.0)
    left = (
        f"{left_s / 3600:.1f}h"
        if left_s >= 3600
        else f"{left_s / 60:.0f}m"
        if left_s >= 60
        else f"{left_s:.0f}s"
    )
    return f"until {at} (in {left})"


def _owner(gpu: Mapping[str, Any], now_unix_s: float) -> str:
    owner = gpu["owner"]
    if owner is None:
        return "-"
    parts = []
    if owner["pin"] is not None:
        pin = owner["pin"]
        reason = f' "{pin["reason"]}"' if pin["reason"] else ""
        by = f" by {_who(pin['set_by'])}" if pin.get("set_by") else ""
        parts.append(f"admin pin{reason}{by} {_when(pin['expires_at_unix_s'], now_unix_s)}")
    if owner["session_id"] is not None:
        parts.append(f"job {owner['job_id']} rank {owner['rank']}")
    return "; ".join(parts)


def _who(set_by: str | None) -> str:
    """The short form of a ``set_by``: the reported user, without the admin socket's details."""
    return (set_by or "unknown").split(" via ")[0].removesuffix(", as reported by the client")


def _drained(gpu: Mapping[str, Any], now_unix_s: float) -> str:
    drain = gpu.get("drain")
    if drain is None:
        return ""
    reason = f' "{drain["reason"]}"' if drain["reason"] else ""
    until = _when(drain["expires_at_unix_s"], now_unix_s) if drain["expires_at_unix_s"] else "until undrained"
    return f"DRAINED{reason} {until}"


def _locked(gpu: Mapping[str, Any]) -> str:
    if gpu["locked_sm_clock_mhz"] is not None:
        return str(gpu["locked_sm_clock_mhz"])
    if gpu["would_lock_sm_clock_mhz"] is not None:
        return f"({gpu['would_lock_sm_clock_mhz']} dry-run)"
    return "-"


def sessions_table(sessions: Sequence[Mapping[str, Any]]) -> str:
    """One line per session and phase kind: clock, controller state and savings so far; with a JOB MODE
    column (incarnation and node rank) when a session is in job mode."""
    if not sessions:
        return "No open sessions."
    job_mode = any(s.get("job_mode") for s in sessions)
    rows = []
    for s in sessions:
        gpus = ",".join(str(i) for i in s["gpu_indices"])
        now = _now_text(s)
        for p in s["phases"] or [{}]:
            rows.append(
                [
                    s["session_id"],
                    s["job_id"],
                    str(s["rank"]),
                    gpus,
                    now,
                    p.get("kind") or "-",
                    _clock(p.get("sm_clock_mhz")),
                    p.get("state") or "-",
                    f"{p['estimated_savings_fraction']:.1%}" if p else "-",
                    f"{p['energy_per_valid_token_j']:.4g} J" if p and p["energy_per_valid_token_j"] else "-",
                ]
            )
            if job_mode:
                rows[-1].append(_job_mode_text(s.get("job_mode")))
    headers = ["SESSION", "JOB", "RANK", "GPUS", "NOW", "PHASE", "CLOCK", "STATE", "SAVINGS", "J/TOKEN"]
    return render_table([*headers, "JOB MODE"] if job_mode else headers, rows)


def _now_text(session: Mapping[str, Any]) -> str:
    """``generation@3``; between phases ``none@3``, and with the GPUs still locked ``none@3, held at
    1200 MHz since 2026-12-01T14:08:41Z``."""
    phase = session["current_phase"]
    text = f"{phase or 'none'}@{session['iteration']}"
    if phase is None and session.get("held_since_unix_s"):
        text += f", held at {session['held_sm_clock_mhz']} MHz since {utc(session['held_since_unix_s'])}"
    return text


def _job_mode_text(job_mode: Mapping[str, Any] | None) -> str:
    if not job_mode:
        return "-"
    return f"incarnation {job_mode['incarnation']}, node {job_mode['node_rank']}"


def _directive_text(d: Mapping[str, Any]) -> str:
    """``off_grid: trial 1501 MHz e3`` for a job-mode decision, ``-`` for the daemon's own."""
    if d.get("verdict") is None:
        return "-"
    directive = d.get("directive")
    if directive is None:
        return str(d["verdict"])
    clock = "default" if directive["sm_clock_mhz"] is None else f"{directive['sm_clock_mhz']} MHz"
    return f"{d['verdict']}: {directive['purpose'] or '?'} {clock} e{directive['epoch']}"


def status_text(status: Mapping[str, Any], now_unix_s: float) -> str:
    """The node at a glance: daemon line, GPU table, session table."""
    d = status["daemon"]
    dry = " · DRY RUN (no clock is applied)" if d["dry_run"] else ""
    head = (
        f"eerld {d['version']} on {d['hostname']} · backend {d['backend']} · controller {d['controller']}"
        f" · up {d['uptime_s']:.0f}s{dry}"
    )
    rows = [
        [
            str(g["index"]),
            g["name"],
            str(g["sm_clock_mhz"]),
            _locked(g),
            f"{g['min_sm_clock_mhz']}-{g['max_sm_clock_mhz']}",
            f"{g['power_w']:.0f} W",
            _energy(g["energy_j"]),
            "; ".join(x for x in (_drained(g, now_unix_s), _owner(g, now_unix_s)) if x and x != "-") or "-",
            f"degraded: {g['degraded_reason']}" if g["degraded"] else "ok",
        ]
        for g in status["gpus"]
    ]
    gpu_table = render_table(
        ["GPU", "NAME", "SM MHZ", "LOCKED", "RANGE MHZ", "POWER", "ENERGY", "OWNER", "HEALTH"], rows
    )
    return f"{head}\n\n{gpu_table}\n\n{sessions_table(status['sessions'])}"


_SOURCE_WORDS = {"admin_pin": "an admin pin", "session": "a session", "default": "the default governor"}


def clocks_text(verb: str, clocks: Mapping[str, Any]) -> str:
    """One line per GPU after pin/unpin/reset, e.g. ``GPU 0: pinned, SM clock now 1200 MHz``."""
    lines = []
    for c in clocks["clocks"]:
        dry = " (dry run: not applied)" if c["dry_run"] else ""
        degraded = f" (degraded: {c['degraded_reason']})" if c["degraded_reason"] else ""
        lines.append(
            f"GPU {c['index']}: {verb}; SM clock now {c['sm_clock_mhz']} MHz, "
            f"decided by {_SOURCE_WORDS.get(c['source'], c['source'])}"
            f"{dry}{degraded}"
        )
    return "\n".join(lines) if lines else "No GPU changed."


def pin_text(outcome: Mapping[str, Any], now_unix_s: float) -> str:
    """What a pin did: the clocks read back, and the pins it replaced."""
    text = clocks_text("pinned", outcome)
    for r in outcome.get("replaced", ()):
        text += f"\nGPU {r['index']}: replaced the pin {_pin_words(r, now_unix_s)}"
    return text


def _pin_words(pin: Mapping[str, Any], now_unix_s: float) -> str:
    reason = f' "{pin["reason"]}"' if pin["reason"] else " (no reason)"
    set_at = f", set {utc(pin['created_at_unix_s'])}" if pin.get("created_at_unix_s") else ""
    by = f" by {_who(pin['set_by'])}" if pin.get("set_by") else ""
    return f"at {pin['sm_clock_mhz']} MHz{reason}{set_at}{by}, {_when(pin['expires_at_unix_s'], now_unix_s)}"


def unpin_text(outcome: Mapping[str, Any], now_unix_s: float) -> str:
    """What an unpin did: per GPU the pin removed and the clock read back after; the GPUs with no pin."""
    removed = {r["index"]: r for r in outcome.get("removed", ())}
    lines = []
    for c in outcome["clocks"]:
        pin = removed.get(c["index"])
        what = f"removed the pin {_pin_words(pin, now_unix_s)}" if pin else "unpinned"
        lines.append(
            f"GPU {c['index']}: {what}; SM clock now {c['sm_clock_mhz']} MHz, "
            f"decided by {_SOURCE_WORDS.get(c['source'], c['source'])}"
            + (" (dry run: not applied)" if c["dry_run"] else "")
            + (f" (degraded: {c['degraded_reason']})" if c["degraded_reason"] else "")
        )
    lines += [f"GPU {i}: had no pin; nothing changed" for i in outcome.get("not_pinned", ())]
    return "\n".join(lines) if lines else "No GPU changed."


def pins_table(pins: Sequence[Mapping[str, Any]], now_unix_s: float) -> str:
    """The admin pins in force: GPU, clocks, reason, when and by whom they were set, expiry."""
    if not pins:
        return "No pins."
    rows = [
        [
            str(p["index"]),
            str(p["sm_clock_mhz"]),
            str(p["mem_clock_mhz"] or "-"),
            p["reason"] or "-",
            utc(p["created_at_unix_s"]) if p["created_at_unix_s"] else "-",
            p["set_by"] or "unknown",
            _when(p["expires_at_unix_s"], now_unix_s) if p["expires_at_unix_s"] else "never",
        ]
        for p in pins
    ]
    return render_table(["GPU", "SM MHZ", "MEM MHZ", "REASON", "SET (UTC)", "SET BY", "EXPIRES"], rows)


def drain_text(outcome: Mapping[str, Any], now_unix_s: float) -> str:
    """What a drain did: the GPUs drained until when, the sessions closed, the clocks read back."""
    gpus = ", ".join(str(i) for i in outcome["gpu_indices"])
    duration = outcome.get("duration_s")
    until = _when(now_unix_s + duration, now_unix_s) if duration else "until eerlctl undrain"
    text = f"GPU(s) {gpus} drained {until}: no new claims"
    if outcome["clocks"]:
        text += "\n" + clocks_text("drained", outcome)
    if outcome["closed_session_ids"]:
        text += "\nClosed sessions: " + ", ".join(outcome["closed_session_ids"])
    return text


def undrain_text(outcome: Mapping[str, Any]) -> str:
    """What an undrain did."""
    lines = [f"GPU {i}: undrained; it may be claimed again" for i in outcome["undrained"]]
    lines += [f"GPU {i}: was not drained; nothing changed" for i in outcome["not_drained"]]
    return "\n".join(lines) if lines else "No GPU changed."


def reset_text(clocks: Mapping[str, Any], closed_session_ids: Sequence[str]) -> str:
    """What a reset did: GPU clocks and the sessions it closed."""
    text = clocks_text("reset", clocks)
    if closed_session_ids:
        text += "\nClosed sessions: " + ", ".join(closed_session_ids)
    return text


def grant_text(grant: Mapping[str, Any], now_unix_s: float) -> str:
    """What a grant did: the socket, who may connect, which GPUs, until when, what it replaced."""
    who = " and ".join(
        [f"uid {grant['uid']}"] * (grant["uid"] is not None)
        + [f"gid {grant['gid']}"] * (grant["gid"] is not None)
    )
    until = _when(grant["expires_at_unix_s"], now_unix_s) if grant["expires_at_unix_s"] else "until revoked"
    job = f" for job {grant['job_id']}" if grant["job_id"] else ""
    gpus = ",".join(str(i) for i in grant["gpu_indices"])
    text = f"granted GPU(s) {gpus} to {who}{job} at {grant['socket_path']} ({until})"
    if grant.get("revoked"):
        text += "\nreplaced: " + ", ".join(grant["revoked"])
    return text


def revoke_text(outcome: Mapping[str, Any]) -> str:
    """What a revoke did: the grants removed, the GPUs' clocks, the sessions closed."""
    text = "revoked: " + ", ".join(outcome["revoked"])
    if outcome["clocks"]:
        text += "\n" + clocks_text("reset", outcome)
    if outcome["closed_session_ids"]:
        text += "\nClosed sessions: " + ", ".join(outcome["closed_session_ids"])
    return text


def grants_table(grants: Sequence[Mapping[str, Any]], now_unix_s: float) -> str:
    """One line per worker socket: who may connect, which GPUs its sessions may claim, until when."""
    if not grants:
        return "No worker sockets."
    rows = []
    for g in grants:
        who = [f"uid {g['uid']}"] if g["uid"] is not None else []
        who += [f"gid {g['gid']}"] if g["gid"] is not None else []
        gpus = ",".join(str(i) for i in g["gpu_indices"]) or "none"
        rows.append(
            [
                g["name"],
                g["kind"],
                gpus,
                " ".join(who) or "-",
                g["job_id"] or "-",
                _when(g["expires_at_unix_s"], now_unix_s) if g["expires_at_unix_s"] else "never",
                str(g["sessions"]),
                g["socket_path"],
            ]
        )
    return render_table(["GRANT", "KIND", "GPUS", "WHO", "JOB", "EXPIRES", "SESSIONS", "SOCKET"], rows)


def decisions_table(decisions: Sequence[Mapping[str, Any]]) -> str:
    """The controller's history, oldest first; with a DIRECTIVE column (the verdict on a job-mode phase's
    directive) when any decision is of a job-mode phase."""
    if not decisions:
        return "No decisions."
    job_mode = any(d.get("verdict") for d in decisions)
    rows = [
        [
            utc(d["timestamp_unix_s"]),
            d["session_id"],
            d["kind"] or "-",
            str(d["iteration"]),
            d["state"] or "-",
            _clock(d["sm_clock_mhz"]),
            "-" if d["throughput_ratio"] is None else f"{d['throughput_ratio']:.3f}",
            "-" if d["energy_ratio"] is None else f"{d['energy_ratio']:.3f}",
            *([_directive_text(d)] if job_mode else []),
            d["reason"],
        ]
        for d in decisions
    ]
    headers = ["TIME", "SESSION", "PHASE", "ITER", "STATE", "CLOCK", "THRU", "ENERGY"]
    return render_table([*headers, *(["DIRECTIVE"] if job_mode else []), "REASON"], rows)
