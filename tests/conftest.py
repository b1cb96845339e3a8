"""Fixtures shared by every test package."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog
from hypothesis import settings

# `make test` (and CI) draws the same examples every run, so a red build is reproducible and a green one is
# not luck; HYPOTHESIS_PROFILE=explore draws fresh random examples to hunt for new failures.
settings.register_profile("ci", derandomize=True, database=None, print_blob=True)
settings.register_profile("explore", derandomize=False, print_blob=True)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))


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
