"""Fixtures for the live demo's tests: the repository root and an environment in which ``demo`` imports."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def demo_env() -> dict[str, str]:
    """The environment for ``python -m demo`` in a subprocess (this checkout first on the path)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env.pop("EERL_DISABLE", None)
    return env


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    """A short directory for Unix sockets (their paths must stay under ~100 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="eerl-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)
