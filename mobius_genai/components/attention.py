"""Multi-head / grouped-query self-attention with a KV cache, as ONNX `Attention` (opset 24).

q/k/v projections (or one packed [q | k | v] projection split in three), optional clipping of
q/k/v, optional q/k normalization (per head, or over the whole projection) before or after the
rotary embedding (unless the layer has none), then one Attention op that appends the new keys
and values to the cache (each row's tokens placed as components/kv_slots.py says) and applies
the additive mask it is given; with attention sinks, its
output is rescaled as components/sinks.py says. With an output gate (Qwen3.5) q_proj yields [q_h
| gate_h] per head and the output is multiplied by sigmoid(gate); with an attention gate of its
own (config/attention_gate.py: Laguna's softplus, AFMoE's sigmoid), by its activation of x @
g_proj, one value per head or per channel. A layer whose stored heads differ from the cache's
layout (config/head_layout.py: MiMo-V2-Flash) widens its keys and values before the Attention op
and narrows its output after it (components/head_layout.py). Llama 4's layers
(config/local_global.py) L2-normalize each rotated q/k head, or, without a rotary embedding,
scale the queries by their position's attention temperature; Ministral 3's layers scale them by
the same kind of factor, before the rotation (which commutes with it).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.head_layout import narrowed_output, widen_key_values
from mobius_genai.components.kv_slots import Slots, place
from mobius_genai.components.linear import Linear, in_float32, parameter
from mobius_genai.components.norms import HeadwiseNorm, RMSNorm, make_norm
from mobius_genai.components.rope import Rotation
from mobius_genai.components.sinks import SCORES_MODE, apply_sinks
from mobius_genai.config import ArchitectureConfig
from mobius_genai.ep.context import get_build_dtype

# Metadata on Attention nodes for rewrite rules: facts the op's attributes cannot carry.
SLIDING_WINDOW_KEY = "mobius.sliding_window"


class Attention(nn.Module):
    """Self-attention of one decoder layer."""

    def __init__(self, config: ArchitectureConfig, layer_index: int) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.scale = config.scale
        self.softcap = config.attn_logit_softcapping
        self.window = config.window_of_layer(layer_index)
        self.clip = config.clip_qkv
        q_size = self.num_heads * self.head_dim
        kv_size = self.num_kv_heads * self.head_dim
        self.sizes = [q_size, kv_size, kv_size]
        self.layout = config.head_layout
        # the projections' sizes where the layer stores fewer or narrower heads than the cache
        k_size, v_size, o_size = kv_size, kv_size, q_size
        if self.layout is not None:
            self.stored_kv_heads = self.layout.kv_heads[layer_index]
            k_size = self.stored_kv_heads * self.head_dim
            v_size = self.stored_kv_heads * self.layout.v_head_dim
            o_size = self.num_heads * self.layout.v_head_dim
        self.output_gate = config.attention_output_gate
        if config.packed_qkv:
            self.qkv_proj = Linear(config.hidden_size, sum(self.sizes), config.qkv_bias)
            self.q_proj = self.k_proj = self.v_proj = None
        else:
            self.qkv_proj = None
            q_out = 2 * q_size if self.output_gate else q_size
            self.q_proj = Linear(config.hidden_size, q_out, config.qkv_bias)
            self.k_proj = Linear(config.hidden_size, k_size, config.qkv_bias)
            self.v_proj = Linear(config.hidden_size, v_size, config.qkv_bias)
        self.o_proj = Linear(o_size, config.hidden_size, config.o_bias)
        self.own_gate = config.attention_gate
        if self.own_gate is not None:
            gates = self.num_heads if self.own_gate.per_head else q_size
            self.g_proj = Linear(config.hidden_size, gates, bias=False)
        self.sinks = parameter([self.num_heads]) if config.has_sinks(layer_index) else None
        self.per_head_norm = config.qk_norm_per_head
        self.norm_after_rope = config.qk_norm_after_rope
        if config.qk_norm and config.qk_norm_head_weights:
            norm_type, eps = config.norm_type, config.norm_eps
            stacked = config.qk_norm_stacked_weights
            self.q_norm = HeadwiseNorm(norm_type, self.num_heads, self.head_dim, eps, stacked)
            self.k_norm = HeadwiseNorm(norm_type, self.num_kv_heads, self.head_dim, eps, stacked)
        elif config.qk_norm:
            per_head = config.qk_norm_per_head
            q_norm_size = self.head_dim if per_head else q_size
            k_norm_size = self.head_dim if per_head else kv_size
            self.q_norm = make_norm(config.norm_type, q_norm_size, config.norm_eps)
            self.k_norm = make_norm(config.norm_type, k_norm_size, config.norm_eps)
        else:
            self.q_norm = self.k_norm = None
        local_global = config.local_global
        rotates = config.rope_of_layer(layer_index) is not None
        if local_global is not None and local_global.qk_l2_norm and rotates:
            self.q_norm = RMSNorm(self.head_dim, config.norm_eps, affine=False)
            self.k_norm = RMSNorm(self.head_dim, config.norm_eps, affine=False)
            self.per_head_norm, self.norm_after_rope = True, True
        tuning = None if local_global is None else local_global.temperature
        every = tuning is not None and (tuning.every_layer or not rotates)
        self.temperature = tuning if every else None

    def _project(self, op, x: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
        """q, k and v: three projections, or one packed [q | k | v] projection split."""
        if self.qkv_proj is None:
            return self.q_proj(op, x), self.k_proj(op, x), self.v_proj(op, x)
        sizes = op.Constant(value_ints=self.sizes)
        return op.Split(self.qkv_proj(op, x), sizes, axis=-1, _outputs=3)

    def _gated_query(self, op, q: ir.Value) -> tuple[ir.Value, ir.Value]:
        """[q_h | gate_h] for each head h → q and gate, [batch, seq, heads * head_dim] each."""
        pairs = op.Reshape(q, op.Constant(value_ints=[0, 0, self.num_heads, 2 * self.head_dim]))
        q, gate = op.Split(pairs, num_outputs=2, axis=-1, _outputs=2)
        flat = op.Constant(value_ints=[0, 0, -1])
        return op.Reshape(q, flat), op.Reshape(gate, flat)

    def _gated_output(self, op, output: ir.Value, hidden_states: ir.Value) -> ir.Value:
        """`output` [b, s, heads * d] times act(hidden_states @ g_proj), per head or per
        channel, the activation computed in float32 (Laguna's softplus(g_proj(x).float()))."""
        gate = in_float32(op, self.g_proj(op, hidden_states))
        gate = op.Softplus(gate) if self.own_gate.activation == "softplus" else op.Sigmoid(gate)
        gate = op.CastLike(gate, output)
        if not self.own_gate.per_head:
            return op.Mul(output, gate)
        heads = op.Reshape(output, op.Constant(value_ints=[0, 0, self.num_heads, self.head_dim]))
        gated = op.Mul(heads, op.Unsqueeze(gate, op.Constant(value_ints=[-1])))
        return op.Reshape(gated, op.Constant(value_ints=[0, 0, -1]))

    def _clip(self, op, *values: ir.Value) -> tuple[ir.Value, ...]:
        """Each value clipped to [-clip_qkv, clip_qkv] (olmo's clip_qkv)."""
        dtype = get_build_dtype().numpy()
        low = op.Constant(value=ir.tensor(np.array(-self.clip, dtype=dtype)))
        high = op.Constant(value=ir.tensor(np.array(self.clip, dtype=dtype)))
        return tuple(op.Clip(value, low, high) for value in values)

    def _norm(self, op, x: ir.Value, norm: nn.Module, num_heads: int) -> ir.Value:
        if not self.per_head_norm:
            return norm(op, x)
        heads = op.Reshape(x, op.Constant(value_ints=[0, 0, num_heads, self.head_dim]))
        return op.Reshape(norm(op, heads), op.Constant(value_ints=[0, 0, -1]))

    def _temperature(self, op, position_ids: ir.Value, like: ir.Value) -> ir.Value:
        """[batch, seq, 1]: log1p(floor((position + offset) / floor_scale)) * scale + 1, in
        float32."""
        tuning = self.temperature
        positions = op.Cast(op.Unsqueeze(position_ids, op.Constant(value_ints=[-1])), to=1)
        if tuning.position_offset:
            positions = op.Add(positions, op.Constant(value_float=float(tuning.position_offset)))
        steps = op.Floor(op.Div(positions, op.Constant(value_float=float(tuning.floor_scale))))
        log1p = op.Log(op.Add(steps, op.Constant(value_float=1.0)))
        factor = op.Add(
            op.Mul(log1p, op.Constant(value_float=float(tuning.scale))),
            op.Constant(value_float=1.0),
        )
        return op.CastLike(factor, like)

    def attend(
        self, op, q, k, v, attention_bias, past_key, past_value, attributes
    ) -> tuple[ir.Value, ...]:
        """One Attention node: (output [b, s, heads * d], present key, present value[, its
        scores where the sinks read them])."""
        outputs = op.Attention(
            q,
            k,
            v,
            attention_bias,
            past_key,
            past_value,
            _outputs=3 if self.sinks is None else 4,
            **attributes,
        )
        if self.window is not None:
            outputs[0].producer().metadata_props[SLIDING_WINDOW_KEY] = str(self.window)
        return tuple(outputs)

    def forward(
        self,
        op,
        hidden_states: ir.Value,
        position_ids: ir.Value,
        rotary: Rotation | None,
        attention_bias: ir.Value,
        past_key: ir.Value,
        past_value: ir.Value,
        slots: Slots | None = None,
    ) -> tuple[ir.Value, ir.Value, ir.Value]:
        """Returns (output [b, s, hidden], present_key, present_value [b, kv, total, d]);
        with `slots` (components/kv_slots.py) the new keys and values land there."""
        q, k, v = self._project(op, hidden_states)
        if self.layout is not None:
            k, v = widen_key_values(
                op, k, v, self.layout, self.stored_kv_heads, self.num_kv_heads, self.head_dim
            )
        gate = None
        if self.output_gate:
            q, gate = self._gated_query(op, q)
        if self.clip is not None:
            q, k, v = self._clip(op, q, k, v)
        if self.q_norm is not None and not self.norm_after_rope:
            q = self._norm(op, q, self.q_norm, self.num_heads)
            k = self._norm(op, k, self.k_norm, self.num_kv_heads)
        # the rotary turns each channel pair of a position, so a position's scale commutes
        # with it: scaled first, the rotary stays next to the attention (GQA's do_rotary)
        scaled_first = self.temperature is not None and not self.norm_after_rope
        if scaled_first:
            q = op.Mul(q, self._temperature(op, position_ids, q))
        if rotary is not None:
            q = rotary(op, q, position_ids, self.num_heads)
            k = rotary(op, k, position_ids, self.num_kv_heads)
        if self.q_norm is not None and self.norm_after_rope:
            q = self._norm(op, q, self.q_norm, self.num_heads)
            k = self._norm(op, k, self.k_norm, self.num_kv_heads)
        if self.temperature is not None and not scaled_first:
            q = op.Mul(q, self._temperature(op, position_ids, q))
        attributes = {"q_num_heads": self.num_heads, "kv_num_heads": self.num_kv_heads}
        attributes["scale"] = self.scale
        if self.softcap:
            attributes["softcap"] = float(self.softcap)
        if self.sinks is not None:
            attributes["qk_matmul_output_mode"] = SCORES_MODE
        if slots is not None:
            shape = (self.num_kv_heads, self.head_dim)
            past_key = place(op, past_key, k, slots, *shape)
            past_value = place(op, past_value, v, slots, *shape)
        output, present_key, present_value, *scores = self.attend(
            op, q, k, v, attention_bias, past_key, past_value, attributes
        )
        if self.sinks is not None:
            output = apply_sinks(op, output, scores[0], self.sinks, self.num_heads, self.head_dim)
        if self.layout is not None:
            output = narrowed_output(op, output, self.layout, self.num_heads, self.head_dim)
        if gate is not None:
            output = op.Mul(output, op.Sigmoid(gate))
        if self.own_gate is not None:
            output = self._gated_output(op, output, hidden_states)
        return self.o_proj(op, output), present_key, present_value
