"""Qwen3-VL's vision tower, for one image (or video clip) per call.

    patches   pixel_values [P, C·T·p²] @ the Conv3d weight + bias (Qwen2.5-VL's patch embed)
              + a learned position embedding: the square grid `pos_embed` resampled to the
              image's (h, w) patches, bilinear with aligned corners (transformers'
              get_vision_interpolation_indices_and_weights: 4 taps per patch)
    block     h = x + proj(attn(LayerNorm(x))), out = h + fc2(act(fc1(LayerNorm(h)))); attention
              within each frame (com.microsoft::PackedMultiHeadAttention, a Tier-1 op, one
              sequence per frame); q and k rotated by (row, column) of each patch (2-D rope)
    merger    LayerNorm, m² patches of a token concatenated, Linear → GELU → Linear
    DeepStack after each block of `deepstack_visual_indexes`, a merger of its own (LayerNorm
              after the m² patches are concatenated) gives that block's tokens

Patches arrive in merge-block order (the m² patches of a merged token consecutive), so no
reordering is needed and merged tokens come out in image order. The output is the merger's
tokens and the DeepStack mergers' side by side, [P / m², out_hidden · (1 + deepstack)]: the
embedding graph carries them to the decoder, which adds the k-th DeepStack part to its hidden
states after its layer k (components/deepstack.py).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import Linear, parameter
from mobius_genai.components.mlp import activation
from mobius_genai.components.norms import LayerNorm
from mobius_genai.components.qwen_vision import (
    AxialRotary,
    FrameLayout,
    PackedSequences,
    PatchEmbedding,
    QwenVisionAttention,
)
from mobius_genai.config.qwen3_vision import Qwen3VisionConfig
from mobius_genai.ep.context import get_build_dtype


def _ints(op, *values: int) -> ir.Value:
    return op.Constant(value_ints=list(values))


def _int(op, value: int) -> ir.Value:
    return op.Constant(value_int=value)


def _float(op, value: float) -> ir.Value:
    return op.Constant(value_float=value)


class _PositionGrid(nn.Module):
    """`pos_embed` [side², hidden] resampled to each patch: bilinear, aligned corners."""

    def __init__(self, config: Qwen3VisionConfig) -> None:
        super().__init__()
        self.side = config.grid_side
        self.weight = parameter([config.num_position_embeddings, config.hidden_size])

    def _axis(self, op, index: ir.Value, size: ir.Value) -> tuple[ir.Value, ir.Value]:
        """Taps [P, 2] int64 and weights [P, 2] float32 along one axis of `size` patches."""
        side = self.side
        to_float = ir.DataType.FLOAT
        spread = op.Max(op.Sub(op.Cast(size, to=to_float), _float(op, 1.0)), _float(op, 1.0))
        source = op.Div(op.Mul(op.Cast(index, to=to_float), _float(op, side - 1.0)), spread)
        floor = op.Floor(source)
        offsets = np.array([[0, 1]], dtype=np.int64)
        raw = op.Add(
            op.Unsqueeze(op.Cast(floor, to=ir.DataType.INT64), _ints(op, 1)),
            op.Constant(value=ir.tensor(offsets)),
        )
        taps = op.Clip(raw, _int(op, 0), _int(op, side - 1))
        distance = op.Abs(
            op.Sub(
                op.Unsqueeze(op.Sub(source, floor), _ints(op, 1)),
                op.Constant(value=ir.tensor(offsets.astype(np.float32))),
            )
        )
        return taps, op.Relu(op.Sub(_float(op, 1.0), distance))

    def forward(self, op, layout: FrameLayout) -> ir.Value:
        rows, row_weights = self._axis(op, layout.row, layout.height)
        cols, col_weights = self._axis(op, layout.col, layout.width)
        flat = _ints(op, -1, 4)
        indices = op.Reshape(
            op.Add(
                op.Mul(op.Unsqueeze(rows, _ints(op, 2)), _int(op, self.side)),
                op.Unsqueeze(cols, _ints(op, 1)),
            ),
            flat,
        )
        weights = op.Reshape(
            op.Mul(
                op.Unsqueeze(row_weights, _ints(op, 2)), op.Unsqueeze(col_weights, _ints(op, 1))
            ),
            flat,
        )
        taps = op.Gather(self.weight, indices, axis=0)  # [P, 4, hidden]
        weights = op.Cast(op.Unsqueeze(weights, _ints(op, 2)), to=get_build_dtype())
        return op.ReduceSum(op.Mul(taps, weights), _ints(op, 1), keepdims=0)


class _VisionMLP(nn.Module):
    def __init__(self, config: Qwen3VisionConfig) -> None:
        super().__init__()
        self.act = config.hidden_act
        self.linear_fc1 = Linear(config.hidden_size, config.intermediate_size, bias=True)
        self.linear_fc2 = Linear(config.intermediate_size, config.hidden_size, bias=True)

    def forward(self, op, x: ir.Value) -> ir.Value:
        return self.linear_fc2(op, activation(op, self.linear_fc1(op, x), self.act))


class Qwen3VisionBlock(nn.Module):
    def __init__(self, config: Qwen3VisionConfig) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.norm_eps
        self.norm1 = LayerNorm(hidden, eps)
        self.attn = QwenVisionAttention(config)  # type: ignore[arg-type]
        self.norm2 = LayerNorm(hidden, eps)
        self.mlp = _VisionMLP(config)

    def forward(self, op, x: ir.Value, rotary: AxialRotary, sequences: PackedSequences) -> ir.Value:
        x = op.Add(x, self.attn(op, self.norm1(op, x), rotary, sequences))
        return op.Add(x, self.mlp(op, self.norm2(op, x)))


class Qwen3PatchMerger(nn.Module):
    """LayerNorm → m² patches concatenated → Linear → GELU → Linear; `postshuffle` normalises
    after concatenating (the DeepStack mergers), else before (the final merger)."""

    def __init__(self, config: Qwen3VisionConfig, postshuffle: bool) -> None:
        super().__init__()
        self.merged = config.hidden_size * config.spatial_merge_size**2
        self.postshuffle = postshuffle
        norm_size = self.merged if postshuffle else config.hidden_size
        self.norm = LayerNorm(norm_size, config.norm_eps)
        self.linear_fc1 = Linear(self.merged, self.merged, bias=True)
        self.linear_fc2 = Linear(self.merged, config.out_hidden_size, bias=True)

    def forward(self, op, x: ir.Value) -> ir.Value:
        shape = _ints(op, -1, self.merged)
        if self.postshuffle:
            x = self.norm(op, op.Reshape(x, shape))
        else:
            x = op.Reshape(self.norm(op, x), shape)
        return self.linear_fc2(op, op.Gelu(self.linear_fc1(op, x)))


class Qwen3VisionTower(nn.Module):
    """(pixel_values [P, C·T·p²], image_grid_thw [1, 3]) → [P / m², out_hidden · (1 + D)]: the
    merger's tokens then each DeepStack merger's (zeros for a block a twin dropped); module
    names follow transformers' (`visual.blocks.0.attn.qkv`, `visual.deepstack_merger_list.0.norm`,
    ...)."""

    def __init__(self, config: Qwen3VisionConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embed = PatchEmbedding(config, bias=True)
        self.pos_embed = _PositionGrid(config)
        self.blocks = nn.ModuleList([Qwen3VisionBlock(config) for _ in range(config.depth)])
        self.merger = Qwen3PatchMerger(config, postshuffle=False)
        self.deepstack_merger_list = nn.ModuleList(
            [Qwen3PatchMerger(config, postshuffle=True) for _ in range(config.deepstack_mergers)]
        )

    def forward(self, op, pixel_values: ir.Value, grid: ir.Value) -> ir.Value:
        layout = FrameLayout(op, grid, self.config.spatial_merge_size)
        patches = op.Add(self.patch_embed(op, pixel_values), self.pos_embed(op, layout))
        x = op.Unsqueeze(patches, _ints(op, 0))
        rotary = AxialRotary(op, layout, self.config)
        frames = PackedSequences(op, layout.frame)
        deepstack = []
        for index, block in enumerate(self.blocks):
            x = block(op, x, rotary, frames)
            if index in self.config.deepstack_visual_indexes:
                merger = self.deepstack_merger_list[
                    self.config.deepstack_visual_indexes.index(index)
                ]
                deepstack.append(merger(op, op.Squeeze(x, _ints(op, 0))))
        merged = self.merger(op, op.Squeeze(x, _ints(op, 0)))
        missing = len(self.config.deepstack_visual_indexes) - len(deepstack)  # a twin's
        if missing:
            zero = op.Constant(value=ir.tensor(np.zeros([1, 1], get_build_dtype().numpy())))
            deepstack += [op.Expand(zero, op.Shape(merged))] * missing
        return op.Concat(merged, *deepstack, axis=-1) if deepstack else merged
