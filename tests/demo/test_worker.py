"""The simulated RL worker: what it reports through the client is exactly the scenario's sampled workload."""

from __future__ import annotations

import dataclasses
import itertools
import json
from pathlib import Path

import pytest
from eerl import ClientConfig, connect
from eerl.phases import PhaseKind, Workload
from eerl.testing import FakeDaemon, RecordedPhase
from eerl_sim.evaluate import evaluate_between, sample_iteration
from eerl_sim.gpu import VirtualClock, create_sim_backend
from eerl_sim.scenario import load_scenario

from demo.live import locked_gpus
from demo.worker import PhaseRun, SimWorker
from tests.conftest import short_socket_dir

ITERATIONS = 2


def _fast(config: ClientConfig) -> ClientConfig:
    return dataclasses.replace(config, reconnect_initial_s=0.02, reconnect_max_s=0.1)


@dataclasses.dataclass(frozen=True)
class WorkerRun:
    """What the worker metered, and what the fake daemon received."""

    runs: list[PhaseRun]
    phases: list[RecordedPhase]


def run_worker(scenario_name: str, iterations: int) -> WorkerRun:
    """``iterations`` of a scenario on 8 GPUs (virtual time), reported to a recording fake daemon."""
    scenario = load_scenario(scenario_name)
    backend = create_sim_backend(scenario.gpu, scenario.workload.gpus, clock=VirtualClock())
    with short_socket_dir() as socket_dir, FakeDaemon(socket_dir / "eerld.sock") as fake:
        session = connect(gpus=list(range(8)), job_id="test", config=_fast(fake.config))
        with session:
            assert session.wait_until_connected(10.0)
            worker = SimWorker(scenario, backend.device, session, gpu_indices=range(8), wait_for_clock_s=0.0)
            runs = worker.run(iterations)
            assert session.flush(10.0)
        return WorkerRun(runs, list(fake.phases))


@pytest.fixture(scope="module")
def worker_run() -> WorkerRun:
    """Two iterations of sync-h100."""
    return run_worker("sync-h100", ITERATIONS)


class TestSimWorker:
    def test_reported_token_counts_equal_the_scenarios_sampled_workload(self, worker_run: WorkerRun) -> None:
        """Every EndPhase the daemon receives carries the sampled workload of that iteration and phase."""
        scenario = load_scenario("sync-h100")
        ends = [p for p in worker_run.phases if not p.begin]
        assert [(p.iteration, p.kind.value) for p in ends] == [
            (i, kind) for i in range(ITERATIONS) for kind in ("generation", "training")
        ]
        for recorded in ends:
            expected = (
                sample_iteration(scenario, recorded.iteration).phase(PhaseKind(recorded.kind.value)).workload
            )
            assert dataclasses.asdict(recorded.workload) == dataclasses.asdict(expected)

    def test_training_reports_the_valid_tokens_and_generation_none(self, worker_run: WorkerRun) -> None:
        """Valid tokens are credited once per iteration, to the training phase that trains on them."""
        by_kind = {
            kind: [r.workload.valid_tokens for r in worker_run.runs if r.kind is kind] for kind in PhaseKind
        }
        assert by_kind[PhaseKind.GENERATION] == [0] * ITERATIONS
        assert all(tokens > 0 for tokens in by_kind[PhaseKind.TRAINING])

    def test_each_phase_is_metered_in_simulated_seconds_with_positive_energy(
        self, worker_run: WorkerRun
    ) -> None:
        """The worker's own meter gives each phase a simulated duration and the energy of its GPUs."""
        runs = worker_run.runs
        assert all(r.duration_s > 1.0 and r.energy_j > 0 for r in runs)
        assert all(a.end_s <= b.start_s for a, b in itertools.pairwise(runs))

    def test_a_phase_record_survives_its_json_line(self) -> None:
        """The orchestrator reads back exactly what the worker wrote."""
        run = PhaseRun(3, PhaseKind.TRAINING, 10.0, 45.5, 1234.5, 1395, Workload(10, 7, 2, 5, 3))
        assert PhaseRun.from_json(json.loads(run.to_json())) == run


class TestLockCheck:
    def test_a_gpu_left_locked_in_the_state_file_is_reported(self, tmp_path: Path) -> None:
        """The demo's final check names the simulated GPUs that still hold a clock lock."""
        scenario = load_scenario("sync-h100")
        state = tmp_path / "state.json"
        backend = create_sim_backend(scenario.gpu, 4, speedup=10.0, state_file=state)
        backend.lock_sm_clock(2, 1200)
        assert locked_gpus(state) == [2]
        backend.reset_sm_clock(2)
        assert locked_gpus(state) == []


class TestWorkBetweenThePhases:
    def test_the_gpus_run_it_after_generation_outside_any_phase(self) -> None:
        """verl-h100: between generation's end and training's begin the GPUs run the work between the phases
        at the default governor (the fake daemon locks nothing), and no phase is open meanwhile."""
        scenario = load_scenario("verl-h100")
        run = run_worker("verl-h100", 1)
        generation, training = run.runs
        recorded = [(p.kind.value, p.begin) for p in run.phases]
        between = evaluate_between(scenario, sample_iteration(scenario, 0))
        assert between.duration_s > 10.0
        assert training.start_s - generation.end_s == pytest.approx(between.duration_s, rel=0.01)
        kinds = ("generation", "training")
        assert recorded == [(kind, begin) for kind in kinds for begin in (True, False)]
