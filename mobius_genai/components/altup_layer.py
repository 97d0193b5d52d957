"""Gemma 3n's decoder layer: attention and MLP on AltUp's active stream, beside a Laurel
block, then the per-layer input added to every stream but the first.

    P = predict(S);  a = P_active;  n = norm(a)
    h = (a + norm(attn(n)) + laurel(n)) / √2            laurel(n) = n + norm(R(L(n)))
    y = h + norm(mlp(norm(h)))                           mlp with a Gaussian top-k when sparse
    C = correct(P, y);  g = norm(proj(act(gate(C_active · scale)) * per_layer_input))
    out = [C_0, C_1 + g, ..., C_{n-1} + g]

A layer whose cache is shared (config/altup.py's kv_sources) has no k/v projections: it
attends with its own queries over the source layer's keys and values, through an Attention
node fed exactly as the source's (the same new keys and the source's past), so the graph keeps
og's past/present per layer and every attention fusion still applies.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.altup import AltUp
from mobius_genai.components.attention import SLIDING_WINDOW_KEY
from mobius_genai.components.kv_slots import place
from mobius_genai.components.linear import Linear
from mobius_genai.components.mlp import activation
from mobius_genai.components.norms import RMSNorm
from mobius_genai.components.rope import Rotation
from mobius_genai.config import ArchitectureConfig

# (new keys, new values, past keys, past values) as a layer's Attention node reads them.
KeysValues = tuple[ir.Value, ir.Value, ir.Value, ir.Value]


class Laurel(nn.Module):
    """x + norm(linear_right(linear_left(x))): a low-rank residual."""

    def __init__(self, hidden: int, rank: int, eps: float) -> None:
        super().__init__()
        self.linear_left = Linear(hidden, rank)
        self.linear_right = Linear(rank, hidden)
        self.post_laurel_norm = RMSNorm(hidden, eps)

    def forward(self, op, x: ir.Value) -> ir.Value:
        low_rank = self.linear_right(op, self.linear_left(op, x))
        return op.Add(x, self.post_laurel_norm(op, low_rank))


class SparseGatedMLP(nn.Module):
    """down(act(g) * up(x)) with g = gate(x), or with `sparsity` > 0 g = relu(gate(x) - cutoff),
    cutoff = mean + std · Φ⁻¹(sparsity) over the channels (float32 Φ⁻¹, as transformers)."""

    def __init__(self, hidden: int, intermediate: int, act: str, sparsity: float) -> None:
        super().__init__()
        self.act = act
        self.multiplier = float(np.float32(NormalDist().inv_cdf(sparsity))) if sparsity else None
        self.gate_proj = Linear(hidden, intermediate)
        self.up_proj = Linear(hidden, intermediate)
        self.down_proj = Linear(intermediate, hidden)

    def _cutoff(self, op, gate: ir.Value) -> ir.Value:
        axes = op.Constant(value_ints=[-1])
        mean = op.ReduceMean(gate, axes, keepdims=1)
        centered = op.Sub(gate, mean)
        std = op.Sqrt(op.ReduceMean(op.Mul(centered, centered), axes, keepdims=1))
        multiplier = op.CastLike(op.Constant(value_float=self.multiplier), gate)
        return op.Relu(op.Sub(gate, op.Add(mean, op.Mul(std, multiplier))))

    def forward(self, op, x: ir.Value) -> ir.Value:
        gate = self.gate_proj(op, x)
        if self.multiplier is not None:
            gate = self._cutoff(op, gate)
        return self.down_proj(op, op.Mul(activation(op, gate, self.act), self.up_proj(op, x)))


class SharedKVAttention(nn.Module):
    """Gemma 3n's and Gemma 4's attention: q/k norms, an unscaled v norm, softmax scale 1; a
    layer that shares its source's cache has no k/v projections (see the module docstring).
    Its head size and key/value heads are its layer's (Gemma 4's full layers have their own);
    with `values_are_keys` it has no v_proj and its values are its keys' projection, normed
    without scale and not rotated (Gemma 4's attention_k_eq_v)."""

    def __init__(
        self, config: ArchitectureConfig, layer_index: int, values_are_keys: bool = False
    ) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.kv_heads_of(layer_index)
        self.head_dim, self.scale = config.head_dim_of(layer_index), config.scale
        self.window = config.window_of_layer(layer_index)
        q_size, kv_size = self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        eps = config.norm_eps
        self.q_proj = Linear(config.hidden_size, q_size, config.qkv_bias)
        self.q_norm = RMSNorm(self.head_dim, eps)
        self.shares = config.kv_source_of(layer_index) != layer_index
        self.v_proj = None
        if not self.shares:
            self.k_proj = Linear(config.hidden_size, kv_size, config.qkv_bias)
            if not values_are_keys:
                self.v_proj = Linear(config.hidden_size, kv_size, config.qkv_bias)
            self.k_norm = RMSNorm(self.head_dim, eps)
            self.v_norm = RMSNorm(self.head_dim, eps, affine=False)
        self.o_proj = Linear(q_size, config.hidden_size, config.o_bias)

    def _headwise(self, op, x: ir.Value, norm: nn.Module, heads: int) -> ir.Value:
        split = op.Reshape(x, op.Constant(value_ints=[0, 0, heads, self.head_dim]))
        return op.Reshape(norm(op, split), op.Constant(value_ints=[0, 0, -1]))

    def _keys_values(self, op, x, position_ids, rotary, past_key, past_value, slots) -> KeysValues:
        keys = self.k_proj(op, x)
        values = keys if self.v_proj is None else self.v_proj(op, x)
        k = self._headwise(op, keys, self.k_norm, self.num_kv_heads)
        v = self._headwise(op, values, self.v_norm, self.num_kv_heads)
        if rotary is not None:
            k = rotary(op, k, position_ids, self.num_kv_heads)
        if slots is not None:
            shape = (self.num_kv_heads, self.head_dim)
            past_key = place(op, past_key, k, slots, *shape)
            past_value = place(op, past_value, v, slots, *shape)
        return k, v, past_key, past_value

    def forward(
        self, op, x, position_ids, rotary: Rotation | None, bias, past, slots, shared
    ) -> tuple[ir.Value, ir.Value, ir.Value, KeysValues]:
        """(output, present key, present value, the new keys and values and the past its
        Attention node read): this layer's own, or `shared`, its source layer's."""
        kv = shared
        if kv is None:
            kv = self._keys_values(op, x, position_ids, rotary, *past, slots)
        q = self._headwise(op, self.q_proj(op, x), self.q_norm, self.num_heads)
        if rotary is not None:
            q = rotary(op, q, position_ids, self.num_heads)
        output, present_key, present_value = op.Attention(
            q,
            *kv[:2],
            bias,
            *kv[2:],
            _outputs=3,
            q_num_heads=self.num_heads,
            kv_num_heads=self.num_kv_heads,
            scale=self.scale,
        )
        if self.window is not None:
            output.producer().metadata_props[SLIDING_WINDOW_KEY] = str(self.window)
        return self.o_proj(op, output), present_key, present_value, kv


class AltUpDecoderLayer(nn.Module):
    """One Gemma 3n layer (see the module docstring); module names as transformers'."""

    def __init__(self, config: ArchitectureConfig, layer_index: int) -> None:
        super().__init__()
        section, hidden, eps = config.altup, config.hidden_size, config.norm_eps
        self.act, self.active = config.hidden_act, section.active
        self.self_attn = SharedKVAttention(config, layer_index)
        self.mlp = SparseGatedMLP(
            hidden,
            section.intermediate_sizes[layer_index],
            config.hidden_act,
            section.activation_sparsity[layer_index],
        )
        for name in (
            "input_layernorm",
            "post_attention_layernorm",
            "pre_feedforward_layernorm",
            "post_feedforward_layernorm",
            "post_per_layer_input_norm",
        ):
            setattr(self, name, RMSNorm(hidden, eps))
        self.altup = AltUp(hidden, section.streams, section.active, eps, section.correct_scale)
        self.laurel = Laurel(hidden, section.laurel_rank, eps)
        self.per_layer_input_gate = Linear(hidden, section.per_layer_size)
        self.per_layer_projection = Linear(section.per_layer_size, hidden)

    def forward(
        self, op, streams, per_layer_input, position_ids, rotary, bias, past, slots, shared
    ) -> tuple[ir.Value, tuple[ir.Value, ir.Value], KeysValues]:
        """(new streams, (present key, present value), the keys and values it attended over);
        `shared` is the source layer's keys and values when this layer shares them."""
        predictions = self.altup(op, streams)
        active = op.Gather(predictions, op.Constant(value_int=self.active), axis=2)
        normed = self.input_layernorm(op, active)
        attn, present_key, present_value, kv = self.self_attn(
            op, normed, position_ids, rotary, bias, past, slots, shared
        )
        hidden = op.Add(active, self.post_attention_layernorm(op, attn))
        hidden = op.Add(hidden, self.laurel(op, normed))
        hidden = op.Div(hidden, op.CastLike(op.Constant(value_float=math.sqrt(2)), hidden))
        mlp = self.mlp(op, self.pre_feedforward_layernorm(op, hidden))
        output = op.Add(hidden, self.post_feedforward_layernorm(op, mlp))
        corrected, first = self.altup(op, predictions, output)
        gate = activation(op, self.per_layer_input_gate(op, first), self.act)
        gated = op.Mul(gate, per_layer_input)
        added = self.post_per_layer_input_norm(op, self.per_layer_projection(op, gated))
        return _add_after_first(op, corrected, added), (present_key, present_value), kv


def _add_after_first(op, streams: ir.Value, x: ir.Value) -> ir.Value:
    """[S_0, S_1 + x, ..., S_{n-1} + x] for streams [batch, seq, n, hidden]."""
    axis = op.Constant(value_ints=[2])
    first = op.Slice(streams, op.Constant(value_ints=[0]), op.Constant(value_ints=[1]), axis)
    rest = op.Slice(streams, op.Constant(value_ints=[1]), op.Constant(value_ints=[2**62]), axis)
    return op.Concat(first, op.Add(rest, op.Unsqueeze(x, axis)), axis=2)
