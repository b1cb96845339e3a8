"""The controller's CPU-independent arithmetic, and the same decisions whatever kernels the CPU picks."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from eerl.control import numeric

ROOT = Path(__file__).resolve().parents[3]

_NO_AVX512 = "AVX512F,AVX512CD,AVX512_SKX,AVX512_CLX,AVX512_CNL,AVX512_ICL,AVX512_SPR,X86_V4"
VARIANTS: dict[str, dict[str, str]] = {
    "as found": {},
    "BLAS Haswell": {"OPENBLAS_CORETYPE": "Haswell"},
    "BLAS SkylakeX": {"OPENBLAS_CORETYPE": "SkylakeX"},
    "BLAS Zen": {"OPENBLAS_CORETYPE": "Zen"},
    "BLAS Prescott, one thread": {"OPENBLAS_CORETYPE": "Prescott", "OPENBLAS_NUM_THREADS": "1"},
    "NumPy without AVX-512": {"NPY_DISABLE_CPU_FEATURES": _NO_AVX512},
}
"""Environments that make BLAS (OpenBLAS's kernel for another CPU) and NumPy's own SIMD loops (``exp`` and
``power`` differ in their last bits between AVX-512 and AVX2) compute as on another x86-64 machine."""

_DRIVER = """
import json, sys
from eerl.control.base import ControllerSettings
from eerl.control.eerl import create_eerl_controller
from tests.client.control.synthetic import GRID_MHZ, SyntheticJob, drive_sync
from eerl_sim.bench.runner import ScenarioRun
from eerl_sim.scenario import load_scenario
from eerl.control.registry import controller_factory

controller = create_eerl_controller(ControllerSettings(supported_sm_clocks_mhz=GRID_MHZ))
job = SyntheticJob(step_at_iteration=60, step_memory_factor=2.0, step_tokens_factor=2.0)
drive_sync(controller, job, 200)
synthetic = [[d.iteration, d.kind.value, d.sm_clock_mhz, d.reason] for d in controller.decisions()]
run = ScenarioRun(load_scenario("noisy-h100"), iterations=120)
timeline = run.run_online(controller_factory("eerl"), 0.95).timeline
bench = {k.value: v for k, v in sorted(timeline.sm_clock_mhz.items(), key=lambda kv: kv[0].value)}
json.dump({"synthetic": synthetic, "bench": bench}, sys.stdout)
"""


def _decisions(env: dict[str, str]) -> dict[str, object]:
    path = os.pathsep.join([str(ROOT), str(ROOT / "client"), os.environ.get("PYTHONPATH", "")])
    result = subprocess.run(
        [sys.executable, "-c", _DRIVER],
        env={**os.environ, "PYTHONPATH": path, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(result.stdout)  # type: ignore[no-any-return]


class TestExp:
    def test_it_agrees_with_the_library_exponential(self) -> None:
        """Within a few units in the last place over the range the controller uses."""
        x = np.linspace(-60.0, 0.0, 20001)
        ours = numeric.exp(x)
        assert np.max(np.abs(ours / np.array([math.exp(v) for v in x]) - 1.0)) < 1e-15

    def test_it_is_exact_where_exp_is(self) -> None:
        """exp(0) is 1 and far below the range it is 0."""
        assert numeric.exp(np.array([0.0, -800.0])).tolist() == [1.0, 0.0]


class TestLinearAlgebra:
    def test_solve_agrees_with_lapack(self) -> None:
        """A small ridge system with two right-hand sides."""
        rng = np.random.default_rng(3)
        rows = rng.normal(size=(12, 4))
        matrix = numeric.gram(rows) + 2e-3 * np.eye(4)
        rhs = rng.normal(size=(4, 2))
        assert np.allclose(numeric.solve(matrix, rhs), np.linalg.solve(matrix, rhs), rtol=1e-12)

    def test_products_agree_with_matmul(self) -> None:
        """gram, cross, dot_rows and dot are the matrix products they stand for."""
        rng = np.random.default_rng(4)
        rows, values, vector = rng.normal(size=(9, 3)), rng.normal(size=9), rng.normal(size=3)
        assert np.allclose(numeric.gram(rows), rows.T @ rows)
        assert np.allclose(numeric.cross(rows, values), rows.T @ values)
        assert np.allclose(numeric.dot_rows(rows, vector), rows @ vector)
        assert numeric.dot(vector, vector) == pytest.approx(float(vector @ vector))

    def test_a_singular_system_raises(self) -> None:
        """No pivot: LinAlgError, as LAPACK's solve."""
        with pytest.raises(np.linalg.LinAlgError):
            numeric.solve(np.zeros((2, 2)), np.ones(2))


@pytest.mark.slow
class TestSameDecisionsOnEveryCpu:
    def test_forced_blas_and_simd_kernels_give_the_same_decisions(self) -> None:
        """The noiseless step job whose re-tune once ended at 0.948 on an AMD EPYC without AVX-512, and a
        noisy bench scenario: the same decisions with BLAS forced to other CPUs and NumPy without AVX-512."""
        runs = {name: _decisions(env) for name, env in VARIANTS.items()}
        reference = runs.pop("as found")
        for name, decisions in runs.items():
            assert decisions == reference, name
