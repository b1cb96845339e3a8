"""Fixtures for the live demo's tests: the repository root and an environment in which ``demo`` imports."""

from __future__ import annotations

import os
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
