"""Checks and safe operations on the paths a root daemon trusts: its state, its sockets, its config.

eerld runs as root, so every path it reads decisions from or changes modes on must be one that no other
user controls. The rules, each refused with :class:`~eerld.errors.ConfigError` naming the flag and the path:

- **Trusted owner**: root or the daemon's own effective uid (``uid`` arguments; default ``os.geteuid()``).
- **Directories above** (the real path, symlinks resolved, up to ``/``): a trusted owner, and not writable by
  group or others unless sticky (``/tmp``: others may create there but not rename or remove what is ours).
  A directory another user may write lets that user rename ours away and plant another.
- **State directory** (:func:`check_private_dir`, :func:`ensure_private_dir`): not a symlink, a trusted
  owner, not writable by group or others (created 0700). It holds the ledger and the pins.
- **Socket directory** (:func:`check_socket_dir`, :func:`ensure_socket_dir`): not a symlink, a trusted
  owner, not writable by group or others unless sticky (then nobody else can remove or swap our socket).
- **Sockets** (:func:`secure_socket`): chmod and chown go through an ``O_PATH | O_NOFOLLOW`` descriptor of
  the path (``/proc/self/fd/N``), so a symlink swapped in is never followed; the path must still be the
  socket the daemon bound (a socket owned by the daemon) before and after.
- **Config file** (:func:`check_config_file`): opened (a symlink to it is followed), then the opened file
  must be a regular file of a trusted owner, not writable by group or others, in directories that pass
  the rule above; its bytes are read from that same descriptor, so nothing can be swapped in between.
- **State files** (:func:`read_json_object`, :func:`atomic_write_bytes`): read with ``O_NOFOLLOW`` (with
  ``private``, refused unless owned by a trusted owner and not writable by group or others); written
  to a temp file created ``O_EXCL | O_NOFOLLOW`` mode 0600 in the same directory, fsynced, renamed over the
  file, the directory fsynced; the temp file is removed on any failure (a full disk leaves nothing behind).
  A corrupt file is moved out of the way by :func:`set_aside` (``<name>.corrupt-<unix time>``).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import secrets
import socket
import stat
import time
from pathlib import Path
from typing import Any

from eerld.errors import ConfigError

PRIVATE_DIR_MODE = 0o700
PUBLIC_DIR_MODE = 0o755
STATE_FILE_MODE = 0o600
_GROUP_OR_OTHER_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _trusted(uid: int | None) -> frozenset[int]:
    return frozenset({0, os.geteuid() if uid is None else uid})


def _owner_problem(st: os.stat_result, trusted: frozenset[int]) -> str:
    if st.st_uid in trusted:
        return ""
    names = " or ".join(("root" if u == 0 else f"uid {u}") for u in sorted(trusted))
    return f"is owned by uid {st.st_uid}, not {names}"


def _check_chain(directory: Path, flag: str, trusted: frozenset[int], what: Path) -> None:
    """``directory`` (its real location) and every directory above it: a trusted owner, and writable by
    group or others only if sticky; ``what`` is the path the check is for, named in the message."""
    real = Path(os.path.realpath(directory))
    for parent in (real, *real.parents):
        try:
            st = os.stat(parent)
        except OSError as e:
            raise ConfigError(f"{flag}: cannot check {parent}: {e.strerror}") from None
        problem = _owner_problem(st, trusted)
        if problem:
            raise ConfigError(f"{flag}: {parent} (above {what}) {problem}; refusing it")
        if st.st_mode & _GROUP_OR_OTHER_WRITE and not st.st_mode & stat.S_ISVTX:
            raise ConfigError(
                f"{flag}: {parent} (above {what}) is writable by group or others and not sticky; refusing it"
            )


def _check_parents(path: Path, flag: str, trusted: frozenset[int]) -> None:
    """Every directory above ``path``, which is not itself resolved (it may be missing or a symlink)."""
    _check_chain(path.parent, flag, trusted, path)


def _lstat_dir(path: Path, flag: str) -> os.stat_result:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise ConfigError(f"{flag}: {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"{flag}: cannot check {path}: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise ConfigError(f"{flag}: {path} is a symlink; refusing to follow it (name the real directory)")
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"{flag}: {path} is not a directory")
    return st


def check_private_dir(path: Path, flag: str, *, uid: int | None = None) -> None:
    """``path`` is a directory only a trusted owner may change (state directory); ConfigError otherwise."""
    trusted = _trusted(uid)
    st = _lstat_dir(path, flag)
    problem = _owner_problem(st, trusted)
    if problem:
        raise ConfigError(f"{flag}: {path} {problem}; refusing it")
    if st.st_mode & _GROUP_OR_OTHER_WRITE:
        mode = stat.S_IMODE(st.st_mode)
        raise ConfigError(f"{flag}: {path} is writable by group or others (mode {mode:04o}); refusing it")
    _check_parents(path, flag, trusted)


def check_socket_dir(path: Path, flag: str, *, uid: int | None = None) -> None:
    """``path`` may hold the daemon's sockets: a trusted owner; writable by others only if sticky."""
    trusted = _trusted(uid)
    st = _lstat_dir(path, flag)
    problem = _owner_problem(st, trusted)
    if problem:
        raise ConfigError(f"{flag}: {path} {problem}; refusing it")
    if st.st_mode & _GROUP_OR_OTHER_WRITE and not st.st_mode & stat.S_ISVTX:
        mode = stat.S_IMODE(st.st_mode)
        raise ConfigError(
            f"{flag}: {path} is writable by group or others and not sticky (mode {mode:04o}); "
            "another user could swap the socket; refusing it"
        )
    _check_parents(path, flag, trusted)


def _make_dirs(path: Path, flag: str, mode: int, trusted: frozenset[int]) -> None:
    """Create ``path`` (``mode``) and any missing parent (0755), after checking the deepest existing one."""
    missing: list[Path] = []
    current = path
    while not os.path.lexists(current):
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    if not missing:
        return
    _check_parents(missing[-1], flag, trusted)  # never create inside a directory another user may change
    for directory in reversed(missing):
        try:
            os.mkdir(directory, mode if directory == path else PUBLIC_DIR_MODE)
        except FileExistsError:
            pass
        except OSError as e:
            raise ConfigError(f"{flag}: cannot create {directory}: {e.strerror}") from None


def ensure_private_dir(
    path: Path, flag: str, mode: int = PRIVATE_DIR_MODE, *, uid: int | None = None
) -> None:
    """Create the state directory with ``mode`` if missing, then :func:`check_private_dir` it."""
    _make_dirs(path, flag, mode, _trusted(uid))
    check_private_dir(path, flag, uid=uid)


def ensure_socket_dir(path: Path, flag: str, mode: int = PUBLIC_DIR_MODE, *, uid: int | None = None) -> None:
    """Create a socket directory with ``mode`` if missing, then :func:`check_socket_dir` it."""
    _make_dirs(path, flag, mode, _trusted(uid))
    check_socket_dir(path, flag, uid=uid)


def ensure_narrow_dir(path: Path, flag: str, mode: int) -> None:
    """A directory of sockets only the daemon may change: created with ``mode`` if missing, then refused
    (ConfigError) unless it is the daemon's own (its euid) with no permission beyond ``mode`` and no group
    or other write (:func:`ensure_socket_dir` first: not a symlink, trusted directories above)."""
    ensure_socket_dir(path, flag, mode)
    st = path.lstat()
    if (
        st.st_uid != os.geteuid()
        or st.st_mode & _GROUP_OR_OTHER_WRITE
        or stat.S_IMODE(st.st_mode) & ~mode & 0o777
    ):
        raise ConfigError(
            f"{flag}: {path} must be owned by the daemon's user with mode {mode:04o} at most "
            f"(it is {stat.S_IMODE(st.st_mode):04o}, uid {st.st_uid})"
        )


def ensure_own_socket_dir(path: Path, flag: str, mode: int, socket_name: str) -> None:
    """The directory of one socket (a grant's own directory): :func:`ensure_narrow_dir`, and refused unless
    it is empty or holds only ``socket_name`` (a dead daemon's socket, which the bind then replaces).

    An existing directory is what eerl-csi makes for a pod whose volume it published while eerld was away,
    so that the grant's socket appears in the directory already mounted into the pod; anything else there
    (a symlink, a directory of another owner or mode, other files) was not made for that and is refused.
    """
    ensure_narrow_dir(path, flag, mode)
    others = sorted(name for name in os.listdir(path) if name != socket_name)
    if others:
        raise ConfigError(
            f"{flag}: {path} holds {others[0][:80]!r}: a socket's own directory must be empty; refusing it"
        )


def remove_stale_socket(path: Path, flag: str, server: str) -> bool:
    """Remove the socket of a dead ``server`` at ``path`` so that it can be bound again; False when there
    was none. ConfigError when a live one answers there, or when the path is not a socket."""
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(st.st_mode):
        raise ConfigError(f"{flag}: {path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(str(path))
    except OSError as e:
        if e.errno not in (errno.ECONNREFUSED, errno.ENOENT):
            raise ConfigError(f"{flag}: cannot probe existing socket {path}: {e.strerror}") from None
    else:
        raise ConfigError(f"{flag}: another {server} is already serving on {path}")
    finally:
        probe.close()
    path.unlink()
    return True


def secure_socket(
    path: Path, mode: int, uid: int = -1, gid: int = -1, *, flag: str = "socket", owner: int | None = None
) -> None:
    """chmod (and chown ``uid``/``gid``; -1 keeps one) the socket eerld bound at ``path``, never a symlink.

    The path is opened ``O_PATH | O_NOFOLLOW`` and changed through ``/proc/self/fd/N``, so what is changed is
    the inode that was opened, never what a symlink points to. Refused (ConfigError) when the path is not a
    socket owned by ``owner`` (default: the daemon's euid) or no longer names that socket afterwards.
    """
    expected_owner = os.geteuid() if owner is None else owner
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise ConfigError(f"{flag}: cannot open {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISSOCK(st.st_mode):
            kind = "a symlink" if stat.S_ISLNK(st.st_mode) else "something else"
            raise ConfigError(f"{flag}: {path} is not a socket ({kind}); refusing to chmod or chown it")
        if st.st_uid != expected_owner:
            raise ConfigError(
                f"{flag}: {path} is a socket of uid {st.st_uid}, not the one eerld bound; refusing it"
            )
        through = f"/proc/self/fd/{fd}"
        try:
            if uid != -1 or gid != -1:
                os.chown(through, uid, gid)
            os.chmod(through, mode)
        except OSError as e:
            raise ConfigError(f"{flag}: cannot set the mode or owner of {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    try:
        now = os.lstat(path)
    except OSError as e:
        raise ConfigError(f"{flag}: {path} vanished while it was secured: {e.strerror}") from None
    if (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
        raise ConfigError(f"{flag}: {path} was replaced while it was secured; refusing it")


def check_config_file(path: Path, flag: str = "--config", *, uid: int | None = None) -> bytes:
    """The bytes of a config file, read only if no other user could have written it (ConfigError otherwise).

    The checks apply to the file opened (through a symlink, if ``path`` is one) and to every directory above
    it and above ``path``; the bytes come from the descriptor that was checked.
    """
    trusted = _trusted(uid)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except OSError as e:
        raise ConfigError(f"{flag}: cannot read {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{flag}: {path} is not a regular file")
        problem = _owner_problem(st, trusted)
        if problem:
            raise ConfigError(f"{flag}: {path} {problem}; refusing it (chown root)")
        if st.st_mode & _GROUP_OR_OTHER_WRITE:
            raise ConfigError(f"{flag}: {path} is writable by group or others; refusing it (chmod 0644)")
        try:
            opened = Path(os.readlink(f"/proc/self/fd/{fd}"))
        except OSError:
            opened = Path(os.path.realpath(path))
        _check_parents(opened, flag, trusted)
        if path.is_symlink():  # whoever may change the link's directory may point it elsewhere
            _check_parents(path, flag, trusted)
        return _read_all(fd)
    finally:
        os.close(fd)


# -- state files --------------------------------------------------------------------------------------------


def _read_all(fd: int) -> bytes:
    chunks = []
    while chunk := os.read(fd, 1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def read_bytes_nofollow(path: Path, *, private: bool = False) -> bytes | None:
    """The bytes of the regular file at ``path``; None when missing; ConfigError for a symlink or a non-file,
    and with ``private`` for a file of another owner than root or the euid, or one group or others may write.

    OSError for any other failure to read (the caller decides whether that is a corrupt file).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY)
    except FileNotFoundError:
        return None
    except OSError as e:
        if os.path.islink(path):
            raise ConfigError(f"{path}: is a symlink; refusing to follow it") from None
        raise e from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{path}: not a regular file")
        if private:
            problem = _owner_problem(st, _trusted(None))
            if problem:
                raise ConfigError(f"{path}: {problem}; refusing it")
            if st.st_mode & _GROUP_OR_OTHER_WRITE:
                mode = stat.S_IMODE(st.st_mode)
                raise ConfigError(f"{path}: writable by group or others (mode {mode:04o}); refusing it")
        return _read_all(fd)
    finally:
        os.close(fd)


def read_json_object(path: Path, *, private: bool = False) -> dict[str, Any]:
    """A JSON object from ``path``; ``{}`` when the file is missing; ConfigError naming the file otherwise
    (``private``: see :func:`read_bytes_nofollow`)."""
    try:
        raw = read_bytes_nofollow(path, private=private)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read it ({e.strerror or e})") from None
    if raw is None:
        return {}
    try:
        data = json.loads(raw)
    except ValueError as e:  # bad JSON or UTF-8, an integer of more digits than Python converts
        raise ConfigError(f"{path}: not valid JSON ({str(e)[:200]})") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid JSON (nested too deeply)") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a JSON object, got {type(data).__name__}")
    return data


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class ChangedMeanwhile(OSError):
    """The file changed between the caller's read and the replace; nothing was written."""


def atomic_write_bytes(
    path: Path, data: bytes, mode: int = STATE_FILE_MODE, *, unchanged_since: os.stat_result | None = None
) -> None:
    """Replace ``path`` with ``data`` so that a reader sees the old or the new file, never a mix.

    The temp file is created exclusively (``O_EXCL | O_NOFOLLOW``, ``mode`` whatever the umask) beside
    ``path``, written, fsynced and renamed over ``path`` (a symlink at ``path`` is replaced, never written
    through); then the directory is fsynced. Any failure (a full disk) raises OSError and leaves no temp
    file; when it comes before the rename, ``path`` is unchanged. With ``unchanged_since`` (the file as the
    caller read it), :class:`ChangedMeanwhile` when another writer replaced it since.
    """
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(6)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode)
    renamed = False
    try:
        try:
            os.fchmod(fd, mode)
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        if unchanged_since is not None:
            now = os.lstat(path)
            then = unchanged_since
            if (now.st_ino, now.st_mtime_ns, now.st_size) != (then.st_ino, then.st_mtime_ns, then.st_size):
                raise ChangedMeanwhile(f"{path} changed while it was being rewritten")
        os.replace(tmp, path)
        renamed = True
    finally:
        if not renamed:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
    _fsync_dir(path.parent)


def atomic_write_json(path: Path, data: Any) -> None:
    """:func:`atomic_write_bytes` of ``data`` as indented, key-sorted JSON."""
    atomic_write_bytes(path, json.dumps(data, indent=2, sort_keys=True, allow_nan=False).encode())


def set_aside(path: Path, *, now_unix_s: float | None = None) -> Path:
    """Rename a corrupt ``path`` to ``<name>.corrupt-<unix time>`` (``-1``, ``-2``… if taken); the new path.

    OSError when the rename fails (the file stays where it was).
    """
    stamp = int(time.time() if now_unix_s is None else now_unix_s)
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    n = 0
    while os.path.lexists(target):
        n += 1
        target = path.with_name(f"{path.name}.corrupt-{stamp}-{n}")
    os.rename(path, target)
    with contextlib.suppress(OSError):
        _fsync_dir(path.parent)
    return target


__all__ = [
    "ChangedMeanwhile",
    "atomic_write_bytes",
    "atomic_write_json",
    "check_config_file",
    "check_private_dir",
    "check_socket_dir",
    "ensure_private_dir",
    "ensure_socket_dir",
    "read_bytes_nofollow",
    "read_json_object",
    "secure_socket",
    "set_aside",
]
