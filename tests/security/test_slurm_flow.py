"""A Slurm job end to end on a multi-tenant node: prolog grant, the job's own socket, epilog revoke.

Real processes throughout: the prolog and epilog scripts call the real eerlctl against a running eerld;
the job is a real process of the job's user that configures nothing (the client finds its grant by the
job id); a second user with the same job id in its environment is refused by the kernel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc

from eerld.testing import DaemonHandle, FakeGpuBackend, running_daemon
from tests.security.conftest import NOBODY_UID, NOGROUP_GID

REPO = Path(__file__).resolve().parents[2]
SLURM = REPO / "deploy" / "slurm"
JOB = Path(__file__).with_name("job_as_user.py")
JOB_UID = 4242
JOB_ID = "77"


@pytest.fixture
def node(reachable_dir: Path) -> Iterator[tuple[DaemonHandle, FakeGpuBackend]]:
    fake = FakeGpuBackend(2)
    with running_daemon(reachable_dir, backend=fake, tenancy="multi") as handle:
        yield handle, fake


def slurm(script: str, handle: DaemonHandle) -> subprocess.CompletedProcess[str]:
    env = {
        "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin",
        "EERLCTL": str(Path(sys.executable).parent / "eerlctl"),
        "EERLCTL_SOCKET": str(handle.admin_socket_path),
        "SLURM_JOB_ID": JOB_ID,
        "SLURM_JOB_UID": str(JOB_UID),
        "SLURM_JOB_GPUS": "1",
        "EERL_JOBS_DIR": str(handle.admin_socket_path.parent / "jobs"),
    }
    return subprocess.run(["bash", str(SLURM / script)], env=env, capture_output=True, text=True, check=False)


def start_job(run_dir: Path, uid: int, gid: int, wait_s: float = 10.0) -> subprocess.Popen[str]:
    env = {**os.environ, "SLURM_JOB_ID": JOB_ID, "EERL_RUN_DIR": str(run_dir)}
    env.pop("EERL_SOCKET", None)
    return subprocess.Popen(
        [sys.executable, str(JOB), str(uid), str(gid), str(wait_s)],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finish(job: subprocess.Popen[str]) -> dict[str, object]:
    out, _err = job.communicate("\n", timeout=60)
    return json.loads(out.strip().splitlines()[-1])


def test_the_jobs_user_gets_clock_control_of_its_gpus_and_nobody_else_does(
    node: tuple[DaemonHandle, FakeGpuBackend], reachable_dir: Path
) -> None:
    handle, fake = node
    prolog = slurm("prolog.sh", handle)
    socket = reachable_dir / "grants" / f"job-{JOB_ID}.sock"
    owner = socket.stat().st_uid
    job = start_job(reachable_dir, JOB_UID, JOB_UID)
    other = start_job(reachable_dir, NOBODY_UID, NOGROUP_GID, wait_s=2.0)
    try:
        assert job.stdout is not None
        assert other.stdout is not None
        connected = job.stdout.readline().strip()
        other_connected = other.stdout.readline().strip()
        in_phase = job.stdout.readline().strip()
        locked_in_phase = fake.locked()
        holders = [(s.job_id, s.gpu_indices, s.grant) for s in handle.daemon.reads.sessions()]
        stats = finish(job)
        finish(other)
    finally:
        for proc in (job, other):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    epilog = slurm("epilog.sh", handle)
    grants = [g.grant.name for g in handle.daemon.reads.grants()]
    assert (prolog.returncode, prolog.stderr) == (0, "")
    assert owner == JOB_UID
    assert (connected, in_phase) == ("connected", "in phase")
    assert locked_in_phase == {1: 1200}
    assert holders == [(JOB_ID, (1,), f"job-{JOB_ID}")]
    assert stats["opens"] == 1
    assert other_connected == "not connected"  # nobody may connect to job 77's socket
    assert (epilog.returncode, epilog.stderr) == (0, "")
    assert grants == ["shared"]
    assert not socket.exists()
    assert fake.locked() == {}


def test_the_prolog_and_epilog_reset_sessions_and_locks_but_never_an_operators_pin_or_drain(
    node: tuple[DaemonHandle, FakeGpuBackend], reachable_dir: Path
) -> None:
    """An operator's 10-minute pin on GPU 1 and drain of GPU 0 outlive the next job's prolog and epilog;
    the session a previous job left on GPU 1 is closed all the same (and the GPU goes back to the pin)."""
    handle, fake = node
    ctl = [str(Path(sys.executable).parent / "eerlctl"), "--socket", str(handle.admin_socket_path)]
    pin = [*ctl, "pin", "--gpus", "1", "--sm-mhz", "1005", "--for", "10m", "--reason", "maint"]
    assert subprocess.run(pin, capture_output=True, check=False).returncode == 0
    drain = [*ctl, "drain", "--gpus", "0", "--for", "10m", "--reason", "fan"]
    assert subprocess.run(drain, capture_output=True, check=False).returncode == 0
    assert slurm("prolog.sh", handle).returncode == 0
    with grpc.insecure_channel(f"unix:{reachable_dir / 'grants' / f'job-{JOB_ID}.sock'}") as channel:
        stub = pb_grpc.PhaseServiceStub(channel)
        left = stub.OpenSession(pb.OpenSessionRequest(job_id=JOB_ID, gpus=[pb.GpuRef(index=1)]), timeout=10)
    assert [s.session_id for s in handle.daemon.reads.sessions()] == [left.session_id]
    prolog = slurm("prolog.sh", handle)  # the next job on the same GPU
    after_prolog = [s.session_id for s in handle.daemon.reads.sessions()]
    locked_after_prolog = fake.locked()
    epilog = slurm("epilog.sh", handle)
    gpus = handle.daemon.reads.gpu_status()
    assert (prolog.returncode, prolog.stderr, epilog.returncode, epilog.stderr) == (0, "", 0, "")
    assert after_prolog == []
    assert locked_after_prolog == {1: 1005}
    assert gpus[1].pin is not None
    assert (gpus[1].pin.sm_clock_mhz, gpus[1].pin.reason) == (1005, "maint")
    assert gpus[0].drain is not None
    assert gpus[0].drain.reason == "fan"
    assert fake.locked() == {1: 1005}
