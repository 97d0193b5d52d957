"""Per-block rounding that searches the scale (and zero point) minimizing the block's error.

onnxruntime's kernels round to nearest on a grid spanned by the block's min and max (or
absolute max, symmetric). A few outliers then waste most of the 16 levels. `search_blocks`
does what llama.cpp's k-quants do without an importance matrix (`make_qkx2_quants`, the
candidate grid and weights of onnxruntime's own `quant_tensor_k_quant_cpu`): for each of
`STEPS` candidate scales around the min/max one it rounds the block, refits the scale by
weighted least squares for those integers, rounds again and keeps the candidate with the
smallest weighted squared error, with weights rms(block) + |w| (large weights matter more).
Unlike onnxruntime's k-quant, the zero point is an integer from the start of each candidate,
so the error minimized is the error of what MatMulNBits computes, not of a continuous offset
rounded afterwards. Candidate 10 starts from onnxruntime's min/max (absolute max) grid.

Everything is vectorized over blocks: a block is one row of a [blocks, block_size] array, and
the arithmetic runs in place on reused buffers with row sums as matrix products (~0.1 s per
million weights on one core, 1.5x the plain numpy expressions; their float sums differ in the
last bits, which flips a near tie in about one block in 30,000).
"""

from __future__ import annotations

import dataclasses

import numpy as np

__all__ = ["SEARCH_ELEMENTS", "STEPS", "RoundedBlocks", "search_blocks"]

#: Candidate scales per block: factors `levels - 1 + i / 10` for i in range(STEPS) (llama.cpp).
STEPS = 20
_FIRST, _STEP = -1.0, 0.1
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
    minimized is closer to the error of the matrix product. Rows are searched
    `SEARCH_ELEMENTS` values at a time, so the search's temporaries stay small (about ten
    float32 copies of one slice) whatever the number of blocks.
    """
    count, size = blocks.shape
    q = np.zeros((count, size), np.uint8)
    scales = np.zeros(count, np.float32)
    zero = np.zeros(count, np.uint8)
    step = max(1, SEARCH_ELEMENTS // max(size, 1))
    for start in range(0, count, step):
        rows = slice(start, min(count, start + step))
        weight = None if importance is None else importance[rows]
        q[rows], scales[rows], zero[rows] = _search(blocks[rows], bits, symmetric, weight)
    return RoundedBlocks(q=q, scales=scales, zero=zero)


def _search(
    blocks: np.ndarray, bits: int, symmetric: bool, importance: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    x = np.asarray(blocks, np.float32)
    top = 2**bits - 1
    weights = np.sqrt(np.mean(x * x, axis=1, keepdims=True)) + np.abs(x)
    if importance is not None:
        weights *= importance
    if symmetric:
        middle = 2 ** (bits - 1)
        # the signed value of largest magnitude goes to -middle, as onnxruntime's kernel does
        extreme = np.take_along_axis(x, np.argmax(np.abs(x), axis=1)[:, None], axis=1)
        span, zero = -extreme, np.full((len(x), 1), middle, np.float32)
    else:
        low = np.minimum(x.min(axis=1, keepdims=True), 0)
        span, zero = np.maximum(x.max(axis=1, keepdims=True), 0) - low, None
    best_error = np.full((len(x), 1), np.inf, np.float32)
    best_q = np.zeros(x.shape, np.float32)
    best_scale = np.zeros((len(x), 1), np.float32)
    best_zero = np.zeros((len(x), 1), np.float32)
    levels = 2 ** (bits - 1) if symmetric else top
    work = _Scratch(x, weights, top)
    for step in range(STEPS):
        factor = levels + _FIRST + _STEP * step
        scale = np.where(span != 0, span / factor, 1).astype(np.float32)
        candidate_zero = zero if symmetric else np.clip(np.round(-low / scale), 0, top)
        q, scale = work.round_and_refit(scale, candidate_zero)
        error = work.error(q, scale, candidate_zero)
        better = (error < best_error)[:, 0]
        best_error[better] = error[better]
        best_q[better] = q[better]
        best_scale[better] = scale[better]
        best_zero[better] = np.broadcast_to(candidate_zero, best_zero.shape)[better]
    return best_q.astype(np.uint8), best_scale[:, 0], best_zero[:, 0].astype(np.uint8)


class _Scratch:
    """The per-candidate arithmetic of `_search` on reused [blocks, block_size] buffers (the
    same operations in the same order as plain numpy expressions, without their temporaries)."""

    def __init__(self, x: np.ndarray, weights: np.ndarray, top: int) -> None:
        self.x, self.weights, self.top = x, weights, top
        self.q = np.empty_like(x)
        self.shifted = np.empty_like(x)
        self.product = np.empty_like(x)
        # a row sum as a matrix product: numpy's sum along a short last axis is ten times slower
        self.ones = np.ones((x.shape[1], 1), np.float32)

    def _round(self, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
        """clip(round(x / scale) + zero, 0, top) into `self.q`."""
        np.divide(self.x, scale, out=self.q)
        np.round(self.q, out=self.q)
        np.add(self.q, zero, out=self.q)
        return np.clip(self.q, 0, self.top, out=self.q)

    def _weighted_sum(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """sum(weights * a * b) per block."""
        np.multiply(self.weights, a, out=self.product)
        np.multiply(self.product, b, out=self.product)
        return self.product @ self.ones

    def round_and_refit(self, scale: np.ndarray, zero: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Round on `scale`, refit the scale by weighted least squares, round again on it."""
        q = self._round(scale, zero)
        np.subtract(q, zero, out=self.shifted)
        denominator = self._weighted_sum(self.shifted, self.shifted)
        numerator = self._weighted_sum(self.shifted, self.x)
        positive = denominator > 0
        refit = np.where(positive, numerator / np.where(positive, denominator, 1), scale)
        refit = np.where(refit != 0, refit, scale).astype(np.float32)
        return self._round(refit, zero), refit

    def error(self, q: np.ndarray, scale: np.ndarray, zero: np.ndarray) -> np.ndarray:
        """sum(weights * (scale * (q - zero) - x) ** 2) per block."""
        np.subtract(q, zero, out=self.product)
        np.multiply(scale, self.product, out=self.product)
        np.subtract(self.product, self.x, out=self.product)
        np.square(self.product, out=self.product)
        np.multiply(self.weights, self.product, out=self.product)
        return self.product @ self.ones
