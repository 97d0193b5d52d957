"""Mistral 3's vision graph: the Pixtral tower and the projector, for one image of any size.

    patches   Conv(pixels, patch_size, stride patch_size, no bias) → [h·w, hidden] row-major,
              RMSNorm (ln_pre)
    rotary    patch (r, c) of the h x w grid: the first head_dim / 4 rotation pairs turn by
              r · inv_freq[0::2], the rest by c · inv_freq[1::2] (transformers' axial rope over
              inv_freq = theta^(-2i / head_dim)), rotate-half layout
    layer     h = x + o(attn(RMSNorm(x))), out = h + SwiGLU(RMSNorm(h)); attention over all
              patches of the image (one image per call: og runs the graph once per image)
    project   RMSNorm → m x m neighbouring patches concatenated channel-major (torch's unfold
              with kernel = stride = m) → merging_layer → linear_1 → act → linear_2

Module names follow transformers' (`vision_tower.transformer.layers.0.attention.q_proj`,
`multi_modal_projector.patch_merger.merging_layer`), so the checkpoint name map is a prefix.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import Linear, parameter
from mobius_genai.components.mlp import GatedMLP, activation
from mobius_genai.components.norms import RMSNorm
from mobius_genai.config.pixtral import PixtralVisionConfig
from mobius_genai.config.vision import VisionLanguageConfig
from mobius_genai.ep.context import get_build_dtype
from mobius_genai.tasks.vision_language import IMAGE_HEIGHT, IMAGE_WIDTH, PIXEL_VALUES

#: Pixtral fixes its RMSNorms' epsilon (ln_pre, attention_norm, ffn_norm).
_TOWER_EPS = 1e-5


def _ints(op, *values: int) -> ir.Value:
    return op.Constant(value_ints=list(values))


def patch_grid(op, height: ir.Value, width: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(row, column) [h·w] int64 of each patch of an h x w grid, in row-major order."""
    index = op.Range(op.Constant(value_int=0), op.Mul(height, width), op.Constant(value_int=1))
    return op.Div(index, width), op.Mod(index, width)


class AxialRotary:
    """cos/sin [1, h·w, head_dim / 2] of each patch: its row times the even frequencies, then
    its column times the odd ones (transformers' PixtralVisionRotaryEmbedding)."""

    def __init__(self, op, rows: ir.Value, cols: ir.Value, config: PixtralVisionConfig) -> None:
        dim = config.head_dim
        inv_freq = 1.0 / config.rope_theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
        angles = [
            op.Mul(
                op.Unsqueeze(op.Cast(position, to=ir.DataType.FLOAT), _ints(op, 1)),
                op.Constant(value=ir.tensor(frequencies.astype(np.float32)[None])),
            )
            for position, frequencies in ((rows, inv_freq[0::2]), (cols, inv_freq[1::2]))
        ]
        angle = op.Unsqueeze(op.Concat(*angles, axis=-1), _ints(op, 0))
        dtype = get_build_dtype()
        self.cos = op.Cast(op.Cos(angle), to=dtype)
        self.sin = op.Cast(op.Sin(angle), to=dtype)


class PixtralAttention(nn.Module):
    """q, k rotated by their patch's (row, column); ONNX Attention over every patch, no mask."""

    def __init__(self, config: PixtralVisionConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.q_proj = Linear(hidden, hidden)
        self.k_proj = Linear(hidden, hidden)
        self.v_proj = Linear(hidden, hidden)
        self.o_proj = Linear(hidden, hidden)

    def forward(self, op, x: ir.Value, rotary: AxialRotary) -> ir.Value:
        q, k = (
            op.RotaryEmbedding(proj(op, x), rotary.cos, rotary.sin, num_heads=self.num_heads)
            for proj in (self.q_proj, self.k_proj)
        )
        output = op.Attention(
            q, k, self.v_proj(op, x), q_num_heads=self.num_heads, kv_num_heads=self.num_heads
        )
        return self.o_proj(op, output)


class PixtralLayer(nn.Module):
    def __init__(self, config: PixtralVisionConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.attention_norm = RMSNorm(hidden, _TOWER_EPS)
        self.attention = PixtralAttention(config)
        self.ffn_norm = RMSNorm(hidden, _TOWER_EPS)
        self.feed_forward = GatedMLP(hidden, config.intermediate_size, config.hidden_act)

    def forward(self, op, x: ir.Value, rotary: AxialRotary) -> ir.Value:
        x = op.Add(x, self.attention(op, self.attention_norm(op, x), rotary))
        return op.Add(x, self.feed_forward(op, self.ffn_norm(op, x)))


class _Transformer(nn.Module):
    def __init__(self, config: PixtralVisionConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList([PixtralLayer(config) for _ in range(config.num_hidden_layers)])

    def forward(self, op, x: ir.Value, rotary: AxialRotary) -> ir.Value:
        for layer in self.layers:
            x = layer(op, x, rotary)
        return x


class _PatchConv(nn.Module):
    """Conv2d with kernel = stride = one patch and no bias (weights as stored)."""

    def __init__(self, config: PixtralVisionConfig) -> None:
        super().__init__()
        size = config.patch_size
        self.patch_size = size
        self.weight = parameter([config.hidden_size, config.num_channels, size, size])

    def forward(self, op, pixel_values: ir.Value) -> ir.Value:
        size = self.patch_size
        return op.Conv(pixel_values, self.weight, strides=[size, size])


class PixtralVisionTower(nn.Module):
    """pixel_values [1, C, H, W] → (last hidden state [h·w, hidden], grid [2] = (h, w))."""

    def __init__(self, config: PixtralVisionConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_conv = _PatchConv(config)
        self.ln_pre = RMSNorm(config.hidden_size, _TOWER_EPS)
        self.transformer = _Transformer(config)

    def forward(self, op, pixel_values: ir.Value) -> tuple[ir.Value, ir.Value]:
        patches = self.patch_conv(op, pixel_values)  # [1, hidden, h, w]
        grid = op.Shape(patches, start=2, end=4)
        flat = op.Reshape(patches, _ints(op, self.config.hidden_size, -1))
        x = self.ln_pre(op, op.Unsqueeze(op.Transpose(flat, perm=[1, 0]), _ints(op, 0)))
        height, width = (op.Squeeze(op.Slice(grid, _ints(op, i), _ints(op, i + 1))) for i in (0, 1))
        rotary = AxialRotary(op, *patch_grid(op, height, width), self.config)
        return op.Squeeze(self.transformer(op, x, rotary), _ints(op, 0)), grid


class PatchMerger(nn.Module):
    """[h·w, hidden] → [(h / m)·(w / m), hidden]: each m x m block of patches, channel-major
    then row then column within the block (torch's unfold), through `merging_layer`."""

    def __init__(self, config: PixtralVisionConfig) -> None:
        super().__init__()
        self.merge = config.spatial_merge_size
        self.hidden = config.hidden_size
        self.merging_layer = Linear(self.hidden * self.merge**2, self.hidden)

    def forward(self, op, x: ir.Value, grid: ir.Value) -> ir.Value:
        m = self.merge
        blocks = op.Div(grid, _ints(op, m, m))  # (h / m, w / m)
        rows, cols = (op.Slice(blocks, _ints(op, i), _ints(op, i + 1)) for i in (0, 1))
        shape = op.Concat(rows, _ints(op, m), cols, _ints(op, m, self.hidden), axis=0)
        unfolded = op.Transpose(op.Reshape(x, shape), perm=[0, 2, 4, 1, 3])
        merged = op.Reshape(unfolded, _ints(op, -1, self.hidden * m * m))
        return self.merging_layer(op, merged)


class Mistral3Projector(nn.Module):
    """RMSNorm (the text's epsilon), patch merger, linear_1 → act → linear_2."""

    def __init__(self, config: PixtralVisionConfig) -> None:
        super().__init__()
        self.act = config.projector_hidden_act
        text, bias = config.text_hidden_size, config.projector_bias
        self.norm = RMSNorm(config.hidden_size, config.projector_norm_eps)
        self.patch_merger = PatchMerger(config)
        self.linear_1 = Linear(config.hidden_size, text, bias)
        self.linear_2 = Linear(text, text, bias)

    def forward(self, op, hidden: ir.Value, grid: ir.Value) -> ir.Value:
        merged = self.patch_merger(op, self.norm(op, hidden), grid)
        return self.linear_2(op, activation(op, self.linear_1(op, merged), self.act))


class Mistral3VisionModel(nn.Module):
    """pixel_values [1, C, H, W] of one image at its own size → image_features
    [(H / pm)·(W / pm), text hidden] (Mistral 3; pm = patch_size · spatial_merge_size pixels;
    onnxruntime-genai runs the graph once per image)."""

    def __init__(self, config: VisionLanguageConfig) -> None:
        super().__init__()
        vision = config.vision
        self.graph_inputs = [
            (PIXEL_VALUES, None, [1, vision.num_channels, IMAGE_HEIGHT, IMAGE_WIDTH])
        ]
        self.vision_tower = PixtralVisionTower(vision)
        self.multi_modal_projector = Mistral3Projector(vision)

    def forward(self, op, pixel_values: ir.Value) -> ir.Value:
        return self.multi_modal_projector(op, *self.vision_tower(op, pixel_values))
