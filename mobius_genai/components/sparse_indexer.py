"""DeepSeek sparse attention's lightning indexer (config/sparse_indexer.py): which keys each
query of a latent attention layer may attend to.

    q_h   = rope(wq_b(q_latent))_h              (H heads of D; q_latent: the query's normed latent)
    k     = rope(LayerNorm(wk(x)))              (one key of D per token, cached with the latent)
    w_h   = weights_proj(x)_h * H**-0.5
    score = sum_h w_h * relu(q_h . k * D**-0.5) + bias      (bias: the causal/padding mask)

as transformers' DeepseekV32Indexer computes it (float32; its Hadamard rotation and FP8
scoring leave dot products as they are), then the `topk` best keys (all of them when fewer)
keep their bias and every other key gets the dtype's lowest value: the layer's attention bias.
"""

from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import Linear, in_float32
from mobius_genai.components.norms import LayerNorm
from mobius_genai.components.rope import Rotation
from mobius_genai.config.sparse_indexer import IndexerConfig
from mobius_genai.ep.context import get_build_dtype

#: transformers builds k_norm with this epsilon whatever the config says.
INDEXER_NORM_EPS = 1e-6
#: Metadata on the node yielding the top-k bias: why GroupQueryAttention's fusion declines
#: (the indexer reads the past cache as the Attention op concatenates it, not a shared buffer).
TOP_K_KEY = "mobius.top_k_keys"


def _constant(op, value: float, dtype: ir.DataType) -> ir.Value:
    return op.Constant(value=ir.tensor(np.array(value, dtype=dtype.numpy())))


def _rotation(indexer: IndexerConfig, rotary: Rotation) -> Rotation:
    """The attention's tables, turning pairs or halves as the indexer does."""
    return dataclasses.replace(rotary, interleaved=indexer.interleaved)


class IndexerKey(nn.Module):
    """The indexer's key of each token [batch, seq, head_dim], the rope slice first: computed
    before the cache is written (it is cached), so a module of its own (`indexer_key`, the
    checkpoint's `indexer.wk` and `indexer.k_norm`: the rows' weight renames)."""

    def __init__(self, indexer: IndexerConfig, hidden: int) -> None:
        super().__init__()
        self.config = indexer
        self.wk = Linear(hidden, indexer.head_dim)
        self.k_norm = LayerNorm(indexer.head_dim, INDEXER_NORM_EPS)

    def forward(self, op, x: ir.Value, rotary: Rotation, position_ids: ir.Value) -> ir.Value:
        key = self.k_norm(op, self.wk(op, x))
        return _rotation(self.config, rotary)(op, key, position_ids, 1)


class LightningIndexer(nn.Module):
    """The indexer's scoring and top-k of one layer (`self_attn.indexer.*`)."""

    def __init__(self, indexer: IndexerConfig, hidden: int, q_lora_rank: int) -> None:
        super().__init__()
        self.config = indexer
        self.wq_b = Linear(q_lora_rank, indexer.heads * indexer.head_dim)
        self.weights_proj = Linear(hidden, indexer.heads)

    def _head_weights(self, op, x: ir.Value) -> ir.Value:
        """weights_proj(x) * heads**-0.5 in float32 [batch, seq, 1, heads] (its weight float32
        where the family keeps it so)."""
        weight = self.weights_proj.weight
        x = x if weight.dtype == get_build_dtype() else op.Cast(x, to=weight.dtype)
        weights = in_float32(op, self.weights_proj(op, x), weight.dtype)
        scale = _constant(op, self.config.heads**-0.5, ir.DataType.FLOAT)
        return op.Unsqueeze(op.Mul(weights, scale), op.Constant(value_ints=[2]))

    def scores(
        self,
        op,
        x: ir.Value,
        q_latent: ir.Value,
        keys: ir.Value,
        rotary: Rotation,
        position_ids: ir.Value,
    ) -> ir.Value:
        """Each query's score of every key [batch, seq, total] (float32), before the mask;
        `keys`: every cached key and the new ones [batch, total, head_dim]."""
        heads, dim = self.config.heads, self.config.head_dim
        q = _rotation(self.config, rotary)(op, self.wq_b(op, q_latent), position_ids, heads)
        q = in_float32(op, op.Reshape(q, op.Constant(value_ints=[0, 0, heads, dim])))
        keys = op.Unsqueeze(op.Transpose(in_float32(op, keys), perm=[0, 2, 1]), [1])
        dots = op.Mul(op.MatMul(q, keys), _constant(op, dim**-0.5, ir.DataType.FLOAT))
        weighted = op.MatMul(self._head_weights(op, x), op.Relu(dots))  # [b, s, 1, total]
        return op.Squeeze(weighted, op.Constant(value_ints=[2]))

    def forward(
        self,
        op,
        x: ir.Value,
        q_latent: ir.Value,
        keys: ir.Value,
        rotary: Rotation,
        position_ids: ir.Value,
        bias: ir.Value,
    ) -> ir.Value:
        """The attention bias [batch, 1, seq, total] with every key outside each query's
        top-k (by `scores` plus `bias`) masked."""
        scores = self.scores(op, x, q_latent, keys, rotary, position_ids)
        masked = op.Add(scores, in_float32(op, op.Squeeze(bias, op.Constant(value_ints=[1]))))
        total = op.Shape(masked, start=2, end=3)
        kept = op.Min(op.Constant(value_ints=[self.config.topk]), total)
        _, picks = op.TopK(masked, kept, axis=-1, largest=1, sorted=1, _outputs=2)
        zeros = op.Expand(_constant(op, 0.0, ir.DataType.FLOAT), op.Shape(masked))
        ones = op.Expand(_constant(op, 1.0, ir.DataType.FLOAT), op.Shape(picks))
        chosen = op.ScatterElements(zeros, picks, ones, axis=-1)
        chosen = op.Unsqueeze(op.Cast(chosen, to=ir.DataType.BOOL), op.Constant(value_ints=[1]))
        dtype = get_build_dtype()
        lowest = _constant(op, float(ml_dtypes.finfo(dtype.numpy()).min), dtype)
        sparse = op.Where(chosen, bias, lowest)
        sparse.producer().metadata_props[TOP_K_KEY] = (
            f"each query's {self.config.topk} best keys by the sparse attention's indexer"
        )
        return sparse
