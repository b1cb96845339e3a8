"""Fixtures shared by every test package."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog


@pytest.fixture(autouse=True)
def _default_logging() -> Iterator[None]:
    """In-process daemons and ``main()`` configure structlog process-wide; give every test the defaults."""
    yield
    structlog.reset_defaults()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A directory with a short path (Unix socket paths hold at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="eerl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
