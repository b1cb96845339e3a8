"""Finished sessions' reports: recorded however a session ends, kept across a restart, bounded, and read
from the state directory as untrusted input (a corrupt or foreign file is set aside, a full disk loses
nothing kept in memory)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from eerl.phases import PhaseKind, Workload
from eerl.reports import KindReport, SessionReport, parse_report
from eerl.wire.reports import report_from_pb

from eerld.api.report_codec import report_out
from eerld.daemon import Daemon
from eerld.daemon.reports import REPORTS_FILE, ReportStore
from eerld.testing import ManualClock
from tests.eerld.conftest import HUB_CLOCK_MHZ, gpu_spec
from tests.security.test_failsafes import fill, tmpfs

GEN, TRAIN = PhaseKind.GENERATION, PhaseKind.TRAINING


def _run_one_iteration(hub: Daemon, clock: ManualClock, sid: str) -> None:
    hub.phases.begin_phase(sid, GEN, 0, None)
    clock.advance(2.0)
    hub.phases.end_phase(sid, GEN, 0, Workload(tokens=1000, valid_tokens=0))
    hub.phases.begin_phase(sid, TRAIN, 0, None)
    clock.advance(3.0)
    hub.phases.end_phase(sid, TRAIN, 0, Workload(tokens=3000, valid_tokens=800))


def _report(job_id: str = "job", session_id: str = "s1", **kinds: tuple[float, float]) -> SessionReport:
    """A report whose kinds have (default_s, actual_s) as given (1 J and a 10 % saving each)."""
    return SessionReport(
        job_id=job_id,
        session_id=session_id,
        rank=0,
        gpu_indices=(0,),
        opened_at_unix_s=1.0,
        closed_at_unix_s=2.0,
        reason="closed by client",
        threshold=0.95,
        kinds=tuple(
            KindReport(PhaseKind(k), 1, 900.0, 10, a, 0.1, 0.0, 1200, 1000.0, d, a)
            for k, (d, a) in kinds.items()
        ),
    )


class TestRecordedWhenASessionEnds:
    def test_a_closed_session_leaves_its_totals_clocks_and_reason(
        self, hub: Daemon, clock: ManualClock
    ) -> None:
        sid = hub.book.open_session(gpu_spec(0, job_id="run-7")).session_id
        _run_one_iteration(hub, clock, sid)
        closed = hub.book.close_session(sid)
        report = hub.reports.of_session(sid)
        assert report is not None
        assert (report.job_id, report.reason, report.threshold) == ("run-7", "closed by client", 0.95)
        assert report.energy_j == pytest.approx(closed.energy_mj / 1000.0)
        assert report.energy_j > 0
        assert report.valid_tokens == 800
        assert [(k.kind, k.phases, k.sm_clock_mhz) for k in report.kinds] == [
            (GEN, 1, HUB_CLOCK_MHZ),
            (TRAIN, 1, HUB_CLOCK_MHZ),
        ]
        assert report.throughput_ratio is None  # the fixed controller predicts no default
        assert hub.reports.recent("run-7") == (report,)
        assert hub.reports.recent("another job") == ()

    def test_a_lease_that_runs_out_and_the_daemon_s_stop_leave_reports_too(
        self, hub: Daemon, clock: ManualClock
    ) -> None:
        leased = hub.book.open_session(gpu_spec(0, job_id="leased", lease_ttl_s=5.0)).session_id
        open_at_stop = hub.book.open_session(gpu_spec(1, job_id="running")).session_id
        clock.advance(6.0)
        hub.book.expire_leases()
        hub.shutdown()
        reasons = {r.job_id: r.reason for r in hub.reports.recent()}
        assert reasons["leased"] == "lease expired"
        assert "running" in reasons
        assert hub.reports.of_session(open_at_stop) is not None
        assert hub.reports.of_session(leased) is not None


class TestKept:
    def test_a_restart_reads_the_reports_back(self, hub: Daemon, clock: ManualClock, sock_dir: Path) -> None:
        sid = hub.book.open_session(gpu_spec(0, job_id="run-7")).session_id
        _run_one_iteration(hub, clock, sid)
        hub.book.close_session(sid)
        assert ReportStore(sock_dir).recent() == hub.reports.recent()
        assert len(hub.reports.recent()) == 1

    def test_only_the_newest_are_kept_in_memory_and_on_disk(self, tmp_path: Path) -> None:
        tmp_path.chmod(0o700)
        store = ReportStore(tmp_path, kept=3)
        for n in range(5):
            store.record(_report(session_id=f"s{n}", generation=(1.0, 1.0)))
        assert [r.session_id for r in store.recent()] == ["s2", "s3", "s4"]
        assert [r.session_id for r in ReportStore(tmp_path, kept=3).recent()] == ["s2", "s3", "s4"]


class TestFigures:
    def test_throughput_is_default_time_over_time_taken_and_flagged_under_the_threshold(self) -> None:
        kept = _report(generation=(10.0, 10.2), training=(20.0, 20.5))
        assert kept.throughput_ratio == pytest.approx(30.0 / 30.7)
        assert not kept.under_threshold
        missed = _report(generation=(10.0, 11.0))
        assert missed.throughput_ratio == pytest.approx(10.0 / 11.0)
        assert missed.under_threshold
        assert _report().throughput_ratio is None
        assert not _report().under_threshold

    def test_savings_are_weighted_by_each_kind_s_default_energy(self) -> None:
        report = _report(generation=(1.0, 1.0), training=(1.0, 1.0))
        assert report.estimated_savings_fraction == pytest.approx(0.1)
        data = report.to_json()
        assert data["energy_kwh"] == pytest.approx(1800.0 / 3.6e6)
        assert data["under_threshold"] is False
        assert data["phases"][0]["kind"] == "generation"


class TestOnTheWire:
    def test_a_report_survives_the_wire_and_its_json_whole(self) -> None:
        """What the client reads from CloseSession is the report the daemon kept: every field, so every
        derived figure (throughput, savings) is the same on both sides; and so is the stored JSON."""
        report = _report(generation=(10.0, 10.4), training=(20.0, 20.9))
        assert report_from_pb(report_out(report)) == report
        assert parse_report(json.loads(json.dumps(report.to_json()))) == report
        line = report.summary()
        assert line.startswith("job job (rank 0, GPUs 0): 0.0005 kWh, 20 valid tokens (90 J each)")
        assert "saved 10.0% against the default governor (estimate), throughput 95.8% (threshold 95%)" in line
        assert "UNDER THE THRESHOLD (95%)" in _report(generation=(10.0, 11.0)).summary()


class TestUntrustedFile:
    def test_a_corrupt_file_is_set_aside_and_the_daemon_starts_with_none(self, tmp_path: Path) -> None:
        tmp_path.chmod(0o700)
        (tmp_path / REPORTS_FILE).write_text("{not json")
        (tmp_path / REPORTS_FILE).chmod(0o600)
        store = ReportStore(tmp_path)
        assert store.recent() == ()
        assert not (tmp_path / REPORTS_FILE).exists()
        assert len(list(tmp_path.glob(f"{REPORTS_FILE}.corrupt-*"))) == 1

    def test_a_report_that_does_not_parse_is_dropped_and_the_others_kept(self, tmp_path: Path) -> None:
        tmp_path.chmod(0o700)
        good = _report(session_id="good", generation=(1.0, 1.0)).to_json()
        bad = {**good, "session_id": "bad", "energy_j": "a lot", "phases": [{"kind": "sleeping"}]}
        (tmp_path / REPORTS_FILE).write_text(json.dumps({"reports": [bad, good, None, {**good, "rank": -1}]}))
        (tmp_path / REPORTS_FILE).chmod(0o600)
        assert [r.session_id for r in ReportStore(tmp_path).recent()] == ["good"]

    @pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
    def test_a_file_another_user_owns_is_not_believed(self, tmp_path: Path) -> None:
        tmp_path.chmod(0o700)
        planted = tmp_path / REPORTS_FILE
        planted.write_text(
            json.dumps({"reports": [_report(job_id="forged", generation=(1.0, 1.0)).to_json()]})
        )
        os.chown(planted, 12345, 12345)
        assert ReportStore(tmp_path).recent() == ()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounts a small tmpfs")
class TestFullDisk:
    def test_a_full_disk_loses_no_report_and_the_next_write_carries_it(self, tmp_path: Path) -> None:
        with tmpfs(tmp_path / "state") as state_dir:
            store = ReportStore(state_dir)
            store.record(_report(session_id="before", generation=(1.0, 1.0)))
            filler = fill(state_dir)
            store.record(_report(session_id="while full", generation=(1.0, 1.0)))  # logged, not raised
            assert [r.session_id for r in store.recent()] == ["before", "while full"]
            assert [r.session_id for r in ReportStore(state_dir).recent()] == ["before"]
            filler.unlink()
            store.record(_report(session_id="after", generation=(1.0, 1.0)))
            assert [r.session_id for r in ReportStore(state_dir).recent()] == [
                "before",
                "while full",
                "after",
            ]
