"""The sidecar's HTTP API, its requests and answers: pure functions, no I/O (docs/sidecar.md).

A request body is one JSON object. Everything in it is checked before anything is forwarded: a body that is
not JSON, a field that is unknown, of the wrong type, negative or above the daemon's limit, an unknown phase
kind, all give an :class:`ApiError` (a 4xx and a one-line JSON error that names the field) and change
nothing. The Python client clamps what the daemon would refuse (docs/client.md); the sidecar refuses it,
because a job that speaks HTTP wants to hear about its mistakes.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from eerl._answers import PhaseAnswer
from eerl._pump import ClientStats
from eerl.errors import ConfigError, one_line
from eerl.phases import PhaseKind, Workload
from eerl.wire.limits import MAX_ITERATION, WORKLOAD_LIMITS

MAX_BODY_BYTES = 16 * 1024
"""The largest request body accepted (413 beyond)."""

WORKLOAD_FIELDS: tuple[tuple[str, int], ...] = tuple((name, limit) for name, limit, _ in WORKLOAD_LIMITS)
"""A workload's fields and the daemon's limit on each."""
_BEGIN_FIELDS = frozenset({"kind", "iteration", "hints"})
_END_FIELDS = frozenset({"kind", "iteration"} | {name for name, _ in WORKLOAD_FIELDS})


class ApiError(Exception):
    """A request the sidecar refuses: its HTTP status, and the message (which names the field)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message

    def body(self) -> bytes:
        """The one-line JSON error: ``{"error": "<message>"}``."""
        return encode({"error": self.message})


@dataclass(frozen=True, slots=True)
class BeginRequest:
    """``POST /v1/phases/begin``: the phase kind, its iteration (None: the session counts), hints."""

    kind: PhaseKind
    iteration: int | None
    hints: Workload | None


@dataclass(frozen=True, slots=True)
class EndRequest:
    """``POST /v1/phases/end``: the phase that ends (iteration None: the last of its kind), its workload."""

    kind: PhaseKind
    iteration: int | None
    workload: Workload


def encode(value: object) -> bytes:
    """One line of JSON, newline-terminated (so ``curl`` output reads well in a shell log)."""
    return json.dumps(value, separators=(",", ":"), allow_nan=False).encode() + b"\n"


def parse_begin(body: bytes) -> BeginRequest:
    """A begin request from its body; raises :class:`ApiError`."""
    fields = _object(body, _BEGIN_FIELDS)
    hints_value = fields.get("hints")
    hints: Workload | None = None
    if hints_value is not None:
        if not isinstance(hints_value, dict):
            raise ApiError(400, f"hints: must be an object of workload fields, not {_json_type(hints_value)}")
        hints = _workload(hints_value, prefix="hints.")
    return BeginRequest(_kind(fields), _iteration(fields), hints)


def parse_end(body: bytes) -> EndRequest:
    """An end request from its body; raises :class:`ApiError`."""
    fields = _object(body, _END_FIELDS)
    return EndRequest(_kind(fields), _iteration(fields), _workload(fields, prefix=""))


def begin_answer(
    kind: PhaseKind, iteration: int, connected: bool, answer: PhaseAnswer | None
) -> dict[str, Any]:
    """What ``POST /v1/phases/begin`` answers: the clock now applied, as far as the sidecar knows.

    ``clock`` is ``"locked"`` (``sm_clock_mhz`` holds), ``"default"`` (the default governor) or
    ``"unknown"`` (the daemon has not answered within the sidecar's bound, or is not there; the phase goes
    on all the same, and the daemon applies its clock when it gets the begin).
    """
    reply: dict[str, Any] = {
        "kind": kind.value,
        "iteration": iteration,
        "connected": connected,
        "answered": answer is not None,
        "clock": "unknown",
        "sm_clock_mhz": None,
        "state": None,
        "resynced": False,
        "gpus": [],
    }
    if answer is not None:
        reply["clock"] = "locked" if answer.sm_clock_mhz else "default"
        reply["sm_clock_mhz"] = answer.sm_clock_mhz or None
        reply["state"] = answer.state.value if answer.state is not None else None
        reply["resynced"] = answer.resynced
        reply["gpus"] = [
            {
                "index": clock.index,
                "uuid": clock.uuid,
                "sm_clock_mhz": clock.sm_clock_mhz,
                "requested_sm_clock_mhz": clock.requested_sm_clock_mhz or None,
                "source": clock.source or None,
            }
            for clock in answer.clocks
        ]
    return reply


def end_answer(
    kind: PhaseKind, iteration: int, connected: bool, answer: PhaseAnswer | None
) -> dict[str, Any]:
    """What ``POST /v1/phases/end`` answers: the phase as the daemon metered it; nulls while unknown."""
    reply: dict[str, Any] = {
        "kind": kind.value,
        "iteration": iteration,
        "connected": connected,
        "metered": answer is not None,
        "duration_s": None,
        "duration_clock": None,
        "energy_j": None,
        "mean_power_w": None,
        "gpus": None,
        "sm_clock_mhz": None,
        "clock": "unknown",
        "state": None,
    }
    if answer is not None:
        reply.update(
            duration_s=_finite(answer.duration_s),
            duration_clock="simulated" if answer.simulated_time else "wall",
            energy_j=_finite(answer.energy_j),
            mean_power_w=_finite(answer.mean_power_w),
            gpus=answer.gpus,
            sm_clock_mhz=answer.sm_clock_mhz or None,
            clock="locked" if answer.sm_clock_mhz else "default",
            state=answer.state.value if answer.state is not None else None,
        )
    return reply


def stats_fields(stats: ClientStats) -> dict[str, Any]:
    """The client's counters for ``GET /v1/status`` (without the session's id: that is a credential)."""
    return {
        "queued_events": stats.queued_events,
        "sent_events": stats.sent_events,
        "dropped_events": stats.dropped_events,
        "stale_events": stats.stale_events,
        "failed_events": stats.failed_events,
        "opens": stats.opens,
        "connect_failures": stats.connect_failures,
        "invalid_events": stats.invalid_events,
        "resyncs": stats.resyncs,
        "resets": stats.resets,
        "sender_errors": stats.sender_errors,
    }


# -- checks ------------------------------------------------------------------------------------------------


def _object(body: bytes, allowed: frozenset[str]) -> dict[str, Any]:
    if len(body) > MAX_BODY_BYTES:
        raise ApiError(413, f"body: larger than {MAX_BODY_BYTES} bytes")
    try:
        value = json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except (UnicodeDecodeError, ValueError) as e:
        raise ApiError(400, f"body: not JSON ({one_line(e, 120)})") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"body: must be a JSON object, not {_json_type(value)}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise ApiError(400, f"{unknown[0]}: unknown field (allowed: {', '.join(sorted(allowed))})")
    return value


def _no_constant(name: str) -> None:
    raise ValueError(f"{name} is not a number")


def _kind(fields: dict[str, Any]) -> PhaseKind:
    if "kind" not in fields:
        raise ApiError(400, "kind: required ('generation' or 'training')")
    value = fields["kind"]
    if not isinstance(value, str):
        raise ApiError(400, f"kind: must be a string, not {_json_type(value)}")
    try:
        return PhaseKind.parse(value)
    except ConfigError:
        raise ApiError(400, f"kind: {_shown(value)} is not 'generation' or 'training'") from None


def _iteration(fields: dict[str, Any]) -> int | None:
    value = fields.get("iteration")
    if value is None:
        return None
    return _count(value, "iteration", MAX_ITERATION)


def _workload(fields: dict[str, Any], *, prefix: str) -> Workload:
    if prefix:
        allowed = {name for name, _ in WORKLOAD_FIELDS}
        unknown = sorted(set(fields) - allowed)
        if unknown:
            raise ApiError(
                400, f"{prefix}{unknown[0]}: unknown field (allowed: {', '.join(sorted(allowed))})"
            )
    values = {
        name: _count(fields[name], prefix + name, limit) if fields.get(name) is not None else 0
        for name, limit in WORKLOAD_FIELDS
    }
    if values["valid_tokens"] > values["tokens"]:
        raise ApiError(
            400, f"{prefix}valid_tokens: {values['valid_tokens']} is more than tokens ({values['tokens']})"
        )
    return Workload(**values)


def _count(value: object, name: str, limit: int) -> int:
    """A whole number in [0, limit]: an int, or an integral float (``1e6``); a bool is not one."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ApiError(400, f"{name}: must be a whole number, not {_json_type(value)}")
    if isinstance(value, float):
        if not (math.isfinite(value) and value.is_integer()):
            raise ApiError(400, f"{name}: {value!r} is not a whole number")
        value = int(value)
    if value < 0:
        raise ApiError(400, f"{name}: {value} is negative")
    if value > limit:
        raise ApiError(400, f"{name}: {value} is above the limit ({limit})")
    return value


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def _json_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    return "an object"


def _shown(value: str) -> str:
    return repr(value) if len(value) <= 40 else repr(value[:40] + "…")
