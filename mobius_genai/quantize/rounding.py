"""Per-block rounding that searches the scale (and zero point) minimizing the block's error.

onnxruntime's kernels round to nearest on a grid spanned by the block's min and max (or
absolute max, symmetric). A few outliers then waste most of the 16 levels. `search_blocks`
does what llama.cpp's k-quants do without an importance matrix (`make_qkx2_quants`, the
candidate grid and weights of onnxruntime's own `quant_tensor_k_quant_cpu`): candidate scales
around the min/max one (factors `levels - 1 + i / 10`, i < STEPS; i = 10 is the min/max grid),
each rounding the block and refitting the scale by weighted least squares for those integers,
with weights rms(block) + |w| (large weights matter more). Unlike onnxruntime's k-quant, the
zero point is an integer from the start of each candidate, so the error minimized is the error
of what MatMulNBits computes, not of a continuous offset rounded afterwards.

Each candidate's integers are rounded again on its refit scale, and the error of that second
rounding at the refit scale is the candidate's (scoring the first rounding at its own refit
scale instead, which needs no second rounding, measured worse on SmolLM2's KL:
benchmarks/README.md, "The int4 search's speed"). The error is nearly convex in the scale, so
not every candidate is tried: every third (`_COARSE`), then the two beside each block's best
(`_FINE`); no candidate's integers are kept, the winner's are rounded once more at the end.

Everything is vectorized over blocks, in the column layout: a block is one column of a
[block_size, blocks] array, so each block's scale, zero point and error is one entry of a
[blocks] vector that numpy broadcasts along contiguous rows (in the row layout each of those
operations is a loop of block_size values per block, 2-3x as slow), and the arithmetic runs in
place on reused buffers, `SEARCH_ELEMENTS` values at a time. (A candidate's error from the
refit's weighted sums, s(sΣwq² - 2Σwqx) + Σwx², saves no time over the residual and loses
8-bit blocks' near ties to float32 cancellation.)
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["SEARCH_ELEMENTS", "STEPS", "RoundedBlocks", "search_blocks", "search_columns"]

#: Candidate scales per block: factors `levels - 1 + i / 10` for i in range(STEPS) (llama.cpp).
STEPS = 20
_FIRST, _STEP = -1.0, 0.1
#: The candidates tried first, then the ones at these offsets from each block's best.
_COARSE = tuple(range(1, STEPS, 3))
_FINE = (-1, 1)
#: Values searched together (bounds the temporaries: 256 KiB of float32 each).
SEARCH_ELEMENTS = 1 << 16


@dataclasses.dataclass(frozen=True)
class RoundedBlocks:
    """Integers, scale and zero point per block: w ≈ (q - zero) * scale."""

    q: np.ndarray
    """[blocks, block_size] uint8 in [0, 2**bits - 1]."""
    scales: np.ndarray
    """[blocks] float32."""
    zero: np.ndarray
    """[blocks] uint8 (2**(bits - 1) for every block when symmetric)."""


def search_blocks(
    blocks: np.ndarray, bits: int, symmetric: bool, importance: np.ndarray | None = None
) -> RoundedBlocks:
    """The searched rounding of each row of `blocks` ([blocks, block_size], any float dtype).

    `importance` ([blocks, block_size], non-negative) multiplies each value's weight in the
    error: e.g. the mean square of the activation each weight meets, so that the error
    minimized is closer to the error of the matrix product. The same as `search_columns` of
    the transposed arrays, with `q` transposed back.
    """
    weight = None if importance is None else np.asarray(importance).T
    rounded = search_columns(np.asarray(blocks).T, bits, symmetric, weight)
    return dataclasses.replace(rounded, q=np.ascontiguousarray(rounded.q.T))


def search_columns(
    columns: np.ndarray, bits: int, symmetric: bool, importance: np.ndarray | None = None
) -> RoundedBlocks:
    """The searched rounding of each column of `columns` ([block_size, blocks], any float
    dtype, any strides); `q` of the result is [block_size, blocks] and `importance`
    ([block_size, blocks]) as in `search_blocks`. Columns are searched `SEARCH_ELEMENTS`
    values at a time, so the search's temporaries stay small (about six float32 copies of one
    slice) whatever the number of blocks.
    """
    size, count = columns.shape
    q = np.zeros((size, count), np.uint8)
    scales = np.zeros(count, np.float32)
    zero = np.zeros(count, np.uint8)
    step = max(1, SEARCH_ELEMENTS // max(size, 1))
    for start in range(0, count, step):
        part = slice(start, min(count, start + step))
        weight = None if importance is None else importance[:, part]
        q[:, part], scales[part], zero[part] = _search(columns[:, part], bits, symmetric, weight)
    return RoundedBlocks(q=q, scales=scales, zero=zero)


def _search(
    columns: np.ndarray, bits: int, symmetric: bool, importance: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.ascontiguousarray(columns, np.float32)
    top = 2**bits - 1
    weights = np.abs(x)
    weights += np.sqrt(_column_dot(x, x) / x.shape[0])
    if importance is not None:
        weights *= importance
    if symmetric:
        middle = 2 ** (bits - 1)
        # the signed value of largest magnitude goes to -middle, as onnxruntime's kernel does
        extreme = np.take_along_axis(x, np.argmax(np.abs(x), axis=0)[None], axis=0)
        grid = _Grid(-extreme[0], None, middle, top)
    else:
        low = np.minimum(x.min(axis=0), 0)
        grid = _Grid(np.maximum(x.max(axis=0), 0) - low, low, top, top)
    work = _Scratch(x, weights, top)
    best = _Best(x.shape[1])
    for step in _COARSE:
        best.offer(step, *work.fit(*grid.candidate(step)))
    coarse = best.step.copy()
    for offset in _FINE:
        step = np.clip(coarse + offset, 0, STEPS - 1)
        best.offer(step, *work.fit(*grid.candidate(step)))
    _, zero = grid.candidate(best.step)
    q = np.add(work.shifted(best.scale, zero), zero, out=work.q)
    return q.astype(np.uint8), best.scale, zero.astype(np.uint8)


def _column_dot(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Σ a * b per column, without the product's temporary."""
    return np.einsum("ij,ij->j", a, b)


class _Grid:
    """The candidate scales (and zero points) of each block: `span / factor(step)`."""

    def __init__(self, span: np.ndarray, low: np.ndarray | None, levels: int, top: int) -> None:
        self.span, self.low, self.levels, self.top = span, low, levels, top

    def candidate(self, step: int | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Scale and zero point per block for candidate `step` (one, or one per block)."""
        factor = self.levels + _FIRST + _STEP * np.asarray(step, np.float32)
        scale = np.where(self.span != 0, self.span / factor, 1).astype(np.float32)
        if self.low is None:
            return scale, np.full(scale.shape, (self.top + 1) // 2, np.float32)
        return scale, np.clip(np.round(-self.low / scale), 0, self.top).astype(np.float32)


class _Best:
    """The best candidate of each block so far: its step, error and refit scale."""

    def __init__(self, count: int) -> None:
        self.step = np.zeros(count, np.int64)
        self.error = np.full(count, np.inf, np.float32)
        self.scale = np.zeros(count, np.float32)

    def offer(self, step: int | np.ndarray, error: np.ndarray, refit: np.ndarray) -> None:
        better = error < self.error
        self.step = np.where(better, step, self.step)
        self.error = np.where(better, error, self.error)
        self.scale = np.where(better, refit, self.scale)


class _Scratch:
    """The per-candidate arithmetic of `_search` on reused [block_size, blocks] buffers."""

    def __init__(self, x: np.ndarray, weights: np.ndarray, top: int) -> None:
        self.x, self.weights, self.top = x, weights, top
        self.q = np.empty_like(x)
        self.product = np.empty_like(x)

    def shifted(self, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
        """The integers rounded on `scale`, minus the zero point: clip(round(x / scale),
        -zero, top - zero) per block, into a reused buffer."""
        np.multiply(self.x, 1 / scale, out=self.q)
        np.rint(self.q, out=self.q)
        np.maximum(self.q, -zero, out=self.q)
        return np.minimum(self.q, self.top - zero, out=self.q)

    def _sums(self, shifted: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Σw q² and Σw q x per block, q the `shifted` integers."""
        np.multiply(self.weights, shifted, out=self.product)
        return _column_dot(self.product, shifted), _column_dot(self.product, self.x)

    def fit(self, scale: np.ndarray, zero: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Round on `scale`, refit the scale by weighted least squares (`scale` where there
        is nothing to fit: a block rounded to its zero point), round again on it: the
        weighted error of that rounding at the refit scale, and the refit scale."""
        denominator, numerator = self._sums(self.shifted(scale, zero))
        fitted = (denominator > 0) & (numerator != 0)
        refit = np.where(fitted, numerator / np.where(fitted, denominator, 1), scale)
        refit = refit.astype(np.float32)
        residual = np.multiply(self.shifted(refit, zero), refit, out=self.q)
        np.subtract(residual, self.x, out=residual)
        np.multiply(self.weights, residual, out=self.product)
        return _column_dot(self.product, residual), refit
