"""Naming GPUs: by NVML index or by UUID — the one GPU reference rule, for the job, eerlctl and eerld.

Inside a container the CUDA indices are renumbered (the container's GPU 0 may be the host's GPU 5), while
the daemon runs on the host and sees host indices. A UUID ("GPU-5f1c…", or "MIG-…" for a MIG instance)
names the same device everywhere, so every place that takes a GPU accepts one. Indices are sent as
indices; anything else that looks like an NVML UUID is passed through untouched for the daemon to match.

:func:`parse_gpu_ref` is the rule, and its one home: the client's configuration (:func:`parse_gpu`),
eerlctl's ``--gpus`` and eerld's request decoder all call it, and each says in its own words where the
reference came from (an environment variable, a flag, a request field).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from typing import TypeAlias

from eerl.errors import ConfigError, ValidationError

GpuId: TypeAlias = int | str
"""A GPU named by NVML index (``int``) or by UUID (``str`` starting with ``GPU-`` or ``MIG-``)."""

MAX_GPU_INDEX = 1023
"""The largest GPU index a reference may name (eerld refuses a larger one)."""
MAX_GPU_UUID_CHARS = 96
"""The longest GPU UUID a reference may name (NVML's are 40 characters; a MIG UUID up to 44)."""

_UUID_PREFIXES = ("GPU-", "MIG-")
_NO_DEVICES = frozenset({"", "-1", "none", "nodevfiles", "void"})


def parse_gpu_ref(value: object, *, field: str = "gpu") -> GpuId:
    """One GPU reference as an index or a UUID: the one rule; raises :class:`ValidationError` on ``field``.

    - an index: an ``int``, or text of ASCII digits (spaces around it ignored), from 0 to
      :data:`MAX_GPU_INDEX`;
    - a UUID: text starting with ``GPU-`` or ``MIG-`` (in any case) with something after it, printable,
      without spaces, at most :data:`MAX_GPU_UUID_CHARS` characters; returned as written (spaces around
      it stripped), for the daemon to match.

    Anything else (a bool, a negative or out-of-range index, ``"cuda:0"``, ``"GPU-"``) is refused. Pure.
    """
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise ValidationError(field, f"{value!r} is not a GPU index or UUID")
    if isinstance(value, str):
        text = value.strip()
        if text.isascii() and text.isdecimal():
            value = int(text)
        elif text.upper().startswith(_UUID_PREFIXES) and len(text) > len("GPU-"):
            if len(text) > MAX_GPU_UUID_CHARS:
                raise ValidationError(
                    field, f"a GPU UUID of {len(text)} characters is too long (at most {MAX_GPU_UUID_CHARS})"
                )
            if not text.isprintable() or any(ch.isspace() for ch in text):
                raise ValidationError(
                    field, f"{text!r} is not a GPU UUID (it contains spaces or control characters)"
                )
            return text
        else:
            raise ValidationError(field, f"{value!r} is neither a GPU index nor a UUID (GPU-… or MIG-…)")
    if value < 0:
        raise ValidationError(field, f"GPU index {value} is negative")
    if value > MAX_GPU_INDEX:
        raise ValidationError(field, f"GPU index {value} is out of range (at most {MAX_GPU_INDEX})")
    return value


def parse_gpu(value: int | str, *, source: str = "gpus") -> GpuId:
    """Turns one GPU reference into an index or a UUID (:func:`parse_gpu_ref`); raises
    :class:`ConfigError` naming ``source``."""
    try:
        return parse_gpu_ref(value, field=source)
    except ValidationError as e:
        raise ConfigError(str(e)) from None


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
