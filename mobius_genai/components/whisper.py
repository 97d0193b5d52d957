"""Whisper's encoder and decoder as standard ONNX (onnxscript.nn modules).

    front end  mel [b, mels, frames] → Gelu(Conv1d k3) → Gelu(Conv1d k3 stride 2) → [b, pos, d]
               + the encoder's position table (sinusoids, stored by every checkpoint)
    encoder    h = x + attn(LN(x));  out = h + fc2(gelu(fc1(LN(h))))   (bidirectional);  LN
    cross K/V  per decoder layer: k_proj, v_proj of the encoder output, computed once, in heads
    decoder    tokens + learned positions from the cache's length → layers (causal self-attention
               with a KV cache, cross-attention over the cross K/V, MLP; each pre-norm) → LN →
               tied output (the token table transposed)

Module names follow transformers' (`encoder.conv1`, `decoder.layers.0.encoder_attn.q_proj`),
so a graph parameter is its checkpoint name without `model.` (the MLP's `mlp.` aside). The
attention is ONNX Attention (opset 24): k_proj has no bias, as in Whisper.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.embedding import Embedding
from mobius_genai.components.linear import Linear, parameter
from mobius_genai.components.mlp import FCMLP, activation
from mobius_genai.components.norms import LayerNorm
from mobius_genai.config.whisper import WhisperConfig
from mobius_genai.ep.context import get_build_dtype

#: A (key, value) pair of cache tensors, [batch, heads, length, head_dim] each.
KeyValue = tuple[ir.Value, ir.Value]


class Conv1d(nn.Module):
    """Conv1d with weight [out, in, kernel] and bias, as stored; padding keeps the edges."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, stride: int) -> None:
        super().__init__()
        self.kernel, self.stride = kernel, stride
        self.weight = parameter([out_channels, in_channels, kernel])
        self.bias = parameter([out_channels])

    def forward(self, op, x: ir.Value) -> ir.Value:
        pad = self.kernel // 2
        return op.Conv(x, self.weight, self.bias, pads=[pad, pad], strides=[self.stride])


def split_heads(op, x: ir.Value, heads: int, head_dim: int) -> ir.Value:
    """[b, s, heads * head_dim] → [b, heads, s, head_dim]."""
    split = op.Reshape(x, op.Constant(value_ints=[0, 0, heads, head_dim]))
    return op.Transpose(split, perm=[0, 2, 1, 3])


class SelfAttention(nn.Module):
    """Bidirectional (encoder) or causal with a cache (decoder) self-attention."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.q_proj = Linear(hidden, hidden, bias=True)
        self.k_proj = Linear(hidden, hidden, bias=False)
        self.v_proj = Linear(hidden, hidden, bias=True)
        self.out_proj = Linear(hidden, hidden, bias=True)

    def forward(
        self, op, x: ir.Value, bias: ir.Value | None = None, past: KeyValue | None = None
    ) -> tuple[ir.Value, ir.Value | None, ir.Value | None]:
        """(output, present key, present value); the presents are None without `past`."""
        q, k, v = self.q_proj(op, x), self.k_proj(op, x), self.v_proj(op, x)
        heads = {"q_num_heads": self.heads, "kv_num_heads": self.heads}
        if past is None:
            return self.out_proj(op, op.Attention(q, k, v, **heads)), None, None
        output, key, value = op.Attention(q, k, v, bias, *past, _outputs=3, **heads)
        return self.out_proj(op, output), key, value


class CrossKeyValue(nn.Module):
    """One decoder layer's cross cache: k_proj and v_proj of the encoder output, in heads
    (the encoder graph computes it once; the decoder reads it every step)."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.k_proj = Linear(hidden, hidden, bias=False)
        self.v_proj = Linear(hidden, hidden, bias=True)

    def forward(self, op, encoder_output: ir.Value) -> KeyValue:
        shape = (self.heads, self.head_dim)
        return (
            split_heads(op, self.k_proj(op, encoder_output), *shape),
            split_heads(op, self.v_proj(op, encoder_output), *shape),
        )


class CrossAttention(nn.Module):
    """The decoder's queries over the cross cache (q_proj and out_proj; k/v are cached)."""

    def __init__(self, hidden: int, heads: int) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.q_proj = Linear(hidden, hidden, bias=True)
        self.out_proj = Linear(hidden, hidden, bias=True)

    def forward(self, op, x: ir.Value, cross: KeyValue) -> ir.Value:
        q = split_heads(op, self.q_proj(op, x), self.heads, self.head_dim)
        output = op.Transpose(op.Attention(q, *cross), perm=[0, 2, 1, 3])
        flat = op.Reshape(output, op.Constant(value_ints=[0, 0, self.heads * self.head_dim]))
        return self.out_proj(op, flat)


class EncoderLayer(nn.Module):
    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        d, eps = config.d_model, config.layer_norm_eps
        self.self_attn_layer_norm = LayerNorm(d, eps)
        self.self_attn = SelfAttention(d, config.encoder_attention_heads)
        self.final_layer_norm = LayerNorm(d, eps)
        self.mlp = FCMLP(d, config.encoder_ffn_dim, config.activation_function)

    def forward(self, op, x: ir.Value) -> ir.Value:
        x = op.Add(x, self.self_attn(op, self.self_attn_layer_norm(op, x))[0])
        return op.Add(x, self.mlp(op, self.final_layer_norm(op, x)))


class AudioEncoder(nn.Module):
    """mel [batch, num_mel_bins, mel_frames] → encoder output [batch, positions, d_model]."""

    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        self.act = config.activation_function
        self.conv1 = Conv1d(config.num_mel_bins, config.d_model, 3, 1)
        self.conv2 = Conv1d(config.d_model, config.d_model, 3, 2)
        self.embed_positions = Embedding(config.max_source_positions, config.d_model)
        layers = [EncoderLayer(config) for _ in range(config.encoder_layers)]
        self.layers = nn.ModuleList(layers)
        self.layer_norm = LayerNorm(config.d_model, config.layer_norm_eps)

    def forward(self, op, mel: ir.Value) -> ir.Value:
        x = activation(op, self.conv1(op, mel), self.act)
        x = activation(op, self.conv2(op, x), self.act)
        x = op.Add(op.Transpose(x, perm=[0, 2, 1]), self.embed_positions(op))
        for layer in self.layers:
            x = layer(op, x)
        return self.layer_norm(op, x)


class _CrossLayer(nn.Module):
    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        self.encoder_attn = CrossKeyValue(config.d_model, config.decoder_attention_heads)

    def forward(self, op, encoder_output: ir.Value) -> KeyValue:
        return self.encoder_attn(op, encoder_output)


class _CrossProjections(nn.Module):
    """Each decoder layer's cross-attention k_proj / v_proj, under the decoder's names."""

    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_CrossLayer(config) for _ in range(config.decoder_layers)])

    def forward(self, op, encoder_output: ir.Value) -> list[KeyValue]:
        return [layer(op, encoder_output) for layer in self.layers]


class WhisperEncoderModel(nn.Module):
    """The encoder graph's module: mel → (encoder output, every decoder layer's cross K/V)."""

    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        self.encoder = AudioEncoder(config)
        self.decoder = _CrossProjections(config)

    def forward(self, op, mel: ir.Value) -> tuple[ir.Value, list[KeyValue]]:
        hidden = self.encoder(op, mel)
        return hidden, self.decoder(op, hidden)


class DecoderLayer(nn.Module):
    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        d, eps, heads = config.d_model, config.layer_norm_eps, config.decoder_attention_heads
        self.self_attn_layer_norm = LayerNorm(d, eps)
        self.self_attn = SelfAttention(d, heads)
        self.encoder_attn_layer_norm = LayerNorm(d, eps)
        self.encoder_attn = CrossAttention(d, heads)
        self.final_layer_norm = LayerNorm(d, eps)
        self.mlp = FCMLP(d, config.decoder_ffn_dim, config.activation_function)

    def forward(
        self, op, x: ir.Value, bias: ir.Value, past: KeyValue, cross: KeyValue
    ) -> tuple[ir.Value, ir.Value, ir.Value]:
        attended, key, value = self.self_attn(op, self.self_attn_layer_norm(op, x), bias, past)
        x = op.Add(x, attended)
        x = op.Add(x, self.encoder_attn(op, self.encoder_attn_layer_norm(op, x), cross))
        return op.Add(x, self.mlp(op, self.final_layer_norm(op, x))), key, value


class TextDecoder(nn.Module):
    """input_ids (+ the caches) → logits [batch, seq, vocab] and the new self-attention caches."""

    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.d_model)
        self.embed_positions = Embedding(config.max_target_positions, config.d_model)
        layers = [DecoderLayer(config) for _ in range(config.decoder_layers)]
        self.layers = nn.ModuleList(layers)
        self.layer_norm = LayerNorm(config.d_model, config.layer_norm_eps)

    def forward(
        self, op, input_ids: ir.Value, past: list[KeyValue], cross: list[KeyValue]
    ) -> tuple[ir.Value, list[KeyValue]]:
        past_length = op.Shape(past[0][0], start=2, end=3)
        end = op.Add(past_length, op.Shape(input_ids, start=1, end=2))
        positions = learned_positions(op, self.embed_positions(op), past_length, end)
        x = op.Add(self.embed_tokens(op, input_ids), positions)
        bias = causal_bias(op, past_length, end)
        presents = []
        for layer, layer_past, layer_cross in zip(self.layers, past, cross, strict=True):
            x, key, value = layer(op, x, bias, layer_past, layer_cross)
            presents.append((key, value))
        table = self.embed_tokens(op)  # the tied output projection (proj_out)
        logits = op.MatMul(self.layer_norm(op, x), op.Transpose(table, perm=[1, 0]))
        return logits, presents


class WhisperDecoderModel(nn.Module):
    """The decoder graph's module, its parameters under `decoder.` as in the checkpoint."""

    def __init__(self, config: WhisperConfig) -> None:
        super().__init__()
        self.decoder = TextDecoder(config)

    def forward(
        self, op, input_ids: ir.Value, past: list[KeyValue], cross: list[KeyValue]
    ) -> tuple[ir.Value, list[KeyValue]]:
        return self.decoder(op, input_ids, past, cross)


def learned_positions(op, table: ir.Value, past_length: ir.Value, end: ir.Value) -> ir.Value:
    """The rows past_length..end-1 of the position table: the new tokens follow the cache."""
    return op.Slice(table, past_length, end, op.Constant(value_ints=[0]))


def causal_bias(op, past_length: ir.Value, end: ir.Value) -> ir.Value:
    """[1, 1, seq, total]: 0 where query i (position past + i) may see key j (j <= past + i),
    the dtype's lowest value elsewhere; `past_length` and `end` are 1-D of one element."""
    zero = op.Constant(value_ints=[0])
    step = op.Constant(value_int=1)
    start, stop = op.Squeeze(past_length, zero), op.Squeeze(end, zero)
    queries = op.Unsqueeze(op.Range(start, stop, step), op.Constant(value_ints=[1]))
    keys = op.Unsqueeze(op.Range(op.Constant(value_int=0), stop, step), zero)
    dtype = get_build_dtype().numpy()
    allowed = op.Unsqueeze(op.LessOrEqual(keys, queries), op.Constant(value_ints=[0, 1]))
    return op.Where(
        allowed,
        op.Constant(value=ir.tensor(np.array(0, dtype=dtype))),
        op.Constant(value=ir.tensor(np.array(ml_dtypes.finfo(dtype).min, dtype=dtype))),
    )
