"""Fixtures for the reliability suite: the soak's scenario code (bench/soak_*.py) at small counts."""

from __future__ import annotations

import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:  # the scenarios live in bench/ so that `make soak` runs them at full size
    sys.path.insert(0, str(BENCH))


@pytest.fixture(autouse=True)
def _default_logging() -> Iterator[None]:
    """An in-process daemon may configure structlog; give every test the defaults back."""
    yield
    structlog.reset_defaults()


@pytest.fixture
def sock_dir() -> Iterator[Path]:
    """A directory with a short path (Unix socket paths hold at most 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="eerl-r-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
