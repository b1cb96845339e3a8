"""The wire's limits: the most a phase event may report, and what the client sends whatever the job reported.

The daemon refuses a phase event whose workload it cannot trust (a count above its limits, more valid
tokens than tokens) and protobuf cannot even encode a negative count; either way the phase would go
unmetered, and a sender that let the encoding error escape would stop for good. So every workload and
iteration passes through :func:`check_workload` and :func:`check_iteration` before it is encoded: a value
that is not a whole number is dropped (sent as 0, "unknown"), a negative one is clamped to 0, one above the
daemon's limit is dropped, and ``valid_tokens`` is clamped to ``tokens``. An iteration out of range drops
the whole event. Pure functions: the sender counts and logs what they report.

The limits are the daemon's: :data:`WORKLOAD_LIMITS` and :data:`MAX_ITERATION` are the one table, which
eerld's codec (``eerld.api.codec``) and the sidecar's HTTP API check against too (the client cannot import
eerld; eerld imports this public module, :mod:`eerl.wire`).
"""

from __future__ import annotations

import enum
import math
import numbers
import operator
from dataclasses import dataclass

from eerl.phases import Workload

MAX_TOKENS = 10**12
"""The most tokens (``tokens``, ``valid_tokens``, ``max_response_tokens``, ``prompt_tokens``) one phase may
report."""
MAX_KV_TOKENS = 10**18
"""The most ``max_worker_kv_tokens`` one phase may report (decode reads: squared lengths and weight reads)."""
MAX_SEQUENCES = 10**9
"""The most sequences one phase may report."""
MAX_ITERATION = 10**12
"""The largest iteration the daemon accepts."""

WORKLOAD_LIMITS: tuple[tuple[str, int, str], ...] = (
    ("tokens", MAX_TOKENS, "10**12"),
    ("valid_tokens", MAX_TOKENS, "10**12"),
    ("sequences", MAX_SEQUENCES, "10**9"),
    ("max_response_tokens", MAX_TOKENS, "10**12"),
    ("prompt_tokens", MAX_TOKENS, "10**12"),
    ("max_worker_kv_tokens", MAX_KV_TOKENS, "10**18"),
)
"""Every :class:`~eerl.Workload` field, the most a phase may report of it, and that limit in words."""


class Problem(enum.Enum):
    """A kind of value the client does not send as reported; the sender warns once per kind."""

    NOT_A_NUMBER = "not a whole number, dropped (sent as 0)"
    NEGATIVE = "negative, clamped to 0"
    ABOVE_LIMIT = "above the daemon's limit, dropped (sent as 0)"
    VALID_ABOVE_TOKENS = "more valid tokens than tokens, clamped to tokens"
    BAD_ITERATION = "not an iteration in [0, 10**12], the phase is not sent"


@dataclass(frozen=True, slots=True)
class Finding:
    """One value not sent as reported: its kind and what it was, in words (``tokens=-5``)."""

    problem: Problem
    what: str


@dataclass(frozen=True, slots=True)
class Checked:
    """A workload the daemon accepts, and what had to change to get it."""

    workload: Workload
    clamped: int
    """Values replaced by the nearest acceptable one (negative → 0, valid_tokens → tokens)."""
    dropped: int
    """Values replaced by 0 (unknown): not a whole number, or above the daemon's limit."""
    findings: tuple[Finding, ...]


def to_count(value: object) -> int | None:
    """``value`` as an ``int`` if it is a whole number (an int, a NumPy or PyTorch integer scalar, an
    integral finite float); None otherwise (a bool, a string, NaN, 2.5, None, an array). Never raises."""
    if type(value) is int:
        return value
    if isinstance(value, bool) or value is None or isinstance(value, str | bytes):
        return None
    try:
        return operator.index(value)  # type: ignore[arg-type]  # NumPy / PyTorch integer scalars
    except Exception:  # noqa: S110 - not an integer type: try a real number below
        pass
    if not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except Exception:  # an exotic Real that cannot become a float
        return None
    if not math.isfinite(number) or not number.is_integer():
        return None
    return int(number)


def check_iteration(value: object) -> int | None:
    """The iteration to send, or None when the event must be dropped (not a whole number in range)."""
    iteration = to_count(value)
    if iteration is None or not 0 <= iteration <= MAX_ITERATION:
        return None
    return iteration


def check_workload(workload: Workload) -> Checked:
    """The workload as the daemon will accept it: each field a whole number within the daemon's limits,
    ``valid_tokens`` at most ``tokens``. Fields that are fine are kept as they are."""
    values: dict[str, int] = {}
    findings: list[Finding] = []
    clamped = dropped = 0
    converted = False
    for name, limit, limit_text in WORKLOAD_LIMITS:
        raw = getattr(workload, name)
        count = to_count(raw)
        converted = converted or type(raw) is not int
        if count is None:
            findings.append(Finding(Problem.NOT_A_NUMBER, f"{name} of type {type(raw).__name__}"))
            dropped += 1
            count = 0
        elif count < 0:
            findings.append(Finding(Problem.NEGATIVE, f"{name}={count}"))
            clamped += 1
            count = 0
        elif count > limit:
            findings.append(Finding(Problem.ABOVE_LIMIT, f"{name}={count} (limit {limit_text})"))
            dropped += 1
            count = 0
        values[name] = count
    if values["valid_tokens"] > values["tokens"]:
        what = f"valid_tokens={values['valid_tokens']} > tokens={values['tokens']}"
        findings.append(Finding(Problem.VALID_ABOVE_TOKENS, what))
        clamped += 1
        values["valid_tokens"] = values["tokens"]
    if not findings and not converted:
        return Checked(workload, 0, 0, ())  # the common case: nothing to build
    return Checked(Workload(**values), clamped, dropped, tuple(findings))
