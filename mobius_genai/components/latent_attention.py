"""Multi-head latent attention (config/latent_attention.py) as one ONNX `Attention` op.

    q        = q_b_proj(norm(q_a_proj(x)))  (or q_proj(x)), per head [q_nope | q_rope]
    latent   = kv_a_proj_with_mqa(x) = [c | k_rope]  (k_rope: one rotary key for every head)
    [k_nope | v] per head = kv_b_proj(norm(c))
    key      = [k_nope | rope(k_rope)],  query = [q_nope | rope(q_rope)]

The rotary embedding turns only the rope slices. Keys and values are cached expanded per head,
the shorter padded with zeros to `cache_head_dim` so that one head size serves both caches
(onnxruntime-genai's KV contract, and GroupQueryAttention's equal head sizes): zero key and
query channels add nothing to q·k, and zero value channels are cut from the output before
o_proj. The softmax scale is the config's (qk_head_dim**-0.5 with yarn's mscale, set by the
family row).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.kv_slots import Slots, place
from mobius_genai.components.linear import Linear
from mobius_genai.components.norms import RMSNorm
from mobius_genai.components.rope import Rotation
from mobius_genai.config import ArchitectureConfig

#: The low-rank norms' epsilon: transformers builds them with RMSNorm's default, not the config's.
LATENT_NORM_EPS = 1e-6


def _heads(op, x: ir.Value, heads: int, dim: int) -> ir.Value:
    return op.Reshape(x, op.Constant(value_ints=[0, 0, heads, dim]))


def _flat(op, x: ir.Value) -> ir.Value:
    return op.Reshape(x, op.Constant(value_ints=[0, 0, -1]))


def _padded(op, x: ir.Value, width: int, dim: int) -> ir.Value:
    """x [batch, seq, heads, width] with zero channels up to `dim`, flattened per token."""
    if width < dim:
        x = op.Pad(x, op.Constant(value_ints=[0, 0, 0, 0, 0, 0, 0, dim - width]))
    return _flat(op, x)


class LatentAttention(nn.Module):
    """Self-attention of one MLA decoder layer; names follow DeepSeek's checkpoints."""

    def __init__(self, config: ArchitectureConfig, layer_index: int) -> None:
        super().__init__()
        mla = config.latent_attention
        if mla is None:
            raise ValueError("LatentAttention needs a config with latent_attention set")
        self.mla = mla
        self.num_heads = heads = config.num_attention_heads
        self.head_dim = mla.cache_head_dim
        self.scale = config.scale
        hidden, bias = config.hidden_size, config.qkv_bias
        q_size = heads * mla.qk_head_dim
        if mla.q_lora_rank is None:
            self.q_proj = Linear(hidden, q_size)
            self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        else:
            self.q_proj = None
            self.q_a_proj = Linear(hidden, mla.q_lora_rank, bias)
            self.q_a_layernorm = RMSNorm(mla.q_lora_rank, LATENT_NORM_EPS)
            self.q_b_proj = Linear(mla.q_lora_rank, q_size)
        self.kv_a_proj_with_mqa = Linear(hidden, mla.kv_lora_rank + mla.qk_rope_head_dim, bias)
        self.kv_a_layernorm = RMSNorm(mla.kv_lora_rank, LATENT_NORM_EPS)
        self.kv_b_proj = Linear(mla.kv_lora_rank, heads * (mla.qk_nope_head_dim + mla.v_head_dim))
        self.o_proj = Linear(heads * mla.v_head_dim, hidden, config.o_bias)

    def _query(self, op, x: ir.Value) -> ir.Value:
        if self.q_proj is not None:
            return self.q_proj(op, x)
        return self.q_b_proj(op, self.q_a_layernorm(op, self.q_a_proj(op, x)))

    def _query_slices(self, op, q: ir.Value) -> tuple[ir.Value, ir.Value]:
        """Each head's query [batch, seq, heads, qk_head_dim] → its unrotated channels and the
        rope slice after them."""
        sizes = [self.mla.qk_nope_head_dim, self.mla.qk_rope_head_dim]
        return op.Split(q, op.Constant(value_ints=sizes), axis=-1, _outputs=2)

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
        """Returns (output [b, s, hidden], present_key, present_value [b, heads, total, d])."""
        if rotary is None:
            raise ValueError("multi-head latent attention rotates its rope slice; no rope given")
        mla, heads, dim = self.mla, self.num_heads, self.head_dim
        nope, rope = mla.qk_nope_head_dim, mla.qk_rope_head_dim
        q = _heads(op, self._query(op, hidden_states), heads, mla.qk_head_dim)
        q_nope, q_rope = self._query_slices(op, q)
        q_rope = _heads(op, rotary(op, _flat(op, q_rope), position_ids, heads), heads, rope)
        latent, k_rope = op.Split(
            self.kv_a_proj_with_mqa(op, hidden_states),
            op.Constant(value_ints=[mla.kv_lora_rank, rope]),
            axis=-1,
            _outputs=2,
        )
        kv = self.kv_b_proj(op, self.kv_a_layernorm(op, latent))
        k_nope, v = op.Split(
            _heads(op, kv, heads, nope + mla.v_head_dim),
            op.Constant(value_ints=[nope, mla.v_head_dim]),
            axis=-1,
            _outputs=2,
        )
        k_rope = _heads(op, rotary(op, k_rope, position_ids, 1), 1, rope)
        k_rope = op.Expand(k_rope, op.Constant(value_ints=[1, 1, heads, 1]))
        q = _padded(op, op.Concat(q_nope, q_rope, axis=-1), mla.qk_head_dim, dim)
        k = _padded(op, op.Concat(k_nope, k_rope, axis=-1), mla.qk_head_dim, dim)
        v = _padded(op, v, mla.v_head_dim, dim)
        if slots is not None:
            past_key = place(op, past_key, k, slots, heads, dim)
            past_value = place(op, past_value, v, slots, heads, dim)
        output, present_key, present_value = op.Attention(
            q,
            k,
            v,
            attention_bias,
            past_key,
            past_value,
            _outputs=3,
            q_num_heads=heads,
            kv_num_heads=heads,
            scale=self.scale,
        )
        if mla.v_head_dim < dim:
            output = op.Slice(
                _heads(op, output, heads, dim),
                op.Constant(value_ints=[0]),
                op.Constant(value_ints=[mla.v_head_dim]),
                op.Constant(value_ints=[-1]),
            )
            output = _flat(op, output)
        return self.o_proj(op, output), present_key, present_value
