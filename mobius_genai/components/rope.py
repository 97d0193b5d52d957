"""Rotary position embedding: cos/sin tables computed once, applied with ONNX RotaryEmbedding.

The tables cover every position of the bundle's context length, with the checkpoint's rope
scaling (linear, dynamic, llama3, yarn, longrope) folded into the frequencies and the
attention factor, so the graph itself only gathers rows.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.config import RopeConfig
from mobius_genai.ep.context import get_build_dtype


def inverse_frequencies(rope: RopeConfig, rotary_dim: int, context_length: int) -> np.ndarray:
    """Per-channel-pair rotation frequencies after scaling, float64 [rotary_dim / 2]."""
    exponents = np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.type == "linear":
        return inv_freq / rope.factor
    if rope.type == "llama3":
        return _llama3(inv_freq, rope)
    if rope.type == "yarn":
        return _yarn(inv_freq, rope, rotary_dim)
    if rope.type == "longrope":
        original = rope.original_max_position_embeddings or context_length
        factors = rope.long_factor if context_length > original else rope.short_factor
        return inv_freq / np.asarray(factors, dtype=np.float64)
    # "default", and "dynamic" whose frequencies only change past max_position_embeddings.
    return inv_freq


def attention_factor(rope: RopeConfig, context_length: int) -> float:
    """Scale applied to cos and sin (yarn's and longrope's magnitude correction)."""
    if rope.attention_factor is not None:
        return float(rope.attention_factor)
    if rope.type == "yarn":
        return 0.1 * math.log(rope.factor) + 1.0 if rope.factor > 1 else 1.0
    if rope.type == "longrope":
        original = rope.original_max_position_embeddings or context_length
        scale = context_length / original
        if scale <= 1.0:
            return 1.0
        return math.sqrt(1 + math.log(scale) / math.log(original))
    return 1.0


def _llama3(inv_freq: np.ndarray, rope: RopeConfig) -> np.ndarray:
    original = rope.original_max_position_embeddings or 8192
    low_wavelen = original / rope.low_freq_factor
    high_wavelen = original / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (original / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    medium = (wavelen >= high_wavelen) & (wavelen <= low_wavelen)
    return np.where(medium, smoothed, scaled)


def _yarn(inv_freq: np.ndarray, rope: RopeConfig, rotary_dim: int) -> np.ndarray:
    original = rope.original_max_position_embeddings or 4096

    def correction_dim(rotations: float) -> float:
        return (rotary_dim * math.log(original / (rotations * 2 * math.pi))) / (
            2 * math.log(rope.theta)
        )

    low = max(math.floor(correction_dim(rope.beta_fast)), 0)
    high = min(math.ceil(correction_dim(rope.beta_slow)), rotary_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    interpolation = inv_freq / rope.factor
    return interpolation * (1 - extrapolation) + inv_freq * extrapolation


def cos_sin_tables(
    rope: RopeConfig, rotary_dim: int, context_length: int
) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin tables [context_length, rotary_dim / 2] in float32."""
    inv_freq = inverse_frequencies(rope, rotary_dim, context_length)
    angles = np.outer(np.arange(context_length, dtype=np.float64), inv_freq)
    scale = attention_factor(rope, context_length)
    return (np.cos(angles) * scale).astype(np.float32), (np.sin(angles) * scale).astype(np.float32)


class RotaryEmbedding(nn.Module):
    """Rotates the first `rotary_dim` channels of each head by its position.

    The tables are graph constants named `cos_cache` / `sin_cache`, shared by every layer.
    """

    def __init__(self, rope: RopeConfig, rotary_dim: int, context_length: int) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim
        self.interleaved = rope.interleaved
        cos, sin = cos_sin_tables(rope, rotary_dim, context_length)
        dtype = get_build_dtype()
        self.cos_cache = nn.Parameter(cos.shape, dtype=dtype, data=_tensor(cos, dtype, "cos"))
        self.sin_cache = nn.Parameter(sin.shape, dtype=dtype, data=_tensor(sin, dtype, "sin"))

    def forward(self, op, x: ir.Value, position_ids: ir.Value, num_heads: int) -> ir.Value:
        """x: [batch, seq, num_heads * head_dim]; returns the same shape."""
        return op.RotaryEmbedding(
            x,
            self.cos_cache,
            self.sin_cache,
            position_ids,
            num_heads=num_heads,
            rotary_embedding_dim=self.rotary_dim,
            interleaved=int(self.interleaved),
        )


def _tensor(array: np.ndarray, dtype: ir.DataType, name: str) -> ir.Tensor:
    return ir.Tensor(array.astype(dtype.numpy()), name=name)
