"""What a session did, kept after it ends: the per-job energy report (``eerlctl report``).

A session's totals used to vanish with it (one ``session_close`` log line in mJ). When a session ends — a
close, a broken Attach stream, a lease that ran out, a reset, a revoked grant, the daemon's stop — its
report is kept: energy per phase kind and in all, valid tokens, energy per valid token, the controller's
estimate of the savings against its predicted default, the throughput against that default beside the
session's threshold, the exploration cost and the clocks it ran at.

The newest :data:`REPORTS_KEPT` are kept, in memory and in ``reports.json`` in the state directory, so that
a restart loses none. The file is untrusted input like any other state file (:mod:`eerld.files`): a report
that does not parse is dropped with one warning; a file that is not a JSON object with a list of reports
is set aside (``reports.json.corrupt-<unix time>``). A write that fails (a full disk) loses nothing kept
in memory and is retried with the next report; reports are never a reason to refuse a session.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import structlog
from eerl.control.base import PhaseSnapshot
from eerl.phases import PhaseKind, savings_fraction

from eerld import files
from eerld.errors import ConfigError
from eerld.sessions import HeldSession

log = structlog.get_logger("eerld.reports")

REPORTS_FILE = "reports.json"
REPORTS_KEPT = 256
"""Reports kept (the newest), in memory and on disk: about 1 KB each."""
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


def report_of(
    session: HeldSession,
    snapshots: Sequence[PhaseSnapshot],
    *,
    reason: str,
    closed_at_unix_s: float,
) -> SessionReport:
    """The report of a session that is ending, from its metered totals and its controller's last view."""
    snaps = {s.kind: s for s in snapshots}
    kinds = []
    for kind in session.kinds:
        totals = session.totals[kind]
        snap = snaps.get(kind)
        kinds.append(
            KindReport(
                kind=kind,
                phases=totals.phases,
                energy_j=totals.energy_mj / 1000.0,
                valid_tokens=totals.valid_tokens,
                duration_s=totals.duration_s,
                estimated_savings_fraction=snap.estimated_savings_fraction if snap else 0.0,
                exploration_cost_j=snap.exploration_cost_j if snap else 0.0,
                sm_clock_mhz=snap.sm_clock_mhz if snap else None,
                default_energy_j=snap.default_energy_j if snap else 0.0,
                default_s=snap.default_s if snap else 0.0,
                actual_s=snap.actual_s if snap else 0.0,
            )
        )
    return SessionReport(
        job_id=session.spec.job_id,
        session_id=session.session_id,
        rank=session.spec.rank,
        gpu_indices=tuple(session.gpu_indices),
        opened_at_unix_s=session.opened_at_unix_s,
        closed_at_unix_s=closed_at_unix_s,
        reason=reason,
        threshold=session.throughput_threshold,
        kinds=tuple(kinds),
    )


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


class ReportStore:
    """The newest finished sessions' reports, persisted in the state directory (see the module)."""

    def __init__(self, state_dir: Path, *, kept: int = REPORTS_KEPT) -> None:
        files.check_private_dir(state_dir, "--state-dir")
        self._path = state_dir / REPORTS_FILE
        self._lock = threading.Lock()
        self._reports: deque[SessionReport] = deque(self._load(), maxlen=kept)

    @property
    def path(self) -> Path:
        """Where the reports live."""
        return self._path

    def _load(self) -> list[SessionReport]:
        try:
            data = files.read_json_object(self._path, private=True)
            items = data.get("reports", [])
            if not isinstance(items, list):
                raise ConfigError(f"{self._path}: reports: expected a list, got {type(items).__name__}")
        except ConfigError as e:
            self._set_aside(str(e))
            return []
        reports = []
        for n, item in enumerate(items):
            try:
                reports.append(parse_report(item))
            except ValueError as e:
                log.warning("report_dropped", path=str(self._path), report=f"reports[{n}]", problem=str(e))
        return reports

    def _set_aside(self, reason: str) -> None:
        try:
            moved = files.set_aside(self._path)
        except OSError as e:
            log.warning(
                "reports_unreadable", path=str(self._path), reason=reason, set_aside_failed=e.strerror
            )
            return
        log.warning("reports_set_aside", path=str(self._path), moved_to=str(moved), reason=reason)

    def record(self, report: SessionReport) -> None:
        """Keep a finished session's report and write the file (a failed write is logged, never raised:
        the report stays in memory and the next write carries it)."""
        with self._lock:
            self._reports.append(report)
            data = {"reports": [r.to_json() for r in self._reports]}
            try:
                files.atomic_write_json(self._path, data)
            except OSError as e:
                log.warning("reports_not_written", path=str(self._path), error=e.strerror or str(e))

    def of_session(self, session_id: str) -> SessionReport | None:
        """The report of one finished session, if still kept."""
        with self._lock:
            return next((r for r in reversed(self._reports) if r.session_id == session_id), None)

    def recent(self, job_id: str | None = None) -> tuple[SessionReport, ...]:
        """The kept reports, oldest first (only ``job_id``'s when given)."""
        with self._lock:
            return tuple(r for r in self._reports if job_id is None or r.job_id == job_id)
