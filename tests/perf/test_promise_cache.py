"""perf.promise's price-table cache: a table priced by other simulator code is never reused."""

from __future__ import annotations

from pathlib import Path

import pytest

from perf import promise


def _key(monkeypatch: pytest.MonkeyPatch, simulator: Path, scenario: Path, seed: int = 1) -> str:
    monkeypatch.setattr(promise, "SIMULATOR", simulator)
    promise._simulator_digest.cache_clear()
    try:
        return promise._cache_key(scenario, seed)
    finally:
        promise._simulator_digest.cache_clear()


def test_the_key_follows_the_scenario_the_seed_and_the_simulators_source(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    simulator = tmp_path / "eerl_sim"
    (simulator / "bench").mkdir(parents=True)
    (simulator / "workload.py").write_text("READS = 1\n")
    (simulator / "bench" / "runner.py").write_text("pass\n")
    scenario = tmp_path / "a.toml"
    scenario.write_text('name = "a"\n')
    first = _key(monkeypatch, simulator, scenario)
    assert _key(monkeypatch, simulator, scenario) == first
    assert _key(monkeypatch, simulator, scenario, seed=2) != first
    (simulator / "bench" / "runner.py").write_text("pass  # priced otherwise\n")
    second = _key(monkeypatch, simulator, scenario)
    assert second != first
    scenario.write_text('name = "b"\n')
    assert _key(monkeypatch, simulator, scenario) not in (first, second)
