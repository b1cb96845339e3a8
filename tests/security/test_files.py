"""Files of a root daemon (issue 15, item 6): no path another user controls is trusted or followed.

The attacks: a state directory owned by another user or writable by all (that user erases the ledger or
plants a pins.json applied at the next start); a world-writable, non-sticky socket directory (the socket is
swapped for a symlink, and the root daemon chmods or chowns a file of the attacker's choice); a config file
another user owns or may write (it names the admin socket's group). What must hold: each is refused with
exit code 2 and one ``Error: ...`` line by a real ``eerld`` process; chmod and chown never follow a
symlink; a temp file is created exclusively, never through a symlink, and never left behind.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from eerld import files
from eerld.errors import ConfigError
from tests.security.conftest import NOBODY_UID, NOGROUP_GID, socket_group_gid
from tests.security.test_failsafes import fill, tmpfs

REPO = Path(__file__).resolve().parents[2]


def eerld(*args: str, timeout_s: float = 30.0) -> subprocess.CompletedProcess[str]:
    """A real ``eerld`` on the sim backend; one that serves instead of refusing is killed (and fails)."""
    argv = [
        sys.executable,
        "-m",
        "eerld.main",
        "--backend=sim",
        "--sim-gpus=1",
        "--metrics-address=off",
        *args,
    ]
    try:
        return subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"eerld started serving instead of refusing: {e.stderr!r}") from None


def assert_refused(done: subprocess.CompletedProcess[str], *names: str) -> None:
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("Error: ")
    assert done.stderr.count("\n") == 1, done.stderr
    for name in names:
        assert name in done.stderr


def daemon_args(base: Path, state: Path | None = None, sockets: Path | None = None) -> list[str]:
    sockets = sockets if sockets is not None else base
    return [
        f"--socket={sockets / 'w.sock'}",
        f"--admin-socket={sockets / 'a.sock'}",
        f"--state-dir={state if state is not None else base / 'state'}",
    ]


@pytest.fixture
def root_file(sock_dir: Path) -> Path:
    """A file only root may change (what an attacker would like the daemon to chmod or chown)."""
    target = sock_dir / "precious"
    target.write_text("root's\n")
    target.chmod(0o644)
    return target


# -- the state directory ------------------------------------------------------------------------------------


class TestStateDirectory:
    def test_a_state_directory_owned_by_another_user_is_refused(self, sock_dir: Path) -> None:
        state = sock_dir / "state"
        state.mkdir(mode=0o700)
        os.chown(state, NOBODY_UID, NOGROUP_GID)
        assert_refused(eerld(*daemon_args(sock_dir, state)), str(state), "owned by")

    def test_a_world_writable_state_directory_is_refused(self, sock_dir: Path) -> None:
        state = sock_dir / "state"
        state.mkdir()
        state.chmod(0o777)
        assert_refused(eerld(*daemon_args(sock_dir, state)), str(state), "writable")

    def test_a_state_directory_under_a_directory_others_may_write_is_refused(self, sock_dir: Path) -> None:
        parent = sock_dir / "open"
        parent.mkdir()
        parent.chmod(0o777)  # not sticky: anyone may rename the state directory away and plant another
        state = parent / "state"
        state.mkdir(mode=0o700)
        assert_refused(eerld(*daemon_args(sock_dir, state)), str(parent))

    def test_a_symlink_as_the_state_directory_is_refused(self, sock_dir: Path) -> None:
        real = sock_dir / "real"
        real.mkdir(mode=0o700)
        link = sock_dir / "state"
        link.symlink_to(real)
        assert_refused(eerld(*daemon_args(sock_dir, link)), "symlink")

    def test_reset_clocks_resets_the_gpus_but_leaves_an_untrusted_state_directory_alone(
        self, sock_dir: Path
    ) -> None:
        state = sock_dir / "state"
        state.mkdir(mode=0o700)
        os.chown(state, NOBODY_UID, NOGROUP_GID)
        done = eerld(f"--sim-state={sock_dir / 'sim.state'}", *daemon_args(sock_dir, state), "--reset-clocks")
        assert done.returncode == 2, done.stderr
        errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
        assert len(errors) == 1
        assert str(state) in errors[0]
        assert "owned by" in errors[0]
        assert list(state.iterdir()) == []

    def test_ensure_private_dir_creates_a_missing_directory_mode_0700(self, sock_dir: Path) -> None:
        path = sock_dir / "a" / "b" / "state"
        files.ensure_private_dir(path, "--state-dir")
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.parent.stat().st_mode) & 0o022 == 0

    @pytest.mark.parametrize("mode", [0o770, 0o707, 0o720, 0o702])
    def test_check_private_dir_refuses_any_group_or_other_write_bit(self, sock_dir: Path, mode: int) -> None:
        sock_dir.chmod(mode)
        with pytest.raises(ConfigError, match="writable"):
            files.check_private_dir(sock_dir, "--state-dir")

    def test_check_private_dir_accepts_the_daemons_own_directory_under_a_sticky_tmp(
        self, sock_dir: Path
    ) -> None:
        files.check_private_dir(sock_dir, "--state-dir")  # /tmp is 1777 and root's


# -- the socket directory ----------------------------------------------------------------------


class TestSocketDirectory:
    def test_a_world_writable_non_sticky_socket_directory_is_refused_by_the_daemon(
        self, sock_dir: Path
    ) -> None:
        """Needs server.py to call files.ensure_socket_dir (or check_socket_dir) before it binds."""
        sockets = sock_dir / "run"
        sockets.mkdir()
        sockets.chmod(0o777)
        assert_refused(eerld(*daemon_args(sock_dir, sockets=sockets)), str(sockets), "writable")

    def test_check_socket_dir_refuses_a_world_writable_non_sticky_directory(self, sock_dir: Path) -> None:
        sock_dir.chmod(0o777)
        with pytest.raises(ConfigError, match="writable"):
            files.check_socket_dir(sock_dir, "--socket")

    def test_check_socket_dir_refuses_a_directory_owned_by_another_user(self, sock_dir: Path) -> None:
        os.chown(sock_dir, NOBODY_UID, NOGROUP_GID)
        with pytest.raises(ConfigError, match="owned by"):
            files.check_socket_dir(sock_dir, "--socket")

    def test_check_socket_dir_refuses_a_symlink(self, sock_dir: Path) -> None:
        link = sock_dir / "run"
        link.symlink_to(sock_dir)
        with pytest.raises(ConfigError, match="symlink"):
            files.check_socket_dir(link, "--socket")

    @pytest.mark.parametrize("mode", [0o755, 0o700, 0o1777])
    def test_check_socket_dir_accepts_a_root_directory_others_cannot_write_or_a_sticky_one(
        self, sock_dir: Path, mode: int
    ) -> None:
        sock_dir.chmod(mode)
        files.check_socket_dir(sock_dir, "--socket")


class TestSecureSocket:
    @staticmethod
    def bound_socket(path: Path) -> socket.socket:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(str(path))
        return server

    def test_a_socket_swapped_for_a_symlink_is_refused_and_its_target_is_untouched(
        self, sock_dir: Path, root_file: Path
    ) -> None:
        path = sock_dir / "eerld.sock"
        with self.bound_socket(path):
            path.unlink()
            path.symlink_to(root_file)  # the swap, between the daemon's bind and its chmod/chown
            before = root_file.stat()
            with pytest.raises(ConfigError, match="not a socket"):
                files.secure_socket(path, 0o666, gid=NOGROUP_GID)
            after = root_file.stat()
        assert (stat.S_IMODE(after.st_mode), after.st_uid, after.st_gid) == (
            stat.S_IMODE(before.st_mode),
            before.st_uid,
            before.st_gid,
        )

    def test_a_socket_gets_its_mode_and_group(self, sock_dir: Path) -> None:
        path = sock_dir / "eerld.sock"
        with self.bound_socket(path):
            files.secure_socket(path, 0o660, gid=socket_group_gid())
            st = path.lstat()
        assert stat.S_ISSOCK(st.st_mode)
        assert stat.S_IMODE(st.st_mode) == 0o660
        assert st.st_gid == socket_group_gid()

    def test_a_regular_file_at_the_socket_path_is_refused(self, sock_dir: Path, root_file: Path) -> None:
        with pytest.raises(ConfigError, match="not a socket"):
            files.secure_socket(root_file, 0o666)
        assert stat.S_IMODE(root_file.stat().st_mode) == 0o644


# -- the config file ---------------------------------------------------------------------------


class TestConfigFile:
    @staticmethod
    def config(sock_dir: Path, mode: int = 0o644) -> Path:
        path = sock_dir / "eerld.toml"
        path.write_text('admin_group = "daemon"\n')
        path.chmod(mode)
        return path

    def test_a_config_file_owned_by_another_user_is_refused(self, sock_dir: Path) -> None:
        path = self.config(sock_dir)
        os.chown(path, NOBODY_UID, NOGROUP_GID)
        assert_refused(eerld(f"--config={path}", *daemon_args(sock_dir)), str(path), "owned by")

    def test_a_config_file_anyone_may_write_is_refused(self, sock_dir: Path) -> None:
        path = self.config(sock_dir, 0o666)
        assert_refused(eerld(f"--config={path}", *daemon_args(sock_dir)), str(path), "writable")

    def test_a_symlink_to_a_config_file_another_user_owns_is_refused(self, sock_dir: Path) -> None:
        target = self.config(sock_dir)
        os.chown(target, NOBODY_UID, NOGROUP_GID)
        link = sock_dir / "link.toml"
        link.symlink_to(target)
        assert_refused(eerld(f"--config={link}", *daemon_args(sock_dir)), "owned by")

    def test_a_config_file_in_a_directory_others_may_write_is_refused(self, sock_dir: Path) -> None:
        parent = sock_dir / "etc"
        parent.mkdir()
        path = self.config(parent)
        parent.chmod(0o777)
        assert_refused(eerld(f"--config={path}", *daemon_args(sock_dir)), str(parent), "writable")

    @pytest.mark.parametrize(
        ("line", "named"),
        [
            ('state_dir = "a\\u0000b"', "--state-dir"),
            ("lease_ttl_s = [2]", "--lease-ttl"),
            ("socket = 5", "--socket"),
        ],
    )
    def test_a_config_value_of_the_wrong_type_is_one_error_line_naming_it(
        self, sock_dir: Path, line: str, named: str
    ) -> None:
        path = sock_dir / "eerld.toml"
        path.write_text(line + "\n")
        path.chmod(0o644)
        assert_refused(eerld(f"--config={path}", "--reset-clocks"), named)

    def test_a_directory_as_the_sim_state_file_is_one_error_line(self, sock_dir: Path) -> None:
        assert_refused(eerld(f"--sim-state={sock_dir}", *daemon_args(sock_dir)), "--sim-state", str(sock_dir))

    def test_a_root_config_file_mode_0644_is_read(self, sock_dir: Path) -> None:
        path = self.config(sock_dir)
        assert files.check_config_file(path) == path.read_bytes()


# -- state files -------------------------------------------------------------------------------


class TestAtomicWrites:
    def test_a_write_that_fails_on_a_full_disk_leaves_no_temp_file_and_the_old_file_whole(
        self, sock_dir: Path
    ) -> None:
        with tmpfs(sock_dir / "full") as directory:
            path = directory / "ledger.json"
            files.atomic_write_json(path, {"locked": []})
            old = path.read_bytes()
            fill(directory)
            with pytest.raises(OSError):
                files.atomic_write_json(path, {"locked": [{"index": i} for i in range(500)]})
            assert sorted(p.name for p in directory.iterdir()) == ["filler", "ledger.json"]
            assert path.read_bytes() == old

    def test_a_write_replaces_a_symlink_at_the_path_instead_of_writing_through_it(
        self, sock_dir: Path, root_file: Path
    ) -> None:
        path = sock_dir / "ledger.json"
        path.symlink_to(root_file)
        files.atomic_write_json(path, {"locked": []})
        assert root_file.read_text() == "root's\n"
        assert not path.is_symlink()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600

    def test_a_state_file_that_is_a_symlink_is_not_read(self, sock_dir: Path, root_file: Path) -> None:
        path = sock_dir / "pins.json"
        path.symlink_to(root_file)
        with pytest.raises(ConfigError, match="symlink"):
            files.read_json_object(path)

    def test_a_corrupt_file_is_set_aside_under_a_name_with_the_time(self, sock_dir: Path) -> None:
        path = sock_dir / "ledger.json"
        path.write_bytes(b"not json")
        moved = files.set_aside(path, now_unix_s=1_700_000_000.5)
        assert moved.name == "ledger.json.corrupt-1700000000"
        assert moved.read_bytes() == b"not json"
        assert not path.exists()
        path.write_bytes(b"again")
        assert files.set_aside(path, now_unix_s=1_700_000_000.9).name == "ledger.json.corrupt-1700000000-1"
