"""Naming GPUs: by NVML index or by UUID.

Inside a container the CUDA indices are renumbered (the container's GPU 0 may be the host's GPU 5), while
the daemon runs on the host and sees host indices. A UUID ("GPU-5f1c…", or "MIG-…" for a MIG instance)
names the same device everywhere, so every place that takes a GPU accepts one. Indices are sent as
indices; anything else that looks like an NVML UUID is passed through untouched for the daemon to match.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TypeAlias

from eerl.errors import ConfigError

GpuId: TypeAlias = int | str
"""A GPU named by NVML index (``int``) or by UUID (``str`` starting with ``GPU-`` or ``MIG-``)."""

_UUID_PREFIXES = ("GPU-", "MIG-")
_NO_DEVICES = frozenset({"", "-1", "none", "nodevfiles", "void"})


def parse_gpu(value: int | str, *, source: str = "gpus") -> GpuId:
    """Turns one GPU reference into an index or a UUID; raises :class:`ConfigError` naming ``source``."""
    if isinstance(value, bool):
        raise ConfigError(f"{source}: {value!r} is not a GPU index or UUID")
    if isinstance(value, int):
        if value < 0:
            raise ConfigError(f"{source}: GPU index {value} is negative")
        return value
    text = value.strip()
    if text.isdecimal():
        return int(text)
    if text.upper().startswith(_UUID_PREFIXES) and len(text) > 4:
        return text
    raise ConfigError(f"{source}: {value!r} is neither a GPU index nor a UUID (GPU-… or MIG-…)")


def parse_gpus(values: Iterable[int | str], *, source: str = "gpus") -> tuple[GpuId, ...]:
    """Parses a sequence of GPU references, keeping order and dropping repeats."""
    seen: dict[GpuId, None] = {}
    for value in values:
        seen.setdefault(parse_gpu(value, source=source), None)
    return tuple(seen)


def parse_gpu_list(text: str, *, source: str) -> tuple[GpuId, ...]:
    """Parses a comma-separated list as found in ``CUDA_VISIBLE_DEVICES`` or ``EERL_GPUS``."""
    if text.strip().lower() in _NO_DEVICES:
        return ()
    return parse_gpus([part for part in text.split(",") if part.strip()], source=source)


def visible_gpus(environ: Mapping[str, str] | None = None) -> tuple[GpuId, ...]:
    """The GPUs this process may use, as the environment names them.

    ``CUDA_VISIBLE_DEVICES`` first; when it is unset, ``NVIDIA_VISIBLE_DEVICES`` if it lists UUIDs
    (container runtimes set it; "all" names nothing specific and is ignored). Empty when neither says.
    """
    env = os.environ if environ is None else environ
    cuda = env.get("CUDA_VISIBLE_DEVICES")
    if cuda is not None:
        return parse_gpu_list(cuda, source="CUDA_VISIBLE_DEVICES")
    nvidia = env.get("NVIDIA_VISIBLE_DEVICES", "")
    entries = [part.strip() for part in nvidia.split(",") if part.strip()]
    if entries and all(entry.upper().startswith(_UUID_PREFIXES) for entry in entries):
        return parse_gpus(entries, source="NVIDIA_VISIBLE_DEVICES")
    return ()
