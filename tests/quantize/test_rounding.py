"""The per-block scale search (`rounding.search_blocks`) against a plain per-block reference.

The reference is the recipe written one block and one candidate at a time with Python scalars
(llama.cpp's make_qkx2_quants candidates, integer zero point, weighted least-squares refit,
rounded again; every third candidate, then the two beside the best), so a vectorization slip (wrong axis, broadcast, candidate grid, tie-breaking) shows up.
"""

from __future__ import annotations

import numpy as np
import pytest

from mobius_genai.quantize.layout import (
    dequantize_blocked_int4,
    dequantize_matmul_nbits,
    quantize_blocked_int4,
    quantize_matmul_nbits,
)
from mobius_genai.quantize.rounding import STEPS, search_blocks


def _reference_block(
    x: np.ndarray, bits: int, symmetric: bool, importance: np.ndarray | None = None
) -> tuple[list[int], float, int]:
    """(q, scale, zero) of one block, searched candidate by candidate."""
    top = 2**bits - 1
    x = [float(v) for v in x.astype(np.float32)]
    rms = (sum(v * v for v in x) / len(x)) ** 0.5
    weights = [rms + abs(v) for v in x]
    if importance is not None:
        weights = [w * float(i) for w, i in zip(weights, importance, strict=True)]
    if symmetric:
        extreme = max(x, key=abs)
        span, levels = -extreme, 2 ** (bits - 1)
    else:
        low = min(min(x), 0.0)
        span, levels = max(max(x), 0.0) - low, top

    def candidate(step: int) -> tuple[float, int]:
        factor = np.float32(levels - 1.0 + 0.1 * step)
        scale = float(np.float32(span) / factor) if span != 0 else 1.0
        zero = 2 ** (bits - 1) if symmetric else min(max(round(-low / scale), 0), top)
        return scale, zero

    def fitted(scale: float, zero: int) -> tuple[float, list[int], float]:
        """Round on `scale`, refit, round again: (error, q, refit scale) of that rounding."""

        def rounded(s: float) -> list[int]:
            return [min(max(round(v / s) + zero, 0), top) for v in x]

        q = rounded(scale)
        den = sum(w * (k - zero) ** 2 for w, k in zip(weights, q, strict=True))
        num = sum(w * (k - zero) * v for w, k, v in zip(weights, q, x, strict=True))
        refit = num / den if den > 0 and num != 0 else scale
        q = rounded(refit)
        error = sum(
            w * (refit * (k - zero) - v) ** 2 for w, k, v in zip(weights, q, x, strict=True)
        )
        return error, q, refit

    best = (float("inf"), [], 0.0, 0, 0)
    for steps in (range(1, STEPS, 3), "fine"):
        if steps == "fine":
            steps = [min(max(best[4] + offset, 0), STEPS - 1) for offset in (-1, 1)]
        for step in steps:
            scale, zero = candidate(step)
            error, q, refit = fitted(scale, zero)
            if error < best[0] * (1 - 1e-6):
                best = (error, q, refit, zero, step)
    return best[1], best[2], best[3]


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("symmetric", [True, False])
def test_search_matches_the_per_block_reference(bits, symmetric):
    rng = np.random.default_rng(0)
    blocks = (rng.standard_t(3, size=(40, 32)) * 0.02).astype(np.float32)
    blocks[0] = 0.0  # an all-zero block
    blocks[1] = np.abs(blocks[1])  # all positive: zero point 0
    ours = search_blocks(blocks, bits, symmetric)
    for index, block in enumerate(blocks):
        q, scale, zero = _reference_block(block, bits, symmetric)
        ours_values = (ours.q[index].astype(np.float64) - ours.zero[index]) * ours.scales[index]
        expected = (np.array(q, np.float64) - zero) * scale
        np.testing.assert_allclose(ours_values, expected, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("symmetric", [True, False])
def test_importance_weights_each_values_error(symmetric):
    """With `importance` the search minimizes the error weighted by it: the reference's
    candidates with those weights, and a different rounding than without."""
    rng = np.random.default_rng(3)
    blocks = (rng.standard_t(3, size=(24, 32)) * 0.02).astype(np.float32)
    importance = rng.lognormal(0.0, 1.5, size=blocks.shape).astype(np.float32)
    ours = search_blocks(blocks, 4, symmetric, importance)
    for index, block in enumerate(blocks):
        q, scale, zero = _reference_block(block, 4, symmetric, importance[index])
        ours_values = (ours.q[index].astype(np.float64) - ours.zero[index]) * ours.scales[index]
        expected = (np.array(q, np.float64) - zero) * scale
        np.testing.assert_allclose(ours_values, expected, rtol=1e-4, atol=1e-7)
    plain = search_blocks(blocks, 4, symmetric)
    assert not np.array_equal(plain.q, ours.q)


def test_importance_per_input_feature_in_the_column_layout():
    """`quantize_matmul_nbits(importance=[K])` gives every column's blocks the importance of
    their k, whatever the slicing."""
    rng = np.random.default_rng(4)
    w = (rng.standard_normal((128, 40)) * 0.02).astype(np.float32)
    importance = rng.lognormal(0.0, 1.0, size=128).astype(np.float32)
    blocks = np.ascontiguousarray(w.T).reshape(-1, 32)
    ours = search_blocks(blocks, 4, False, np.tile(importance.reshape(4, 32), (40, 1)))
    expected = (
        ((ours.q.astype(np.float32) - ours.zero[:, None]) * ours.scales[:, None]).reshape(40, 128).T
    )
    nbits = quantize_matmul_nbits(
        w, 32, False, search=True, chunk_elements=300, importance=importance
    )
    np.testing.assert_array_equal(dequantize_matmul_nbits(nbits, 128), expected)
    with pytest.raises(ValueError, match="importance needs search=True"):
        quantize_matmul_nbits(w, 32, False, importance=importance)


@pytest.mark.parametrize("symmetric", [True, False])
def test_search_has_smaller_error_than_onnxruntimes_round_to_nearest(symmetric):
    w = (np.random.default_rng(1).standard_t(4, size=(256, 64)) * 0.02).astype(np.float32)
    nearest = dequantize_matmul_nbits(quantize_matmul_nbits(w, 32, symmetric), 256)
    searched = dequantize_matmul_nbits(quantize_matmul_nbits(w, 32, symmetric, search=True), 256)
    assert np.mean((searched - w) ** 2) < 0.97 * np.mean((nearest - w) ** 2)


@pytest.mark.parametrize("symmetric", [True, False])
def test_both_layouts_hold_the_searched_values_whatever_the_slicing(symmetric):
    """MatMulNBits and DequantizeLinear layouts dequantize to the same searched weight, and
    slicing the weight (streaming) changes nothing."""
    w = (np.random.default_rng(2).standard_normal((128, 40)) * 0.02).astype(np.float32)
    blocks = np.ascontiguousarray(w.T).reshape(-1, 32)
    ours = search_blocks(blocks, 4, symmetric)
    expected = (
        ((ours.q.astype(np.float32) - ours.zero[:, None]) * ours.scales[:, None]).reshape(40, 128).T
    )
    nbits = quantize_matmul_nbits(w, 32, symmetric, search=True, chunk_elements=300)
    blocked = quantize_blocked_int4(w, 32, symmetric, search=True, chunk_elements=10)
    np.testing.assert_array_equal(dequantize_matmul_nbits(nbits, 128), expected)
    np.testing.assert_array_equal(dequantize_blocked_int4(blocked, 128, 40), expected)


def test_eight_bit_layout_is_one_byte_per_value():
    w = (np.random.default_rng(3).standard_normal((256, 24)) * 0.02).astype(np.float32)
    nbits = quantize_matmul_nbits(w, 128, False, bits=8)
    assert nbits.packed.shape == (24, 2, 128) and nbits.zero_points.shape == (24, 2)
    assert np.abs(dequantize_matmul_nbits(nbits, 256) - w).max() < np.abs(w).max() / 100
