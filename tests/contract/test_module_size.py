"""A guard on the size of production modules: one job per module, so none grows past about 600 lines.

A module over the limit is a sign it holds more than one concept; split it by job (docs/architecture.md says
where each concept lives). Generated code (protobuf, gRPC) is not ours to split.
"""

from __future__ import annotations

from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PRODUCTION_ROOTS = ("eerld", "eerlctl", "client/eerl", "sim/eerl_sim")
MAX_LINES = 600


def production_modules() -> list[Path]:
    """Every hand-written Python module the wheels ship."""
    return sorted(
        path
        for root in PRODUCTION_ROOTS
        for path in (REPO / root).rglob("*.py")
        if not path.name.endswith(("_pb2.py", "_pb2_grpc.py"))
    )


def test_the_guard_sees_every_wheel() -> None:
    """The roots exist and hold modules (a moved package must not make this guard pass by seeing nothing)."""
    modules = production_modules()
    found = {root: sum(1 for p in modules if p.is_relative_to(REPO / root)) for root in PRODUCTION_ROOTS}
    assert all(count >= 5 for count in found.values()), found


@pytest.mark.parametrize("path", production_modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_no_production_module_is_over_the_limit(path: Path) -> None:
    lines = len(path.read_text(encoding="utf-8").splitlines())
    name = path.relative_to(REPO)
    assert lines <= MAX_LINES, f"{name} has {lines} lines: split it by job (limit {MAX_LINES})"
