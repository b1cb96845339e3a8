"""Shared fixtures of the simulator tests: scenarios and a few expensive results, computed once."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from eerl_sim.scenario import Scenario, load_scenario
from eerl_sim.sweep import SweepResult, sweep

CALIBRATION_ITERATIONS = 12
"""Iterations per calibration run: enough for stable ratios (common random numbers), quick enough."""

SCENARIO_OF_PROFILE = {"h100-sxm": "sync-h100", "gb200": "sync-gb200"}


def quiet(scenario: Scenario) -> Scenario:
    """The same scenario without measurement noise (for exact physics comparisons)."""
    gpu = scenario.gpu.with_overrides(
        {"noise_duration": 0.0, "noise_power": 0.0, "noise_phase_duration": 0.0, "noise_phase_power": 0.0}
    )
    return dataclasses.replace(scenario, gpu=gpu)


@pytest.fixture(scope="session")
def sync_h100() -> Scenario:
    return load_scenario("sync-h100")


@pytest.fixture(scope="session")
def async_h100() -> Scenario:
    return load_scenario("async-h100")


@pytest.fixture(scope="session", params=sorted(SCENARIO_OF_PROFILE))
def reference(request: pytest.FixtureRequest) -> Scenario:
    """The reference scenario of each built-in profile."""
    return load_scenario(SCENARIO_OF_PROFILE[request.param])


@pytest.fixture(scope="session")
def reference_sweep(reference: Scenario) -> SweepResult:
    """A short whole-run sweep of the reference scenario (once per profile)."""
    return sweep(reference, iterations=CALIBRATION_ITERATIONS)


@pytest.fixture
def write_scenario(tmp_path: Path):  # type: ignore[no-untyped-def]
    """Write a scenario file from the reference text with some lines replaced; returns its path."""
    reference_text = Path(load_scenario("sync-h100").source).read_text()  # the packaged file

    def write(replacements: dict[str, str] | None = None, append: str = "", name: str = "bad.toml") -> Path:
        text = reference_text
        for old, new in (replacements or {}).items():
            assert old in text, old
            text = text.replace(old, new)
        path = tmp_path / name
        path.write_text(text + append)
        return path

    return write
