"""Multi-head latent attention (config/latent_attention.py) over a latent KV cache, as one ONNX
`Attention` op with one key/value head.

    q          = q_b_proj(norm(q_a_proj(x)))  (or q_proj(x)), per head [q_nope | q_rope]
    [c | k_r]  = kv_a_proj_with_mqa(x), c = norm(c)   (k_r: one rotary key for every head)
    kv_b_proj  = per head [W_uk (qk_nope rows) ; W_uv (v rows)] over c's channels

transformers expands per head key = [W_uk c | rope(k_r)] and value = W_uv c. Since
q_nope · W_uk c = (W_uk^T q_nope) · c and sum_t a_t W_uv c_t = W_uv sum_t a_t c_t, the same
attention runs on the latent itself: query [W_uk^T q_nope | rope(q_rope)] per head, one key head
[c | rope(k_r)] shared by every query head, the same tensor as value, and W_uv applied to each
head's first kv_lora_rank output channels. The cache is that one head (kv_lora_rank +
qk_rope_head_dim channels per token) as key and as value: onnxruntime-genai's decoder contract
with num_key_value_heads 1, instead of every head's expanded key and value. The softmax scale is
the config's (qk_head_dim**-0.5 with yarn's mscale, set by the family row). In a layer without
rotary (Kimi Linear's NoPE) the rope slices of q and k_r attend as they are.

With DeepSeek sparse attention (mla.indexer, components/sparse_indexer.py) each cached token
also carries the lightning indexer's key after [c | rope(k_r)], and the queries zeros there:
the attention is unchanged, the indexer reads every key from the cache, and its top-k mask
replaces the layer's attention bias.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.kv_slots import Slots, place
from mobius_genai.components.linear import Linear, parameter
from mobius_genai.components.norms import RMSNorm
from mobius_genai.components.rope import Rotation
from mobius_genai.components.sparse_indexer import IndexerKey, LightningIndexer
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.latent_attention import LatentAttentionConfig

#: The low-rank norms' epsilon: transformers builds them with RMSNorm's default, not the config's.
LATENT_NORM_EPS = 1e-6


def _heads(op, x: ir.Value, heads: int, dim: int) -> ir.Value:
    return op.Reshape(x, op.Constant(value_ints=[0, 0, heads, dim]))


def _flat(op, x: ir.Value) -> ir.Value:
    return op.Reshape(x, op.Constant(value_ints=[0, 0, -1]))


def _per_head(op, x: ir.Value, matrices: ir.Value) -> ir.Value:
    """x [batch, seq, heads, m] times each head's matrix [heads, m, n]: [batch, seq, heads, n]."""
    product = op.MatMul(op.Transpose(x, perm=[0, 2, 1, 3]), matrices)
    return op.Transpose(product, perm=[0, 2, 1, 3])


class LatentUpProjection(nn.Module):
    """kv_b_proj's weight (checkpoint [heads * (qk_nope + v), kv_lora_rank]) as each head's
    W_uk^T [heads, qk_nope, kv_lora_rank] and W_uv^T [heads, kv_lora_rank, v]."""

    def __init__(self, mla: LatentAttentionConfig, heads: int) -> None:
        super().__init__()
        self.mla, self.heads = mla, heads
        rows = heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        self.weight = parameter([mla.kv_lora_rank, rows], transposed=True)

    def forward(self, op) -> tuple[ir.Value, ir.Value]:
        mla = self.mla
        per_head = op.Reshape(
            self.weight,
            op.Constant(
                value_ints=[mla.kv_lora_rank, self.heads, mla.qk_nope_head_dim + mla.v_head_dim]
            ),
        )
        per_head = op.Transpose(per_head, perm=[1, 0, 2])  # [heads, kv_lora_rank, nope + v]
        key, value = op.Split(
            per_head,
            op.Constant(value_ints=[mla.qk_nope_head_dim, mla.v_head_dim]),
            axis=-1,
            _outputs=2,
        )
        return op.Transpose(key, perm=[0, 2, 1]), value


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
        self.kv_b_proj = LatentUpProjection(mla, heads)
        self.o_proj = Linear(heads * mla.v_head_dim, hidden, config.o_bias)
        self.indexer = self.indexer_key = None
        if mla.indexer is not None:
            if mla.q_lora_rank is None:
                raise ValueError("the sparse attention indexer reads the low-rank query's latent")
            self.indexer = LightningIndexer(mla.indexer, hidden, mla.q_lora_rank)
            self.indexer_key = IndexerKey(mla.indexer, hidden)

    def _query_latent(self, op, x: ir.Value) -> ir.Value | None:
        """The low-rank query's normed latent, or None with one q_proj."""
        if self.q_proj is not None:
            return None
        return self.q_a_layernorm(op, self.q_a_proj(op, x))

    def _query(self, op, x: ir.Value, latent: ir.Value | None) -> ir.Value:
        return self.q_proj(op, x) if latent is None else self.q_b_proj(op, latent)

    def _sparse_bias(
        self,
        op,
        x: ir.Value,
        q_latent: ir.Value,
        cached: ir.Value,
        rotary: Rotation,
        position_ids: ir.Value,
        bias: ir.Value,
    ) -> ir.Value:
        """The indexer's top-k mask over `cached` [b, 1, total, d], its keys the last
        channels of each token."""
        start = self.mla.kv_lora_rank + self.mla.qk_rope_head_dim
        keys = op.Slice(
            op.Squeeze(cached, op.Constant(value_ints=[1])),
            op.Constant(value_ints=[start]),
            op.Constant(value_ints=[self.head_dim]),
            op.Constant(value_ints=[-1]),
        )
        return self.indexer(op, x, q_latent, keys, rotary, position_ids, bias)

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
        """Returns (output [b, s, hidden], present_key, present_value [b, 1, total, d]), d =
        kv_lora_rank + qk_rope_head_dim (+ the indexer's head_dim)."""
        mla, heads, dim = self.mla, self.num_heads, self.head_dim
        rank, rope = mla.kv_lora_rank, mla.qk_rope_head_dim
        key_up, value_up = self.kv_b_proj(op)
        q_latent = self._query_latent(op, hidden_states)
        q = _heads(op, self._query(op, hidden_states, q_latent), heads, mla.qk_head_dim)
        q_nope, q_rope = self._query_slices(op, q)
        if rotary is not None:
            q_rope = _heads(op, rotary(op, _flat(op, q_rope), position_ids, heads), heads, rope)
        q = op.Concat(_per_head(op, q_nope, key_up), q_rope, axis=-1)
        if self.indexer is not None:  # zeros against the indexer's key channels
            indexed = dim - rank - rope
            q = op.Pad(q, op.Constant(value_ints=[0, 0, 0, 0, 0, 0, 0, indexed]))
        q = _flat(op, q)
        latent, k_rope = op.Split(
            self.kv_a_proj_with_mqa(op, hidden_states),
            op.Constant(value_ints=[rank, rope]),
            axis=-1,
            _outputs=2,
        )
        latent = self.kv_a_layernorm(op, latent)
        if rotary is not None:
            k_rope = rotary(op, k_rope, position_ids, 1)
        parts = [latent, k_rope]
        if self.indexer is not None:
            parts.append(self.indexer_key(op, hidden_states, rotary, position_ids))
        kv = op.Concat(*parts, axis=-1)  # [b, s, dim]
        if slots is not None:
            past_key = place(op, past_key, kv, slots, 1, dim)
            past_value = place(op, past_value, kv, slots, 1, dim)
        if self.indexer is not None:
            cached = op.Concat(past_key, op.Unsqueeze(kv, op.Constant(value_ints=[1])), axis=2)
            attention_bias = self._sparse_bias(
                op, hidden_states, q_latent, cached, rotary, position_ids, attention_bias
            )
        output, present_key, present_value = op.Attention(
            q,
            kv,
            kv,
            attention_bias,
            past_key,
            past_value,
            _outputs=3,
            q_num_heads=heads,
            kv_num_heads=1,
            scale=self.scale,
        )
        attended = op.Slice(
            _heads(op, output, heads, dim),
            op.Constant(value_ints=[0]),
            op.Constant(value_ints=[rank]),
            op.Constant(value_ints=[-1]),
        )
        output = _flat(op, _per_head(op, attended, value_up))
        return self.o_proj(op, output), present_key, present_value
