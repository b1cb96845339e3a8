"""Parsing of eerlctl's argument values: GPU lists and durations (pure; no I/O).

Kept apart from the CLI so that the rules (``all``, indices, ``GPU-`` UUIDs; ``30m``, ``1h30m``) are
tested on their own and shared by the Slurm scripts' expectations.
"""

from __future__ import annotations

import datetime as dt
import grp
import pwd
import re
from dataclasses import dataclass

from eerl.errors import ValidationError as RefusedReference
from eerl.gpus import parse_gpu_ref

from eerld.errors import ValidationError

__all__ = [
    "GpuSelection",
    "parse_duration_s",
    "parse_gid",
    "parse_gpus",
    "parse_sm_mhz",
    "parse_uid",
    "parse_until_s",
]

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)([smhd])")
_UNIT_S = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


@dataclass(frozen=True, slots=True)
class GpuSelection:
    """GPUs named on the command line: every GPU, or indices and UUIDs (in the order given)."""

    all: bool = False
    indices: tuple[int, ...] = ()
    uuids: tuple[str, ...] = ()


def parse_gpus(text: str, *, flag: str = "--gpus") -> GpuSelection:
    """Parse ``all``, ``0,1``, ``GPU-5f1c…`` or a comma-separated mix of indices and UUIDs.

    Slurm's ``SLURM_JOB_GPUS`` and ``CUDA_VISIBLE_DEVICES`` use the same comma-separated form.
    """
    stripped = text.strip()
    if stripped.lower() == "all":
        return GpuSelection(all=True)
    indices: list[int] = []
    uuids: list[str] = []
    for part in (p.strip() for p in stripped.split(",")):
        try:
            ref = parse_gpu_ref(part, field=flag)  # the one rule (eerl.gpus)
        except RefusedReference:
            raise ValidationError(flag, f"{part!r} is not a GPU index, a UUID (GPU-…) or 'all'") from None
        if isinstance(ref, int):
            indices.append(ref)
        else:
            uuids.append(ref)
    listed = [str(i) for i in indices] + uuids
    twice = sorted({x for x in listed if listed.count(x) > 1})
    if twice:
        raise ValidationError(flag, f"GPU {', '.join(twice)} is listed twice")
    return GpuSelection(indices=tuple(indices), uuids=tuple(uuids))


def parse_duration_s(text: str, *, flag: str = "--for") -> float:
    """Parse ``90``, ``90s``, ``30m``, ``2h``, ``1h30m`` or ``1d`` into seconds (> 0)."""
    stripped = text.strip().lower()
    if stripped.startswith("-"):
        raise ValidationError(flag, f"{text!r}: a duration cannot be negative; give how long, e.g. 30m or 2h")
    try:
        seconds = float(stripped)
    except ValueError:
        parts = _DURATION_PART.findall(stripped)
        if not parts or "".join(n + u for n, u in parts) != stripped:
            raise ValidationError(flag, f"{text!r} is not a duration such as 90s, 30m, 2h or 1h30m") from None
        seconds = sum(float(n) * _UNIT_S[u] for n, u in parts)
    if not seconds > 0:
        raise ValidationError(flag, f"{text!r}: the duration must be positive")
    return seconds


def parse_sm_mhz(text: str, *, flag: str = "--sm-mhz") -> int:
    """A clock in MHz: a positive integer (the daemon checks that the GPU supports it)."""
    if not text.strip().isdigit() or int(text) <= 0:
        raise ValidationError(flag, f"{text!r} is not a clock in MHz (a positive integer)")
    return int(text)


def parse_uid(text: str, *, flag: str = "--uid") -> int:
    """A user name or a numeric uid (a uid unknown to this host is taken as given: LDAP, containers)."""
    stripped = text.strip()
    if stripped.isdigit():
        return int(stripped)
    try:
        return pwd.getpwnam(stripped).pw_uid
    except KeyError:
        raise ValidationError(flag, f"no user named {stripped!r} on this host") from None


def parse_gid(text: str, *, flag: str = "--gid") -> int:
    """A group name or a numeric gid."""
    stripped = text.strip()
    if stripped.isdigit():
        return int(stripped)
    try:
        return grp.getgrnam(stripped).gr_gid
    except KeyError:
        raise ValidationError(flag, f"no group named {stripped!r} on this host") from None


def parse_until_s(text: str, now_unix_s: float, *, flag: str = "--until") -> float:
    """Seconds from ``now_unix_s`` until an ISO time (local time unless it names a zone) or Unix seconds."""
    stripped = text.strip()
    try:
        at = float(stripped)
    except ValueError:
        try:
            at = dt.datetime.fromisoformat(stripped).timestamp()
        except ValueError:
            raise ValidationError(
                flag, f"{text!r} is not an ISO time (2026-12-01T18:00) or Unix seconds"
            ) from None
    if at <= now_unix_s:
        raise ValidationError(flag, f"{text!r} is in the past")
    return at - now_unix_s
