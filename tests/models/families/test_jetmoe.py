"""JetMoE beyond the parity table (test_parity.py's CASES and MUTANTS: the row's layer norm
epsilon and expert bias): its mixture of attention heads against transformers when the heads'
order or the gates are broken, a left-padded batch, the GPU EPs' graphs, the cpu int4 bundle,
og's tokens alone and in a batch (slow), the config it reads and refuses."""

from __future__ import annotations

import json
from collections import Counter

import numpy as np
import pytest

import mobius_genai
from mobius_genai import ConfigError
from mobius_genai.components.attention_experts import MixtureOfHeadsAttention
from mobius_genai.models import FAMILIES
from tests._bundles import (
    bundle_checkpoint,
    check_bundle_generates_like_transformers,
    int4_bundle_ops,
)
from tests._hf import hf_reference_logits, tiny_config, write_tiny_checkpoint
from tests._ort import graph_diffs, left_padded_diffs

TOLERANCE = 1e-4  # f32, max abs diff of logits
ROW = FAMILIES["jetmoe"]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("jetmoe") / "ckpt", "jetmoe", seed=1)


def _heads_by_pick(original):
    """`_queries` with the heads left in pick order (i, j): grouped-query attention then
    pairs query head h with key/value head h // top_k, not transformers' h % kv_heads."""

    def queries(self, op, tokens, stacked, picks):
        by_group = op.Reshape(
            original(self, op, tokens, stacked, picks),
            op.Constant(value_ints=[-1, self.num_kv_heads, self.top_k, self.head_dim]),
        )
        by_pick = op.Transpose(by_group, perm=[0, 2, 1, 3])
        return op.Reshape(by_pick, op.Constant(value_ints=[-1, self.top_k * self.width]))

    return queries


def _gates_dropped(original):
    """`_picks` with every gate 1: the picks' outputs summed unweighted."""

    def picks(self, op, logits):
        chosen, gates = original(self, op, logits)
        return chosen, op.Div(gates, gates)

    return picks


MUTANTS = {
    "heads_by_pick": ("_queries", _heads_by_pick),
    "gates_dropped": ("_picks", _gates_dropped),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_parity_fails_with_the_mixture_of_heads_broken(mutant, checkpoint, tmp_path, monkeypatch):
    name, broken = MUTANTS[mutant]
    ids = np.random.default_rng(0).integers(3, 128, size=(1, 6))
    reference = hf_reference_logits(checkpoint, ids, decode_steps=1)
    original = getattr(MixtureOfHeadsAttention, name)
    monkeypatch.setattr(MixtureOfHeadsAttention, name, broken(original))
    diffs = graph_diffs(checkpoint, reference, ("default",), tmp_path)
    assert diffs["default"] > 10 * TOLERANCE, diffs


@pytest.mark.slow  # routing is per token: the parity case and og's batch (slow) cover it too
def test_left_padded_batch_matches_transformers(checkpoint, tmp_path):
    first, rest = left_padded_diffs(checkpoint, tmp_path)
    assert first <= TOLERANCE and rest <= TOLERANCE, (first, rest)


@pytest.mark.parametrize(
    "ep", ["cuda", *(pytest.param(e, marks=pytest.mark.slow) for e in ("dml", "webgpu"))]
)
def test_gpu_ep_graphs_attend_with_group_query_attention(ep, checkpoint):
    """Each layer's query heads, grouped top_k per key/value head, attend in one
    GroupQueryAttention node, and its norms with their residual adds fuse (float16)."""
    graph = mobius_genai.build(checkpoint, ep, "f16", load_weights=False)["model"].graph
    ops = Counter(node.op_type for node in graph)
    assert (ops["GroupQueryAttention"], ops["Attention"]) == (3, 0), ops
    assert ops["SkipSimplifiedLayerNormalization"] == 6, ops


def test_cpu_int4_bundle_generates(tmp_path):
    """int4 for cpu: each layer's kv_proj and two routers and the LM head in MatMulNBits, the
    MLP experts in QMoE, the attention experts' stacked projections in float; og generates
    every token asked for."""
    ops = int4_bundle_ops("jetmoe", tmp_path)
    assert (ops["QMoE"], ops["MoE"]) == (3, 0), ops
    assert ops["MatMulNBits"] == 3 * 3 + 1, ops


@pytest.mark.slow
def test_bundle_generates_like_transformers_alone_and_in_a_batch(tmp_path, capsys):
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "jetmoe")
    check_bundle_generates_like_transformers(ckpt, tmp_path, capsys)


def _parsed(**overrides):
    raw = tiny_config("jetmoe", **overrides).to_dict()
    return ROW.parse_config(json.loads(json.dumps(raw)))


def test_reads_its_heads_experts_and_norm_epsilons():
    config = _parsed(num_experts_per_tok=1)
    assert (config.num_attention_heads, config.num_key_value_heads, config.head_dim) == (2, 2, 16)
    assert (config.attention_experts.num_experts, config.attention_experts.top_k) == (4, 1)
    assert (config.moe.top_k, config.moe.output_bias, config.moe.normalize_top_k) == (1, True, True)
    assert (config.norm_eps, config.block_norm_eps) == (1e-3, 1e-6)


def test_a_config_json_without_num_attention_heads_reads_as_transformers_derives_it():
    raw = json.loads(json.dumps(tiny_config("jetmoe").to_dict()))
    raw.pop("num_attention_heads")
    assert ROW.parse_config(raw).num_attention_heads == 4


def test_more_picks_than_experts_is_refused_in_one_line():
    raw = {**tiny_config("jetmoe").to_dict(), "num_experts_per_tok": 5}
    with pytest.raises(ConfigError, match="num_experts_per_tok is 5; accepted: 1..4") as error:
        ROW.parse_config(raw)
    assert "\n" not in str(error.value)
