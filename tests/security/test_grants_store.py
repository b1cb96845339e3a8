"""The grants store attacked: what the daemon restores at start, and what it does when it cannot write.

``<state dir>/grants.json`` decides, at every start, which users get a socket that claims which GPUs: a
file eerld did not write must restore nothing. The attacks: a symlink at the store's path (to a grants file
elsewhere) or at its temp file's; a corrupt file (garbage, wrong types, absurd values: each once crashed a
start or restored a grant eerld would never have made); a file owned by another user or writable by one; a
full disk while a grant is written (a replace that revoked the old grant and made no new one). What must
hold: nothing is read or written through a symlink; a file eerld would not have written is set aside whole
with one ``grants_set_aside`` line and the daemon serves with no grant (fail closed); a write that fails is
a clear UNAVAILABLE that changes nothing (or is rolled back), and no grant is lost from memory.
Each runs a real daemon (in process) on real sockets; the users are real processes (``run_as``).
"""

from __future__ import annotations

import json
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
from eerl.v1 import eerl_pb2 as pb
from eerl.v1 import eerl_pb2_grpc as pb_grpc
from structlog.testing import capture_logs

from eerld.grants import GRANTS_FILE, MAX_GRANTS
from eerld.testing import DaemonHandle, FakeGpuBackend, running_daemon
from tests.security.conftest import NOBODY_UID, NOGROUP_GID, run_as
from tests.security.test_claims import VICTIM_UID, grant, holders, open_call
from tests.security.test_failsafes import fill, tmpfs

FAKE_UUID = "GPU-fake-{:04d}-0000-0000-000000000000"


def stored(name: str = "planted", gpu: int = 0, **fields: Any) -> dict[str, Any]:
    """One grant as eerld writes it: ``nobody`` may claim fake GPU ``gpu``."""
    item: dict[str, Any] = {
        "name": name,
        "gpu_uuids": [FAKE_UUID.format(gpu)],
        "uid": NOBODY_UID,
        "gid": None,
        "job_id": "",
        "created_at_unix_s": 1_700_000_000.0,
        "expires_at_unix_s": 0.0,
        "reason": "",
        "own_directory": False,
    }
    item.update(fields)
    return item


def grants_file(*items: dict[str, Any], version: object = 1) -> bytes:
    return json.dumps({"version": version, "grants": list(items)}).encode()


def state_dir(directory: Path) -> Path:
    state = directory / "state"
    state.mkdir(mode=0o700, exist_ok=True)
    return state


@contextmanager
def daemon(directory: Path, gpus: int = 4) -> Iterator[DaemonHandle]:
    with running_daemon(directory, backend=FakeGpuBackend(gpus), reaper=False, tenancy="multi") as handle:
        yield handle


def names(handle: DaemonHandle) -> list[str]:
    return [g.grant.name for g in handle.daemon.reads.grants()]


def set_aside_files(state: Path) -> list[Path]:
    return sorted(p for p in state.iterdir() if p.name.startswith(f"{GRANTS_FILE}.corrupt-"))


def grant_error(handle: DaemonHandle, name: str, gpus: list[int], **extra: Any) -> tuple[str, str]:
    """A Grant expected to fail: its status code and message."""
    try:
        grant(handle, name, gpus, VICTIM_UID, **extra)
    except grpc.RpcError as e:
        return e.code().name, e.details() or ""
    return "OK", ""


def revoke(handle: DaemonHandle, name: str) -> pb.RevokeResponse:
    with grpc.insecure_channel(f"unix:{handle.admin_socket_path}") as channel:
        reply: pb.RevokeResponse = pb_grpc.AdminServiceStub(channel).Revoke(
            pb.RevokeRequest(name=name), timeout=10
        )
        return reply


HUGE_DIGITS = (
    b'{"version": 1, "grants": [{"name": "planted", "gpu_uuids": ["x"], "uid": 1' + b"0" * 5000 + b"}]}"
)
CORRUPT: dict[str, bytes] = {
    "garbage": b"\x00\xffnot json at all",
    "not an object": b"[1, 2]",
    "grants not a list": b'{"version": 1, "grants": {"planted": 1}}',
    "a version eerld does not know": grants_file(stored(), version=2),
    "a grant that is a string": grants_file("planted"),  # type: ignore[arg-type]
    "uid a string": grants_file(stored(uid="65534")),
    "uid a boolean": grants_file(stored(uid=True)),
    "uid negative": grants_file(stored(uid=-1)),
    "uid past 2**32-2": grants_file(stored(uid=2**40)),
    "uid of 5000 digits": HUGE_DIGITS,
    "neither uid nor gid": grants_file(stored(uid=None)),
    "gpu_uuids empty": grants_file(stored(gpu_uuids=[])),
    "gpu_uuids of 100000": grants_file(stored(gpu_uuids=[f"GPU-{n}" for n in range(100_000)])),
    "a GPU twice": grants_file(stored(gpu_uuids=[FAKE_UUID.format(0)] * 2)),
    "an expiry before 1970": grants_file(stored(expires_at_unix_s=-5)),
    "a time of 10**400": grants_file(stored(created_at_unix_s=10**400)),
    "a time of Infinity": b'{"version": 1, "grants": [{"name": "planted", "gpu_uuids": ["x"], "uid": 1, '
    b'"expires_at_unix_s": Infinity}]}',
    "a name that is no grant name": grants_file(stored(name="../../etc/x")),
    "the shared socket's name": grants_file(stored(name="shared")),
    "a control character in the job id": grants_file(stored(job_id="a\nb")),
    "a reason of 1 MiB": grants_file(stored(reason="r" * (1 << 20))),
    "own_directory a string": grants_file(stored(own_directory="yes")),
    "two grants of one name": grants_file(stored(gpu=0), stored(gpu=1)),
    "two grants of one GPU": grants_file(stored("a", 0), stored("b", 0)),
    "more grants than a daemon holds": grants_file(
        *[stored(f"g{n}", gpu_uuids=[f"GPU-{n}"]) for n in range(MAX_GRANTS + 1)]
    ),
    "nested 100000 deep": b"[" * 100_000,
}


class TestAFileEerldDidNotWrite:
    @pytest.mark.parametrize("kind", sorted(CORRUPT))
    def test_is_set_aside_whole_with_one_line_and_the_daemon_serves_with_no_grant(
        self, reachable_dir: Path, kind: str
    ) -> None:
        state = state_dir(reachable_dir)
        (state / GRANTS_FILE).write_bytes(CORRUPT[kind])
        inode = (state / GRANTS_FILE).stat().st_ino
        with capture_logs() as logs, daemon(reachable_dir) as handle:
            restored = names(handle)
            fresh = grant(handle, "fresh", [1], NOBODY_UID)
            listed = names(handle)
        set_aside = set_aside_files(state)
        assert restored == ["shared"]
        assert [p.stat().st_ino for p in set_aside] == [inode]
        assert len([e for e in logs if e["event"] == "grants_set_aside"]) == 1
        assert fresh.grant.name == "fresh"
        assert listed == ["shared", "fresh"]

    @pytest.mark.parametrize("how", ["owned by nobody", "mode 0660", "mode 0666"])
    def test_one_another_user_owns_or_may_write_restores_nothing(self, reachable_dir: Path, how: str) -> None:
        """A well-formed file that grants ``nobody`` GPU 0, but one that ``nobody`` (or a group) could
        have written: what it says is not trusted."""
        state = state_dir(reachable_dir)
        path = state / GRANTS_FILE
        path.write_bytes(grants_file(stored()))
        if how == "owned by nobody":
            os.chown(path, NOBODY_UID, NOGROUP_GID)
        else:
            path.chmod(int(how.split()[1], 8))
        with capture_logs() as logs, daemon(reachable_dir) as handle:
            restored = names(handle)
        [event] = [e for e in logs if e["event"] == "grants_set_aside"]
        assert restored == ["shared"]
        assert str(path) in event["error"]
        assert len(set_aside_files(state)) == 1

    def test_a_well_formed_file_of_roots_is_restored(self, reachable_dir: Path) -> None:
        """The control: the same file, root's and 0600, restores the grant (its socket nobody's)."""
        state = state_dir(reachable_dir)
        (state / GRANTS_FILE).write_bytes(grants_file(stored()))
        (state / GRANTS_FILE).chmod(0o600)
        with daemon(reachable_dir) as handle:
            restored = names(handle)
        assert restored == ["shared", "planted"]


class TestSymlinks:
    def test_a_symlink_at_the_store_is_neither_read_nor_written_through(self, reachable_dir: Path) -> None:
        """The link points to a grants file elsewhere that grants ``nobody`` GPU 0: no grant is restored
        from it, the link is set aside, and the next write makes a file of eerld's own."""
        state = state_dir(reachable_dir)
        elsewhere = reachable_dir / "elsewhere.json"
        elsewhere.write_bytes(grants_file(stored()))
        (state / GRANTS_FILE).symlink_to(elsewhere)
        with capture_logs() as logs, daemon(reachable_dir) as handle:
            restored = names(handle)
            attacker = run_as(
                f"unix:{reachable_dir / 'grants' / 'planted.sock'}", [open_call(0, job_id="mallory")]
            )[0]
            grant(handle, "fresh", [1], VICTIM_UID)
        [moved] = set_aside_files(state)
        assert restored == ["shared"]
        assert attacker.code == "UNAVAILABLE"  # no such socket
        assert moved.is_symlink()
        assert len([e for e in logs if e["event"] == "grants_set_aside"]) == 1
        assert elsewhere.read_bytes() == grants_file(stored())
        assert not (state / GRANTS_FILE).is_symlink()
        assert [g["name"] for g in json.loads((state / GRANTS_FILE).read_text())["grants"]] == ["fresh"]

    def test_a_symlink_at_the_temp_files_path_refuses_the_grant_clearly_and_writes_nothing_through_it(
        self, reachable_dir: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """The temp file's name has a random part; were it known, a symlink there is not written through
        (``O_EXCL | O_NOFOLLOW``): the grant is refused and nothing changes."""
        target = reachable_dir / "precious"
        target.write_text("root's\n")
        with daemon(reachable_dir) as handle:
            grant(handle, "first", [0], VICTIM_UID)
            state = reachable_dir / "state"
            before = (state / GRANTS_FILE).read_bytes()
            monkeypatch.setattr(secrets, "token_hex", lambda n: "0" * (2 * n))
            (state / f".{GRANTS_FILE}.{os.getpid()}.{'0' * 12}.tmp").symlink_to(target)
            code, message = grant_error(handle, "second", [1])
            monkeypatch.undo()
            listed = names(handle)
            after = (state / GRANTS_FILE).read_bytes()
        assert code == "UNAVAILABLE"
        assert message.startswith(f"cannot record the grant in {state / GRANTS_FILE}: File exists")
        assert listed == ["shared", "first"]
        assert after == before
        assert target.read_text() == "root's\n"
        assert not (reachable_dir / "grants" / "second.sock").exists()


class TestAFullDisk:
    def test_a_grant_that_cannot_be_written_is_refused_clearly_changes_nothing_and_passes_once_space_returns(
        self, reachable_dir: Path
    ) -> None:
        with tmpfs(reachable_dir / "state") as state, daemon(reachable_dir) as handle:
            grant(handle, "victim", [0], VICTIM_UID)
            filler = fill(state)
            code, message = grant_error(handle, "second", [1])
            on_full_disk = (names(handle), sorted(p.name for p in state.iterdir()))
            second_socket = (reachable_dir / "grants" / "second.sock").exists()
            victim = run_as(
                f"unix:{reachable_dir / 'grants' / 'victim.sock'}",
                [open_call(job_id="v")],
                uid=VICTIM_UID,
                gid=VICTIM_UID,
            )[0]
            filler.unlink()
            again = grant(handle, "second", [1], VICTIM_UID)
            stored_names = [g["name"] for g in json.loads((state / GRANTS_FILE).read_text())["grants"]]
        assert (code, message) == (
            "UNAVAILABLE",
            f"cannot record the grant in {state / GRANTS_FILE}: No space left on device; nothing changed",
        )
        assert on_full_disk == (["shared", "victim"], ["filler", GRANTS_FILE])
        assert not second_socket
        assert victim.code == "OK"  # the daemon serves the others
        assert again.grant.name == "second"
        assert sorted(stored_names) == ["second", "victim"]

    def test_a_replace_on_a_nearly_full_disk_loses_no_grant(self, reachable_dir: Path) -> None:
        """The replace's new file is larger than the old one by a page: the disk has room for the removal
        alone. Before: the old grant was revoked (memory and disk) and the new one not made (INTERNAL).
        After: one write of both, which fails: UNAVAILABLE, the old grant whole, its session untouched."""
        with tmpfs(reachable_dir / "state") as state, daemon(reachable_dir, gpus=64) as handle:
            grant(handle, "victim", [0], VICTIM_UID)
            victim_socket = f"unix:{reachable_dir / 'grants' / 'victim.sock'}"
            opened = run_as(victim_socket, [open_call(job_id="v")], uid=VICTIM_UID, gid=VICTIM_UID)[0]
            filler = fill(state)
            size = filler.stat().st_size
            os.truncate(filler, size - (size % 4096 or 4096))  # one page free
            code, message = grant_error(handle, "big", list(range(64)), reason="r" * 1024, replace=True)
            listed = names(handle)
            held = holders(handle)
            stored_names = [g["name"] for g in json.loads((state / GRANTS_FILE).read_text())["grants"]]
        assert code == "UNAVAILABLE"
        assert "No space left on device; nothing changed" in message
        assert opened.code == "OK"
        assert listed == ["shared", "victim"]
        assert stored_names == ["victim"]
        assert held == {0: "v"}

    def test_a_revoke_on_a_full_disk_takes_effect_and_is_written_once_space_returns(
        self, reachable_dir: Path
    ) -> None:
        """Revoking is the safe direction: the socket closes at once even when the file cannot be written;
        the file catches up at the next tick with room (a restart before then would restore the grant:
        ``grants_write_failed`` says so)."""
        with tmpfs(reachable_dir / "state") as state, daemon(reachable_dir) as handle:
            grant(handle, "gone", [0], VICTIM_UID)
            grant(handle, "kept", [1], VICTIM_UID)
            filler = fill(state)
            with capture_logs() as logs:
                revoked = revoke(handle, "gone")
            on_full_disk = [g["name"] for g in json.loads((state / GRANTS_FILE).read_text())["grants"]]
            socket_gone = not (reachable_dir / "grants" / "gone.sock").exists()
            filler.unlink()
            handle.daemon.tick()
            after = [g["name"] for g in json.loads((state / GRANTS_FILE).read_text())["grants"]]
            listed = names(handle)
        assert list(revoked.revoked) == ["gone"]
        assert socket_gone
        assert sorted(on_full_disk) == ["gone", "kept"]
        assert len([e for e in logs if e["event"] == "grants_write_failed"]) == 1
        assert after == ["kept"]
        assert listed == ["shared", "kept"]


class TestAGrantWhoseSocketCannotOpen:
    def test_a_replace_that_fails_to_open_its_socket_puts_the_old_grant_back(
        self, reachable_dir: Path
    ) -> None:
        """A directory planted where the new grant's socket goes (eerld refuses it): the replace fails
        after the old grant's socket was closed. Before: the old grant was gone (memory and disk) and its
        session held GPU 0 with no grant. After: the old grant is back, on disk and serving."""
        with daemon(reachable_dir) as handle:
            grant(handle, "victim", [0], VICTIM_UID)
            victim_socket = f"unix:{reachable_dir / 'grants' / 'victim.sock'}"
            run_as(victim_socket, [open_call(job_id="v")], uid=VICTIM_UID, gid=VICTIM_UID)
            planted = reachable_dir / "grants" / "big"
            planted.mkdir(mode=0o777)
            code, _ = grant_error(handle, "big", [0], replace=True, own_directory=True)
            listed = names(handle)
            again = run_as(victim_socket, [open_call(1, job_id="v")], uid=VICTIM_UID, gid=VICTIM_UID)[0]
            stored_names = [
                g["name"] for g in json.loads((reachable_dir / "state" / GRANTS_FILE).read_text())["grants"]
            ]
            mode = stat.S_IMODE((reachable_dir / "grants" / "victim.sock").stat().st_mode)
        assert code == "FAILED_PRECONDITION"
        assert listed == ["shared", "victim"]
        assert stored_names == ["victim"]
        assert again.code == "PERMISSION_DENIED"  # its socket serves again (GPU 1 is not its)
        assert "it may claim GPU(s) 0" in again.details
        assert mode == 0o600
