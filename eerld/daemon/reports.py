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

import threading
from collections import deque
from collections.abc import Sequence
from pathlib import Path

import structlog
from eerl.control.base import PhaseSnapshot
from eerl.reports import KindReport, SessionReport, parse_report

from eerld import files
from eerld.errors import ConfigError
from eerld.sessions import HeldSession

log = structlog.get_logger("eerld.reports")

REPORTS_FILE = "reports.json"
REPORTS_KEPT = 256
"""Reports kept (the newest), in memory and on disk: about 1 KB each."""


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
                pinned_phases=totals.pinned_phases,
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
