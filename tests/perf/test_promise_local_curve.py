"""perf.promise --local-curve: the single-node and the job controllers both read their clock curves
through the local fit alone (the physics-shaped curve off), and a multi-node job run takes the controller
it is given."""

from __future__ import annotations

from pathlib import Path

from eerl.control.base import ControllerSettings
from eerl.control.eerl import JOB_CONFIG, EerlController
from eerl_sim.bench.multinode import MultinodeRun

from perf import promise

GRID = tuple(range(345, 1981, 15))
SCENARIOS = Path(promise.SCENARIOS)


def test_both_controllers_read_the_local_fit_alone() -> None:
    settings = ControllerSettings(GRID)
    single = promise._local_controller(settings)
    job = promise._local_job_controller(settings)
    assert isinstance(single, EerlController)
    assert isinstance(job, EerlController)
    assert not single._config.physics_curve
    assert not job._config.physics_curve
    assert job._config.recheck_energy_stop == JOB_CONFIG.recheck_energy_stop  # the job's tuning kept
    assert all(track.curve._top_mhz is None for track in single._all)
    assert all(track.curve._top_mhz == 1980.0 for track in EerlController(settings)._all)  # the default


def test_a_job_run_uses_the_controller_it_is_given(tmp_path: Path) -> None:
    made: list[ControllerSettings] = []

    def factory(settings: ControllerSettings) -> EerlController:
        made.append(settings)
        controller = promise._local_job_controller(settings)
        assert isinstance(controller, EerlController)
        return controller

    run = promise.priced_run(SCENARIOS / "multinode-4-h100.toml", 1, tmp_path)
    assert isinstance(run, MultinodeRun)
    run.iterations = 12
    totals = run.run_job(0.95, controller=factory)
    assert made
    assert totals.wall_s > 0
