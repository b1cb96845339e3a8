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
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from eerl.phases import PhaseKind, savings_fraction

__all__ = [
    "JOULES_PER_KWH",
    "JobReport",
    "KindReport",
    "SessionReport",
    "jobs_of",
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
    pinned_phases: int = 0
    """Phases an admin pin held (metered; the controller waited)."""


class _Figures:
    """What a session's and a job's report compute alike from their per-kind totals."""

    __slots__ = ()
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
    def exploration_cost_j(self) -> float:
        """Energy of the trials that missed the threshold."""
        return sum(k.exploration_cost_j for k in self.kinds)

    @property
    def pinned_phases(self) -> int:
        """Phases an admin pin held."""
        return sum(k.pinned_phases for k in self.kinds)

    def _figures_json(self) -> dict[str, Any]:
        return {
            "energy_j": self.energy_j,
            "energy_kwh": self.energy_j / JOULES_PER_KWH,
            "valid_tokens": self.valid_tokens,
            "energy_per_valid_token_j": self.energy_per_valid_token_j,
            "estimated_savings_fraction": self.estimated_savings_fraction,
            "exploration_cost_j": self.exploration_cost_j,
            "pinned_phases": self.pinned_phases,
            "phases": [{**asdict(k), "kind": k.kind.value} for k in self.kinds],
        }


def _throughput_words(ratio: float | None, threshold: float, under: bool) -> str:
    percent = f"{threshold * 100:g}%"
    if ratio is None:
        return f"throughput not predicted (threshold {percent})"
    if under:
        return f"throughput {ratio:.1%}, UNDER THE THRESHOLD ({percent})"
    return f"throughput {ratio:.1%} (threshold {percent})"


@dataclass(frozen=True, slots=True)
class SessionReport(_Figures):
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

    def summary(self) -> str:
        """One line for people: ``job run-7 (rank 0, GPUs 0,1): 0.47 kWh, 1,234,567 valid tokens (0.0094 J
        each), saved 14.3% against the default governor (estimate), throughput 95.3% (threshold 95%)``."""
        gpus = ",".join(map(str, self.gpu_indices)) or "none"
        tokens = f"{self.valid_tokens:,} valid tokens"
        if self.energy_per_valid_token_j is not None:
            tokens += f" ({self.energy_per_valid_token_j:.3g} J each)"
        throughput = _throughput_words(self.throughput_ratio, self.threshold, self.under_threshold)
        pinned = f", {self.pinned_phases} phases held by an admin pin" if self.pinned_phases else ""
        return (
            f"job {self.job_id} (rank {self.rank}, GPUs {gpus}): {self.energy_j / JOULES_PER_KWH:.3g} kWh, "
            f"{tokens}, saved {self.estimated_savings_fraction:.1%} against the default governor (estimate), "
            f"{throughput}{pinned}"
        )

    def to_json(self) -> dict[str, Any]:
        """The report as stored and as ``eerlctl report --json`` prints it (derived figures included)."""
        return {
            "job_id": self.job_id,
            "session_id": self.session_id,
            "rank": self.rank,
            "gpu_indices": list(self.gpu_indices),
            "opened_at_unix_s": self.opened_at_unix_s,
            "closed_at_unix_s": self.closed_at_unix_s,
            "reason": self.reason,
            "threshold": self.threshold,
            "throughput_ratio": self.throughput_ratio,
            "under_threshold": self.under_threshold,
            **self._figures_json(),
        }


def _summed(kind: PhaseKind, parts: Sequence[KindReport]) -> KindReport:
    """One kind's totals over several sessions (the clock: the last session's)."""
    default_energy_j = sum(p.default_energy_j for p in parts)
    saved = sum(p.estimated_savings_fraction * p.default_energy_j for p in parts)
    return KindReport(
        kind=kind,
        phases=sum(p.phases for p in parts),
        energy_j=sum(p.energy_j for p in parts),
        valid_tokens=sum(p.valid_tokens for p in parts),
        duration_s=sum(p.duration_s for p in parts),
        estimated_savings_fraction=savings_fraction(saved, default_energy_j),
        exploration_cost_j=sum(p.exploration_cost_j for p in parts),
        sm_clock_mhz=parts[-1].sm_clock_mhz,
        default_energy_j=default_energy_j,
        default_s=sum(p.default_s for p in parts),
        actual_s=sum(p.actual_s for p in parts),
        pinned_phases=sum(p.pinned_phases for p in parts),
    )


@dataclass(frozen=True, slots=True)
class JobReport(_Figures):
    """One job's finished sessions on a node, summed (``eerlctl report JOB_ID``, the per-job metrics)."""

    job_id: str
    sessions: tuple[SessionReport, ...]
    kinds: tuple[KindReport, ...]

    @classmethod
    def of(cls, job_id: str, sessions: Sequence[SessionReport]) -> JobReport:
        """The job's report from its sessions' (oldest first)."""
        by_kind: dict[PhaseKind, list[KindReport]] = {}
        for session in sessions:
            for k in session.kinds:
                by_kind.setdefault(k.kind, []).append(k)
        kinds = tuple(_summed(kind, parts) for kind, parts in by_kind.items())
        return cls(job_id, tuple(sessions), kinds)

    @property
    def threshold(self) -> float:
        """The highest of its sessions' thresholds (they agree in a job)."""
        return max((s.threshold for s in self.sessions), default=0.0)

    @property
    def throughput_ratio(self) -> float | None:
        """The lowest of its sessions' (a rank that fell behind holds the whole job back); None: unknown."""
        ratios = [r for s in self.sessions if (r := s.throughput_ratio) is not None]
        return min(ratios) if ratios else None

    @property
    def under_threshold(self) -> bool:
        """Whether the job ended below its threshold (unknown throughput: not flagged)."""
        ratio = self.throughput_ratio
        return ratio is not None and ratio < self.threshold

    @property
    def closed_at_unix_s(self) -> float:
        """When its last session ended."""
        return max((s.closed_at_unix_s for s in self.sessions), default=0.0)

    def to_json(self) -> dict[str, Any]:
        """As ``eerlctl report JOB_ID --json`` prints it: the job's figures and each session's report."""
        return {
            "job_id": self.job_id,
            "closed_at_unix_s": self.closed_at_unix_s,
            "threshold": self.threshold,
            "throughput_ratio": self.throughput_ratio,
            "under_threshold": self.under_threshold,
            **self._figures_json(),
            "sessions": [s.to_json() for s in self.sessions],
        }


def jobs_of(reports: Sequence[SessionReport]) -> list[JobReport]:
    """The jobs of these reports (oldest first), each with its sessions, in the order each last ended."""
    by_job: dict[str, list[SessionReport]] = {}
    for report in reports:
        by_job.setdefault(report.job_id, []).append(report)
    jobs = [JobReport.of(job_id, sessions) for job_id, sessions in by_job.items()]
    return sorted(jobs, key=lambda j: j.closed_at_unix_s)


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
        raise ValueError("phases: expected objects")
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
        pinned_phases=_count(item, "pinned_phases") if "pinned_phases" in item else 0,
    )


def parse_report(item: object) -> SessionReport:
    """A report from its stored form; ValueError naming the field for a wrong type or an absurd value."""
    if not isinstance(item, dict):
        raise ValueError(f"expected an object, got {'null' if item is None else type(item).__name__}")
    gpus = item.get("gpu_indices")
    kinds = item.get("phases")
    if not isinstance(gpus, list) or not all(isinstance(g, int) and 0 <= g < 4096 for g in gpus):
        raise ValueError("gpu_indices: expected a list of GPU indices")
    if not isinstance(kinds, list) or len(kinds) > len(PhaseKind):
        raise ValueError("phases: expected a list of at most one report per phase kind")
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
