"""DeepSeek sparse attention's lightning indexer (DeepSeek-V3.2, GLM-5): its sizes, as data.

Per query, the indexer scores every key with its own small projections, keeps the best
`index_topk` and masks the others out of the latent attention's softmax
(components/sparse_indexer.py). Its queries come from the low-rank query's normed latent
(wq_b), its keys from the hidden states (wk, then a LayerNorm); the first qk_rope_head_dim
channels of each rotate with the attention's rope tables, as halves (V3.2) or as pairs (GLM-5).

The indexer's keys must outlive the step that computed them, as the attention's do, and
onnxruntime-genai 0.18 carries no growing cache besides the KV pair (its recurrent states
have one fixed shape each). So they ride in the latent cache: each cached token is
[latent | rotated key | indexer key], `index_head_dim` channels more per token
(LatentAttentionConfig.cache_head_dim), with zeros in the queries' matching channels.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError, UnsupportedModelError

_SIZES = ("index_topk", "index_n_heads", "index_head_dim")


@dataclasses.dataclass(frozen=True)
class IndexerConfig:
    """The lightning indexer of every layer: `heads` query heads of `head_dim` over one key
    head, the `topk` best keys kept; `interleaved`: its rope slice turns pairs, not halves."""

    topk: int
    heads: int
    head_dim: int
    interleaved: bool


def read_indexer(raw: Mapping[str, Any], interleaved: bool) -> IndexerConfig:
    """The IndexerConfig of config.json `raw`; errors name the field."""
    sizes = [fields.integer(fields.require(raw, name), name) for name in _SIZES]
    if raw.get("q_lora_rank") is None:
        raise UnsupportedModelError(
            "config.json: q_lora_rank is None; sparse attention models are supported with a "
            "low-rank query (an integer q_lora_rank: the indexer reads its latent)"
        )
    rope = fields.require(raw, "qk_rope_head_dim")
    if sizes[2] < rope:
        raise ConfigError(
            f"config.json: index_head_dim is {sizes[2]}; accepted: at least qk_rope_head_dim "
            f"({rope}), the channels its rope turns"
        )
    kinds = _indexer_types(raw)
    if set(kinds) != {"full"}:
        raise UnsupportedModelError(
            f"config.json: indexer_types is {kinds!r}; accepted: 'full' in every layer (layers "
            "that reuse an earlier layer's top-k are not supported)"
        )
    return IndexerConfig(*sizes, interleaved=interleaved)


def _indexer_types(raw: Mapping[str, Any]) -> list[str]:
    """Each layer's indexer, as GlmMoeDsaConfig derives it: `indexer_types`, else
    `index_topk_pattern` ("F" full, "S" shared), else every `index_topk_freq`-th layer from
    `index_skip_topk_offset - 1` on full (every layer by default)."""
    if raw.get("indexer_types") is not None:
        return list(raw["indexer_types"])
    pattern = raw.get("index_topk_pattern")
    if pattern is not None:
        names = {"F": "full", "S": "shared"}
        return [names.get(c, c) for c in pattern] if isinstance(pattern, str) else list(pattern)
    freq = max(raw.get("index_topk_freq") or 1, 1)
    offset = raw.get("index_skip_topk_offset", 2)
    layers = fields.require(raw, "num_hidden_layers")
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]
