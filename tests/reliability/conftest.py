"""Fixtures for the reliability suite: the soak's scenario code (bench/soak_*.py) at small counts."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:  # the scenarios live in bench/ so that `make soak` runs them at full size
    sys.path.insert(0, str(BENCH))
