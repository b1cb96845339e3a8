"""The daemon's log set-up: JSON lines a machine can parse, timestamps like structlog's, and output that
follows ``sys.stderr`` even though loggers are cached on first use."""

from __future__ import annotations

import io
import json
import re
import sys
from datetime import UTC, datetime

import pytest
import structlog

from eerld import logging as eerld_logging
from eerld.logging import IsoUtcStamper, configure_logging

ISO_UTC = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")


def lines(text: str) -> list[dict[str, object]]:
    return [json.loads(line) for line in text.splitlines()]


def json_lines(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    """The JSON lines written to stderr (pytest's capture is a text stream with a byte buffer, like a
    real stderr)."""
    return lines(capsys.readouterr().err)


class TestJsonLines:
    def test_a_lock_line_carries_its_fields_level_and_an_iso_utc_timestamp(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        configure_logging("json")
        before = datetime.now(UTC)
        structlog.get_logger("test").info("clock_lock", gpu_index=3, sm_clock_mhz=1200, pinned=False)
        (line,) = json_lines(capsys)
        assert line["event"] == "clock_lock"
        assert line["level"] == "info"
        assert line["gpu_index"] == 3
        assert line["sm_clock_mhz"] == 1200
        assert line["pinned"] is False
        stamp = str(line["timestamp"])
        assert ISO_UTC.match(stamp)
        logged = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        assert 0 <= (logged - before).total_seconds() < 5

    def test_an_exception_is_rendered_into_the_line(self, capsys: pytest.CaptureFixture[str]) -> None:
        configure_logging("json")
        try:
            raise RuntimeError("boom")
        except RuntimeError:
            structlog.get_logger("test").exception("controller_error", session_id="abc")
        (line,) = json_lines(capsys)
        assert line["level"] == "error"
        assert "RuntimeError: boom" in str(line["exception"])

    def test_debug_lines_appear_only_with_debug(self, capsys: pytest.CaptureFixture[str]) -> None:
        configure_logging("json")
        structlog.get_logger("quiet").debug("rpc_rejected")
        configure_logging("json", debug=True)
        structlog.get_logger("loud").debug("rpc_rejected")
        assert [line["event"] for line in json_lines(capsys)] == ["rpc_rejected"]


class TestStderrFollowing:
    def test_a_cached_logger_writes_to_the_stderr_of_the_moment(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        first = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
        monkeypatch.setattr(sys, "stderr", first)
        configure_logging("json")
        log = structlog.get_logger("cached")
        log.info("first")
        second = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
        monkeypatch.setattr(sys, "stderr", second)
        first.close()  # the first stream is gone, as a test's capture is after the test
        log.info("second")
        assert [line["event"] for line in lines(second.buffer.getvalue().decode())] == ["second"]  # type: ignore[attr-defined]

    def test_a_text_only_stderr_gets_the_line_as_text(self, monkeypatch: pytest.MonkeyPatch) -> None:
        text = io.StringIO()
        monkeypatch.setattr(sys, "stderr", text)
        configure_logging("json")
        structlog.get_logger("text").info("session_open", job_id="j")
        assert json.loads(text.getvalue())["job_id"] == "j"

    def test_console_format_writes_readable_text(self, capsys: pytest.CaptureFixture[str]) -> None:
        configure_logging("console")
        structlog.get_logger("console").info("serving", socket="/run/eerld/eerld.sock")
        out = capsys.readouterr().err
        assert "serving" in out
        assert "socket=/run/eerld/eerld.sock" in out


class TestIsoUtcStamper:
    @pytest.mark.parametrize(
        "now", [1764470399.999998, 1764470400.000001, 1764470400.5, 0.25, 2000000000.123456]
    )
    def test_it_matches_datetime_to_the_microsecond_across_second_boundaries(
        self, now: float, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        stamper = IsoUtcStamper()
        stamper(None, "info", {})  # primes the cached second with the real time
        monkeypatch.setattr(eerld_logging.time, "time", lambda: now)
        stamp = str(stamper(None, "info", {})["timestamp"])
        expected = datetime.fromtimestamp(now, UTC)
        got = datetime.fromisoformat(stamp.replace("Z", "+00:00"))
        assert ISO_UTC.match(stamp)
        assert abs((got - expected).total_seconds()) <= 1e-6
