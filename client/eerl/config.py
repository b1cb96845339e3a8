"""Client configuration: where the daemon is, which GPUs and job, and how the sender behaves.

A :class:`ClientConfig` is frozen; build it with :meth:`ClientConfig.uds`, :meth:`ClientConfig.tcp` or
:meth:`ClientConfig.from_env`, and adjust tuning fields with :func:`dataclasses.replace`.

Environment variables read by :meth:`ClientConfig.from_env`:

``EERL_DISABLE``    ``1``/``true``/``yes``/``on``: no connection at all; phases cost next to nothing.
``EERL_SOCKET``     the daemon's worker socket, or a colon-separated list of them: the session is opened on
                    the first, and each other one gives a claim ticket for its GPUs (default: discovered
                    under ``EERL_RUN_DIR``, see :func:`discover_sockets`).
``EERL_RUN_DIR``    where the daemon's sockets live (default ``/run/eerld``).
``EERL_SIDECAR``    the job's sidecar (``unix:/path``, or ``http://127.0.0.1:PORT``): phase events go to
                    it, and it holds the daemon session (docs/sidecar.md); wins over the three below.
``EERL_SIDECAR_TOKEN``, ``EERL_SIDECAR_TOKEN_FILE``
                    the secret a TCP sidecar demands (``-- command`` sets the first), or a file holding it.
``EERL_ADDRESS``    ``host:port`` of the daemon over TCP (mutual TLS); wins over ``EERL_SOCKET``.
``EERL_TLS_CA``, ``EERL_TLS_CERT``, ``EERL_TLS_KEY``
                    PEM files for TCP: the CA that signed the daemon's certificate, and this client's
                    certificate and key. All three are required with ``EERL_ADDRESS``.
``EERL_JOB_ID``     the job id (default: ``SLURM_JOB_ID``, else ``<host>-<pid>``).
``EERL_GPUS``       comma-separated GPU indices or UUIDs (default: ``CUDA_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from eerl.errors import ConfigError
from eerl.gpus import GpuId, parse_gpu_list
from eerl.sidecar._address import parse_address
from eerl.sidecar._owner import token_from_env

DEFAULT_SOCKET_PATH = "/run/eerld/eerld.sock"
"""Where the daemon's shared worker socket lives unless configured otherwise."""
DEFAULT_RUN_DIR = "/run/eerld"
"""Where the daemon's sockets live: ``eerld.sock``, ``grants/<name>.sock``, ``gpus/<GPU UUID>/eerld.sock``."""
_GPU_SOCKET_NAME = "eerld.sock"
"""The socket in each GPU's directory under ``gpus/`` (the daemon's ``eerld.access.GPU_SOCKET_NAME``)."""

_GRANT_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""What the daemon accepts as a grant's name (a job id that does not fit cannot have a grant socket)."""

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"", "0", "false", "no", "off"})

Transport = Literal["uds", "tcp", "sidecar", "disabled"]


@dataclass(frozen=True, slots=True)
class ClientConfig:
    """Everything the client needs to reach the daemon and to stay out of the job's way.

    The tuning fields bound what the background sender may cost: ``queue_size`` events wait at most
    (the oldest is dropped beyond that), one RPC waits at most ``rpc_timeout_s``, a phase begin that
    waited longer than ``stale_after_s`` in the queue is dropped with its end (the daemon would meter a
    phase it did not see start), and reconnects back off from ``reconnect_initial_s`` to
    ``reconnect_max_s``. ``close_timeout_s`` bounds how long :meth:`Session.close` flushes.

    Several worker sockets (per-GPU sockets, a grant and more): the session is opened on ``socket_path``;
    before every open, each of ``ticket_socket_paths`` is asked for a claim ticket, which adds its GPUs
    to those the session may claim. ``socket_paths`` lists them all, ``socket_path`` first. ``scoped``:
    the session's socket is scoped (a grant's, a GPU's, or one of several), so a session may name no
    GPUs and the daemon claims every GPU the socket and the tickets cover.
    """

    transport: Transport
    socket_path: str | None = None
    address: str | None = None
    root_cert_pem: bytes | None = None
    cert_chain_pem: bytes | None = None
    private_key_pem: bytes | None = None
    job_id: str | None = None
    gpus: tuple[GpuId, ...] | None = None
    rpc_timeout_s: float = 2.0
    queue_size: int = 1024
    stale_after_s: float = 2.0
    reconnect_initial_s: float = 0.2
    reconnect_max_s: float = 5.0
    close_timeout_s: float = 2.0
    lease_ttl_s: float = 0.0
    client_name: str = ""
    ticket_socket_paths: tuple[str, ...] = ()
    scoped: bool = False
    sidecar_url: str | None = None
    sidecar_token: str | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        if self.transport == "uds" and not self.socket_path:
            raise ConfigError("socket_path: required for a Unix-socket config")
        if self.transport == "sidecar":
            if not self.sidecar_url:
                raise ConfigError("sidecar_url: required for a sidecar config")
            object.__setattr__(self, "sidecar_url", parse_address(self.sidecar_url, what="sidecar_url").url)
        if self.ticket_socket_paths:
            if self.transport != "uds":
                raise ConfigError("ticket_socket_paths: only with a Unix-socket config")
            # Frozen: normalise through object.__setattr__ (a list given by hand becomes a tuple).
            object.__setattr__(
                self, "ticket_socket_paths", tuple(os.fspath(p) for p in self.ticket_socket_paths)
            )
            object.__setattr__(self, "scoped", True)  # several sockets: each one is scoped
        if self.transport == "tcp":
            if not self.address:
                raise ConfigError("address: required for a TCP config")
            if not (self.root_cert_pem and self.cert_chain_pem and self.private_key_pem):
                raise ConfigError("tls: TCP needs a root certificate, a client certificate and its key")
        for name in ("rpc_timeout_s", "stale_after_s", "reconnect_initial_s", "reconnect_max_s"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name}: must be positive")
        if self.close_timeout_s < 0 or self.lease_ttl_s < 0:
            raise ConfigError("close_timeout_s, lease_ttl_s: must not be negative")
        if self.queue_size < 2:
            raise ConfigError("queue_size: must be at least 2 (a begin and its end)")

    @property
    def disabled(self) -> bool:
        """True when the client must not connect at all."""
        return self.transport == "disabled"

    @property
    def target(self) -> str:
        """The gRPC target string of the daemon."""
        if self.transport == "uds":
            assert self.socket_path is not None
            return uds_target(self.socket_path)
        if self.transport == "tcp":
            assert self.address is not None
            return self.address
        if self.transport == "sidecar":
            assert self.sidecar_url is not None
            return self.sidecar_url
        return ""

    @property
    def socket_paths(self) -> tuple[str, ...]:
        """Every worker socket of a Unix config, the session's (``socket_path``) first; else empty."""
        if self.transport != "uds" or self.socket_path is None:
            return ()
        return (self.socket_path, *self.ticket_socket_paths)

    @classmethod
    def uds(
        cls,
        path: str | os.PathLike[str] = DEFAULT_SOCKET_PATH,
        *more: str | os.PathLike[str],
        scoped: bool = False,
    ) -> ClientConfig:
        """The daemon on this node, over its Unix worker socket (the normal case).

        ``more``: other worker sockets of the same daemon, each asked for a claim ticket (the config is
        then scoped). ``scoped``: ``path`` is a scoped socket (a grant's or a GPU's).
        """
        first = os.fspath(path)
        others = tuple(dict.fromkeys(os.fspath(p) for p in more if os.fspath(p) != first))
        return cls(transport="uds", socket_path=first, ticket_socket_paths=others, scoped=scoped)

    @classmethod
    def tcp(
        cls,
        address: str,
        *,
        root_cert: bytes | str | os.PathLike[str],
        cert: bytes | str | os.PathLike[str],
        key: bytes | str | os.PathLike[str],
    ) -> ClientConfig:
        """The daemon over TCP with mutual TLS; certificates are PEM bytes or paths to PEM files."""
        return cls(
            transport="tcp",
            address=address,
            root_cert_pem=_pem(root_cert, "root_cert"),
            cert_chain_pem=_pem(cert, "cert"),
            private_key_pem=_pem(key, "key"),
        )

    @classmethod
    def sidecar(cls, url: str, *, token: str | None = None) -> ClientConfig:
        """The job's sidecar (``eerl-sidecar``), which holds the daemon session: ``unix:/path/to/it.sock``,
        or ``http://127.0.0.1:PORT`` with ``token``, the secret a TCP sidecar demands (docs/sidecar.md)."""
        return cls(transport="sidecar", sidecar_url=url, sidecar_token=token)

    @classmethod
    def disabled_config(cls) -> ClientConfig:
        """A config that never connects (what ``EERL_DISABLE=1`` gives)."""
        return cls(transport="disabled")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ClientConfig:
        """Reads the ``EERL_*`` variables (see the module docstring); raises :class:`ConfigError`."""
        env = os.environ if environ is None else environ
        disable = env.get("EERL_DISABLE", "").strip().lower()
        if disable not in _TRUE | _FALSE:
            raise ConfigError(f"EERL_DISABLE: {disable!r} is not a boolean")
        job_id = env.get("EERL_JOB_ID") or None
        gpus_text = env.get("EERL_GPUS")
        gpus = parse_gpu_list(gpus_text, source="EERL_GPUS") if gpus_text is not None else None
        base: ClientConfig
        if disable in _TRUE:
            base = cls.disabled_config()
        elif env.get("EERL_SIDECAR", "").strip():
            base = cls.sidecar(
                parse_address(env["EERL_SIDECAR"], default_port=None).url, token=token_from_env(env)
            )
        elif env.get("EERL_ADDRESS"):
            missing = [name for name in ("EERL_TLS_CA", "EERL_TLS_CERT", "EERL_TLS_KEY") if not env.get(name)]
            if missing:
                raise ConfigError(f"{', '.join(missing)}: required with EERL_ADDRESS (TCP needs mutual TLS)")
            base = cls.tcp(
                env["EERL_ADDRESS"],
                root_cert=Path(env["EERL_TLS_CA"]),
                cert=Path(env["EERL_TLS_CERT"]),
                key=Path(env["EERL_TLS_KEY"]),
            )
        elif env.get("EERL_SOCKET", "").strip():
            listed = [part.strip() for part in env["EERL_SOCKET"].split(":") if part.strip()]
            if not listed:
                raise ConfigError(f"EERL_SOCKET: {env['EERL_SOCKET']!r} names no socket")
            base = cls.uds(*listed)
        else:
            found, scoped = discover_sockets(env)
            base = cls.uds(*found, scoped=scoped)
        return cls(
            transport=base.transport,
            socket_path=base.socket_path,
            address=base.address,
            root_cert_pem=base.root_cert_pem,
            cert_chain_pem=base.cert_chain_pem,
            private_key_pem=base.private_key_pem,
            job_id=job_id,
            gpus=gpus,
            ticket_socket_paths=base.ticket_socket_paths,
            scoped=base.scoped,
            sidecar_url=base.sidecar_url,
            sidecar_token=base.sidecar_token,
        )


def discover_sockets(environ: Mapping[str, str] | None = None) -> tuple[tuple[str, ...], bool]:
    """The worker sockets to use when ``EERL_SOCKET`` is unset, and whether they are scoped.

    Under ``EERL_RUN_DIR`` (default ``/run/eerld``), the first that exists of: (a) this job's grant,
    ``grants/job-<job id>.sock`` (``EERL_JOB_ID``, else ``SLURM_JOB_ID``); (b) the per-GPU sockets,
    ``gpus/<GPU>/eerld.sock`` for every directory ``gpus/<GPU>``, sorted by directory name (Kubernetes
    mounts into a container exactly its GPUs' directories); (c) the shared ``eerld.sock``, not scoped,
    which is also the answer when nothing exists yet. In (b) the directory counts, not the socket: while
    eerld restarts a directory has no socket, and eerld creates the new one in the same directory, where
    the client's reconnects find it.
    """
    env = os.environ if environ is None else environ
    run_dir = env.get("EERL_RUN_DIR") or DEFAULT_RUN_DIR
    job_id = env.get("EERL_JOB_ID") or env.get("SLURM_JOB_ID")
    if job_id and _GRANT_NAME.fullmatch(f"job-{job_id}"):
        grant = os.path.join(run_dir, "grants", f"job-{job_id}.sock")
        if os.path.exists(grant):
            return (grant,), True
    gpu_dir = os.path.join(run_dir, "gpus")
    try:
        names = sorted(os.listdir(gpu_dir))
    except OSError:  # absent, or not readable by this user
        names = []
    per_gpu = [
        os.path.join(gpu_dir, name, _GPU_SOCKET_NAME)
        for name in names
        if os.path.isdir(os.path.join(gpu_dir, name))
    ]
    if per_gpu:
        return tuple(per_gpu), True
    return (os.path.join(run_dir, "eerld.sock"),), False


def uds_target(path: str) -> str:
    """The gRPC target of a Unix socket path."""
    return "unix://" + os.path.abspath(path)


def _pem(value: bytes | str | os.PathLike[str], name: str) -> bytes:
    """PEM bytes as given, or read from the file a path names."""
    if isinstance(value, bytes):
        return value
    try:
        return Path(value).read_bytes()
    except OSError as e:
        raise ConfigError(f"{name}: cannot read {os.fspath(value)!r}: {e.strerror}") from e
