"""The one mount eerl-csi makes: the grant's directory, bind-mounted read-only at the volume's target path.

A directory, not the socket file: a bind mount holds the inode it was made from, so a mounted socket file
would stay the dead one once eerld restarts and binds a new socket, while a mounted directory shows the
socket eerld re-creates in it (the per-GPU sockets of CDI work the same way, docs/deployment.md).
Read-only, ``nosuid``, ``nodev``, ``noexec``: connecting to a socket needs none of them. The calls are
``mount(2)`` and ``umount2(2)`` through libc (the image needs no ``mount`` binary); in the DaemonSet the
kubelet's directory is mounted ``Bidirectional``, so the mount reaches the host and the pod's container.
No symlink anywhere in the target path is followed: the path is walked from ``/`` one component at a
time, each opened ``O_PATH | O_NOFOLLOW`` relative to the one before (:func:`mount_point`), and the mount
is made on the directory so opened, through ``/proc/self/fd/N``; a symlink at any component (planted by
whoever may write the kubelet's directories) refuses the volume, and nothing is mounted where it points.
An unmount names the target through its opened parent (``UMOUNT_NOFOLLOW`` for the last component), so it
never reaches a mount elsewhere through a link either. Nothing here races a rename: every step after the
walk uses its descriptors, never the path again.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import structlog

from eerld.errors import Conflict, Unavailable

log = structlog.get_logger("eerld.csi")

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_BIND = 4096
UMOUNT_NOFOLLOW = 8
TARGET_DIR_MODE = 0o750
MOUNTINFO = Path("/proc/self/mountinfo")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _mount(source: str | None, target: str, flags: int) -> None:
    if _libc.mount(source.encode() if source else None, target.encode(), None, flags, None) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), target)


def mount_points() -> list[Path]:
    """Every mount point of this process's mount table, as ``/proc/self/mountinfo`` lists them."""
    points = []
    for line in MOUNTINFO.read_bytes().splitlines():
        fields = line.split(b" ")
        if len(fields) > 4:
            points.append(Path(os.fsdecode(_unescape(fields[4]))))
    return points


def is_mount_point(path: Path) -> bool:
    """Whether something is mounted at ``path`` itself, reached without following a symlink (a path with
    one is no mount point of ours)."""
    try:
        parent_fd = _open_parent(path)
    except (Conflict, Unavailable):
        return False
    try:
        real = Path(os.readlink(f"/proc/self/fd/{parent_fd}")) / path.name
    finally:
        os.close(parent_fd)
    return real in mount_points()


@dataclass(frozen=True, slots=True)
class MountPoint:
    """A target path walked without following a symlink: its parent and itself, open ``O_PATH``."""

    path: Path
    parent_fd: int
    fd: int

    @property
    def at(self) -> str:
        """The directory itself, for mount(2): ``/proc/self/fd/N``."""
        return f"/proc/self/fd/{self.fd}"


@contextlib.contextmanager
def mount_point(target: Path) -> Iterator[MountPoint]:
    """The directory at ``target`` (created ``TARGET_DIR_MODE`` if missing), every component opened from
    ``/`` without following a symlink; the descriptors stay open until the block ends.

    Conflict when a component is a symlink or not a directory (refused: nothing is mounted through it);
    Unavailable when a directory above is missing or the target cannot be made.
    """
    parent_fd = _open_parent(target)
    try:
        created = True
        try:
            os.mkdir(target.name, TARGET_DIR_MODE, dir_fd=parent_fd)
        except FileExistsError:
            created = False  # the kubelet may have made it; what it is, the open below checks
        except OSError as e:
            raise Unavailable(f"cannot create the mount point {target}: {e.strerror}") from None
        fd = _open_directory(parent_fd, target.name, target, last=True)
        try:
            yield MountPoint(target, parent_fd, fd)
        except BaseException:
            if created:  # a publish that failed leaves no directory of ours behind
                with contextlib.suppress(OSError):
                    os.rmdir(target.name, dir_fd=parent_fd)
            raise
        finally:
            os.close(fd)
    finally:
        os.close(parent_fd)


def bind_read_only(source: Path, point: MountPoint) -> None:
    """Bind-mount ``source`` read-only on the walked mount point (see :func:`mount_point`).

    Unavailable when the kernel refuses (no privilege, a missing source); nothing stays mounted then.
    """
    try:
        _mount(str(source), point.at, MS_BIND)
    except OSError as e:
        raise Unavailable(f"cannot bind-mount {source} at {point.path}: {e.strerror}") from None
    flags = MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
    try:
        # the mount's root, which the remount must name: the same name under the same opened parent
        root = _open_directory(point.parent_fd, point.path.name, point.path, last=True)
        try:
            _mount(None, f"/proc/self/fd/{root}", flags)
        finally:
            os.close(root)
    except (OSError, Conflict, Unavailable) as e:
        _unmount_under(point.parent_fd, point.path)
        reason = e.strerror if isinstance(e, OSError) else str(e)
        raise Unavailable(f"cannot make the mount at {point.path} read-only: {reason}") from None


def unmount(target: Path) -> bool:
    """Unmount whatever is mounted at ``target`` (every layer); False when nothing was, or when the path
    holds a symlink (logged: whatever is mounted where it points is not ours to unmount)."""
    try:
        parent_fd = _open_parent(target)
    except Conflict as e:
        log.warning("unmount_refused", target_path=str(target), error=str(e))
        return False
    except Unavailable:  # a directory above is gone: nothing can be mounted there
        return False
    try:
        return _unmount_under(parent_fd, target)
    finally:
        os.close(parent_fd)


def remove_mount_point(target: Path) -> None:
    """Remove the (empty, unmounted) directory at ``target``, reached without following a symlink; any
    failure is ignored (the kubelet removes the pod's directories)."""
    with contextlib.suppress(Conflict, Unavailable):
        parent_fd = _open_parent(target)
        try:
            with contextlib.suppress(OSError):
                os.rmdir(target.name, dir_fd=parent_fd)
        finally:
            os.close(parent_fd)


def _unmount_under(parent_fd: int, target: Path) -> bool:
    """Unmount every layer at ``target``'s name under its opened parent; the last component is never
    followed (``UMOUNT_NOFOLLOW``), the parent is the directory opened, not the path."""
    unmounted = False
    at = f"/proc/self/fd/{parent_fd}/{target.name}".encode()
    while True:
        if _libc.umount2(at, UMOUNT_NOFOLLOW) == 0:
            unmounted = True
            continue
        code = ctypes.get_errno()
        if code in (errno.EINVAL, errno.ENOENT):
            return unmounted
        raise Unavailable(f"cannot unmount {target}: {os.strerror(code)}")


def _open_parent(target: Path) -> int:
    """A descriptor (``O_PATH``) of the directory above ``target``, walked from ``/`` one component at a
    time with no symlink followed; the caller closes it.

    Conflict for a symlink or a non-directory on the way; Unavailable for a missing one, or a path that is
    not absolute and normal (the callers checked it is).
    """
    if not target.is_absolute() or ".." in target.parts or target == target.parent:
        raise Unavailable(f"{target} is not an absolute, normal path")
    fd = os.open("/", os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for name in target.parent.parts[1:]:
            next_fd = _open_directory(fd, name, target, last=False)
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_directory(dir_fd: int, name: str, target: Path, *, last: bool) -> int:
    """``name`` under ``dir_fd``, opened ``O_PATH | O_NOFOLLOW``; Conflict unless it is a directory."""
    try:
        fd = os.open(name, os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
    except FileNotFoundError:
        raise Unavailable(f"the mount point {target}: {name} does not exist") from None
    except OSError as e:
        raise Unavailable(f"the mount point {target}: cannot open {name}: {e.strerror}") from None
    mode = os.fstat(fd).st_mode
    if stat.S_ISDIR(mode):
        return fd
    os.close(fd)
    if last:
        kind = "a symlink" if stat.S_ISLNK(mode) else "not a directory"
        raise Conflict(f"the mount point {target} is not a directory ({kind}); refusing to mount on it")
    if stat.S_ISLNK(mode):
        raise Conflict(f"the mount point {target}: {name} is a symlink; refusing to mount through it")
    raise Conflict(f"the mount point {target}: {name} is not a directory; refusing it")


def _unescape(field: bytes) -> bytes:
    """mountinfo's octal escapes (``\\040`` for a space) undone."""
    out = bytearray()
    i = 0
    while i < len(field):
        if field[i : i + 1] == b"\\" and field[i + 1 : i + 4].isdigit():
            out.append(int(field[i + 1 : i + 4], 8))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return bytes(out)


__all__ = [
    "MountPoint",
    "bind_read_only",
    "is_mount_point",
    "mount_point",
    "mount_points",
    "remove_mount_point",
    "unmount",
]
