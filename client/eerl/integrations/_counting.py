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


def kv_reads(mask: Any) -> int:
    """Σ over the rows of a 2-D mask of (row sum)² / 2: the KV-cache tokens its decode steps read (each
    step of a response reads the response so far)."""
    if mask is None or rows(mask) == 0:
        return 0
    if hasattr(mask, "sum") and not isinstance(mask, list | tuple):
        lengths = mask.sum(-1)
        return _scalar((lengths * lengths).sum()) // 2
    return sum(total(row) ** 2 for row in mask) // 2


def _scalar(value: Any) -> int:
    return int(value.item() if hasattr(value, "item") else value)


def row_lengths(mask: Any) -> list[int]:
    """Each row's sum of a 2-D mask, in row order: the length of each sequence it marks."""
    if mask is None or rows(mask) == 0:
        return []
    if hasattr(mask, "sum") and not isinstance(mask, list | tuple):
        return as_ints(mask.sum(-1))
    return [total(row) for row in mask]


def busiest_kv(groups: Iterable[Iterable[int]]) -> int:
    """The largest Σ length² / 2 of any one group of response lengths: the KV-cache tokens the busiest
    worker's decode steps read, each group being the responses one worker decoded (0 for no group)."""
    return max((sum(length * length for length in group) // 2 for group in groups), default=0)


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
