"""Where a sidecar listens when nobody says: a Unix socket in a directory only the job's user may use.

The first of these that applies (the same rule for the sidecar, which binds there, and for ``eerl phase``,
which looks there):

1. ``$EERL_JOBS_DIR/<job id>/sidecar.sock`` (``EERL_JOBS_DIR`` defaults to ``/run/eerl-jobs``) when that
   directory exists: a root prolog (deploy/slurm) made it for the job, owned by the job's user, mode 0700,
   in a directory only root may write, so no other user can take the path first.
2. ``$XDG_RUNTIME_DIR/eerl-sidecar-<job id>.sock``: the login's own runtime directory (0700, the user's).
3. ``<tmp>/eerl-<uid>/sidecar-<job id>.sock`` (``<tmp>``: ``TMPDIR``, else ``/tmp``): a directory of the
   user's, mode 0700, made on first use. Another user could make it first, in a world-writable ``/tmp``;
   then it is refused, loudly (never used): whoever owns the directory could swap the socket.

Each directory must be a real directory (not a symlink) owned by this process's user with no access for
group or others; anything else is a :class:`eerl.errors.ConfigError` that says what is wrong and what to do.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from pathlib import Path

from eerl.errors import ConfigError
from eerl.sidecar._address import SidecarAddress

DEFAULT_JOBS_DIR = "/run/eerl-jobs"
"""Where a root prolog makes each job's private directory (deploy/slurm/reset-gpus.sh)."""
JOB_SOCKET_NAME = "sidecar.sock"
_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")
_MAX_NAME = 48
"""A job id longer than this is cut and given a hash (a Unix socket's path holds at most 107 bytes)."""


def socket_name(job_id: str) -> str:
    """``sidecar-<job id>.sock``, with anything but letters, digits, ``_ . -`` replaced and a long id cut
    (plus 8 hex digits of its hash, so that two long ids do not meet)."""
    safe = _UNSAFE.sub("_", job_id).lstrip(".") or "job"
    if len(safe) > _MAX_NAME or safe != job_id:
        digest = hashlib.sha256(job_id.encode()).hexdigest()[:8]
        safe = f"{safe[:_MAX_NAME]}-{digest}"
    return f"sidecar-{safe}.sock"


def env_job_id(env: Mapping[str, str]) -> str | None:
    """The job id the environment names (``EERL_JOB_ID``, else ``SLURM_JOB_ID``), as the client reads it."""
    return (env.get("EERL_JOB_ID") or "").strip() or (env.get("SLURM_JOB_ID") or "").strip() or None


def job_dir(job_id: str, env: Mapping[str, str]) -> Path:
    """The job's directory a root prolog may have made: ``$EERL_JOBS_DIR/<job id>``."""
    return Path(env.get("EERL_JOBS_DIR") or DEFAULT_JOBS_DIR, _UNSAFE.sub("_", job_id))


def default_address(job_id: str, env: Mapping[str, str], *, create: bool) -> SidecarAddress:
    """The sidecar's default Unix socket for ``job_id`` (see the module); ``create``: make the per-user
    directory under ``<tmp>`` if it is missing (the sidecar does, a client does not). Raises ConfigError."""
    prolog_dir = job_dir(job_id, env)
    if _exists(prolog_dir):
        _check_root_made(prolog_dir)
        check_private_dir(prolog_dir, what="the job's directory")
        return SidecarAddress(path=str(prolog_dir / JOB_SOCKET_NAME))
    runtime = env.get("XDG_RUNTIME_DIR", "").strip()
    if runtime and Path(runtime).is_absolute() and _exists(Path(runtime)):
        check_private_dir(Path(runtime), what="XDG_RUNTIME_DIR")
        return SidecarAddress(path=str(Path(runtime, f"eerl-{socket_name(job_id)}")))
    base = Path(env.get("TMPDIR") or tempfile.gettempdir(), f"eerl-{os.geteuid()}")
    if create:
        try:
            base.mkdir(mode=0o700)
        except FileExistsError:
            pass  # checked below, whoever made it
        except OSError as e:
            raise ConfigError(f"cannot make {base} for the sidecar's socket: {e.strerror or e}") from None
    if create or _exists(base):  # a client looking where no sidecar ever was finds nothing there, quietly
        check_private_dir(base, what="the sidecar's directory")
    return SidecarAddress(path=str(base / socket_name(job_id)))


def make_socket_dir(path: str) -> None:
    """Makes the directory of a ``--listen unix:`` path when it is missing (mode 0700: the job's user's
    alone), one level only; raises ConfigError."""
    directory = Path(path).parent
    if _exists(directory):
        return
    try:
        directory.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise ConfigError(f"cannot make {directory} for the sidecar's socket: {e.strerror or e}") from None


def check_private_dir(path: Path, *, what: str) -> None:
    """Raises ConfigError unless ``path`` is a directory (not a symlink) of this process's user that group
    and others may not use at all."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise ConfigError(f"{what} {path} does not exist") from None
    except OSError as e:
        raise ConfigError(f"{what} {path}: {e.strerror or e}") from None
    if stat.S_ISLNK(info.st_mode) or not stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{what} {path} is not a directory (a symlink is not followed)")
    if info.st_uid != os.geteuid():
        raise ConfigError(
            f"{what} {path} belongs to uid {info.st_uid}, not to you ({os.geteuid()}): another user made it "
            "first, so it is not used; remove it (as root), or give --listen unix:<a path in a directory of "
            "yours>"
        )
    if info.st_mode & 0o077:
        raise ConfigError(
            f"{what} {path} has mode {stat.S_IMODE(info.st_mode):04o}: group and others must have no access "
            f"(chmod 700 {path})"
        )


def _check_root_made(path: Path) -> None:
    """The jobs directory above a prolog's job directory: root's, writable by nobody else."""
    parent = path.parent
    try:
        info = os.lstat(parent)
    except OSError as e:
        raise ConfigError(f"{parent}: {e.strerror or e}") from None
    if stat.S_ISLNK(info.st_mode) or info.st_uid != 0 or info.st_mode & 0o022:
        raise ConfigError(
            f"{parent} is not a directory of root's that only root may write: the job's directory in it "
            "could have been made by anyone, so it is not used"
        )


def _exists(path: Path) -> bool:
    try:
        os.lstat(path)
    except OSError:
        return False
    return True
