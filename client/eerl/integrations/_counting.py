"""Token counting on framework batches without importing a tensor library.

The hooks see PyTorch tensors (or NumPy arrays, or lists) but ``eerl`` must not import them; these helpers
rely only on what such objects share: ``.sum()``, ``.item()``, ``.tolist()``, ``.shape`` and iteration.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


def total(mask: Any) -> int:
    """Sum of all entries of a mask (a tensor, an array, or nested lists)."""
    if mask is None:
        return 0
    if hasattr(mask, "sum") and not isinstance(mask, list | tuple):
        return _scalar(mask.sum())
    return sum(total(row) if isinstance(row, list | tuple) else int(row) for row in mask)


def rows(mask: Any) -> int:
    """Number of rows (sequences) of a 2-D mask."""
    if mask is None:
        return 0
    shape = getattr(mask, "shape", None)
    if shape is not None and len(shape) > 0:
        return int(shape[0])
    return len(mask)


def longest_row(mask: Any) -> int:
    """The largest row sum of a 2-D mask: the longest sequence it marks."""
    if mask is None or rows(mask) == 0:
        return 0
    if hasattr(mask, "sum") and not isinstance(mask, list | tuple):
        return _scalar(mask.sum(-1).max())
    return max(total(row) for row in mask)


DEFAULT_STEP_READS = 122_000
"""What one decode step's weight read costs, in KV-cache tokens read, when the model is not known: that of
Llama-3.1-8B (8.03 G parameters over 2 × 32 layers × 8 KV heads × 128 values per head: 122 k). Other
models: Qwen2.5-7B 265 k, Qwen3-8B 111 k, Llama-3.1-70B 428 k (:func:`step_reads`)."""


def step_reads(parameters: float, layers: int, kv_heads: int, head_dim: int) -> float | None:
    """One decode step's weight read in KV-cache tokens: the model's parameters over the values one token
    adds to the KV cache (a key and a value per layer and KV head); None when any of them is not positive.

    Decoding is memory-bound: a step reads every weight once and, per live response, its context's KV
    cache. A generation worker's decode time is therefore about ``step_reads`` × its decode steps (its
    longest response) + Σ its responses' length² / 2, in units of one KV-cache token read."""
    values_per_token = 2 * layers * kv_heads * head_dim
    if parameters <= 0 or values_per_token <= 0:
        return None
    return float(parameters) / values_per_token


def model_step_reads(model: Any) -> float:
    """:func:`step_reads` of a ``transformers`` model (its ``config`` and ``num_parameters()``), else
    :data:`DEFAULT_STEP_READS` (any other object, or a config without the attention shape)."""
    try:
        config = model.config
        layers = int(config.num_hidden_layers)
        heads = int(config.num_attention_heads)
        kv_heads = int(getattr(config, "num_key_value_heads", None) or heads)
        head_dim = int(getattr(config, "head_dim", None) or int(config.hidden_size) // heads)
        reads = step_reads(float(model.num_parameters()), layers, kv_heads, head_dim)
    except Exception:
        return DEFAULT_STEP_READS
    return DEFAULT_STEP_READS if reads is None else reads


def decode_reads(lengths: Iterable[int], reads_per_step: float = DEFAULT_STEP_READS) -> int:
    """One worker's decode reads in KV-cache tokens: ``reads_per_step`` for each of its decode steps (its
    longest response) plus Σ length² / 2 (each step of a response reads the response so far); see
    :func:`step_reads`. 0 for no response."""
    lengths = list(lengths)
    if not lengths:
        return 0
    return int(reads_per_step * max(lengths)) + sum(length * length for length in lengths) // 2


def mask_decode_reads(mask: Any, reads_per_step: float = DEFAULT_STEP_READS) -> int:
    """:func:`decode_reads` of the responses a 2-D mask marks (row sums are their lengths)."""
    return decode_reads(row_lengths(mask), reads_per_step)


def _scalar(value: Any) -> int:
    return int(value.item() if hasattr(value, "item") else value)


def row_lengths(mask: Any) -> list[int]:
    """Each row's sum of a 2-D mask, in row order: the length of each sequence it marks."""
    if mask is None or rows(mask) == 0:
        return []
    if hasattr(mask, "sum") and not isinstance(mask, list | tuple):
        return as_ints(mask.sum(-1))
    return [total(row) for row in mask]


def busiest_decode_reads(groups: Iterable[Iterable[int]], reads_per_step: float = DEFAULT_STEP_READS) -> int:
    """The largest :func:`decode_reads` of any one group of response lengths, each group being the
    responses one worker decoded: the worker the phase waits for (0 for no group)."""
    return max((decode_reads(group, reads_per_step) for group in groups), default=0)


def contiguous_chunks(lengths: Sequence[int], chunks: int) -> list[Sequence[int]]:
    """``lengths`` split as ``torch.chunk`` (and verl's ``DataProto.chunk``) splits a batch into ``chunks``
    workers: consecutive runs of ⌈n / chunks⌉, the last one shorter (fewer runs when n is small)."""
    if chunks < 1:
        raise ValueError(f"chunks must be positive, not {chunks}")
    size = -(-len(lengths) // chunks)
    return [lengths[start : start + size] for start in range(0, len(lengths), size)] if size else []


def as_ints(values: Any) -> list[int]:
    """The entries of a 1-D tensor, array or list, as ints (lengths kept as floats come back whole)."""
    if values is None:
        return []
    if hasattr(values, "tolist"):
        values = values.tolist()  # one copy out of a tensor or array, not one ``.item()`` per entry
    return [_scalar(value) for value in values]
