"""Token counting on framework batches without importing a tensor library.

The hooks see PyTorch tensors (or NumPy arrays, or lists) but ``eerl`` must not import them; these helpers
rely only on what such objects share: ``.sum()``, ``.item()``, ``.shape`` and iteration.
"""

from __future__ import annotations

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
