"""Qwen2.5-VL's vision tower (and Qwen2-VL's, the same tower without windows), for one image
(or video clip) per call.

    patches   pixel_values [P, C·T·p²] @ the Conv3d weight as a [hidden, C·T·p²] matrix
    windows   merged tokens (m x m patches, consecutive rows) sorted by window, row-major
              windows of `window_tokens`² tokens within each frame (transformers'
              get_vision_window_index); patches and their 2-D rotary follow that order
    block     h = x + proj(attn(norm(x))), out = h + mlp(norm(h)); attention within a window,
              or within a frame for `fullatt_block_indexes`: each window (frame) one sequence
              of com.microsoft::PackedMultiHeadAttention, a Tier-1 op whose standard body
              InlinePass expands for an EP without the kernel; q and k rotated by (row,
              column) of each patch. Qwen2.5-VL: RMSNorm and SwiGLU; Qwen2-VL: LayerNorm and
              fc1 → act → fc2 (the config's `norm_type` and `gated_mlp`)
    merger    norm, m² patches of a token concatenated, Linear → GELU → Linear, tokens put
              back in image order (the inverse of the window order)

The window order only changes which rows are neighbours: it makes each window a contiguous
run, the layout packed (variable-length) attention needs. The sequences are the runs of the
sorted window ids, so they are right only for patches in that order. A tower without windows
(Qwen2-VL's) keeps the patches in pixel_values' order, each frame one sequence.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import Linear, parameter
from mobius_genai.components.mlp import FCMLP, GatedMLP
from mobius_genai.components.norms import make_norm
from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.config.qwen3_vision import Qwen3VisionConfig
from mobius_genai.config.qwen_vision import QwenVisionConfig
from mobius_genai.ep.context import get_build_dtype

_INT64_MAX = 2**63 - 1


def _ints(op, *values: int) -> ir.Value:
    return op.Constant(value_ints=list(values))


def _int(op, value: int) -> ir.Value:
    return op.Constant(value_int=value)


def _grid_sizes(op, grid: ir.Value) -> tuple[ir.Value, ...]:
    """The scalars t, h, w of image_grid_thw [1, 3] (frames, rows and columns of patches)."""
    return tuple(op.Squeeze(op.Slice(grid, _ints(op, 0, i), _ints(op, 1, i + 1))) for i in range(3))


class FrameLayout:
    """Each patch's frame, row and column for image_grid_thw [1, 3] = (t, h, w) patches, in
    pixel_values' order: frames, then merged tokens row-major, then the m x m patches of each."""

    def __init__(self, op, grid: ir.Value, merge: int) -> None:
        t, h, w = _grid_sizes(op, grid)
        area = op.Mul(h, w)
        patches = op.Range(_int(op, 0), op.Mul(t, area), _int(op, 1))
        self.frame = op.Div(patches, area)
        within = op.Mod(patches, area)
        square = _int(op, merge * merge)
        block = op.Div(within, square)
        blocks_per_row = op.Div(w, _int(op, merge))
        inside = op.Mod(within, square)
        self.row = op.Add(
            op.Mul(op.Div(block, blocks_per_row), _int(op, merge)), op.Div(inside, _int(op, merge))
        )
        self.col = op.Add(
            op.Mul(op.Mod(block, blocks_per_row), _int(op, merge)), op.Mod(inside, _int(op, merge))
        )
        self.height, self.width = h, w


class WindowLayout:
    """The order of one image's patches and the groups they attend within, computed in the
    graph from image_grid_thw [1, 3] = (t, h, w) patches."""

    def __init__(self, op, grid: ir.Value, config: QwenVisionConfig) -> None:
        merge, side = config.spatial_merge_size, config.window_tokens
        self.merge = merge
        t, h, w = _grid_sizes(op, grid)
        rows, cols = op.Div(h, _int(op, merge)), op.Div(w, _int(op, merge))
        units = op.Range(_int(op, 0), op.Mul(t, op.Mul(rows, cols)), _int(op, 1))
        frame = op.Div(units, op.Mul(rows, cols))
        row = op.Mod(op.Div(units, cols), rows)
        col = op.Mod(units, cols)
        windows_per_row = op.Add(op.Div(cols, _int(op, side)), _int(op, 1))
        windows_per_frame = op.Mul(
            op.Add(op.Div(rows, _int(op, side)), _int(op, 1)), windows_per_row
        )
        window = op.Add(
            op.Mul(frame, windows_per_frame),
            op.Add(
                op.Mul(op.Div(row, _int(op, side)), windows_per_row), op.Div(col, _int(op, side))
            ),
        )
        inside = op.Add(
            op.Mul(op.Mod(row, _int(op, side)), _int(op, side)), op.Mod(col, _int(op, side))
        )
        key = op.Add(op.Mul(window, _int(op, side * side)), inside)
        count = op.Reshape(op.Size(units), _ints(op, 1))
        _, self.order = op.TopK(key, count, largest=0, sorted=1, _outputs=2)  # window_index
        _, self.inverse = op.TopK(self.order, count, largest=0, sorted=1, _outputs=2)
        self.row = self._patches(op, op.Gather(row, self.order), axis=0)
        self.col = self._patches(op, op.Gather(col, self.order), axis=1)
        self.window = self._repeat(op, op.Gather(window, self.order))
        self.frame = self._repeat(op, op.Gather(frame, self.order))
        self.patch_order = self._patches(op, self.order, axis=None)

    def _repeat(self, op, per_token: ir.Value) -> ir.Value:
        """[tokens] → [tokens · m²]: each merged token's value for each of its patches."""
        square = self.merge * self.merge
        tiled = op.Expand(op.Unsqueeze(per_token, _ints(op, 1)), _ints(op, 1, square))
        return op.Reshape(tiled, _ints(op, -1))

    def _patches(self, op, per_token: ir.Value, axis: int | None) -> ir.Value:
        """Patch values from token values: the row (axis 0) or column (axis 1) of each patch
        in the image, or (None) each patch's row index in pixel_values."""
        merge = self.merge
        offsets = np.arange(merge * merge, dtype=np.int64)
        offsets = {0: offsets // merge, 1: offsets % merge, None: offsets}[axis]
        scale = merge * merge if axis is None else merge
        base = op.Unsqueeze(op.Mul(per_token, _int(op, scale)), _ints(op, 1))
        table = op.Constant(value=ir.tensor(offsets[None]))
        return op.Reshape(op.Add(base, table), _ints(op, -1))


def _run_starts(op, groups: ir.Value) -> ir.Value:
    """[runs] int64: where each run of equal ids starts in `groups` (nondecreasing)."""
    previous = op.Concat(_ints(op, -1), op.Slice(groups, _ints(op, 0), _ints(op, -1)), axis=0)
    return op.Reshape(op.NonZero(op.Not(op.Equal(groups, previous))), _ints(op, -1))


class PackedSequences:
    """PackedMultiHeadAttention's cumulative_sequence_length [runs + 1] and token_offset
    [runs, longest] (int32) for patches grouped into runs of equal ids: each run a sequence
    (transformers' cu_seqlens, without its empty windows), token_offset the padded position of
    each patch in packed order, then those of the padding (components/attention_bodies.py)."""

    def __init__(self, op, groups: ir.Value) -> None:
        total = op.Reshape(op.Size(groups), _ints(op, 1))
        bounds = op.Concat(_run_starts(op, groups), total, axis=0)
        ends = op.Slice(bounds, _ints(op, 1), _ints(op, _INT64_MAX))
        lengths = op.Sub(ends, op.Slice(bounds, _ints(op, 0), _ints(op, -1)))
        longest = op.ReduceMax(lengths, keepdims=1)
        runs = op.Shape(lengths)
        slots = op.Range(_int(op, 0), op.Squeeze(op.Mul(runs, longest)), _int(op, 1))
        row, column = op.Div(slots, longest), op.Mod(slots, longest)
        real = op.Less(column, op.Gather(lengths, row))
        order = op.Concat(op.NonZero(real), op.NonZero(op.Not(real)), axis=1)
        layout = op.Concat(runs, longest, axis=0)
        self.token_offset = op.Cast(op.Reshape(order, layout), to=ir.DataType.INT32)
        self.cumulative = op.Cast(bounds, to=ir.DataType.INT32)


class AxialRotary:
    """cos/sin rows [1, P, head_dim / 2] of each patch: (row, column) positions times the
    same frequencies, row half then column half (transformers' axial rope)."""

    def __init__(self, op, layout, config: QwenVisionConfig | Qwen3VisionConfig) -> None:
        half = config.head_dim // 2
        inv_freq = 1.0 / config.rope_theta ** (np.arange(0, half, 2, dtype=np.float64) / half)
        frequencies = op.Constant(value=ir.tensor(inv_freq.astype(np.float32)[None]))
        angles = [
            op.Mul(op.Unsqueeze(op.Cast(axis, to=ir.DataType.FLOAT), _ints(op, 1)), frequencies)
            for axis in (layout.row, layout.col)
        ]
        angle = op.Unsqueeze(op.Concat(*angles, axis=-1), _ints(op, 0))
        dtype = get_build_dtype()
        self.cos = op.Cast(op.Cos(angle), to=dtype)
        self.sin = op.Cast(op.Sin(angle), to=dtype)


class QwenVisionAttention(nn.Module):
    """Packed qkv projection, 2-D rotary on q and k, attention within each packed sequence
    (com.microsoft::PackedMultiHeadAttention, a Tier-1 op: its standard body is inlined for an
    EP without the kernel), proj."""

    def __init__(self, config: QwenVisionConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_heads
        self.qkv = Linear(hidden, 3 * hidden, bias=True)
        self.proj = Linear(hidden, hidden, bias=True)

    def forward(self, op, x: ir.Value, rotary: AxialRotary, sequences: PackedSequences) -> ir.Value:
        q, k, v = op.Split(self.qkv(op, x), num_outputs=3, axis=-1, _outputs=3)
        q, k = (
            op.RotaryEmbedding(t, rotary.cos, rotary.sin, num_heads=self.num_heads) for t in (q, k)
        )
        batch = _ints(op, 0)
        output = op.PackedMultiHeadAttention(
            *(op.Squeeze(t, batch) for t in (q, k, v)),
            None,
            sequences.token_offset,
            sequences.cumulative,
            num_heads=self.num_heads,
            _domain=MS_DOMAIN,
        )
        output.type = x.type  # what onnxruntime's schema infers: [patches, hidden]
        return self.proj(op, op.Unsqueeze(output, batch))


class QwenVisionBlock(nn.Module):
    def __init__(self, config: QwenVisionConfig) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.norm_eps
        self.norm1 = make_norm(config.norm_type, hidden, eps)
        self.attn = QwenVisionAttention(config)
        self.norm2 = make_norm(config.norm_type, hidden, eps)
        mlp = GatedMLP if config.gated_mlp else FCMLP
        self.mlp = mlp(hidden, config.intermediate_size, config.hidden_act, bias=True)

    def forward(self, op, x: ir.Value, rotary: AxialRotary, sequences: PackedSequences) -> ir.Value:
        x = op.Add(x, self.attn(op, self.norm1(op, x), rotary, sequences))
        return op.Add(x, self.mlp(op, self.norm2(op, x)))


class _PatchEmbed(nn.Module):
    """Conv3d with kernel = stride = one patch, as a MatMul over flattened patches."""

    def __init__(self, config: QwenVisionConfig | Qwen3VisionConfig, bias: bool) -> None:
        super().__init__()
        self.hidden = config.hidden_size
        size, frames = config.patch_size, config.temporal_patch_size
        self.weight = parameter([config.hidden_size, config.in_channels, frames, size, size])
        self.bias = parameter([config.hidden_size]) if bias else None

    def forward(self, op, pixel_values: ir.Value) -> ir.Value:
        matrix = op.Reshape(self.weight, _ints(op, self.hidden, -1))
        patches = op.MatMul(pixel_values, op.Transpose(matrix, perm=[1, 0]))
        return patches if self.bias is None else op.Add(patches, self.bias)


class PatchEmbedding(nn.Module):
    """Holds `proj` so the weight is `patch_embed.proj.weight`, as stored (Qwen3-VL's Conv3d
    has a bias, Qwen2.5-VL's none)."""

    def __init__(self, config: QwenVisionConfig | Qwen3VisionConfig, bias: bool = False) -> None:
        super().__init__()
        self.proj = _PatchEmbed(config, bias)

    def forward(self, op, pixel_values: ir.Value) -> ir.Value:
        return self.proj(op, pixel_values)


class _Gelu(nn.Module):
    def forward(self, op, x: ir.Value) -> ir.Value:
        return op.Gelu(x)


class PatchMerger(nn.Module):
    def __init__(self, config: QwenVisionConfig) -> None:
        super().__init__()
        self.merged = config.hidden_size * config.spatial_merge_size**2
        self.ln_q = make_norm(config.norm_type, config.hidden_size, config.norm_eps)
        # Linear → GELU → Linear under transformers' nn.Sequential names (mlp.0, mlp.2)
        self.mlp = nn.ModuleList(
            [
                Linear(self.merged, self.merged, bias=True),
                _Gelu(),
                Linear(self.merged, config.out_hidden_size, bias=True),
            ]
        )

    def forward(self, op, x: ir.Value) -> ir.Value:
        x = op.Reshape(self.ln_q(op, x), _ints(op, -1, self.merged))
        for module in self.mlp:
            x = module(op, x)
        return x


class QwenVisionTower(nn.Module):
    """(pixel_values [P, C·T·p²], image_grid_thw [1, 3]) → image tokens [P / m², out_hidden]
    in image order; module names follow transformers' (`visual.blocks.0.attn.qkv`, ...)."""

    def __init__(self, config: QwenVisionConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbedding(config)
        self.blocks = nn.ModuleList([QwenVisionBlock(config) for _ in range(config.depth)])
        self.merger = PatchMerger(config)

    def forward(self, op, pixel_values: ir.Value, grid: ir.Value) -> ir.Value:
        config = self.config
        patches = self.patch_embed(op, pixel_values)
        if config.window_size is None:
            layout, windows = FrameLayout(op, grid, config.spatial_merge_size), None
        else:
            layout = WindowLayout(op, grid, config)
            patches = op.Gather(patches, layout.patch_order, axis=0)
            windows = PackedSequences(op, layout.window)
        x = op.Unsqueeze(patches, _ints(op, 0))
        rotary = AxialRotary(op, layout, config)
        frames = PackedSequences(op, layout.frame)
        for index, block in enumerate(self.blocks):
            x = block(op, x, rotary, frames if config.full_attention(index) else windows)
        merged = self.merger(op, op.Squeeze(x, _ints(op, 0)))
        return merged if windows is None else op.Gather(merged, layout.inverse, axis=0)
