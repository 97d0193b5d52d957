"""Gemma 4's audio graph (E2B, E4B): the conformer tower and the embedder into the text, as
standard ONNX (config/gemma4_audio.py has the sizes; transformers' Gemma4AudioModel).

    subsample  twice: frames masked, Conv2d 3 x 3 stride 2 → LayerNorm over channels → ReLU
               (the mask keeps every second frame); then (mel, channel) flattened → Linear
    layer      x += ½ FFN(x);  x += norm(attn(norm(x)));  x += LightConv(x);  x += ½ FFN(x);
               x = norm(x)   (FFN: norm → Linear → act → Linear → norm; values clipped)
    attention  queries in chunks of C, each over a window of its P past keys, itself and F
               future keys; logits q·k + q·rel[shift] (Transformer-XL's relative shift over
               sinusoidal positions), q scaled by softplus(per_dim_scale) / (√d · ln 2), k by
               log2(1 + e); softcapped; keys k outside t − P < k ≤ t (or t < k < t + F), past
               either end or masked get −1e9
    lightconv  norm → Linear(2H) → GLU → causal depthwise conv → norm → act → Linear
    embed      Linear(H → output_proj_dims) + b → RMSNorm without scale → Linear into the text

The output is the real frames' tokens only [tokens, text hidden], every clip's in order (as
transformers drops the padding tokens before placing them in the prompt). Module names follow
transformers' (`audio_tower.layers.0.self_attn.q_proj.linear`, `embed_audio.embedding_projection`).
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.gemma4_vision import ClippableLinear, MultimodalEmbedder
from mobius_genai.components.linear import Linear, in_float32, parameter
from mobius_genai.components.mlp import activation
from mobius_genai.components.norms import LayerNorm, RMSNorm
from mobius_genai.config.gemma4_audio import Gemma4AudioConfig
from mobius_genai.config.vision import VisionLanguageConfig
from mobius_genai.ep.context import get_build_dtype

INPUT_FEATURES = "input_features"
INPUT_FEATURES_MASK = "input_features_mask"
CLIPS, FRAMES, MEL_BINS = "num_clips", "num_frames", "num_mel_bins"
_FLOAT = ir.DataType.FLOAT


def _ints(op, *values: int) -> ir.Value:
    return op.Constant(value_ints=list(values))


def _scalar(op, value: float, like: ir.Value) -> ir.Value:
    return op.CastLike(op.Constant(value=ir.tensor(np.array(value, dtype=np.float32))), like)


def _clip(op, x: ir.Value, bound: float) -> ir.Value:
    """x clamped to ±bound, bound cut to the build dtype's largest value (transformers'
    gradient_clipping)."""
    bound = min(bound, float(np.finfo(get_build_dtype().numpy()).max))
    return op.Clip(x, _scalar(op, -bound, x), _scalar(op, bound, x))


def _every_second(op, mask: ir.Value) -> ir.Value:
    """mask[:, ::2]: the frames a stride-2 convolution keeps."""
    return op.Slice(
        mask, _ints(op, 0), _ints(op, np.iinfo(np.int64).max), _ints(op, 1), _ints(op, 2)
    )


class _Conv(nn.Module):
    """Conv without bias; `weight` [out, in / group, *kernel] as the checkpoint stores it."""

    def __init__(self, shape: list[int], **attributes: object) -> None:
        super().__init__()
        self.weight = parameter(shape)
        self.attributes = attributes

    def forward(self, op, x: ir.Value) -> ir.Value:
        return op.Conv(x, self.weight, **self.attributes)


class _SubsampleLayer(nn.Module):
    """Masked frames zeroed, Conv2d 3 x 3 stride 2 (no bias), LayerNorm over channels, ReLU."""

    def __init__(self, in_channels: int, out_channels: int, eps: float) -> None:
        super().__init__()
        self.conv = _Conv(
            [out_channels, in_channels, 3, 3],
            kernel_shape=[3, 3],
            strides=[2, 2],
            pads=[1, 1, 1, 1],
        )
        self.norm = LayerNorm(out_channels, eps, bias=False)

    def forward(self, op, x: ir.Value, mask: ir.Value) -> tuple[ir.Value, ir.Value]:
        x = self.conv(op, masked_frames(op, x, mask))
        normed = self.norm(op, op.Transpose(x, perm=[0, 2, 3, 1]))
        return op.Transpose(op.Relu(normed), perm=[0, 3, 1, 2]), _every_second(op, mask)


class _Subsample(nn.Module):
    """[clips, frames, mel] → [clips, frames / 4, hidden], and the mask of the kept frames."""

    def __init__(self, config: Gemma4AudioConfig) -> None:
        super().__init__()
        first, second = config.subsampling_conv_channels
        self.layer0 = _SubsampleLayer(1, first, config.rms_norm_eps)
        self.layer1 = _SubsampleLayer(first, second, config.rms_norm_eps)
        self.input_proj_linear = Linear((first // 4) * second, config.hidden_size)

    def forward(self, op, features: ir.Value, mask: ir.Value) -> tuple[ir.Value, ir.Value]:
        x, mask = self.layer0(op, op.Unsqueeze(features, _ints(op, 1)), mask)
        x, mask = self.layer1(op, x, mask)
        flat = op.Reshape(op.Transpose(x, perm=[0, 2, 3, 1]), _ints(op, 0, 0, -1))
        return self.input_proj_linear(op, flat), mask


def relative_positions(config: Gemma4AudioConfig) -> np.ndarray:
    """[context // 2 + 1, hidden]: sin then cos of the distances context // 2 … 0
    (Gemma4AudioRelPositionalEncoding)."""
    half = config.hidden_size // 2
    increment = math.log(10_000.0) / max(half - 1, 1)
    inv_timescales = np.exp(np.arange(half, dtype=np.float32) * -increment)
    distances = np.arange(config.context_size // 2, -1, -1, dtype=np.float32)[:, None]
    scaled = distances * inv_timescales[None, :]
    return np.concatenate([np.sin(scaled), np.cos(scaled)], axis=-1).astype(np.float32)


def rel_shift(op, scores: ir.Value, chunk: int, context: int, length: int) -> ir.Value:
    """[..., U, C, P] → [..., U, C, W]: row c shifted right by C − 1 − c (zeros padded to W + 1,
    the rows laid end to end and re-cut at W; Gemma4AudioAttention._rel_shift)."""
    padded = op.Pad(scores, _ints(op, 0, 0, 0, 0, 0, 0, 0, 0, 0, context + 1 - length))
    lead = op.Shape(scores, end=3)
    flat = op.Reshape(padded, op.Concat(lead, _ints(op, chunk * (context + 1)), axis=0))
    cut = op.Slice(flat, _ints(op, 0), _ints(op, chunk * context), _ints(op, 3))
    return op.Reshape(cut, op.Concat(lead, _ints(op, chunk, context), axis=0))


def query_scale(op, per_dim_scale: ir.Value) -> ir.Value:
    """The learned per-dimension scale of the queries: softplus(per_dim_scale), in float32."""
    return op.Softplus(in_float32(op, per_dim_scale))


def masked_frames(op, x: ir.Value, mask: ir.Value) -> ir.Value:
    """x [clips, channels, frames, mel] with the frames the mask [clips, frames] drops zeroed."""
    return op.Mul(x, op.CastLike(op.Unsqueeze(mask, _ints(op, 1, 3)), x))


class _Blocks:
    """Index tensors of one run's chunks: U chunks of C queries, each over W keys."""

    def __init__(self, op, frames: ir.Value, config: Gemma4AudioConfig) -> None:
        c, w = config.attention_chunk_size, config.context_size
        self.frames = frames  # [1] int64
        self.chunks = op.Div(op.Add(frames, _ints(op, c - 1)), _ints(op, c))
        zero, one = op.Constant(value_int=0), op.Constant(value_int=1)
        starts = op.Mul(op.Range(zero, op.Squeeze(self.chunks), one), op.Constant(value_int=c))
        # [U, W]: the (padded) key index each chunk's window reads
        self.window = op.Add(
            op.Unsqueeze(starts, _ints(op, 1)), op.Range(zero, op.Constant(value_int=w), one)
        )
        # [C, W]: the key's offset from the query, k − q (its window index minus P minus row)
        offsets = np.arange(w)[None, :] - config.past_horizon - np.arange(c)[:, None]
        self.near = op.Constant(
            value=ir.tensor(
                (offsets > -config.past_horizon)
                & (offsets < max(config.attention_context_right, 1))
            )
        )


class Gemma4AudioAttention(nn.Module):
    """Chunked local attention with relative positions and a softcap (Gemma4AudioAttention),
    in float32."""

    def __init__(self, config: Gemma4AudioConfig) -> None:
        super().__init__()
        hidden, clipped = config.hidden_size, config.use_clipped_linears
        self.config = config
        self.heads, self.head_dim = config.num_attention_heads, config.head_dim
        self.q_proj = ClippableLinear(hidden, hidden, clipped)
        self.k_proj = ClippableLinear(hidden, hidden, clipped)
        self.v_proj = ClippableLinear(hidden, hidden, clipped)
        self.post = ClippableLinear(hidden, hidden, clipped)
        self.relative_k_proj = Linear(hidden, hidden)
        self.per_dim_scale = parameter([self.head_dim])

    def _heads(self, op, x: ir.Value) -> ir.Value:
        """[clips, frames, hidden] → [clips, frames, heads, head_dim] in float32."""
        return op.Reshape(in_float32(op, x), _ints(op, 0, 0, self.heads, self.head_dim))

    def _windows(self, op, x: ir.Value, blocks: _Blocks) -> ir.Value:
        """[clips, frames, heads, d] → [clips, heads, U, W, d]: each chunk's keys, zeros past
        either end."""
        config = self.config
        after = config.attention_context_right + config.attention_chunk_size - 1
        padded = op.Pad(x, _ints(op, 0, config.past_horizon, 0, 0, 0, after, 0, 0))
        return op.Transpose(op.Gather(padded, blocks.window, axis=1), perm=[0, 3, 1, 2, 4])

    def _chunks(self, op, q: ir.Value, blocks: _Blocks) -> ir.Value:
        """[clips, frames, heads, d] → [clips, heads, U, C, d], zeros after the last frame."""
        c = self.config.attention_chunk_size
        tail = op.Sub(op.Mul(blocks.chunks, _ints(op, c)), blocks.frames)
        chunked = op.Pad(q, op.Concat(_ints(op, 0, 0, 0, 0, 0), tail, _ints(op, 0, 0), axis=0))
        shape = op.Concat(
            op.Shape(q, end=1), blocks.chunks, _ints(op, c, self.heads, self.head_dim), axis=0
        )
        return op.Transpose(op.Reshape(chunked, shape), perm=[0, 3, 1, 2, 4])

    def _relative(self, op, queries: ir.Value, blocks: _Blocks) -> ir.Value:
        """q · rel, shifted so that window index w holds the key's distance (Transformer-XL's
        appendix B): [clips, heads, U, C, W]."""
        config = self.config
        c, w = config.attention_chunk_size, config.context_size
        positions = op.Constant(value=ir.tensor(relative_positions(config)))
        rel = self.relative_k_proj(op, op.CastLike(positions, self.per_dim_scale))
        rel = op.Transpose(
            op.Reshape(in_float32(op, rel), _ints(op, -1, self.heads, self.head_dim)),
            perm=[1, 2, 0],
        )  # [heads, d, P]
        scores = op.MatMul(queries, op.Unsqueeze(rel, _ints(op, 1)))  # [clips, heads, U, C, P]
        return rel_shift(op, scores, c, w, relative_positions(config).shape[0])

    def _allowed(self, op, key_mask: ir.Value, blocks: _Blocks) -> ir.Value:
        """[clips, 1, U, C, W]: the key is near the query, inside the clip and not masked."""
        past = self.config.past_horizon
        after = self.config.attention_context_right + self.config.attention_chunk_size - 1
        # 0 past either end (padded as numbers: onnxruntime pads no bool tensors)
        padded = op.Pad(op.Cast(key_mask, to=_FLOAT), _ints(op, 0, past, 0, after))
        keys = op.Greater(op.Gather(padded, blocks.window, axis=1), op.Constant(value_float=0.5))
        return op.And(op.Unsqueeze(keys, _ints(op, 1, 3)), blocks.near)

    def forward(self, op, x: ir.Value, key_mask: ir.Value, blocks: _Blocks) -> ir.Value:
        config = self.config
        q_scale = self.head_dim**-0.5 / math.log(2)
        k_scale = math.log(1 + math.e) / math.log(2)
        q = op.Mul(self._heads(op, self.q_proj(op, x)), op.Constant(value_float=q_scale))
        q = op.Mul(q, query_scale(op, self.per_dim_scale))
        k = op.Mul(self._heads(op, self.k_proj(op, x)), op.Constant(value_float=k_scale))
        v = self._heads(op, self.v_proj(op, x))
        queries = self._chunks(op, q, blocks)
        keys = self._windows(op, k, blocks)
        logits = op.Add(
            op.MatMul(queries, op.Transpose(keys, perm=[0, 1, 2, 4, 3])),
            self._relative(op, queries, blocks),
        )
        cap = op.Constant(value_float=config.attention_logit_cap)
        logits = op.Mul(op.Tanh(op.Div(logits, cap)), cap)
        invalid = op.Constant(value_float=config.attention_invalid_logits_value)
        logits = op.Where(self._allowed(op, key_mask, blocks), logits, invalid)
        attended = op.MatMul(op.Softmax(logits, axis=-1), self._windows(op, v, blocks))
        merged = op.Reshape(
            op.Transpose(attended, perm=[0, 2, 3, 1, 4]), _ints(op, 0, -1, config.hidden_size)
        )
        out = op.Slice(merged, _ints(op, 0), blocks.frames, _ints(op, 1))
        return self.post(op, op.CastLike(out, x))


class _FeedForward(nn.Module):
    """Half-step macaron FFN: clip → norm → Linear(4H) → act → Linear → clip → norm → · w."""

    def __init__(self, config: Gemma4AudioConfig) -> None:
        super().__init__()
        hidden, clipped, eps = config.hidden_size, config.use_clipped_linears, config.rms_norm_eps
        self.config = config
        self.ffw_layer_1 = ClippableLinear(hidden, 4 * hidden, clipped)
        self.ffw_layer_2 = ClippableLinear(4 * hidden, hidden, clipped)
        self.pre_layer_norm = RMSNorm(hidden, eps)
        self.post_layer_norm = RMSNorm(hidden, eps)

    def forward(self, op, x: ir.Value) -> ir.Value:
        bound = self.config.gradient_clipping
        h = self.pre_layer_norm(op, _clip(op, x, bound))
        h = self.ffw_layer_2(op, activation(op, self.ffw_layer_1(op, h), self.config.hidden_act))
        h = self.post_layer_norm(op, _clip(op, h, bound))
        return op.Add(x, op.Mul(h, _scalar(op, self.config.residual_weight, h)))


class _LightConv(nn.Module):
    """norm → Linear(2H) → GLU → causal depthwise Conv1d → clip → norm → act → Linear, + x."""

    def __init__(self, config: Gemma4AudioConfig) -> None:
        super().__init__()
        hidden, clipped, eps = config.hidden_size, config.use_clipped_linears, config.rms_norm_eps
        self.config = config
        self.linear_start = ClippableLinear(hidden, 2 * hidden, clipped)
        self.linear_end = ClippableLinear(hidden, hidden, clipped)
        kernel = config.conv_kernel_size  # causal: padded on the left only
        self.depthwise_conv1d = _Conv(
            [hidden, 1, kernel], kernel_shape=[kernel], group=hidden, pads=[kernel - 1, 0]
        )
        self.pre_layer_norm = RMSNorm(hidden, eps)
        self.conv_norm = RMSNorm(hidden, eps)

    def forward(self, op, x: ir.Value) -> ir.Value:
        config = self.config
        value, gate = op.Split(
            self.linear_start(op, self.pre_layer_norm(op, x)), num_outputs=2, axis=-1, _outputs=2
        )
        h = op.Transpose(op.Mul(value, op.Sigmoid(gate)), perm=[0, 2, 1])
        h = self.depthwise_conv1d(op, h)
        h = self.conv_norm(op, _clip(op, op.Transpose(h, perm=[0, 2, 1]), config.gradient_clipping))
        return op.Add(x, self.linear_end(op, activation(op, h, config.hidden_act)))


class Gemma4AudioLayer(nn.Module):
    """One conformer layer (Gemma4AudioLayer)."""

    def __init__(self, config: Gemma4AudioConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.bound = config.gradient_clipping
        self.feed_forward1 = _FeedForward(config)
        self.feed_forward2 = _FeedForward(config)
        self.self_attn = Gemma4AudioAttention(config)
        self.lconv1d = _LightConv(config)
        self.norm_pre_attn = RMSNorm(hidden, config.rms_norm_eps)
        self.norm_post_attn = RMSNorm(hidden, config.rms_norm_eps)
        self.norm_out = RMSNorm(hidden, config.rms_norm_eps)

    def forward(self, op, x: ir.Value, key_mask: ir.Value, blocks: _Blocks) -> ir.Value:
        x = self.feed_forward1(op, x)
        h = self.self_attn(op, self.norm_pre_attn(op, _clip(op, x, self.bound)), key_mask, blocks)
        x = op.Add(x, self.norm_post_attn(op, _clip(op, h, self.bound)))
        x = self.feed_forward2(op, self.lconv1d(op, x))
        return self.norm_out(op, _clip(op, x, self.bound))


class Gemma4AudioTower(nn.Module):
    """(input_features [clips, frames, mel], mask [clips, frames]) → (the tower's output
    [clips, frames / 4, output_proj_dims], the mask of its tokens)."""

    def __init__(self, config: Gemma4AudioConfig) -> None:
        super().__init__()
        self.config = config
        self.subsample_conv_projection = _Subsample(config)
        self.layers = nn.ModuleList([Gemma4AudioLayer(config) for _ in range(config.num_layers)])
        self.output_proj = Linear(config.hidden_size, config.output_proj_dims, bias=True)

    def forward(self, op, features: ir.Value, mask: ir.Value) -> tuple[ir.Value, ir.Value]:
        x, mask = self.subsample_conv_projection(op, features, mask)
        blocks = _Blocks(op, op.Shape(x, start=1, end=2), self.config)
        for layer in self.layers:
            x = layer(op, x, mask, blocks)
        return self.output_proj(op, x), mask


class Gemma4AudioModel(nn.Module):
    """input_features [clips, frames, mel bins] (log-mel, onnxruntime-genai's Gemma4LogMel)
    and input_features_mask [clips, frames] (bool, True on real frames) → audio_features
    [tokens, text hidden]: the real frames' tokens, every clip's in order (Gemma 4)."""

    def __init__(self, config: VisionLanguageConfig) -> None:
        super().__init__()
        audio: Gemma4AudioConfig = config.audio  # type: ignore[assignment]
        self.graph_inputs = [
            (INPUT_FEATURES, None, [CLIPS, FRAMES, MEL_BINS]),
            (INPUT_FEATURES_MASK, ir.DataType.BOOL, [CLIPS, FRAMES]),
        ]
        self.audio_tower = Gemma4AudioTower(audio)
        self.embed_audio = MultimodalEmbedder(
            audio.output_proj_dims, audio.rms_norm_eps, audio.text_hidden_size
        )

    def forward(self, op, features: ir.Value, mask: ir.Value) -> ir.Value:
        tokens, kept = self.audio_tower(op, features, mask)
        embedded = self.embed_audio(op, tokens)
        flat = op.Reshape(embedded, op.Concat(_ints(op, -1), op.Shape(embedded, start=2), axis=0))
        return op.Compress(flat, op.Reshape(kept, _ints(op, -1)), axis=0)
