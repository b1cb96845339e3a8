"""Which node of which job a sidecar is, and where the job's nodes meet: ``--job-nodes``, ``--node-rank``,
``--rendezvous``, else what the job's launcher put in the environment.

Pure (the environment is an argument). The launchers' names: Slurm's ``srun`` gives ``SLURM_NNODES`` and
``SLURM_NODEID``; torchrun-style launchers and plain scripts ``WORLD_SIZE`` with ``NODE_RANK`` or ``RANK``
(one sidecar per node, so its rank among the sidecars is its node's rank); everyone ``MASTER_ADDR`` and
``MASTER_PORT``. The sidecars meet one port above ``MASTER_PORT``: ``MASTER_PORT`` itself is the job's own
rendezvous, and a sidecar that took it first (the sidecars start before the job) would make the job fail.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from eerl.errors import ConfigError

__all__ = ["JobWorld", "job_world"]

_NODES_FROM = ("EERL_JOB_NODES", "SLURM_NNODES", "WORLD_SIZE")
_RANK_FROM = ("EERL_NODE_RANK", "NODE_RANK", "SLURM_NODEID", "RANK")
MAX_NODES = 65536


@dataclass(frozen=True, slots=True)
class JobWorld:
    """A sidecar's place in a multi-node job: ``node_rank`` of ``nodes``, meeting at ``rendezvous``."""

    nodes: int
    node_rank: int
    rendezvous: str
    """``tcp://host:port``, torch.distributed's ``init_method``."""

    @property
    def leader(self) -> bool:
        """Node 0 runs the job-level controller."""
        return self.node_rank == 0


def job_world(
    nodes: str | None, node_rank: int | None, rendezvous: str | None, env: Mapping[str, str]
) -> JobWorld | None:
    """The job world the flags and ``env`` give; None when ``nodes`` is None (no job mode).

    ``nodes``: a number, or ``auto`` (``EERL_JOB_NODES``, ``SLURM_NNODES``, else ``WORLD_SIZE``).
    ``node_rank`` None: ``EERL_NODE_RANK``, ``NODE_RANK``, ``SLURM_NODEID``, else ``RANK``.
    ``rendezvous`` None: ``EERL_RENDEZVOUS``, else ``tcp://$MASTER_ADDR:$((MASTER_PORT + 1))``.
    Raises ConfigError naming the flag and what is missing or wrong.
    """
    if nodes is None:
        return None
    if nodes.strip().lower() == "auto":
        count = _first_number(env, _NODES_FROM, "--job-nodes auto")
    else:
        count = _number(nodes, "--job-nodes")
    if not 1 <= count <= MAX_NODES:
        raise ConfigError(f"--job-nodes: {count} is not in 1..{MAX_NODES}")
    rank = node_rank if node_rank is not None else _first_number(env, _RANK_FROM, "--node-rank")
    if not 0 <= rank < count:
        raise ConfigError(f"--node-rank: {rank} is not in 0..{count - 1} (--job-nodes {count})")
    return JobWorld(count, rank, _rendezvous(rendezvous, env))


def _rendezvous(given: str | None, env: Mapping[str, str]) -> str:
    text = given if given is not None else env.get("EERL_RENDEZVOUS")
    if text is None:
        host = env.get("MASTER_ADDR", "").strip()
        port_text = env.get("MASTER_PORT", "").strip()
        if not host or not port_text:
            raise ConfigError(
                "--rendezvous: not given, and MASTER_ADDR and MASTER_PORT are not both set "
                "(give --rendezvous tcp://HOST:PORT, the same on every node)"
            )
        port = _number(port_text, "MASTER_PORT") + 1
        return _checked(f"tcp://{_bracketed(host)}:{port}", "MASTER_ADDR/MASTER_PORT")
    return _checked(text.strip(), "--rendezvous")


def _checked(url: str, what: str) -> str:
    rest = url.removeprefix("tcp://")
    if rest == url:
        raise ConfigError(f"{what}: {url!r} is not tcp://HOST:PORT")
    host, sep, port_text = rest.rpartition(":")
    if not sep or not host or any(c in rest for c in "/?#@"):
        raise ConfigError(f"{what}: {url!r} is not tcp://HOST:PORT")
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise ConfigError(f"{what}: {url!r}: port {port_text!r} is not in 1..65535")
    return url


def _bracketed(host: str) -> str:
    try:
        return f"[{host}]" if ipaddress.ip_address(host).version == 6 else host
    except ValueError:
        return host


def _first_number(env: Mapping[str, str], names: tuple[str, ...], flag: str) -> int:
    for name in names:
        value = env.get(name, "").strip()
        if value:
            return _number(value, name)
    raise ConfigError(f"{flag}: not given, and none of {', '.join(names)} is set")


def _number(text: str, what: str) -> int:
    value = text.strip()
    if not value.isdigit():
        raise ConfigError(f"{what}: {text!r} is not a whole number")
    return int(value)
