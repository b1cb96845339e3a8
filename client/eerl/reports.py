"""What a finished session did: energy, tokens, savings and throughput against its threshold.

The one home of a session's report, shared by the daemon (which records one as each session ends and keeps
the newest: ``eerld.daemon.reports``), ``eerlctl report`` and the client, whose ``Session.close()`` returns
the report of its own session (``CloseSessionResponse.report``, read by :mod:`eerl.wire.reports`). A report
carries what its derived figures are computed from (per kind: the default-equivalent energy and time, and
the time taken), so the figures are the same wherever a report is read: the daemon's store, the wire, the
JSON.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from eerl.phases import PhaseKind, savings_fraction

__all__ = [
    "JOULES_PER_KWH",
    "KindReport",
    "SessionReport",
    "parse_report",
]

MAX_TEXT = 256
MAX_NUMBER = 1e18
JOULES_PER_KWH = 3.6e6


@dataclass(frozen=True, slots=True)
class KindReport:
    """One phase kind of a finished session."""

    kind: PhaseKind
    phases: int
    energy_j: float
    valid_tokens: int
    duration_s: float
    estimated_savings_fraction: float
    exploration_cost_j: float
    sm_clock_mhz: int | None
    """The clock the controller held at the end (None: the default governor)."""
    default_energy_j: float = 0.0
    default_s: float = 0.0
    actual_s: float = 0.0


@dataclass(frozen=True, slots=True)
class SessionReport:
    """A finished session's totals (see the module)."""

    job_id: str
    session_id: str
    rank: int
    gpu_indices: tuple[int, ...]
    opened_at_unix_s: float
    closed_at_unix_s: float
    reason: str
    threshold: float
    kinds: tuple[KindReport, ...]

    @property
    def energy_j(self) -> float:
        """Energy of every metered phase."""
        return sum(k.energy_j for k in self.kinds)

    @property
    def valid_tokens(self) -> int:
        """Valid training tokens reported."""
        return sum(k.valid_tokens for k in self.kinds)

    @property
    def energy_per_valid_token_j(self) -> float | None:
        """Joules per valid token (None without valid tokens)."""
        return self.energy_j / self.valid_tokens if self.valid_tokens else None

    @property
    def estimated_savings_fraction(self) -> float:
        """The controller's estimate over both kinds: saved energy over the default-equivalent energy."""
        saved = sum(k.estimated_savings_fraction * k.default_energy_j for k in self.kinds)
        return savings_fraction(saved, sum(k.default_energy_j for k in self.kinds))

    @property
    def throughput_ratio(self) -> float | None:
        """Phase time on the predicted default governor over the time the phases took (None: unknown,
        e.g. under the fixed controller or in job mode, where the node's controller predicts nothing)."""
        actual = sum(k.actual_s for k in self.kinds)
        return sum(k.default_s for k in self.kinds) / actual if actual > 0 else None

    @property
    def under_threshold(self) -> bool:
        """Whether the session ended below its threshold (unknown throughput: not flagged)."""
        ratio = self.throughput_ratio
        return ratio is not None and ratio < self.threshold

    @property
    def exploration_cost_j(self) -> float:
        """Energy of the trials that missed the threshold."""
        return sum(k.exploration_cost_j for k in self.kinds)

    def summary(self) -> str:
        """One line for people: ``job run-7 (rank 0, GPUs 0,1): 0.47 kWh, 1,234,567 valid tokens (0.0094 J
        each), saved 14.3% against the default governor (estimate), throughput 95.3% (threshold 95%)``."""
        gpus = ",".join(map(str, self.gpu_indices)) or "none"
        tokens = f"{self.valid_tokens:,} valid tokens"
        if self.energy_per_valid_token_j is not None:
            tokens += f" ({self.energy_per_valid_token_j:.3g} J each)"
        ratio = self.throughput_ratio
        threshold = f"{self.threshold * 100:g}%"
        if ratio is None:
            throughput = f"throughput not predicted (threshold {threshold})"
        elif self.under_threshold:
            throughput = f"throughput {ratio:.1%}, UNDER THE THRESHOLD ({threshold})"
        else:
            throughput = f"throughput {ratio:.1%} (threshold {threshold})"
        return (
            f"job {self.job_id} (rank {self.rank}, GPUs {gpus}): {self.energy_j / JOULES_PER_KWH:.3g} kWh, "
            f"{tokens}, saved {self.estimated_savings_fraction:.1%} against the default governor (estimate), "
            f"{throughput}"
        )

    def to_json(self) -> dict[str, Any]:
        """The report as stored and as ``eerlctl report --json`` prints it (derived figures included)."""
        data = asdict(self)
        data["gpu_indices"] = list(self.gpu_indices)
        data["kinds"] = [{**asdict(k), "kind": k.kind.value} for k in self.kinds]
        data.update(
            energy_j=self.energy_j,
            energy_kwh=self.energy_j / JOULES_PER_KWH,
            valid_tokens=self.valid_tokens,
            energy_per_valid_token_j=self.energy_per_valid_token_j,
            estimated_savings_fraction=self.estimated_savings_fraction,
            throughput_ratio=self.throughput_ratio,
            under_threshold=self.under_threshold,
            exploration_cost_j=self.exploration_cost_j,
        )
        return data


def _number(item: Mapping[str, Any], name: str, *, optional: bool = False) -> float:
    value = item.get(name)
    if optional and value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name}: expected a number, got {value!r:.80}")
    if not math.isfinite(value) or abs(value) > MAX_NUMBER:
        raise ValueError(f"{name}: expected a finite number, got {value!r:.80}")
    return float(value)


def _count(item: Mapping[str, Any], name: str) -> int:
    value = item.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_NUMBER:
        raise ValueError(f"{name}: expected a whole number ≥ 0, got {value!r:.80}")
    return value


def _text(item: Mapping[str, Any], name: str) -> str:
    value = item.get(name)
    if not isinstance(value, str) or len(value) > MAX_TEXT or not value.isprintable():
        raise ValueError(f"{name}: expected at most {MAX_TEXT} printable characters")
    return value


def _kind_report(item: object) -> KindReport:
    if not isinstance(item, dict):
        raise ValueError("kinds: expected objects")
    try:
        kind = PhaseKind(str(item.get("kind")))
    except ValueError:
        raise ValueError(f"kind: expected generation or training, got {item.get('kind')!r:.40}") from None
    clock = item.get("sm_clock_mhz")
    if clock is not None:
        clock = _count(item, "sm_clock_mhz")
    return KindReport(
        kind=kind,
        phases=_count(item, "phases"),
        energy_j=_number(item, "energy_j"),
        valid_tokens=_count(item, "valid_tokens"),
        duration_s=_number(item, "duration_s"),
        estimated_savings_fraction=_number(item, "estimated_savings_fraction"),
        exploration_cost_j=_number(item, "exploration_cost_j"),
        sm_clock_mhz=clock,
        default_energy_j=_number(item, "default_energy_j", optional=True),
        default_s=_number(item, "default_s", optional=True),
        actual_s=_number(item, "actual_s", optional=True),
    )


def parse_report(item: object) -> SessionReport:
    """A report from its stored form; ValueError naming the field for a wrong type or an absurd value."""
    if not isinstance(item, dict):
        raise ValueError(f"expected an object, got {'null' if item is None else type(item).__name__}")
    gpus = item.get("gpu_indices")
    kinds = item.get("kinds")
    if not isinstance(gpus, list) or not all(isinstance(g, int) and 0 <= g < 4096 for g in gpus):
        raise ValueError("gpu_indices: expected a list of GPU indices")
    if not isinstance(kinds, list) or len(kinds) > len(PhaseKind):
        raise ValueError("kinds: expected a list of at most one report per phase kind")
    return SessionReport(
        job_id=_text(item, "job_id"),
        session_id=_text(item, "session_id"),
        rank=_count(item, "rank"),
        gpu_indices=tuple(gpus),
        opened_at_unix_s=_number(item, "opened_at_unix_s"),
        closed_at_unix_s=_number(item, "closed_at_unix_s"),
        reason=_text(item, "reason"),
        threshold=_number(item, "threshold"),
        kinds=tuple(_kind_report(k) for k in kinds),
    )
