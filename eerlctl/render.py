"""eerlctl's text for people: the dicts of :mod:`eerlctl.replies` as tables and one-line outcomes.

Tables are rendered from the very dicts that ``--json`` prints, so both views always agree. Everything here
is pure: the current time comes in as ``now_unix_s``, and every time shown is UTC.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "clocks_text",
    "decisions_table",
    "drain_text",
    "grant_text",
    "grants_table",
    "job_report_text",
    "pin_text",
    "pins_table",
    "render_table",
    "reports_table",
    "reset_text",
    "revoke_text",
    "sessions_table",
    "status_text",
    "undrain_text",
    "unpin_text",
    "utc",
]


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
            _who(p["set_by"]),  # the whole record (which socket, its mode) is in --json
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


def _percent(fraction: float | None) -> str:
    return "-" if fraction is None else f"{fraction:.1%}"


def _throughput(r: Mapping[str, Any]) -> str:
    """``95.3%`` of the predicted default, with ``UNDER`` when below the threshold."""
    if r["throughput_ratio"] is None:
        return "-"
    return f"{r['throughput_ratio']:.1%}" + (" UNDER" if r["under_threshold"] else "")


def reports_table(reports: Sequence[Mapping[str, Any]]) -> str:
    """The finished sessions kept, oldest first: one line each."""
    if not reports:
        return "No reports (a session's report is kept when it ends)."
    rows = [
        [
            r["job_id"],
            r["session_id"],
            str(r["rank"]),
            ",".join(map(str, r["gpu_indices"])) or "-",
            utc(r["closed_at_unix_s"]),
            f"{r['energy_kwh']:.3g} kWh",
            "-" if r["energy_per_valid_token_j"] is None else f"{r['energy_per_valid_token_j']:.4g} J",
            _percent(r["estimated_savings_fraction"]),
            _throughput(r),
            f"{r['threshold']:.0%}",
            r["reason"],
        ]
        for r in reports
    ]
    headers = ["JOB", "SESSION", "RANK", "GPUS", "ENDED", "ENERGY", "J/TOKEN", "SAVED", "THROUGHPUT"]
    return render_table([*headers, "THRESHOLD", "WHY IT ENDED"], rows)


def job_report_text(job: Mapping[str, Any]) -> str:
    """One job's report in words: energy, tokens, savings and throughput against its threshold."""
    sessions = job["sessions"]
    ended = max(s["closed_at_unix_s"] for s in sessions)
    lines = [
        f"Job {job['job_id']}: {len(sessions)} session{'s' if len(sessions) != 1 else ''} on this node, the "
        f"last ended {utc(ended)}",
        f"  energy        {job['energy_kwh']:.3g} kWh ({_energy(job['energy_j'])}), "
        f"{job['valid_tokens']:,} valid tokens"
        + (
            f", {job['energy_per_valid_token_j']:.4g} J per valid token"
            if job["energy_per_valid_token_j"] is not None
            else ""
        ),
        f"  saved         {job['estimated_savings_fraction']:.1%} against the predicted default governor "
        "(the controller's estimate)",
    ]
    if job["throughput_ratio"] is None:
        lines.append(f"  throughput    not predicted (threshold {job['threshold']:.0%})")
    else:
        verdict = "UNDER THE THRESHOLD" if job["under_threshold"] else "at or above the threshold"
        lines.append(
            f"  throughput    {job['throughput_ratio']:.1%} of the predicted default, threshold "
            f"{job['threshold']:.0%}: {verdict}"
        )
    lines.append(f"  exploration   {_energy(job['exploration_cost_j'])} in trials that missed the threshold")
    if job["pinned_phases"]:
        lines.append(
            f"  pinned        {job['pinned_phases']} phases held by an admin pin (the controller waited)"
        )
    for p in job["phases"]:
        lines.append(
            f"  {p['kind'] or '?':<13} {p['phases']} phases, {_energy(p['energy_j'])}, "
            f"saved {p['estimated_savings_fraction']:.1%}"
        )
    clocks = {
        p["kind"]: _clock(p["sm_clock_mhz"]) for s in sessions for p in s["phases"] if p["kind"] is not None
    }
    if clocks:
        lines.append("  at the end    " + ", ".join(f"{k} {c}" for k, c in clocks.items()))
    return "\n".join(lines)
