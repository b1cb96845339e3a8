"""Arithmetic whose result does not depend on the CPU it runs on.

The controller's decisions hinge on comparisons of estimates (which clock saves more, which allocation meets
the threshold), so a last-bit difference can change a decision, and a changed decision changes the rest of
the run. NumPy's ``exp`` and ``power`` pick a SIMD kernel at run time (AVX-512 and AVX2 give different last
bits), and matrix products and ``linalg`` go through BLAS and LAPACK kernels chosen per CPU (their
summation order, fused multiply-adds). On the decision path the controller therefore uses only operations
IEEE 754 rounds exactly — elementwise ``+ - * /``, ``sqrt``, comparisons, sorting and NumPy's own
sums — and the few things built from them here: an exponential, dot products and a small linear solve.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]

_LN2_HI = 0.6931471803691238
"""ln 2 split in two (Cody-Waite): ``k * _LN2_HI`` is exact for the ``k`` that occur here."""
_LN2_LO = 1.9082149292705877e-10
_INV_LN2 = 1.4426950408889634
_TAYLOR = tuple(1.0 / float(np.prod(np.arange(1, n + 1, dtype=np.float64))) for n in range(14))
"""1/n! for n = 0..13: the Taylor series of exp on |r| ≤ ln 2 / 2 to well within a double's precision."""


def exp(x: FloatArray) -> FloatArray:
    """``e ** x`` elementwise, the same to the last bit on every CPU (relative error ~1e-16).

    Range reduction ``x = k ln 2 + r`` then a Taylor polynomial in Horner form; arguments below -700 give
    0 (the controller only takes exponentials of non-positive numbers: kernel weights and decay).
    """
    values = np.asarray(x, dtype=np.float64)
    clipped = np.clip(values, -700.0, 700.0)
    k = np.floor(clipped * _INV_LN2 + 0.5)
    r = (clipped - k * _LN2_HI) - k * _LN2_LO
    result = np.full(r.shape, _TAYLOR[-1])
    for coefficient in _TAYLOR[-2::-1]:
        result = result * r + coefficient
    scaled = np.ldexp(result, k.astype(np.int64))
    return np.where(values < -700.0, 0.0, scaled)


def dot_rows(matrix: FloatArray, vector: FloatArray) -> FloatArray:
    """``matrix @ vector`` for a 2-D matrix: each row's products summed by NumPy, not by BLAS."""
    return (matrix * vector[None, :]).sum(axis=1)  # type: ignore[no-any-return]


def dot(a: FloatArray, b: FloatArray) -> float:
    """``a @ b`` of two vectors, summed left to right in plain floats."""
    total = 0.0
    for x, y in zip(a.tolist(), b.tolist(), strict=True):
        total += x * y
    return total


def gram(rows: FloatArray) -> FloatArray:
    """``rows.T @ rows``: the products summed over the rows in order."""
    return (rows[:, :, None] * rows[:, None, :]).sum(axis=0)  # type: ignore[no-any-return]


def cross(rows: FloatArray, values: FloatArray) -> FloatArray:
    """``rows.T @ values``: each column's products with ``values`` summed over the rows in order."""
    return (rows * values[:, None]).sum(axis=0)  # type: ignore[no-any-return]


def solve(matrix: FloatArray, rhs: FloatArray) -> FloatArray:
    """Solve ``matrix @ x = rhs`` (``rhs`` one column per right-hand side) for a small, well-posed system.

    Gaussian elimination with partial pivoting in plain Python floats (ties in the pivot go to the lower
    row index): a handful of unknowns, so the cost is a few microseconds and no LAPACK kernel decides it.
    """
    n = len(matrix)
    a = [list(map(float, row)) for row in np.asarray(matrix, dtype=np.float64).tolist()]
    b = [list(map(float, row)) for row in np.asarray(rhs, dtype=np.float64).reshape(n, -1).tolist()]
    width = len(b[0]) if b else 0
    for col in range(n):
        pivot = max(range(col, n), key=lambda row: (abs(a[row][col]), -row))
        if a[pivot][col] == 0.0:
            raise np.linalg.LinAlgError("singular matrix")
        a[col], a[pivot] = a[pivot], a[col]
        b[col], b[pivot] = b[pivot], b[col]
        for row in range(col + 1, n):
            factor = a[row][col] / a[col][col]
            if factor == 0.0:
                continue
            for j in range(col, n):
                a[row][j] -= factor * a[col][j]
            for j in range(width):
                b[row][j] -= factor * b[col][j]
    x = [[0.0] * width for _ in range(n)]
    for row in range(n - 1, -1, -1):
        for j in range(width):
            acc = b[row][j]
            for k in range(row + 1, n):
                acc -= a[row][k] * x[k][j]
            x[row][j] = acc / a[row][row]
    return np.array(x, dtype=np.float64).reshape(np.asarray(rhs).shape)
