"""The slime hook against slime's source, THUDM/slime at commit 624b824a898a (not on the package index).

What runs: the contract, read in excerpts of that commit (tests/frameworks/sources, cut by vendor.py):
``RolloutManager.generate`` converts through ``self._convert_samples_to_train_data`` (the fields the hook
counts) and ``eval`` does not; ``RayTrainGroup.async_train`` returns one ref per train actor; ``train.py``
and ``train_async.py`` ``ray.get`` what ``generate.remote`` and ``async_train`` return. Then **the driver
loops of that commit's ``train.py`` and ``train_async.py`` themselves** (the excerpts, executed) with the
two adoption lines of docs/integrations.md inserted after ``create_training_models``, on a local Ray
cluster: the rollout manager is a Ray actor with the real one's methods (canned samples instead of SGLang
engines), the train group a local object over Ray actors with ``train`` (no Megatron). Recorded, and
metered by the real daemon on the sim backend: ``train_async.py`` as two sessions, one per pool, in async
mode with their roles; ``train.py`` (colocated or not: its pools take turns) as one sync session. With a
job object (``job=``, as an ``eerl.ray.RayJob`` with pools): both loops report through it, ``train_async.py``
with generation k + 1 open over training k (the multi-node pools themselves: tests/ray/test_ray_pools.py).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import eerl
import eerl.integrations.slime as hook_module
import pytest
import ray
from eerl.integrations import HookWarning
from eerl.phases import PhaseKind, Workload

from tests.client.conftest import fast
from tests.frameworks.conftest import (
    GENERATION_MHZ,
    TRAINING_MHZ,
    Recorded,
    Recorder,
    SimWork,
    assert_commits,
    source_excerpt,
)

COMMIT = hook_module.SLIME_COMMIT
ADOPT_AFTER = "    actor_model, critic_model = create_training_models(args, pgs, rollout_manager)\n"
CLOSE_BEFORE = "    ray.get(rollout_manager.dispose.remote())\n"
ADOPTION = (
    "    eerl_job = eerl.integrations.slime.instrument_job(\n"
    "        rollout_manager, actor_model, overlap=OVERLAP, job_id='slime-run',\n"
    "        gpus=EERL_GPUS, config=CONFIG, job=JOB,\n"
    "    )\n"
)
# Three samples per rollout: prompts of 4, 2, 3 tokens; responses of 3, 5, 2 (loss on 3, 4, 2 of them).
SAMPLES = [(4, 3, [1, 1, 1]), (2, 5, [1, 1, 1, 1, 0]), (3, 2, [1, 1])]
GENERATION = Workload(tokens=10, sequences=3, max_response_tokens=5, prompt_tokens=9)
TRAINING = Workload(tokens=19, valid_tokens=9, sequences=3, max_response_tokens=5, prompt_tokens=9)
ROLLOUTS = 3


def excerpt(path: str, name: str) -> str:
    return source_excerpt("slime", COMMIT, path, name)


class TestContract:
    def test_generate_converts_through_the_method_the_hook_counts_on_and_eval_does_not(
        self, framework_version: str
    ) -> None:
        manager = excerpt("slime/ray/rollout.py", "RolloutManager")
        generate = manager[
            manager.index("    def generate(self, rollout_id):") : manager.index("    def eval(")
        ]
        assert generate.index("self.rollout_id = rollout_id") < generate.index(
            "data, metrics = self._get_rollout_data(rollout_id=rollout_id)"
        )
        assert "data = self._convert_samples_to_train_data(data)" in generate
        assert "    def _get_rollout_data(self, rollout_id):" in manager
        assert "return self._split_train_data_by_dp(data)" in generate
        evaluation = manager[
            manager.index("    def eval(self, rollout_id):") : manager.index("    def save(")
        ]
        assert "_convert_samples_to_train_data" not in evaluation
        assert "_get_rollout_data" not in evaluation
        for field in (
            '"tokens": [sample.tokens for sample in samples]',
            '"response_lengths": [sample.response_length for sample in samples]',
            'train_data["loss_masks"] = loss_masks',
        ):
            assert field in manager
        assert manager.startswith("@ray.remote\nclass RolloutManager:")

    def test_async_train_returns_one_ref_per_train_actor(self) -> None:
        group = excerpt("slime/ray/actor_group.py", "RayTrainGroup")
        assert "    def async_train(self, rollout_id, rollout_data_ref, external_data=None):" in group
        assert "actor.train.remote(rollout_id, rollout_data_ref, external_data=external_data)" in group
        train = excerpt("slime/backends/megatron_utils/actor.py", "MegatronTrainRayActor.train")
        assert "def train(self, rollout_id: int, rollout_data_ref: Box, external_data=None):" in train

    def test_the_driver_loops_wait_for_what_the_hook_waits_for(self) -> None:
        sync = excerpt("train.py", "train")
        assert "rollout_data_ref = ray.get(rollout_manager.generate.remote(rollout_id))" in sync
        assert "ray.get(actor_model.async_train(rollout_id, rollout_data_ref))" in sync
        asynchronous = excerpt("train_async.py", "train")
        assert 'assert not args.colocate, "Colocation is not supported for async training."' in asynchronous
        assert "rollout_data_next_future = rollout_manager.generate.remote(rollout_id + 1)" in asynchronous
        assert "ray.get(actor_model.async_train(rollout_id, rollout_data_curr_ref))" in asynchronous
        for loop in (sync, asynchronous):
            assert ADOPT_AFTER in loop + "\n"
            assert CLOSE_BEFORE in loop + "\n"

    def test_an_object_it_cannot_hook_warns_naming_the_commit(self, recorder: Recorder) -> None:
        with pytest.warns(HookWarning, match=COMMIT[:12]):
            hook = hook_module.instrument(object(), recorder)
        assert not hook.attached


def stand_in_classes() -> tuple[type, type]:
    """The rollout manager (its methods as in the excerpt; canned samples for SGLang) and a train actor
    (``train`` as ``MegatronTrainRayActor``'s, without Megatron). Made in a function so that Ray ships them
    by value: the workers need not import this module."""

    class Sample:
        def __init__(self, index: int, prompt: int, response: int, loss_mask: list[int]) -> None:
            self.index, self.rollout_id = index, index
            self.tokens = list(range(prompt + response))
            self.response_length, self.loss_mask = response, loss_mask

    def sim_work(
        state_file: str | None, gpu: int, compute_mhz_s: float, memory_s: float, wait_s: float
    ) -> None:
        """The phase's work on the shared simulated GPUs (``state_file``: the daemon's), else a sleep."""
        if state_file is None:
            time.sleep(wait_s)
            return
        from eerl_sim.gpu import open_sim_device  # noqa: PLC0415 - in the actor's process

        open_sim_device(Path(state_file)).run_segments(gpu, [compute_mhz_s], [memory_s], 1.0)

    class RolloutManager:
        def __init__(
            self, args: Any, pg: Any, samples: list[tuple[int, int, list[int]]], state_file: str | None = None
        ) -> None:
            self.args, self.pg, self.samples, self.generated, self.evaluated = args, pg, samples, [], []
            self.state_file = state_file

        def generate(self, rollout_id: int) -> list[Any]:
            self.rollout_id = rollout_id
            data, _metrics = self._get_rollout_data(rollout_id=rollout_id)
            data = self._convert_samples_to_train_data(data)
            self.generated.append(rollout_id)
            return self._split_train_data_by_dp(data)

        def _get_rollout_data(self, rollout_id: int) -> tuple[list[Any], dict[str, float]]:
            sim_work(self.state_file, 0, *SimWork.GENERATION, 0.05)  # the engines sampling, on GPU 0
            return [Sample(i, *sample) for i, sample in enumerate(self.samples)], {}

        def eval(self, rollout_id: int) -> None:
            self.evaluated.append(rollout_id)

        def _convert_samples_to_train_data(self, samples: list[Any]) -> dict[str, Any]:
            return {
                "tokens": [sample.tokens for sample in samples],
                "response_lengths": [sample.response_length for sample in samples],
                "loss_masks": [sample.loss_mask for sample in samples],
            }

        def _split_train_data_by_dp(self, data: dict[str, Any]) -> list[Any]:
            return [ray.put(data)]

        def offload(self) -> None: ...
        def onload_weights(self) -> None: ...
        def onload_kv(self) -> None: ...
        def save(self, rollout_id: int) -> None: ...
        def dispose(self) -> list[int]:
            return self.generated

        def calls(self) -> tuple[list[int], list[int]]:
            return self.generated, self.evaluated

    class TrainActor:
        def __init__(self, state_file: str | None = None) -> None:
            self.trained: list[int] = []
            self.state_file = state_file

        def train(self, rollout_id: int, rollout_data_ref: Any, external_data: Any = None) -> None:
            compute_mhz_s, memory_s = SimWork.TRAINING
            sim_work(self.state_file, 1, compute_mhz_s / 2, memory_s / 2, 0.05)  # its half, on GPU 1
            self.trained.append(rollout_id)

        def done(self) -> list[int]:
            return self.trained

    return RolloutManager, TrainActor


class TrainGroup:
    """Stands in for ``RayTrainGroup``: its ``async_train`` over Ray train actors, the rest local no-ops."""

    def __init__(self, actors: list[Any]) -> None:
        self._actor_handlers = actors

    def async_train(self, rollout_id: int, rollout_data_ref: Any, external_data: Any = None) -> list[Any]:
        return [
            actor.train.remote(rollout_id, rollout_data_ref, external_data=external_data)
            for actor in self._actor_handlers
        ]

    def update_weights(self) -> None: ...
    def save_model(self, rollout_id: int, force_sync: bool = False) -> None: ...
    def clear_memory(self) -> None: ...
    def create(self) -> None: ...


@pytest.fixture(scope="module")
def local_ray() -> Iterator[None]:
    """A new local Ray (``address="local"``), never another cluster running on the machine (``make test``
    runs the main suite's beside it)."""
    ray.init(
        address="local", num_cpus=4, include_dashboard=False, log_to_driver=False, configure_logging=False
    )
    yield
    ray.shutdown()


def _args(colocate: bool, rollouts: int = ROLLOUTS) -> SimpleNamespace:
    return SimpleNamespace(
        colocate=colocate,
        release_train=False,
        offload_rollout=colocate,
        offload_train=False,
        check_weight_update_equal=False,
        num_rollout=rollouts,
        start_rollout_id=0,
        eval_interval=None,
        skip_eval_before_train=True,
        use_critic=False,
        num_critic_only_steps=0,
        save_interval=None,
        rollout_global_dataset=False,
        update_weights_interval=1,
    )


def run_driver_loop(
    script: str,
    colocate: bool,
    config: Any,
    env: dict[str, str],
    gpus: dict[str, list[int]],
    *,
    rollouts: int = ROLLOUTS,
    state_file: str | None = None,
    job: Any = None,
) -> tuple[Any, list[Any]]:
    """Executes ``script``'s ``train(args)`` at the commit (the excerpt), the adoption lines inserted,
    with slime's set-up functions returning the stand-ins; returns the rollout manager and train actors."""
    manager_class, actor_class = stand_in_classes()
    manager = (
        ray.remote(manager_class)
        .options(runtime_env={"env_vars": env})
        .remote(_args(colocate, rollouts), None, SAMPLES, state_file)
    )
    actors = [ray.remote(actor_class).remote(state_file) for _ in range(2)]
    source = excerpt(script, "train")
    source = source.replace(ADOPT_AFTER, ADOPT_AFTER + ADOPTION, 1)
    source = source.replace(CLOSE_BEFORE, "    eerl_job.close()\n" + CLOSE_BEFORE, 1)
    namespace: dict[str, Any] = {
        "ray": ray,
        "eerl": eerl,
        "CONFIG": config,
        "OVERLAP": script == "train_async.py",
        "EERL_GPUS": gpus,
        "JOB": job,
        "configure_logger": lambda: None,
        "init_tracking": lambda args: None,
        "finish_tracking": lambda args: None,
        "create_placement_groups": lambda args: {"rollout": None, "actor": None},
        "create_rollout_manager": lambda args, pg: (manager, rollouts),
        "create_training_models": lambda args, pgs, rollout_manager: (TrainGroup(actors), None),
        "should_run_periodic_action": lambda *args, **kwargs: False,
    }
    exec(compile(source, f"{script}@{COMMIT[:12]}", "exec"), namespace)  # slime's own loop text, at COMMIT
    namespace["train"](_args(colocate, rollouts))
    return manager, actors


@pytest.mark.usefixtures("local_ray")
class TestDriven:
    def test_the_rollout_manager_counts_and_reports_generate_not_eval(self, recorder: Recorder) -> None:
        manager_class, _ = stand_in_classes()
        manager = manager_class(_args(False), None, SAMPLES)
        hook = hook_module.instrument(manager, recorder)
        manager.generate(7)
        manager.eval(8)
        assert [(p.kind, p.iteration, p.workload) for p in recorder.phases] == [
            (PhaseKind.GENERATION, 7, GENERATION)
        ]
        assert hook.workload(7) == (GENERATION, TRAINING)
        hook.remove()
        assert "generate" not in vars(manager)

    def test_the_train_group_reports_until_its_actors_are_done_with_the_rollouts_tokens(
        self, recorder: Recorder
    ) -> None:
        manager_class, actor_class = stand_in_classes()
        manager = ray.remote(manager_class).remote(_args(False), None, SAMPLES)
        assert ray.get(manager.__ray_call__.remote(hook_module._attach, None, "run", None))
        actors = [ray.remote(actor_class).remote() for _ in range(2)]
        group = TrainGroup(actors)
        hook_module.instrument(group, recorder, rollout_manager=manager)
        refs = group.async_train(0, ray.get(manager.generate.remote(0)))
        assert ray.wait(refs, num_returns=2, timeout=0)[1] == []  # done when the phase ended
        assert [(p.kind, p.iteration, p.workload) for p in recorder.phases] == [
            (PhaseKind.TRAINING, 0, TRAINING)
        ]

    def test_a_failing_session_never_stops_the_loop(self) -> None:
        class Broken:
            def phase(self, *args: Any, **kwargs: Any) -> Any:
                raise RuntimeError("no daemon")

        manager_class, _ = stand_in_classes()
        manager = manager_class(_args(False), None, SAMPLES)
        hook_module.instrument(manager, Broken())
        assert manager.generate(0)


class PoolsJob:
    """A job object with pools (as :class:`eerl.ray.RayJob` with ``pools``): records each phase's begin and
    end, from whichever thread, in order."""

    pools = (PhaseKind.GENERATION, PhaseKind.TRAINING)

    def __init__(self) -> None:
        self.events: list[tuple[str, PhaseKind, int | None]] = []
        self.workloads: dict[tuple[PhaseKind, int | None], Workload] = {}
        self.closed = False
        self._lock = threading.Lock()

    def phase(self, kind: Any, iteration: int | None = None, **kwargs: Any) -> Recorded:
        job = self

        class Logged(Recorded):
            def __enter__(self) -> Recorded:
                with job._lock:
                    job.events.append(("begin", self.kind, self.iteration))
                return self

            def __exit__(self, *exc: object) -> None:
                with job._lock:
                    job.events.append(("end", self.kind, self.iteration))
                    job.workloads[self.kind, self.iteration] = self.workload

        return Logged(PhaseKind.parse(kind), iteration)

    def close(self) -> None:
        self.closed = True


@pytest.mark.usefixtures("local_ray")
class TestPoolsJob:
    def test_train_async_py_reports_both_pools_through_the_job_generation_k_plus_1_over_training_k(
        self,
    ) -> None:
        job = PoolsJob()
        manager, _ = run_driver_loop("train_async.py", False, None, {}, {}, rollouts=4, job=job)
        assert ray.get(manager.calls.remote()) == (list(range(4)), [])
        assert job.closed
        gen, train = PhaseKind.GENERATION, PhaseKind.TRAINING
        assert sorted(job.workloads.items()) == sorted(
            [((gen, i), GENERATION) for i in range(4)] + [((train, i), TRAINING) for i in range(4)]
        )
        events = job.events
        for k in range(3):  # generation k + 1 begins before training k, and they overlap
            assert events.index(("begin", gen, k + 1)) < events.index(("begin", train, k))
            assert events.index(("begin", train, k)) < events.index(("end", gen, k + 1))
        # one generation phase at a time: each ends before the next begins
        for k in range(3):
            assert events.index(("end", gen, k)) < events.index(("begin", gen, k + 1))

    def test_train_py_with_a_job_reports_the_pools_in_turn(self) -> None:
        job = PoolsJob()
        run_driver_loop("train.py", False, None, {}, {}, job=job)
        gen, train = PhaseKind.GENERATION, PhaseKind.TRAINING
        assert job.events == [
            (edge, kind, i) for i in range(ROLLOUTS) for kind in (gen, train) for edge in ("begin", "end")
        ]

    def test_ray_pools_reads_the_placement_groups_slime_s_own_code_makes(
        self, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """``create_placement_groups`` and its layout, executed from the excerpt of the named commit (only
        the Ray placement group itself stood in: 2 actor nodes × 2 GPUs, 2 rollout nodes × 2 GPUs), give
        ``ray_pools`` the shape it reads: each pool's nodes and their GPU ids."""
        bundle_node = {b: f"node-{b // 2}" for b in range(8)}  # bundles 0–7, two per node, in node order
        namespace: dict[str, Any] = {
            "logger": SimpleNamespace(info=lambda *_: None),
            "_create_placement_group": lambda n: ("pg", list(range(n)), [b % 2 for b in range(n)]),
        }
        for name in ("_get_placement_group_layout", "create_placement_groups"):
            exec(excerpt("slime/ray/placement_group.py", name), namespace)  # the vendored source
        args = SimpleNamespace(
            actor_num_nodes=2, actor_num_gpus_per_node=2, rollout_num_gpus=4, debug_train_only=False,
            rollout_external=False, debug_rollout_only=False, colocate=False, use_critic=False,
        )  # fmt: skip
        pgs = namespace["create_placement_groups"](args)
        monkeypatch.setattr(ray.util, "placement_group_table", lambda pg: {"bundles_to_node_id": bundle_node})
        pools, gpus = hook_module.ray_pools(pgs, args)
        assert pools == {"generation": ["node-2", "node-3"], "training": ["node-0", "node-1"]}
        assert gpus == {
            "generation": {"node-2": [0, 1], "node-3": [0, 1]},
            "training": {"node-0": [0, 1], "node-1": [0, 1]},
        }


@pytest.mark.usefixtures("local_ray")
class TestMetered:
    def test_train_async_py_runs_each_pool_as_an_async_session_with_its_role(
        self, metering_daemon: Any
    ) -> None:
        env = {"EERL_SOCKET": str(metering_daemon.socket_path)}
        gpus = {"generation": [0], "training": [1]}
        manager, actors = run_driver_loop("train_async.py", False, fast(metering_daemon.config), env, gpus)
        assert ray.get(manager.calls.remote()) == (list(range(ROLLOUTS)), [])
        assert all(ray.get(actor.done.remote()) == list(range(ROLLOUTS)) for actor in actors)
        records = metering_daemon.records
        assert sorted(
            (r.iteration, r.tokens, r.valid_tokens, r.sm_clock_mhz, r.gpu_indices)
            for r in records
            if r.kind is PhaseKind.GENERATION
        ) == [(i, GENERATION.tokens, 0, GENERATION_MHZ, (0,)) for i in range(ROLLOUTS)]
        assert sorted(
            (r.iteration, r.tokens, r.valid_tokens, r.sm_clock_mhz, r.gpu_indices)
            for r in records
            if r.kind is PhaseKind.TRAINING
        ) == [(i, TRAINING.tokens, TRAINING.valid_tokens, TRAINING_MHZ, (1,)) for i in range(ROLLOUTS)]
        assert len({r.session_id for r in records}) == 2  # one per pool
        # the driver's session is closed by job.close(); the rollout manager's lives with its actor
        assert [(view.mode.value, view.role.value) for view in metering_daemon.sessions()] == [
            ("async", "generation")
        ]

    @pytest.mark.parametrize(
        ("colocate", "gpus", "held"),
        [
            (False, {"generation": [0], "training": [1]}, (0, 1)),
            (True, {"generation": [0, 1], "training": [0, 1]}, (0, 1)),
        ],
    )
    def test_train_py_runs_one_sync_session_that_reports_both_phases_in_turn(
        self, metering_daemon: Any, colocate: bool, gpus: dict[str, list[int]], held: tuple[int, ...]
    ) -> None:
        manager, _ = run_driver_loop("train.py", colocate, fast(metering_daemon.config), {}, gpus)
        assert ray.get(manager.calls.remote()) == (list(range(ROLLOUTS)), [])
        records = metering_daemon.records
        assert [
            (r.kind, r.iteration, r.tokens, r.valid_tokens, r.sm_clock_mhz, r.gpu_indices) for r in records
        ] == [
            (kind, i, workload.tokens, workload.valid_tokens, mhz, held)
            for i in range(ROLLOUTS)
            for kind, workload, mhz in (
                (PhaseKind.GENERATION, Workload(tokens=GENERATION.tokens), GENERATION_MHZ),
                (PhaseKind.TRAINING, TRAINING, TRAINING_MHZ),
            )
        ]
        assert len({r.session_id for r in records}) == 1

    def test_train_async_py_each_pools_controller_commits_a_clock(self, sock_dir: Path) -> None:
        """Both pools' work runs on simulated GPUs shared through a state file (the rollout manager's on
        GPU 0, the train actors' on GPU 1): each pool's own async session explores and commits, the other
        pool's phase times feeding its slack."""
        from eerl_sim.gpu import create_sim_backend  # noqa: PLC0415 - the simulator loads only here
        from eerl_sim.profiles import builtin_profile  # noqa: PLC0415

        from tests.client.conftest import SimDaemon  # noqa: PLC0415

        state_file = sock_dir / "gpus.json"
        backend = create_sim_backend(builtin_profile("h100-sxm"), 2, speedup=2.0, state_file=state_file)
        daemon = SimDaemon(sock_dir, controller="eerl", backend=backend).start()
        try:
            env = {"EERL_SOCKET": str(daemon.socket_path)}
            gpus = {"generation": [0], "training": [1]}
            run_driver_loop(
                "train_async.py",
                False,
                fast(daemon.config),
                env,
                gpus,
                rollouts=40,
                state_file=str(state_file),
            )
        finally:
            daemon.stop()
        assert_commits(daemon.records)
        assert {r.gpu_indices for r in daemon.records if r.kind is PhaseKind.GENERATION} == {(0,)}
        assert {r.gpu_indices for r in daemon.records if r.kind is PhaseKind.TRAINING} == {(1,)}
