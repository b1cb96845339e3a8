"""The daemon's log set-up: JSON lines a machine can parse, timestamps like structlog's, and output that
follows ``sys.stderr`` even though loggers are cached on first use."""

from __future__ import annotations

import io
import json
import logging
import re
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

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


class Unserialisable:
    def __repr__(self) -> str:
        return "<unserialisable>"


class StructlogAware:
    def __structlog__(self) -> str:
        return "as-structlog-says"


class TestPlainLinesSkipTheChain:
    """A plain line is built without walking the processor chain: the bytes must be the chain's."""

    @staticmethod
    def through_chain_and_plain(
        monkeypatch: pytest.MonkeyPatch, emit: Callable[[Any], None], *, bind: dict[str, object] | None = None
    ) -> tuple[bytes, bytes]:
        monkeypatch.setattr(eerld_logging.time, "time", lambda: 1764470400.25)
        out: list[bytes] = []
        for plain in (False, True):
            stream = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
            monkeypatch.setattr(sys, "stderr", stream)
            configure_logging("json")
            if not plain:  # the same chain, but every line through it
                structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.INFO))
            log = structlog.get_logger("same").bind(**(bind or {}))
            emit(log)
            out.append(stream.buffer.getvalue())  # type: ignore[attr-defined]
        return out[0], out[1]

    @pytest.mark.parametrize("level", ["info", "warning", "error", "critical"])
    def test_every_level_renders_the_bytes_of_the_chain(
        self, level: str, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        def emit(log: Any) -> None:
            getattr(log, level)(
                "clock_lock", gpu_index=0, gpu_uuid="GPU-1", sm_clock_mhz=1200, pinned=False, share=0.5
            )

        chain, plain = self.through_chain_and_plain(monkeypatch, emit)
        assert plain == chain
        assert json.loads(plain)["level"] == level

    def test_bound_context_and_odd_values_render_as_the_chain_renders_them(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        def emit(log: Any) -> None:
            log.info("session_open", odd=Unserialisable(), aware=StructlogAware(), nested={"a": [1, 2]})

        chain, plain = self.through_chain_and_plain(monkeypatch, emit, bind={"session_id": "abc", "rank": 3})
        assert plain == chain
        line = json.loads(plain)
        assert (line["session_id"], line["odd"], line["aware"]) == (
            "abc",
            "<unserialisable>",
            "as-structlog-says",
        )
        assert list(line)[:2] == ["session_id", "rank"]  # bound context first, as structlog orders it

    def test_percent_arguments_and_exceptions_still_go_through_the_chain(
        self, capsys: pytest.CaptureFixture[str]
    ) -> None:
        configure_logging("json")
        log = structlog.get_logger("chain")
        log.info("gpu %s lost", 3)
        try:
            raise ValueError("bad")
        except ValueError:
            log.error("controller_error", exc_info=True)
        first, second = json_lines(capsys)
        assert first["event"] == "gpu 3 lost"
        assert "ValueError: bad" in str(second["exception"])

    def test_below_the_level_nothing_is_written(self, capsys: pytest.CaptureFixture[str]) -> None:
        configure_logging("json")
        structlog.get_logger("quiet").debug("rate_limited", gpu_index=1)
        assert capsys.readouterr().err == ""


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
