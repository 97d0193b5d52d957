"""LFM2-VL's vision graph: a SigLIP2 NaFlex tower and the pixel-unshuffle projector, as
standard ONNX (config/siglip2.py has the sizes).

    embed    Linear(patches) + the learned position grid resized to each image's patch grid
             (bilinear, antialiased: Siglip2VisionEmbeddings' explicit weights)
    layer    h = x + attn(LayerNorm(x)) over the image's real patches (padding keys masked);
             out = h + fc2(act(fc1(LayerNorm(h))))
    tower    post_layernorm(layers(embed))                          [images, patches, hidden]
    project  each downsample_factor² block of an image's patch grid → one token of its patches
             (row offset, column offset, channel) → LayerNorm → Linear → GELU → Linear

The images of one run share the padded patch axis; `spatial_shapes` gives each one's patch
rows and columns (row-major, first in the padded axis), so the graph has no size built in.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import Linear, parameter
from mobius_genai.components.mlp import activation
from mobius_genai.components.norms import LayerNorm
from mobius_genai.components.vision import VisionAttention, VisionEncoderLayer
from mobius_genai.config.siglip2 import NaflexVisionConfig
from mobius_genai.config.vision import VisionLanguageConfig
from mobius_genai.tasks.vision_language import IMAGES, PATCHES, PIXEL_VALUES

PIXEL_ATTENTION_MASK = "pixel_attention_mask"
SPATIAL_SHAPES = "spatial_shapes"
_FLOAT = ir.DataType.FLOAT
_INT64 = ir.DataType.INT64


def _ints(op, *values: int) -> ir.Value:
    return op.Constant(value_ints=list(values))


def _float(op, value: float) -> ir.Value:
    return op.Constant(value=ir.tensor(np.array(value, dtype=np.float32)))


class _PositionGrid(nn.Module):
    """The learned positions, [grid², hidden] (an nn.Embedding's weight in the checkpoint)."""

    def __init__(self, count: int, hidden: int) -> None:
        super().__init__()
        self.weight = parameter([count, hidden])

    def forward(self, op) -> ir.Value:
        return self.weight


def _axis_weights(op, index: ir.Value, size: ir.Value, grid: int) -> ir.Value:
    """F.interpolate(bilinear, align_corners=False, antialias=True)'s weights along one axis:
    [images, patches, grid] for output positions `index` [images, patches] of an axis `size`
    [images, 1] long, read from `grid` inputs."""
    scale = op.Div(_float(op, float(grid)), size)
    support = op.Max(scale, _float(op, 1.0))
    center = op.Sub(op.Mul(op.Add(index, _float(op, 0.5)), scale), _float(op, 0.5))
    source = op.Constant(value=ir.tensor(np.arange(grid, dtype=np.float32)))
    distance = op.Abs(op.Sub(source, op.Unsqueeze(center, _ints(op, -1))))
    weights = op.Relu(
        op.Sub(_float(op, 1.0), op.Div(distance, op.Unsqueeze(support, _ints(op, -1))))
    )
    return op.Div(weights, op.ReduceSum(weights, _ints(op, -1), keepdims=1))


class NaflexEmbeddings(nn.Module):
    """Patches [images, patches, patch_dim] → Linear + positions resized per image."""

    def __init__(self, config: NaflexVisionConfig) -> None:
        super().__init__()
        self.grid = config.position_grid
        self.patch_embedding = Linear(config.patch_dim, config.hidden_size, bias=True)
        self.position_embedding = _PositionGrid(config.num_patches, config.hidden_size)

    def forward(self, op, pixel_values: ir.Value, spatial_shapes: ir.Value) -> ir.Value:
        patches = self.patch_embedding(op, pixel_values)
        sizes = op.Cast(spatial_shapes, to=_FLOAT)
        rows_count = op.Slice(sizes, _ints(op, 0), _ints(op, 1), _ints(op, 1))
        cols_count = op.Slice(sizes, _ints(op, 1), _ints(op, 2), _ints(op, 1))
        length = op.Shape(pixel_values, start=1, end=2)
        positions = op.Cast(op.Range(_ints(op, 0), op.Squeeze(length), _ints(op, 1)), to=_FLOAT)
        rows = op.Floor(op.Div(positions, cols_count))  # [images, patches]
        cols = op.Sub(positions, op.Mul(rows, cols_count))
        real = op.Less(positions, op.Mul(rows_count, cols_count))
        zero = _float(op, 0.0)
        rows, cols = op.Where(real, rows, zero), op.Where(real, cols, zero)  # padding: (0, 0)
        weights = op.Mul(
            op.Unsqueeze(_axis_weights(op, rows, rows_count, self.grid), _ints(op, -1)),
            op.Unsqueeze(_axis_weights(op, cols, cols_count, self.grid), _ints(op, -2)),
        )
        weights = op.Reshape(weights, _ints(op, 0, 0, self.grid * self.grid))
        table = op.Cast(self.position_embedding(op), to=_FLOAT)
        return op.Add(patches, op.CastLike(op.MatMul(weights, table), patches))


class _MaskedAttention(VisionAttention):
    """SigLIP's attention with an additive key mask (the padding patches)."""

    def forward(self, op, x: ir.Value, key_bias: ir.Value) -> ir.Value:
        output = op.Attention(
            self.q_proj(op, x),
            self.k_proj(op, x),
            self.v_proj(op, x),
            key_bias,
            q_num_heads=self.num_heads,
            kv_num_heads=self.num_heads,
        )
        return self.out_proj(op, output)


class _MaskedLayer(VisionEncoderLayer):
    def __init__(self, config: NaflexVisionConfig) -> None:
        super().__init__(config)  # type: ignore[arg-type]
        self.self_attn = _MaskedAttention(config)  # type: ignore[arg-type]

    def forward(self, op, x: ir.Value, key_bias: ir.Value) -> ir.Value:
        x = op.Add(x, self.self_attn(op, self.layer_norm1(op, x), key_bias))
        return op.Add(x, self.mlp(op, self.layer_norm2(op, x)))


class _Encoder(nn.Module):
    def __init__(self, config: NaflexVisionConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_MaskedLayer(config) for _ in range(config.num_layers)])

    def forward(self, op, x: ir.Value, key_bias: ir.Value) -> ir.Value:
        for layer in self.layers:
            x = layer(op, x, key_bias)
        return x


class NaflexVisionTower(nn.Module):
    """(pixel_values, pixel_attention_mask, spatial_shapes) → [images, patches, hidden]."""

    def __init__(self, config: NaflexVisionConfig) -> None:
        super().__init__()
        self.embeddings = NaflexEmbeddings(config)
        self.encoder = _Encoder(config)
        self.post_layernorm = LayerNorm(config.hidden_size, config.layer_norm_eps)

    def forward(
        self, op, pixel_values: ir.Value, mask: ir.Value, spatial_shapes: ir.Value
    ) -> ir.Value:
        x = self.embeddings(op, pixel_values, spatial_shapes)
        real = op.Unsqueeze(op.Cast(mask, to=ir.DataType.BOOL), _ints(op, 1, 2))
        key_bias = op.CastLike(op.Where(real, _float(op, 0.0), _float(op, -np.inf)), x)
        length = op.Shape(mask, start=1, end=2)  # onnxruntime wants a row per query
        rows = op.Concat(op.Shape(mask, start=0, end=1), _ints(op, 1), length, length, axis=0)
        key_bias = op.Expand(key_bias, rows)
        return self.post_layernorm(op, self.encoder(op, x, key_bias))


class Lfm2VlProjector(nn.Module):
    """Each image's real downsample_factor² patch blocks, row-major, as tokens [tokens, text
    hidden] (Lfm2VlModel.get_image_features: pixel unshuffle, then the projector)."""

    def __init__(self, config: VisionLanguageConfig) -> None:
        super().__init__()
        vision: NaflexVisionConfig = config.vision  # type: ignore[assignment]
        self.factor = vision.downsample_factor
        self.act = vision.projector_act
        width = vision.hidden_size * self.factor**2
        self.layer_norm = LayerNorm(width, 1e-5) if vision.projector_layernorm else None
        self.linear_1 = Linear(width, vision.projector_hidden_size, vision.projector_bias)
        self.linear_2 = Linear(
            vision.projector_hidden_size, config.text.hidden_size, vision.projector_bias
        )

    def forward(self, op, hidden: ir.Value, spatial_shapes: ir.Value) -> ir.Value:
        f = self.factor
        rows = op.Slice(spatial_shapes, _ints(op, 0), _ints(op, 1), _ints(op, 1))  # [images, 1]
        cols = op.Slice(spatial_shapes, _ints(op, 1), _ints(op, 2), _ints(op, 1))
        per_row = op.Div(cols, _ints(op, f))
        tokens = op.Mul(op.Div(rows, _ints(op, f)), per_row)  # each image's token count
        patches = op.Shape(hidden, start=1, end=2)
        slots = op.Div(patches, _ints(op, f * f))
        token = op.Unsqueeze(op.Range(_ints(op, 0), op.Squeeze(slots), _ints(op, 1)), _ints(op, 0))
        top = op.Mul(op.Div(token, per_row), _ints(op, f))  # [images, slots]: block's first row
        left = op.Mul(op.Mod(token, per_row), _ints(op, f))
        images = op.Shape(hidden, start=0, end=1)
        first = op.Mul(op.Range(_ints(op, 0), op.Squeeze(images), _ints(op, 1)), patches)
        index = op.Add(op.Unsqueeze(first, _ints(op, 1, 2, 3)), self._block(op, top, left, cols))
        real = op.Less(token, tokens)
        index = op.Where(op.Unsqueeze(real, _ints(op, -1, -2)), index, _ints(op, 0))
        flat = op.Reshape(hidden, op.Concat(_ints(op, -1), op.Shape(hidden, start=2), axis=0))
        blocks = op.Gather(flat, index, axis=0)  # [images, slots, f, f, hidden]
        width = op.Mul(op.Shape(hidden, start=2), _ints(op, f * f))
        blocks = op.Reshape(blocks, op.Concat(_ints(op, -1), width, axis=0))
        blocks = op.Compress(blocks, op.Reshape(real, _ints(op, -1)), axis=0)
        if self.layer_norm is not None:
            blocks = self.layer_norm(op, blocks)
        return self.linear_2(op, activation(op, self.linear_1(op, blocks), self.act))

    def _block(self, op, top: ir.Value, left: ir.Value, cols: ir.Value) -> ir.Value:
        """[images, slots, f, f]: the patch (in its image) of each block's row offset, then
        column offset."""
        offsets = op.Constant(value=ir.tensor(np.arange(self.factor, dtype=np.int64)))
        rows = op.Add(op.Unsqueeze(top, _ints(op, -1, -2)), op.Unsqueeze(offsets, _ints(op, -1)))
        columns = op.Add(op.Unsqueeze(left, _ints(op, -1, -2)), offsets)
        return op.Add(op.Mul(rows, op.Unsqueeze(cols, _ints(op, -1, -2))), columns)


class Lfm2VlVisionModel(nn.Module):
    """pixel_values [images, patches, patch_dim], pixel_attention_mask [images, patches]
    (int64, 1 for real patches) and spatial_shapes [images, 2] (int64 patch rows, columns) →
    image_features [tokens, text hidden], every image's tokens in order (LFM2-VL)."""

    def __init__(self, config: VisionLanguageConfig) -> None:
        super().__init__()
        vision: NaflexVisionConfig = config.vision  # type: ignore[assignment]
        self.graph_inputs = [
            (PIXEL_VALUES, None, [IMAGES, PATCHES, vision.patch_dim]),
            (PIXEL_ATTENTION_MASK, _INT64, [IMAGES, PATCHES]),
            (SPATIAL_SHAPES, _INT64, [IMAGES, 2]),
        ]
        self.vision_tower = NaflexVisionTower(vision)
        self.multi_modal_projector = Lfm2VlProjector(config)

    def forward(
        self, op, pixel_values: ir.Value, mask: ir.Value, spatial_shapes: ir.Value
    ) -> ir.Value:
        hidden = self.vision_tower(op, pixel_values, mask, spatial_shapes)
        return self.multi_modal_projector(op, hidden, spatial_shapes)
