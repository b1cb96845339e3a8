"""The one mount eerl-csi makes: the grant's directory, bind-mounted read-only at the volume's target path.

A directory, not the socket file: a bind mount holds the inode it was made from, so a mounted socket file
would stay the dead one once eerld restarts and binds a new socket, while a mounted directory shows the
socket eerld re-creates in it (the per-GPU sockets of CDI work the same way, docs/deployment.md).
Read-only, ``nosuid``, ``nodev``, ``noexec``: connecting to a socket needs none of them. The calls are
``mount(2)`` and ``umount2(2)`` through libc (the image needs no ``mount`` binary); in the DaemonSet the
kubelet's directory is mounted ``Bidirectional``, so the mount reaches the host and the pod's container.
No symlink at the target is followed: the target is opened ``O_PATH | O_NOFOLLOW | O_DIRECTORY`` and
mounted on through ``/proc/self/fd/N``, so a symlink planted there (to ``/etc``) is refused, never mounted
over; unmounting uses ``UMOUNT_NOFOLLOW``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import os
from collections.abc import Iterator
from pathlib import Path

from eerld.errors import Conflict, Unavailable

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
    """Whether something is mounted at ``path`` itself (the directories above resolved, not ``path``: a
    symlink there is no mount point)."""
    return Path(os.path.realpath(path.parent)) / path.name in mount_points()


def bind_read_only(source: Path, target: Path) -> None:
    """Create ``target`` (a directory) if missing and bind-mount ``source`` there read-only.

    Conflict when ``target`` is not a real directory (a symlink is never followed); Unavailable when the
    kernel refuses (no privilege, a missing source). Nothing stays mounted then.
    """
    try:
        target.mkdir(mode=TARGET_DIR_MODE)
    except FileExistsError:
        pass  # the kubelet may have made it; what it is, the open below checks
    except OSError as e:
        raise Unavailable(f"cannot create the mount point {target}: {e.strerror}") from None
    with _directory_nofollow(target) as at:
        try:
            _mount(str(source), at, MS_BIND)
        except OSError as e:
            raise Unavailable(f"cannot bind-mount {source} at {target}: {e.strerror}") from None
    try:
        with _directory_nofollow(target) as at:  # now the mount's root, which the remount must name
            _mount(None, at, MS_BIND | MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except (OSError, Conflict) as e:
        unmount(target)
        reason = e.strerror if isinstance(e, OSError) else str(e)
        raise Unavailable(f"cannot make the mount at {target} read-only: {reason}") from None


@contextlib.contextmanager
def _directory_nofollow(path: Path) -> Iterator[str]:
    """``/proc/self/fd/N`` of the directory at ``path``, opened without following a symlink there; Conflict
    when ``path`` is not a directory (a symlink, a file)."""
    try:
        fd = os.open(path, os.O_PATH | os.O_NOFOLLOW | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        kind = "a symlink" if os.path.islink(path) else e.strerror
        raise Conflict(
            f"the mount point {path} is not a directory ({kind}); refusing to mount on it"
        ) from None
    try:
        yield f"/proc/self/fd/{fd}"
    finally:
        os.close(fd)


def unmount(target: Path) -> bool:
    """Unmount whatever is mounted at ``target`` (every layer); False when nothing was. Never follows a
    symlink at the path."""
    unmounted = False
    while True:
        if _libc.umount2(str(target).encode(), UMOUNT_NOFOLLOW) == 0:
            unmounted = True
            continue
        code = ctypes.get_errno()
        if code in (errno.EINVAL, errno.ENOENT):
            return unmounted
        raise Unavailable(f"cannot unmount {target}: {os.strerror(code)}")


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


__all__ = ["bind_read_only", "is_mount_point", "mount_points", "unmount"]
