"""Gemma 4's vision graph: the tower, its pooler and the embedder into the text, as standard
ONNX (config/gemma4_vision.py has the sizes).

    embed    Linear(2 · (patches − 0.5)) + table[0][column] + table[1][row] (padding: no
             position)
    rotary   axial: the first half of each head turns by the patch's column, the second half by
             its row, each half rotate-half over inv_freq = theta^(-4i / head_dim)
    layer    h = x + norm(o(attn(rope(qnorm(q)), rope(knorm(k)), unit-norm(v)))), scale 1, the
             padding keys masked;  out = h + norm(GeGLU(norm(h)))     (sandwich RMSNorms)
    pool     (in float32) each k x k block of an image's patch grid averaged, by its patches'
             (column, row), times sqrt(hidden); blocks with no patch dropped; then standardize
             (− std_bias, · std_scale) where the config says
    embed    RMSNorm without scale → Linear into the text's hidden size

The images of one run share the patch axis (transformers pads each to the same count with
(-1, -1) positions; onnxruntime-genai feeds the real patches), so the graph has no size built
in. Module names follow transformers' (`vision_tower.encoder.layers.0.self_attn.q_proj.linear`,
`embed_vision.embedding_projection`), so the checkpoint name map is a prefix.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import Linear, parameter
from mobius_genai.components.mlp import activation
from mobius_genai.components.norms import RMSNorm
from mobius_genai.config.gemma4_vision import Gemma4VisionConfig
from mobius_genai.config.vision import VisionLanguageConfig
from mobius_genai.ep.context import get_build_dtype
from mobius_genai.tasks.vision_language import IMAGES, PATCHES, PIXEL_VALUES

PIXEL_POSITION_IDS = "pixel_position_ids"
_FLOAT = ir.DataType.FLOAT


def _ints(op, *values: int) -> ir.Value:
    return op.Constant(value_ints=list(values))


def _float(op, value: float) -> ir.Value:
    return op.Constant(value=ir.tensor(np.array(value, dtype=np.float32)))


def _axis(op, positions: ir.Value, index: int) -> ir.Value:
    """[images, patches]: column (0) or row (1) of each patch."""
    return op.Gather(positions, op.Constant(value_int=index), axis=-1)


class ClippableLinear(nn.Module):
    """`linear` (no bias), with its input and output clamped to stored bounds where the config
    uses clipped linears (Gemma4ClippableLinear)."""

    def __init__(self, in_features: int, out_features: int, clipped: bool) -> None:
        super().__init__()
        self.linear = Linear(in_features, out_features)
        bounds = ("input_min", "input_max", "output_min", "output_max")
        self.clipped = clipped
        for name in bounds if clipped else ():
            setattr(self, name, parameter([]))

    def forward(self, op, x: ir.Value) -> ir.Value:
        if not self.clipped:
            return self.linear(op, x)
        y = self.linear(op, op.Clip(x, self.input_min, self.input_max))
        return op.Clip(y, self.output_min, self.output_max)


class _PatchEmbedder(nn.Module):
    """Patches projected, plus the learned position of the patch's column and of its row
    (`position_embedding_table` [2, size, hidden]); padding patches get no position."""

    def __init__(self, config: Gemma4VisionConfig) -> None:
        super().__init__()
        self.input_proj = Linear(config.patch_dim, config.hidden_size)
        self.position_embedding_table = parameter(
            [2, config.position_embedding_size, config.hidden_size]
        )

    def forward(self, op, pixel_values: ir.Value, clamped: ir.Value, padding: ir.Value):
        scaled = op.Mul(
            op.Sub(pixel_values, op.CastLike(_float(op, 0.5), pixel_values)),
            op.CastLike(_float(op, 2.0), pixel_values),
        )
        hidden = self.input_proj(op, scaled)
        table = self.position_embedding_table
        positions = op.Add(
            *(
                op.Gather(
                    op.Gather(table, op.Constant(value_int=axis), axis=0),
                    _axis(op, clamped, axis),
                    axis=0,
                )
                for axis in (0, 1)
            )
        )
        zero = op.CastLike(_float(op, 0.0), hidden)
        return op.Add(hidden, op.Where(op.Unsqueeze(padding, _ints(op, -1)), zero, positions))


class AxialRotary:
    """cos/sin [images, patches, 1, head_dim]: the column's angles over the first half of each
    head, the row's over the second (transformers' H-H-W-W layout of Gemma4VisionRotaryEmbedding)."""

    def __init__(self, op, positions: ir.Value, config: Gemma4VisionConfig) -> None:
        half = config.head_dim // 2
        inv_freq = 1.0 / config.rope_theta ** (np.arange(0, half, 2, dtype=np.float32) / half)
        frequencies = op.Constant(value=ir.tensor(inv_freq.astype(np.float32)))
        angles = [
            op.Mul(
                op.Unsqueeze(op.Cast(_axis(op, positions, axis), to=_FLOAT), _ints(op, -1)),
                frequencies,
            )
            for axis in (0, 1)
        ]
        dtype = get_build_dtype()
        self.cos, self.sin = (
            op.Cast(
                op.Unsqueeze(
                    op.Concat(*(f(a) for a in angles for _ in (0, 1)), axis=-1), _ints(op, 2)
                ),
                to=dtype,
            )
            for f in (op.Cos, op.Sin)
        )

    def rotate(self, op, x: ir.Value) -> ir.Value:
        """x [images, patches, heads, head_dim] rotated: each half rotate-half by its axis."""
        a, b, c, d = op.Split(x, num_outputs=4, axis=-1, _outputs=4)
        turned = op.Concat(op.Neg(b), a, op.Neg(d), c, axis=-1)
        return op.Add(op.Mul(x, self.cos), op.Mul(turned, self.sin))


class Gemma4VisionAttention(nn.Module):
    """q and k RMS-normed per head then rotated, v normed without scale; scale 1; ONNX
    Attention over each image's patches with the padding keys masked."""

    def __init__(self, config: Gemma4VisionConfig) -> None:
        super().__init__()
        hidden, head_dim = config.hidden_size, config.head_dim
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            head_dim,
        )
        clipped, eps = config.use_clipped_linears, config.rms_norm_eps
        self.q_proj = ClippableLinear(hidden, self.heads * head_dim, clipped)
        self.k_proj = ClippableLinear(hidden, self.kv_heads * head_dim, clipped)
        self.v_proj = ClippableLinear(hidden, self.kv_heads * head_dim, clipped)
        self.o_proj = ClippableLinear(self.heads * head_dim, hidden, clipped)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)
        self.v_norm = RMSNorm(head_dim, eps, affine=False)

    def _heads(self, op, x: ir.Value, norm: RMSNorm, rotary: AxialRotary | None) -> ir.Value:
        split = op.Reshape(x, _ints(op, 0, 0, -1, self.head_dim))
        normed = norm(op, split)
        if rotary is not None:
            normed = rotary.rotate(op, normed)
        return op.Reshape(normed, _ints(op, 0, 0, -1))

    def forward(self, op, x: ir.Value, rotary: AxialRotary, key_bias: ir.Value) -> ir.Value:
        q = self._heads(op, self.q_proj(op, x), self.q_norm, rotary)
        k = self._heads(op, self.k_proj(op, x), self.k_norm, rotary)
        v = self._heads(op, self.v_proj(op, x), self.v_norm, None)
        output = op.Attention(
            q, k, v, key_bias, q_num_heads=self.heads, kv_num_heads=self.kv_heads, scale=1.0
        )
        return self.o_proj(op, output)


class _GeGLU(nn.Module):
    def __init__(self, config: Gemma4VisionConfig) -> None:
        super().__init__()
        hidden, inner, clipped = (
            config.hidden_size,
            config.intermediate_size,
            config.use_clipped_linears,
        )
        self.act = config.hidden_act
        self.gate_proj = ClippableLinear(hidden, inner, clipped)
        self.up_proj = ClippableLinear(hidden, inner, clipped)
        self.down_proj = ClippableLinear(inner, hidden, clipped)

    def forward(self, op, x: ir.Value) -> ir.Value:
        gated = op.Mul(activation(op, self.gate_proj(op, x), self.act), self.up_proj(op, x))
        return self.down_proj(op, gated)


class Gemma4VisionLayer(nn.Module):
    """Sandwich-normed attention and GeGLU blocks (Gemma4VisionEncoderLayer)."""

    def __init__(self, config: Gemma4VisionConfig) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Gemma4VisionAttention(config)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.pre_feedforward_layernorm = RMSNorm(hidden, eps)
        self.mlp = _GeGLU(config)
        self.post_feedforward_layernorm = RMSNorm(hidden, eps)

    def forward(self, op, x: ir.Value, rotary: AxialRotary, key_bias: ir.Value) -> ir.Value:
        attended = self.self_attn(op, self.input_layernorm(op, x), rotary, key_bias)
        x = op.Add(x, self.post_attention_layernorm(op, attended))
        mlp = self.mlp(op, self.pre_feedforward_layernorm(op, x))
        return op.Add(x, self.post_feedforward_layernorm(op, mlp))


class _Encoder(nn.Module):
    def __init__(self, config: Gemma4VisionConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList([Gemma4VisionLayer(config) for _ in range(config.num_layers)])

    def forward(self, op, x: ir.Value, rotary: AxialRotary, key_bias: ir.Value) -> ir.Value:
        for layer in self.layers:
            x = layer(op, x, rotary, key_bias)
        return x


def _key_bias(op, padding: ir.Value, like: ir.Value) -> ir.Value:
    """[images, 1, patches, patches]: 0 for real keys, -inf for padding ones (a row per query:
    onnxruntime's Attention wants one)."""
    bias = op.Where(op.Unsqueeze(padding, _ints(op, 1, 2)), _float(op, -np.inf), _float(op, 0.0))
    length = op.Shape(padding, start=1, end=2)
    rows = op.Concat(op.Shape(padding, start=0, end=1), _ints(op, 1), length, length, axis=0)
    return op.Expand(op.CastLike(bias, like), rows)


class Gemma4VisionTower(nn.Module):
    """(pixel_values [images, patches, patch_dim], pixel_position_ids [images, patches, 2]) →
    the pooled image tokens [tokens, hidden], float32, every image's in order."""

    def __init__(self, config: Gemma4VisionConfig) -> None:
        super().__init__()
        self.config = config
        self.patch_embedder = _PatchEmbedder(config)
        self.encoder = _Encoder(config)
        if config.standardize:
            self.std_bias = parameter([config.hidden_size])
            self.std_scale = parameter([config.hidden_size])

    def forward(self, op, pixel_values: ir.Value, positions: ir.Value) -> ir.Value:
        padding = op.Equal(op.ReduceMax(positions, _ints(op, -1), keepdims=0), _ints(op, -1))
        clamped = op.Max(positions, _ints(op, 0))
        x = self.patch_embedder(op, pixel_values, clamped, padding)
        rotary = AxialRotary(op, positions, self.config)
        hidden = self.encoder(op, x, rotary, _key_bias(op, padding, x))
        pooled = self._pool(op, hidden, clamped, padding)
        if self.config.standardize:
            bias, scale = (op.Cast(p, to=_FLOAT) for p in (self.std_bias, self.std_scale))
            pooled = op.Mul(op.Sub(pooled, bias), scale)
        return pooled

    def pool_index(self, op, clamped: ir.Value) -> ir.Value:
        """[images, patches]: the pooled token of each patch, k x k blocks row-major over the
        image's columns (transformers' _avg_pool_by_positions)."""
        k = _ints(op, self.config.pooling_kernel_size)
        columns = op.Add(
            op.ReduceMax(_axis(op, clamped, 0), _ints(op, -1), keepdims=1), _ints(op, 1)
        )
        blocks = op.Div(clamped, k)
        return op.Add(_axis(op, blocks, 0), op.Mul(op.Div(columns, k), _axis(op, blocks, 1)))

    def _pool(self, op, hidden: ir.Value, clamped: ir.Value, padding: ir.Value) -> ir.Value:
        k2 = self.config.pooling_kernel_size**2
        hidden = op.Cast(hidden, to=_FLOAT)
        hidden = op.Where(op.Unsqueeze(padding, _ints(op, -1)), _float(op, 0.0), hidden)
        patches = op.Gather(op.Shape(hidden), op.Constant(value_int=1))
        length = op.Div(patches, op.Constant(value_int=k2))
        slots = op.Range(op.Constant(value_int=0), length, op.Constant(value_int=1))
        index = op.Unsqueeze(self.pool_index(op, clamped), _ints(op, -1))
        weights = op.Div(op.Cast(op.Equal(index, slots), to=_FLOAT), _float(op, float(k2)))
        pooled = op.MatMul(op.Transpose(weights, perm=[0, 2, 1]), hidden)  # [images, slots, hidden]
        real = op.Greater(op.ReduceMax(weights, _ints(op, 1), keepdims=0), _float(op, 0.0))
        pooled = op.Mul(pooled, _float(op, float(self.config.hidden_size) ** 0.5))
        flat = op.Reshape(pooled, _ints(op, -1, self.config.hidden_size))
        return op.Compress(flat, op.Reshape(real, _ints(op, -1)), axis=0)


class MultimodalEmbedder(nn.Module):
    """RMSNorm without scale, then the projection into the text's hidden size (Gemma 4's
    embedders of image and audio tokens)."""

    def __init__(self, width: int, eps: float, text_hidden: int) -> None:
        super().__init__()
        self.embedding_pre_projection_norm = RMSNorm(width, eps, affine=False)
        self.embedding_projection = Linear(width, text_hidden)

    def forward(self, op, x: ir.Value) -> ir.Value:
        return self.embedding_projection(op, self.embedding_pre_projection_norm(op, x))


class Gemma4VisionModel(nn.Module):
    """pixel_values [images, patches, 3 · patch²] (values in [0, 1]) and pixel_position_ids
    [images, patches, 2] (int64 column, row; (-1, -1) for padding) → image_features [tokens,
    text hidden], every image's tokens in order (Gemma 4)."""

    def __init__(self, config: VisionLanguageConfig) -> None:
        super().__init__()
        vision: Gemma4VisionConfig = config.vision  # type: ignore[assignment]
        self.graph_inputs = [
            (PIXEL_VALUES, None, [IMAGES, PATCHES, vision.patch_dim]),
            (PIXEL_POSITION_IDS, ir.DataType.INT64, [IMAGES, PATCHES, 2]),
        ]
        self.vision_tower = Gemma4VisionTower(vision)
        self.embed_vision = MultimodalEmbedder(
            vision.hidden_size, vision.rms_norm_eps, vision.text_hidden_size
        )

    def forward(self, op, pixel_values: ir.Value, positions: ir.Value) -> ir.Value:
        pooled = op.Cast(self.vision_tower(op, pixel_values, positions), to=get_build_dtype())
        return self.embed_vision(op, pooled)
