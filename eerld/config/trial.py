"""``eerld --sim``: the daemon tried by hand, without root and without GPUs, in a minute.

One flag stands for the options a newcomer would otherwise assemble from docs/operations.md's table:
simulated GPUs (``--backend sim``), one tenant (``--tenancy single``: the README's two-line client may claim
every GPU over the shared socket), no grant sockets, no metrics endpoint, no kubelet, and the sockets and
the state in a directory of the user's own:

1. ``$XDG_RUNTIME_DIR/eerld-sim`` when the login has a runtime directory (the user's, 0700);
2. else ``<tmp>/eerld-sim-<uid>`` (``<tmp>``: ``TMPDIR``, else ``/tmp``).

The directory is made 0700 and must belong to the user (or root) with no write access for anyone else: one
that another user made first in a world-writable ``/tmp`` is refused, never used, since whoever owns it
could swap the sockets (:func:`eerld.files.ensure_private_dir`). Any of these options given as well, by flag
or config file, wins over what ``--sim`` sets; ``--sim`` with ``--backend nvml`` is an error.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from eerld.errors import ConfigError

__all__ = ["SIM_HOME_NAME", "announcement", "sim_home", "with_sim_defaults"]

SIM_HOME_NAME = "eerld-sim"
WORKER_SOCKET_NAME = "eerld.sock"
ADMIN_SOCKET_NAME = "admin.sock"
STATE_DIR_NAME = "state"


def sim_home(env: Mapping[str, str], uid: int) -> Path:
    """Where ``--sim`` keeps its sockets and state for the user ``uid`` (see the module)."""
    runtime = env.get("XDG_RUNTIME_DIR", "").strip()
    if runtime and Path(runtime).is_absolute() and os.path.isdir(runtime):
        return Path(runtime, SIM_HOME_NAME)
    return Path(env.get("TMPDIR") or tempfile.gettempdir(), f"{SIM_HOME_NAME}-{uid}")


def _sim_values(home: Path) -> dict[str, Any]:
    """The options ``--sim`` sets, as raw values by Config field (what flags would give)."""
    return {
        "backend": "sim",
        "tenancy": "single",
        "socket_path": str(home / WORKER_SOCKET_NAME),
        "admin_socket_path": str(home / ADMIN_SOCKET_NAME),
        "state_dir": str(home / STATE_DIR_NAME),
        "grant_dir": "off",
        "metrics_address": "off",
        "pod_resources_socket": "off",
    }


def with_sim_defaults(values: Mapping[str, Any], home: Path) -> dict[str, Any]:
    """``values`` (raw, by Config field, from flags and the config file) over what ``--sim`` sets."""
    backend = values.get("backend")
    if backend is not None and backend != "sim":
        raise ConfigError(f"--sim: simulated GPUs only; it cannot be combined with --backend {backend}")
    return {**_sim_values(home), **values}


def announcement(*, home: Path, socket_path: Path, admin_socket_path: Path, gpus: int, profile: str) -> str:
    """What ``eerld --sim`` prints once it serves: where it lives and the two lines that reach it."""
    return (
        f"eerld --sim: {gpus} simulated {profile} GPUs, one tenant, no root needed; sockets and state in "
        f"{home} (Ctrl-C stops it)\n"
        "In another shell:\n"
        f"  export EERL_SOCKET={socket_path}\n"
        f"  eerlctl --socket {admin_socket_path} status"
    )
