"""Rotary position embedding: cos/sin tables computed once, applied with ONNX RotaryEmbedding.

The tables cover every position of the bundle's context length, with the checkpoint's rope
scaling (linear, dynamic, llama3, yarn, longrope) folded into the frequencies and the
attention factor, so the graph itself only gathers rows.

longrope keeps two sets of frequencies: transformers rotates with `short_factor` while a call's
largest position id + 1 is at most `original_max_position_embeddings` and with `long_factor`
beyond it, picking one set for the whole call (so keys cached by earlier short calls stay as
they were). A bundle whose context length fits in the original length never reaches the long
set and holds only the short table. A longer bundle holds both, stacked [2, context, d/2], and
gathers one per call from `max(position_ids) + 1 > original`, transformers' own test
(onnxruntime-genai's builder makes the same per-call choice from the attention mask's length,
which is equal without left padding).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.config import RopeConfig
from mobius_genai.config.rope import yarn_mscale
from mobius_genai.ep.context import get_build_dtype


def inverse_frequencies(rope: RopeConfig, rotary_dim: int, long: bool = False) -> np.ndarray:
    """Per-channel-pair rotation frequencies after scaling, float64 [rotary_dim / 2].

    `long` selects longrope's `long_factor` (else its `short_factor`); other types ignore it.
    `frequency_factors` (a GGUF's rope_freqs) divide the result.
    """
    inv_freq = _scaled(rope, rotary_dim, long)
    if rope.frequency_factors is not None:
        return inv_freq / np.asarray(rope.frequency_factors, dtype=np.float64)
    return inv_freq


def _scaled(rope: RopeConfig, rotary_dim: int, long: bool) -> np.ndarray:
    exponents = np.arange(0, rotary_dim, 2, dtype=np.float64) / rotary_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.type == "linear":
        return inv_freq / rope.factor
    if rope.type == "llama3":
        return _llama3(inv_freq, rope)
    if rope.type == "yarn":
        return _yarn(inv_freq, rope, rotary_dim)
    if rope.type == "longrope":
        factors = rope.long_factor if long else rope.short_factor
        return inv_freq / np.asarray(factors, dtype=np.float64)
    if rope.type == "proportional":  # rotary_dim is the whole head
        rotated = int(rope.partial_rotary_factor * rotary_dim // 2)
        return np.where(np.arange(rotary_dim // 2) < rotated, inv_freq, 0.0) / rope.factor
    # "default", and "dynamic" whose frequencies only change past max_position_embeddings.
    return inv_freq


def attention_factor(rope: RopeConfig, long: bool = False) -> float:
    """Scale applied to cos and sin (yarn's and longrope's magnitude correction).

    As in transformers it depends on the checkpoint (`factor`, which for longrope defaults to
    max_position_embeddings / original_max_position_embeddings at parse time), never on the
    bundle's context length, and longrope applies it to the short and the long set alike,
    unless the checkpoint gives each set its own (PhiMoE's `short_mscale` / `long_mscale`,
    selected by `long`).
    """
    mscale = rope.long_mscale if long else rope.short_mscale
    if rope.type == "longrope" and mscale is not None:
        return float(mscale)
    if rope.attention_factor is not None:
        return float(rope.attention_factor)
    if rope.type == "yarn":
        if rope.mscale and rope.mscale_all_dim:
            return yarn_mscale(rope.factor, rope.mscale) / yarn_mscale(
                rope.factor, rope.mscale_all_dim
            )
        return yarn_mscale(rope.factor)
    if rope.type == "longrope":
        original = rope.original_max_position_embeddings
        if rope.factor <= 1.0 or not original:
            return 1.0
        return math.sqrt(1 + math.log(rope.factor) / math.log(original))
    return 1.0


def uses_long_factors(rope: RopeConfig, context_length: int) -> bool:
    """True when a bundle of `context_length` positions can reach longrope's long set."""
    original = rope.original_max_position_embeddings
    return rope.type == "longrope" and original is not None and context_length > original


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

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001
    ramp = np.clip((np.arange(rotary_dim // 2, dtype=np.float64) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    interpolation = inv_freq / rope.factor
    return interpolation * (1 - extrapolation) + inv_freq * extrapolation


def _table(
    rope: RopeConfig, rotary_dim: int, context_length: int, function: np.ufunc, long: bool
) -> np.ndarray:
    """`function` (np.cos or np.sin) of each position's angles, scaled: the float32 table
    [context_length, rotary_dim / 2]."""
    inv_freq = inverse_frequencies(rope, rotary_dim, long)
    angles = np.outer(np.arange(context_length, dtype=np.float64), inv_freq)
    return (function(angles) * attention_factor(rope, long)).astype(np.float32)


@dataclasses.dataclass(frozen=True)
class Rotation:
    """The cos/sin tables of one forward call and how the layers apply them."""

    cos: ir.Value
    sin: ir.Value
    rotary_dim: int
    interleaved: bool
    per_token: bool = False
    """cos/sin are each token's rows [batch, seq, rotary_dim / 2], gathered already (mrope);
    else tables indexed by position_ids."""

    def __call__(self, op, x: ir.Value, position_ids: ir.Value, num_heads: int) -> ir.Value:
        """x: [batch, seq, num_heads * head_dim]; returns the same shape, rotated."""
        return op.RotaryEmbedding(
            x,
            self.cos,
            self.sin,
            *(() if self.per_token else (position_ids,)),
            num_heads=num_heads,
            rotary_embedding_dim=self.rotary_dim,
            interleaved=int(self.interleaved),
        )


class RotaryEmbedding(nn.Module):
    """Rotates the first `rotary_dim` channels of each head by its position.

    The tables are graph constants `cos_cache` / `sin_cache` [context, rotary_dim / 2], shared
    by every layer that uses this rope; a longrope bundle that can reach the long factors
    stacks short and long tables [2, context, rotary_dim / 2] and picks one per call.
    """

    def __init__(self, rope: RopeConfig, rotary_dim: int, context_length: int) -> None:
        super().__init__()
        self.rotary_dim = rotary_dim
        self.interleaved = rope.interleaved
        self.original = rope.original_max_position_embeddings
        self.switched = uses_long_factors(rope, context_length)
        sets = (False, True) if self.switched else (False,)
        dtype = get_build_dtype()
        self.cos_cache = _cache(rope, rotary_dim, context_length, np.cos, sets, dtype)
        self.sin_cache = _cache(rope, rotary_dim, context_length, np.sin, sets, dtype)

    def forward(self, op, position_ids: ir.Value) -> Rotation:
        """The tables for a call at `position_ids` [batch, seq]."""
        if not self.switched:
            return Rotation(self.cos_cache, self.sin_cache, self.rotary_dim, self.interleaved)
        # max(position_ids) + 1 > original  ⇔  max(position_ids) > original - 1
        longest = op.ReduceMax(position_ids, keepdims=0)
        threshold = op.Constant(value=ir.tensor(np.array(self.original - 1, dtype=np.int64)))
        index = op.Cast(op.Greater(longest, threshold), to=ir.DataType.INT64)
        tables = []
        for stacked in (self.cos_cache, self.sin_cache):
            table = op.Gather(stacked, index, axis=0)
            table.shape = ir.Shape(stacked.shape[1:])
            table.dtype = stacked.dtype
            tables.append(table)
        return Rotation(tables[0], tables[1], self.rotary_dim, self.interleaved)


class MultimodalRotaryEmbedding(RotaryEmbedding):
    """Qwen2.5-VL's and Qwen3-VL's mrope: position_ids [3, batch, seq] give each token a
    temporal, a height and a width position, and each channel pair rotates by one of them
    (`channel_axes`: transformers' Qwen2_5_VLRotaryEmbedding, Qwen3VLTextRotaryEmbedding). The
    rows of the same tables are gathered per axis and each channel pair taken from its axis,
    giving each token its own cos/sin rows."""

    def __init__(self, rope: RopeConfig, rotary_dim: int, context_length: int) -> None:
        super().__init__(rope, rotary_dim, context_length)
        self.axes = channel_axes(rope, rotary_dim // 2)

    def forward(self, op, position_ids: ir.Value) -> Rotation:
        """Per-token tables [batch, seq, rotary_dim / 2] for `position_ids` [3, batch, seq]."""
        pairs = len(self.axes)
        # the column of pair j in [batch, seq, 3 · pairs]: its axis' block, then j
        columns = np.asarray(self.axes, dtype=np.int64) * pairs + np.arange(pairs)
        tables = []
        for table in (self.cos_cache, self.sin_cache):
            rows = op.Gather(table, position_ids, axis=0)  # [3, batch, seq, pairs]
            side_by_side = op.Reshape(
                op.Transpose(rows, perm=[1, 2, 0, 3]), op.Constant(value_ints=[0, 0, -1])
            )
            tables.append(op.Gather(side_by_side, op.Constant(value=ir.tensor(columns)), axis=2))
        return Rotation(tables[0], tables[1], self.rotary_dim, self.interleaved, per_token=True)


def channel_axes(rope: RopeConfig, pairs: int) -> list[int]:
    """The position axis (0 temporal, 1 height, 2 width) of each of the `pairs` channel pairs:
    `mrope_section` in turn (section i rotating by axis i % 3), or interleaved (Qwen3-VL): pair
    j takes height where j % 3 == 1 and j < 3 · section 1, width where j % 3 == 2 and
    j < 3 · section 2, temporal otherwise."""
    sections = rope.mrope_section or ()
    if not rope.mrope_interleaved:
        return [index % 3 for index, width in enumerate(sections) for _ in range(width)][:pairs]
    axes = [0] * pairs
    for axis in (1, 2):
        for pair in range(axis, min(3 * sections[axis], pairs), 3):
            axes[pair] = axis
    return axes


def _cache(
    rope: RopeConfig,
    rotary_dim: int,
    context_length: int,
    function: np.ufunc,
    sets: tuple[bool, ...],
    dtype: ir.DataType,
) -> nn.Parameter:
    """The cos or sin table (`function`) as a parameter whose values are computed when the
    model is saved: a long context's tables cost memory only then, after the checkpoint's
    weights were checked. `sets` lists longrope's factor sets (False: short) to stack."""
    name = function.__name__

    def compute() -> ir.Tensor:
        tables = [_table(rope, rotary_dim, context_length, function, long) for long in sets]
        table = tables[0] if len(tables) == 1 else np.stack(tables)
        return ir.Tensor(table.astype(dtype.numpy()), name=name)

    shape = [*([len(sets)] if len(sets) > 1 else []), context_length, rotary_dim // 2]
    data = ir.LazyTensor(compute, dtype=dtype, shape=ir.Shape(shape), name=name)
    return nn.Parameter(shape, dtype=dtype, data=data)
