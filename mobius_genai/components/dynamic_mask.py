"""Doge's dynamic mask attention (config/dynamic_mask.py): Attention's projections, q/k norms,
rotary and cache, with each key's bias from its value states added to the mask.

Over the present values V [batch, kv_heads, total, head_dim] (the past's and the new ones), per
key/value head j and key t:

    dt[j, t] = exp(A_j * softplus(dt_proj(V[:, t] as one row of kv_heads * head_dim))_j)

The mask each query head h of group j gets is mask + dt[j] (transformers replaces the allowed
positions by dt and leaves the masked ones at the dtype's lowest value: the same, since the
lowest value plus a finite dt rounds back to it). When a query could see more than
`keep_window_size` keys, only its `keep_window_size` largest biases stay (the others go to the
lowest value): the threshold is the k-th largest of its row, k = min(total, window), so keys
tied with it all stay, where torch.topk keeps some of them (exact ties come from repeated
tokens, whose first layer's values are equal). The
causal GroupQueryAttention fusion declines the biased mask, so the layer stays standard
Attention on every EP.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx_ir as ir

from mobius_genai.components.attention import Attention
from mobius_genai.components.linear import Linear, parameter
from mobius_genai.config import ArchitectureConfig
from mobius_genai.ep.context import get_build_dtype

#: Metadata on the biased mask's node: why the causal GroupQueryAttention fusion declines it
#: (optimize/pipeline.py's fusion check expects the Attention node to stay).
KEY_BIAS_KEY = "mobius.key_bias"


class DynamicMaskAttention(Attention):
    """One layer's attention with Doge's dynamic mask (module docstring)."""

    def __init__(self, config: ArchitectureConfig, layer_index: int) -> None:
        super().__init__(config, layer_index)
        section = config.dynamic_mask
        width = self.num_kv_heads * self.head_dim
        self.A = parameter([self.num_kv_heads])
        self.dt_proj = Linear(width, self.num_kv_heads, section.dt_bias)
        # the top-k is built whatever max_position_embeddings says: a bundle's context may be
        # longer (--context-length), and within the window it keeps every key
        self.keep_window = section.keep_window_size

    def _key_bias(self, op, past_value: ir.Value, v: ir.Value) -> ir.Value:
        """dt of every present key, repeated for each query head: [batch, heads, 1, total]."""
        new = op.Reshape(v, op.Constant(value_ints=[0, 0, self.num_kv_heads, self.head_dim]))
        values = op.Concat(past_value, op.Transpose(new, perm=[0, 2, 1, 3]), axis=2)
        rows = op.Reshape(
            op.Transpose(values, perm=[0, 2, 1, 3]),
            op.Constant(value_ints=[0, 0, self.num_kv_heads * self.head_dim]),
        )
        dt = op.Exp(op.Mul(self.A, op.Softplus(self.dt_proj(op, rows))))  # [b, total, kv]
        per_group = op.Unsqueeze(
            op.Transpose(dt, perm=[0, 2, 1]), op.Constant(value_ints=[2, 3])
        )  # [b, kv, 1, 1, total]
        group = self.num_heads // self.num_kv_heads
        shape = op.Concat(
            op.Shape(per_group, start=0, end=2),
            op.Constant(value_ints=[group, 1]),
            op.Shape(per_group, start=4, end=5),
            axis=0,
        )
        repeated = op.Expand(per_group, shape)
        return op.Reshape(repeated, op.Constant(value_ints=[0, self.num_heads, 1, -1]))

    def _kept(self, op, bias: ir.Value) -> ir.Value:
        """`bias` [b, heads, seq, total] with all but each row's `keep_window` largest at the
        lowest value (nothing changes where a row has no more than `keep_window` entries)."""
        total = op.Shape(bias, start=3, end=4)
        k = op.Min(total, op.Constant(value_ints=[self.keep_window]))
        top, _ = op.TopK(bias, k, axis=-1, _outputs=2)
        threshold = op.Gather(top, op.Sub(k, op.Constant(value_ints=[1])), axis=-1)
        dtype = get_build_dtype().numpy()
        low = op.Constant(value=ir.tensor(np.array(ml_dtypes.finfo(dtype).min, dtype=dtype)))
        return op.Where(op.Less(bias, threshold), low, bias)

    def attend(
        self, op, q, k, v, attention_bias, past_key, past_value, attributes
    ) -> tuple[ir.Value, ...]:
        bias = op.Add(attention_bias, self._key_bias(op, past_value, v))
        bias = self._kept(op, bias)
        bias.producer().metadata_props[KEY_BIAS_KEY] = "a bias per key from its values (Doge)"
        return super().attend(op, q, k, v, bias, past_key, past_value, attributes)
