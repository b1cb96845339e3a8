"""Fail-safes that must not depend on the thing that failed (issue 15, item 3).

The attacks: a ledger an editor, a bug or a full disk left unreadable or of the wrong shape; a disk that is
full when a lock is taken or released; a clock lock set behind the daemon's back (another tool, a reset
that failed silently); an admin pin file with a clock no GPU supports. What must hold: ``--reset-clocks``
and a daemon start reset every GPU whatever the ledger says and set a corrupt ledger aside; a lock holds
only once its ledger record is durable; a release frees the claim and resets the GPU even when the ledger
cannot be written; every fail-safe path resets the hardware, not what the daemon believes of it; a bad pin
read at start is dropped with one warning.

Real processes wherever the issue is about a process (``python -m eerld.main``, the sim backend's locks in
its shared state file); a real full filesystem (a 64 KiB tmpfs) for the full disk.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc
from eerl_sim.gpu import SimBackend, create_sim_backend, open_sim_device
from eerl_sim.profiles import builtin_profile

from eerld.clocks.ledger import LEDGER_FILE
from eerld.clocks.pins import PINS_FILE
from eerld.errors import NoPermission
from eerld.testing import FakeGpuBackend, ManualClock, running_daemon
from soak.daemon import DaemonProcess

GEN = pb.PHASE_KIND_GENERATION
GPUS = 3
CORRUPT_LEDGERS = {
    "null list": b'{"locked": null}',
    "not json": b"not json",
    "string index": b'{"locked": [{"index": "x"}]}',
}


# -- helpers --------------------------------------------------------------------------------------------


def sim_backend(daemon: DaemonProcess) -> SimBackend:
    """The daemon's simulated GPUs, opened as the daemon opens them (same profile, count, speed-up)."""
    return create_sim_backend(
        builtin_profile("h100-sxm"), daemon.gpus, speedup=10, state_file=daemon.state_file
    )


def leave_gpus_locked(daemon: DaemonProcess) -> None:
    """What a dead daemon or another tool leaves: an SM lock, application clocks, a memory lock."""
    backend = sim_backend(daemon)
    mem = backend.device.profile.mem_clock_mhz
    backend.lock_sm_clock(0, 1200)
    backend.set_application_clocks(1, mem, 1200)
    backend.lock_mem_clock(2, mem)
    backend.lock_sm_clock(2, 1500)
    backend.close()


def clock_settings(daemon: DaemonProcess) -> dict[int, tuple[int | None, int | None, int | None]]:
    """Per GPU, every clock setting left on the simulated GPUs: SM lock, application clock, memory lock."""
    device = open_sim_device(daemon.state_file)
    return {
        i: (g.sm_lock_mhz, g.app_sm_clock_mhz, g.mem_lock_mhz)
        for i in range(daemon.gpus)
        for g in [device.observe(i)]
    }


AT_DEFAULT = dict.fromkeys(range(GPUS), (None, None, None))


def write_ledger(daemon: DaemonProcess, content: bytes) -> Path:
    daemon.state_dir.mkdir(mode=0o700, exist_ok=True)
    path = daemon.state_dir / LEDGER_FILE
    path.write_bytes(content)
    return path


def set_aside(daemon: DaemonProcess) -> list[Path]:
    return sorted(daemon.state_dir.glob(f"{LEDGER_FILE}.corrupt-*"))


def ledger_on_disk(daemon: DaemonProcess) -> list[int]:
    """The GPUs the ledger on disk lists, read as JSON (a corrupt one fails the test here)."""
    path = daemon.state_dir / LEDGER_FILE
    if not path.exists():
        return []
    return sorted(e["index"] for e in json.loads(path.read_text())["locked"])


def lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line]


# -- --reset-clocks and a start whatever the ledger says -----------------------------------------------------


class TestResetClocksWhateverTheLedgerSays:
    @pytest.mark.parametrize("content", CORRUPT_LEDGERS.values(), ids=CORRUPT_LEDGERS.keys())
    def test_reset_clocks_resets_every_gpu_sets_a_corrupt_ledger_aside_and_exits_zero(
        self, sock_dir: Path, content: bytes
    ) -> None:
        daemon = DaemonProcess(sock_dir, gpus=GPUS)
        leave_gpus_locked(daemon)
        write_ledger(daemon, content)
        done = daemon.reset_clocks()
        assert done.returncode == 0, done.stderr
        assert clock_settings(daemon) == AT_DEFAULT
        [moved] = set_aside(daemon)
        assert moved.read_bytes() == content
        assert len(lines_with(done.stderr, "ledger_set_aside")) == 1
        assert ledger_on_disk(daemon) == []
        daemon.start()
        try:
            assert len(daemon.status().gpus) == GPUS
        finally:
            assert daemon.stop() == 0

    def test_reset_clocks_names_each_gpu_it_could_not_reset_exits_one_and_keeps_it_listed(
        self, sock_dir: Path
    ) -> None:
        daemon = DaemonProcess(sock_dir, gpus=GPUS)
        leave_gpus_locked(daemon)
        write_ledger(daemon, CORRUPT_LEDGERS["null list"])
        backend = sim_backend(daemon)
        backend.inject_fault(1, "reset_application_clocks", NoPermission, once=False)
        backend.close()
        done = daemon.reset_clocks()
        assert done.returncode == 1
        errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
        assert len(errors) == 1
        assert errors[0].startswith("Error: GPU 1 ")
        assert "NoPermission" in errors[0]
        settings = clock_settings(daemon)
        assert settings[0] == settings[2] == (None, None, None)
        assert ledger_on_disk(daemon) == [1]

    @pytest.mark.parametrize("content", CORRUPT_LEDGERS.values(), ids=CORRUPT_LEDGERS.keys())
    def test_a_daemon_starting_on_a_corrupt_ledger_serves_resets_every_gpu_and_sets_the_ledger_aside(
        self, sock_dir: Path, content: bytes
    ) -> None:
        daemon = DaemonProcess(sock_dir, gpus=GPUS)
        leave_gpus_locked(daemon)
        write_ledger(daemon, content)
        daemon.start()
        try:
            assert clock_settings(daemon) == AT_DEFAULT
            assert all(not g.degraded_reason for g in daemon.status().gpus)
            [moved] = set_aside(daemon)
            assert moved.read_bytes() == content
            assert ledger_on_disk(daemon) == []
        finally:
            assert daemon.stop() == 0
        log = daemon.log_path.read_text(errors="replace")
        assert len(lines_with(log, "ledger_set_aside")) == 1


# -- a full disk ------------------------------------------------------------------------------------------


@contextlib.contextmanager
def tmpfs(path: Path, size: str = "64k") -> Iterator[Path]:
    """A real, small filesystem at ``path`` (mode 0700, as a state directory must be); unmounted on exit."""
    path.mkdir(mode=0o700, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def fill(directory: Path) -> Path:
    """Write a file until the filesystem is full; return it (delete it to free the space)."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        while True:
            try:
                os.write(fd, b"\0" * 4096)
            except OSError as e:
                if e.errno != errno.ENOSPC:
                    raise
                break
        while True:  # the last partial block too
            try:
                os.write(fd, b"\0")
            except OSError:
                break
    finally:
        os.close(fd)
    return filler


def leftovers(directory: Path) -> list[str]:
    """Anything in the state directory but the filler, the ledger and the pins."""
    return sorted(p.name for p in directory.iterdir() if p.name not in {"filler", LEDGER_FILE, PINS_FILE})


def ledger_indices(path: Path) -> list[int]:
    if not path.exists():
        return []
    return sorted(e["index"] for e in json.loads(path.read_text())["locked"])


@contextlib.contextmanager
def daemon_on_full_disk(sock_dir: Path) -> Iterator[tuple[Any, FakeGpuBackend, ManualClock, Path]]:
    clock = ManualClock()
    fake = FakeGpuBackend(2, clock=clock)
    with (
        tmpfs(sock_dir / "state") as state,
        running_daemon(sock_dir, backend=fake, clock=clock, reaper=False, state_dir=state) as handle,
    ):
        yield handle, fake, clock, state


def open_on(stub: pb_grpc.PhaseServiceStub, gpu: int) -> str:
    request = pb.OpenSessionRequest(job_id=f"j{gpu}", gpus=[pb.GpuRef(index=gpu)])
    session_id: str = stub.OpenSession(request, timeout=10).session_id
    return session_id


def codes(fn: Any) -> str:
    try:
        fn()
    except grpc.RpcError as e:
        return str(e.code().name)
    return "OK"


class TestFullDisk:
    def test_a_lock_whose_ledger_record_cannot_be_written_is_not_taken_not_even_on_a_retry(
        self, sock_dir: Path
    ) -> None:
        with (
            daemon_on_full_disk(sock_dir) as (handle, fake, clock, state),
            grpc.insecure_channel(f"unix:{handle.socket_path}") as channel,
        ):
            fill(state)
            stub = pb_grpc.PhaseServiceStub(channel)
            session_id = open_on(stub, 0)
            for iteration in range(2):
                begin = pb.BeginPhaseRequest(session_id=session_id, kind=GEN, iteration=iteration)
                began = stub.BeginPhase(begin, timeout=10)
                assert fake.locked() == {}
                assert "ledger" in began.clocks[0].degraded_reason
                workload = pb.Workload(tokens=10, valid_tokens=5, sequences=1)
                end = pb.EndPhaseRequest(
                    session_id=session_id, kind=GEN, iteration=iteration, workload=workload
                )
                stub.EndPhase(end, timeout=10)
            clock.advance(120.0)
            handle.daemon.tick()  # the degraded GPU's retry: still no record, so still no lock
            assert fake.locked() == {}
            assert ledger_indices(state / LEDGER_FILE) == []
            assert leftovers(state) == []

    def test_a_close_with_the_disk_full_resets_the_gpu_frees_the_claim_and_unlists_it_once_space_returns(
        self, sock_dir: Path
    ) -> None:
        with (
            daemon_on_full_disk(sock_dir) as (handle, fake, _clock, state),
            grpc.insecure_channel(f"unix:{handle.socket_path}") as channel,
        ):
            stub = pb_grpc.PhaseServiceStub(channel)
            session_id = open_on(stub, 0)
            stub.BeginPhase(pb.BeginPhaseRequest(session_id=session_id, kind=GEN), timeout=10)
            assert fake.locked() == {0: 1200}
            filler = fill(state)
            close = pb.CloseSessionRequest(session_id=session_id)
            assert codes(lambda: stub.CloseSession(close, timeout=10)) == "OK"
            assert fake.locked() == {}
            assert ledger_indices(state / LEDGER_FILE) == [0]  # still listed: the safe direction
            assert codes(lambda: open_on(stub, 0)) == "OK"  # the claim was freed
            assert leftovers(state) == []
            filler.unlink()
            handle.daemon.tick()
            assert ledger_indices(state / LEDGER_FILE) == []


# -- orphan locks -----------------------------------------------------------------------------------------


class TestOrphanLocks:
    """A lock set behind the daemon's back is invisible to its view; the fail-safe paths reset the GPU."""

    def test_reset_all_over_the_admin_socket_resets_a_gpu_the_daemon_believes_unlocked(
        self, sock_dir: Path
    ) -> None:
        fake = FakeGpuBackend(4, clock=ManualClock())
        with running_daemon(sock_dir, backend=fake, reaper=False) as handle:
            fake.force_lock(1, 1200)
            with grpc.insecure_channel(f"unix:{handle.admin_socket_path}") as channel:
                pb_grpc.AdminServiceStub(channel).ResetAll(
                    pb.ResetAllRequest(all=True, reason="t"), timeout=10
                )
            assert fake.locked() == {}

    def test_shutdown_resets_a_gpu_the_daemon_believes_unlocked(self, sock_dir: Path) -> None:
        fake = FakeGpuBackend(4, clock=ManualClock())
        with running_daemon(sock_dir, backend=fake, reaper=False):
            fake.force_lock(2, 1200)
        assert fake.locked() == {}

    def test_a_session_close_resets_its_gpu_even_when_the_daemon_never_locked_it(
        self, sock_dir: Path
    ) -> None:
        fake = FakeGpuBackend(4, clock=ManualClock())
        with (
            running_daemon(sock_dir, backend=fake, reaper=False) as handle,
            grpc.insecure_channel(f"unix:{handle.socket_path}") as channel,
        ):
            stub = pb_grpc.PhaseServiceStub(channel)
            session_id = open_on(stub, 3)
            fake.force_lock(3, 1500)
            stub.CloseSession(pb.CloseSessionRequest(session_id=session_id), timeout=10)
            assert fake.locked() == {}


# -- pins read at start ------------------------------------------------------------------------------------


def pin_entry(uuid: str, **fields: Any) -> dict[str, Any]:
    entry = {
        "uuid": uuid,
        "sm_clock_mhz": 900,
        "mem_clock_mhz": 0,
        "reason": "kept",
        "created_at_unix_s": 1.0,
        "expires_at_unix_s": 0.0,
    }
    entry.update(fields)
    return entry


class TestPinsReadAtStart:
    def test_a_pin_file_with_bad_pins_is_read_like_an_rpc_each_bad_pin_dropped_with_one_warning(
        self, sock_dir: Path
    ) -> None:
        fake = FakeGpuBackend(4, clock=ManualClock())
        uuids = [g.uuid for g in fake.inventory()]
        state = sock_dir / "state"
        state.mkdir(mode=0o700)
        pins = [
            pin_entry(uuids[0]),  # the one good pin
            pin_entry(uuids[1], sm_clock_mhz=1201),  # not a supported clock
            pin_entry("GPU-not-on-this-node"),
            pin_entry(uuids[2], sm_clock_mhz="fast"),
            pin_entry(uuids[3], sm_clock_mhz=10**9),
            5,
        ]
        (state / PINS_FILE).write_text(json.dumps({"version": 1, "pins": pins}))
        with (
            structlog.testing.capture_logs() as logs,
            running_daemon(sock_dir, backend=fake, reaper=False) as handle,
        ):
            status = handle.daemon.reads.gpu_status()
            assert fake.locked() == {0: 900}
        assert [g.pin is not None for g in status] == [True, False, False, False]
        assert all(not g.degraded_reason for g in status)
        dropped = [e for e in logs if e["event"] == "pin_dropped"]
        assert len(dropped) == 5
        assert all(PINS_FILE in str(e) for e in dropped)

    @pytest.mark.parametrize("content", [b'{"pins": null}', b"[1, 2]", b'{"pins": [', b'{"pins": {"a": 1}}'])
    def test_a_pin_file_of_the_wrong_shape_does_not_stop_the_daemon_and_is_set_aside(
        self, sock_dir: Path, content: bytes
    ) -> None:
        fake = FakeGpuBackend(2, clock=ManualClock())
        state = sock_dir / "state"
        state.mkdir(mode=0o700)
        (state / PINS_FILE).write_bytes(content)
        with running_daemon(sock_dir, backend=fake, reaper=False) as handle:
            assert all(g.pin is None for g in handle.daemon.reads.gpu_status())
        [moved] = state.glob(f"{PINS_FILE}.corrupt-*")
        assert moved.read_bytes() == content

    def test_a_pin_of_a_clock_the_gpu_does_not_support_is_dropped_at_start_not_retried_forever(
        self, sock_dir: Path
    ) -> None:
        fake = FakeGpuBackend(2, clock=ManualClock())
        state = sock_dir / "state"
        state.mkdir(mode=0o700)
        pins = [pin_entry(fake.inventory()[1].uuid, sm_clock_mhz=1201)]
        (state / PINS_FILE).write_text(json.dumps({"version": 1, "pins": pins}))
        with running_daemon(sock_dir, backend=fake, reaper=False) as handle:
            gpu = handle.daemon.reads.gpu_status()[1]
        assert gpu.pin is None
        assert gpu.degraded_reason == ""
        assert json.loads((state / PINS_FILE).read_text())["pins"] == []
