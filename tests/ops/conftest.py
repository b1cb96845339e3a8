"""Fixtures of the operations tests: a fake metrics source and its server, the fake admin service."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from eerld.metrics import MetricsServer, start_metrics_server
from tests.ops.fakes import FakeAdminServer, FakeMetricsSource, start_fake_admin


@pytest.fixture
def fake_source() -> FakeMetricsSource:
    """A node with two GPUs (GPU 0 locked by a session, GPU 1 pinned by an admin) and one session."""
    return FakeMetricsSource()


@pytest.fixture
def metrics_server(fake_source: FakeMetricsSource) -> Iterator[MetricsServer]:
    """``/metrics`` over the fake source on a free loopback port."""
    server = start_metrics_server(fake_source, "127.0.0.1:0")
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short temporary directory: Unix socket paths must stay under ~100 bytes."""
    path = Path(tempfile.mkdtemp(prefix="eerl-ops-", dir="/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def fake_admin(short_tmp: Path) -> Iterator[FakeAdminServer]:
    """A fake AdminService (plus health) on a temporary Unix socket."""
    server = start_fake_admin(short_tmp / "admin.sock")
    try:
        yield server
    finally:
        server.stop()
