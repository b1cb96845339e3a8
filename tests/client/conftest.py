"""Fixtures for the client tests: a recording fake daemon on a short Unix socket path, fast tuning."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from eerl import ClientConfig
from eerl.testing import FakeDaemon


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short directory for Unix sockets (their paths must stay under ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="eerl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def fast(config: ClientConfig, **overrides: float) -> ClientConfig:
    """The same config with back-off and timeouts small enough for tests."""
    tuning: dict[str, float] = {
        "reconnect_initial_s": 0.02,
        "reconnect_max_s": 0.1,
        "rpc_timeout_s": 2.0,
        "close_timeout_s": 2.0,
    }
    tuning.update(overrides)
    return dataclasses.replace(config, **tuning)  # type: ignore[arg-type]


@pytest.fixture
def fake(socket_dir: Path) -> Iterator[FakeDaemon]:
    """A running recording fake daemon."""
    with FakeDaemon(socket_dir / "eerld.sock") as daemon:
        yield daemon


@pytest.fixture
def config(fake: FakeDaemon) -> ClientConfig:
    """A fast client config that reaches ``fake``."""
    return fast(fake.config)
