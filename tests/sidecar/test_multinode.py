"""A multi-node job without Ray: one eerl-sidecar per "node", each beside its own eerld (sim), the sidecars
one gloo group at a localhost rendezvous; each node's part of the job is tests/sidecar/job.sh (bash + curl).
Every process and socket is real: the job-level controller runs in node 0's sidecar, and the daemons' own
records say which directive each phase carried."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from eerl.errors import ConfigError
from eerl.sidecar._world import JobWorld, job_world
from eerl.v1 import eerl_pb2

from eerlctl.client import AdminClient
from tests.conftest import short_socket_dir
from tests.sidecar.conftest import (
    JOB_SH,
    Call,
    SidecarProcess,
    SimEerld,
    parse_job_output,
    sidecar_for,
    start_job,
    wait_until,
)

NODES = 3
JOB_CLOCKS = {"generation": 1110, "training": 1410}
"""The job-level controller's clocks (policy fixed): not the daemons' own (1200 / 1500), so a clock that
holds came from the directive."""
ITERATIONS = 3
FORM_WITHIN_S = 90.0
"""Three sidecars importing torch at once on two shared cores: generous, it is a deadline, not a measure."""


@pytest.fixture(scope="module")
def nodes() -> Iterator[list[SimEerld]]:
    """One sim eerld per node, for the module (each test uses its own job id)."""
    with ExitStack() as stack:
        directories = [stack.enter_context(short_socket_dir("eerl-mn-")) for _ in range(NODES)]
        yield [stack.enter_context(SimEerld(directory)) for directory in directories]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_nodes(
    nodes: list[SimEerld], start: Callable[..., SidecarProcess], job_id: str
) -> list[SidecarProcess]:
    """A sidecar per node, in job mode. Node 0 is told everything by flags; node 1 reads a torchrun-style
    environment (WORLD_SIZE, RANK, MASTER_ADDR, MASTER_PORT), node 2 a Slurm one (SLURM_NNODES,
    SLURM_NODEID) with EERL_RENDEZVOUS."""
    port = free_port()
    clocks = ",".join(f"{kind}={mhz}" for kind, mhz in JOB_CLOCKS.items())
    common = ["--job-policy", "fixed", "--job-fixed-clocks", clocks, "--job-timeout-s", "5"]
    launchers: list[tuple[list[str], dict[str, str]]] = [
        (["--job-nodes", str(NODES), "--node-rank", "0", "--rendezvous", f"tcp://127.0.0.1:{port}"], {}),
        (
            ["--job-nodes", "auto"],
            {"WORLD_SIZE": str(NODES), "RANK": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port - 1)},
        ),
        (
            ["--job-nodes", "auto"],
            {"SLURM_NNODES": str(NODES), "SLURM_NODEID": "2", "EERL_RENDEZVOUS": f"tcp://127.0.0.1:{port}"},
        ),
    ]
    sidecars = [  # each "node" its own sidecar socket (one host here: the default path would be shared)
        sidecar_for(
            start,
            daemon.socket_path,
            job_id,
            *common,
            *flags,
            env=env,
            listen=f"unix:{daemon.directory}/sc.sock",
        )
        for daemon, (flags, env) in zip(nodes, launchers, strict=True)
    ]
    for sidecar in sidecars:
        wait_until(
            "the side group formed",
            lambda s=sidecar: s.status()["job"]["state"] != "forming",  # type: ignore[misc]
            FORM_WITHIN_S,
        )
    for rank, sidecar in enumerate(sidecars):
        job = sidecar.status()["job"]
        assert job["state"] == "on", (job, sidecar.stderr()[-3000:])
        assert (job["node_rank"], job["nodes"], job["leader"]) == (rank, NODES, rank == 0)
    return sidecars


def directives(daemon: SimEerld, job_id: str) -> dict[tuple[str, int], tuple[Any, ...]]:
    """What the node's daemon recorded per phase of the job's session: clock, epoch, incarnation, verdict."""
    session = daemon.session_of(job_id)
    assert session is not None
    with AdminClient(daemon.admin_socket_path) as admin:
        decisions = admin.decisions(session_id=session.session_id, timeout_s=5)
    seen: dict[tuple[str, int], tuple[Any, ...]] = {}
    for decision in decisions:
        if not decision.HasField("directive"):
            continue
        directive = decision.directive
        kind = eerl_pb2.PhaseKind.Name(decision.kind).removeprefix("PHASE_KIND_").lower()
        seen[(kind, decision.iteration)] = (
            directive.sm_clock_mhz,
            directive.epoch,
            directive.incarnation,
            eerl_pb2.DirectiveVerdict.Name(decision.verdict),
        )
    return seen


def finish(job: subprocess.Popen[str]) -> list[Call]:
    out, err = job.communicate(timeout=120)
    calls, finished = parse_job_output(out)
    assert job.returncode == 0, err
    assert finished
    return calls


@pytest.mark.usefixtures("curl")  # the node jobs are bash + curl
class TestMultiNodeJob:
    def test_every_node_runs_each_phase_at_the_directive_of_the_leader(
        self, nodes: list[SimEerld], start_sidecar: Callable[..., SidecarProcess]
    ) -> None:
        sidecars = start_nodes(nodes, start_sidecar, "mn-job")
        jobs = [start_job(s.url, env={"ITERATIONS": str(ITERATIONS), "WORK_S": "0.25"}) for s in sidecars]
        answers = [finish(job) for job in jobs]
        for calls in answers:
            assert [c.code for c in calls] == [200] * 4 * ITERATIONS
            # A begin whose step was done in time says the clock its node applied: the directive's.
            for call in calls:
                if call.edge == "begin" and call.answer["job"]["done"]:
                    assert call.answer["sm_clock_mhz"] == JOB_CLOCKS[call.kind]
                    assert call.answer["job"]["verdict"] == "accepted"
                    assert call.answer["job"]["directive"]["sm_clock_mhz"] == JOB_CLOCKS[call.kind]
        # Each node's daemon: every phase carried a directive, the same one on every node, and took it.
        phases = {(kind, i) for kind in JOB_CLOCKS for i in range(ITERATIONS)}
        seen = [directives(daemon, "mn-job") for daemon in nodes]
        assert set(seen[0]) == phases
        assert seen[1] == seen[0]
        assert seen[2] == seen[0]
        for (kind, _), (clock, _, _, verdict) in seen[0].items():
            assert clock == JOB_CLOCKS[kind]
            assert verdict == "DIRECTIVE_VERDICT_ACCEPTED"
        # Each node's daemon metered every phase of its part of the job.
        for daemon in nodes:
            assert daemon.metered("mn-job") == {
                "PHASE_KIND_GENERATION": ITERATIONS,
                "PHASE_KIND_TRAINING": ITERATIONS,
            }
        # Every phase's reports reached the leader, whose controller judged them all.
        leader = sidecars[0].status()["job"]
        controller = leader["controller"]
        assert (controller["observed"], controller["dropped"]) == (2 * ITERATIONS, 0)
        assert {kind: p["state"] for kind, p in controller["phases"].items()} == {
            "generation": "fixed",
            "training": "fixed",
        }
        assert leader["last_observation"]["kind"] == "training"
        assert leader["last_observation"]["iteration"] == ITERATIONS - 1
        for sidecar in sidecars[1:]:
            assert sidecar.status()["job"]["controller"] is None
            assert sidecar.status()["job"]["last_step"] == {"edge": "end", "kind": "training", "iteration": 2}
        assert all(sidecar.status()["open_phases"] == [] for sidecar in sidecars)
        for sidecar in sidecars:
            sidecar.stop()
        for daemon in nodes:
            assert daemon.session_of("mn-job") is None
            assert daemon.locks() == [None, None]

    def test_a_killed_node_turns_job_control_off_and_the_others_go_on_at_default(
        self, nodes: list[SimEerld], start_sidecar: Callable[..., SidecarProcess], tmp_path: Path
    ) -> None:
        sidecars = start_nodes(nodes, start_sidecar, "mn-kill")
        hold = tmp_path / "go-on"
        env = {"ITERATIONS": str(ITERATIONS), "WORK_S": "0.05", "HOLD_AT": "1", "HOLD_FILE": str(hold)}
        jobs = [start_job(s.url, env=env) for s in sidecars]
        in_generation_1 = {"edge": "begin", "kind": "generation", "iteration": 1}
        # Mid-job, inside the generation phase of iteration 1: every node at the directive's clock.
        for sidecar in sidecars:
            wait_until(
                "every node's sidecar in the generation phase 1",
                lambda s=sidecar: s.status()["job"]["last_step"] == in_generation_1,  # type: ignore[misc]
            )
        for daemon in nodes:
            assert daemon.locks() == [JOB_CLOCKS["generation"]] * 2
        sidecars[2].kill()  # a non-leader node's sidecar: SIGKILL
        wait_until("the killed node's GPUs back at default", lambda: nodes[2].locks() == [None, None])
        hold.touch()
        survivors = [finish(job) for job in jobs[:2]]
        killed = finish(jobs[2])
        for calls in survivors:
            # Every call answered (within curl's 1 s), before and after job-level control went off.
            assert [c.code for c in calls] == [200] * 4 * ITERATIONS
            assert calls[-1].answer["connected"] is False
            assert calls[-1].answer["job"]["done"] is False
        assert [c.code for c in killed[5:]] == [0] * (4 * ITERATIONS - 5)  # no sidecar: curl's 000
        for sidecar, daemon in zip(sidecars[:2], nodes[:2], strict=True):
            job = sidecar.status()["job"]
            assert job["state"] == "off"
            assert job["enabled"] is False
            assert "side gloo group" in job["reason"]
            # One warning, and the node's session closed: its daemon put the GPUs back at default.
            assert sidecar.stderr().count("job-level control is off") == 1
            wait_until("the node's session closed", lambda d=daemon: d.session_of("mn-kill") is None)  # type: ignore[misc]
            assert daemon.locks() == [None, None]

    def test_with_a_command_each_sidecar_runs_its_nodes_part_of_the_job(self, nodes: list[SimEerld]) -> None:
        port = free_port()
        clocks = ",".join(f"{kind}={mhz}" for kind, mhz in JOB_CLOCKS.items())
        env = {**os.environ, "ITERATIONS": "2", "WORK_S": "0.05"}
        env.pop("EERL_SIDECAR", None)
        procs = [
            subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "eerl.sidecar.server",
                    *("--job-id", "mn-command", "--gpus", "0,1", "--listen", "127.0.0.1:0"),
                    *(
                        "--socket",
                        str(daemon.socket_path),
                        "--job-policy",
                        "fixed",
                        "--job-fixed-clocks",
                        clocks,
                    ),
                    *(
                        "--job-nodes",
                        "2",
                        "--node-rank",
                        str(rank),
                        "--rendezvous",
                        f"tcp://127.0.0.1:{port}",
                    ),
                    *("--", "bash", str(JOB_SH)),
                ],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for rank, daemon in enumerate(nodes[:2])
        ]
        for proc in procs:
            out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err  # the job's own status
            first, _, rest = out.partition("\n")
            assert first.startswith("eerl-sidecar: listening on http://127.0.0.1:")
            calls, finished = parse_job_output(rest)
            assert finished
            assert [c.code for c in calls] == [200] * 8  # EERL_SIDECAR was set for it
            assert "job-level control is on" in err
            assert "WARNING" not in err
        for daemon in nodes[:2]:
            assert daemon.session_of("mn-command") is None  # the job ended: the sessions closed
            assert daemon.locks() == [None, None]


class TestJobFlags:
    """Which node a sidecar is, from its flags or its launcher's environment; what it refuses."""

    def test_no_job_nodes_means_no_job_mode(self) -> None:
        assert job_world(None, None, None, {"WORLD_SIZE": "4", "RANK": "1"}) is None

    def test_flags_win_over_the_environment(self) -> None:
        env = {"WORLD_SIZE": "8", "RANK": "3", "MASTER_ADDR": "a", "MASTER_PORT": "29500"}
        assert job_world("2", 1, "tcp://b:7000", env) == JobWorld(2, 1, "tcp://b:7000")

    def test_slurm_gives_the_nodes_and_the_node_rank(self) -> None:
        env = {"SLURM_NNODES": "4", "SLURM_NODEID": "3", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
        world = job_world("auto", None, None, env)
        assert world == JobWorld(4, 3, "tcp://node0:29501")
        assert not world.leader

    def test_the_sidecars_meet_one_port_above_the_jobs_own(self) -> None:
        env = {"WORLD_SIZE": "2", "NODE_RANK": "0", "RANK": "1", "MASTER_ADDR": "::1", "MASTER_PORT": "1234"}
        world = job_world("auto", None, None, env)
        assert world == JobWorld(2, 0, "tcp://[::1]:1235")  # NODE_RANK before RANK
        assert world.leader

    @pytest.mark.parametrize(
        ("nodes", "rank", "rendezvous", "env", "names"),
        [
            ("auto", 0, "tcp://h:1", {}, "--job-nodes auto"),
            ("two", 0, "tcp://h:1", {}, "--job-nodes"),
            ("0", 0, "tcp://h:1", {}, "--job-nodes"),
            ("2", 2, "tcp://h:1", {}, "--node-rank"),
            ("2", None, "tcp://h:1", {}, "--node-rank"),
            ("2", 0, None, {"MASTER_ADDR": "h"}, "--rendezvous"),
            ("2", 0, "h:1", {}, "--rendezvous"),
            ("2", 0, "tcp://h:0", {}, "--rendezvous"),
            ("2", 0, None, {"MASTER_ADDR": "h", "MASTER_PORT": "x"}, "MASTER_PORT"),
        ],
    )
    def test_what_is_missing_or_wrong_is_named(
        self, nodes: str, rank: int | None, rendezvous: str | None, env: dict[str, str], names: str
    ) -> None:
        with pytest.raises(ConfigError, match=names):
            job_world(nodes, rank, rendezvous, env)

    def test_a_bad_job_flag_is_a_usage_error(self) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "eerl.sidecar.server", "--job-nodes", "2", "--node-rank", "5"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 2
        assert "--node-rank: 5 is not in 0..1" in done.stderr

    def test_job_mode_without_torch_is_a_usage_error_that_says_so(self) -> None:
        hide_torch = (
            "import sys; sys.modules['torch'] = None; from eerl.sidecar.server import main; "
            "sys.exit(main(['--job-nodes', '2', '--node-rank', '0', '--rendezvous', 'tcp://127.0.0.1:1']))"
        )
        done = subprocess.run(
            [sys.executable, "-c", hide_torch], capture_output=True, text=True, timeout=60, check=False
        )
        assert done.returncode == 2
        assert "job mode needs torch" in done.stderr
        assert "pip install" in done.stderr
