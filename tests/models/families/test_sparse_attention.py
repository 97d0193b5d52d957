"""DeepSeek sparse attention (deepseek_v32, glm_moe_dsa): the latent attention with a lightning
indexer keeping each query's best `index_topk` keys, vs transformers.

The tiny rows (tests/_hf.py) keep 4 keys of 12-token prompts and more, so the indexer masks
most keys out: f32, 2 x 12-token prefill + 4 cached decode steps (16 keys at the end), on the
portable and cpu graphs (Attention stays: GroupQueryAttention takes no indexer); a left-padded
batch; a case keeping every key; mutants (the top-k ignored, the indexer's rope slice turned
the other way, its relu dropped) that must move the logits well past the tolerance; the cache
carrying the indexer's keys; refusals; og batches (og.Generator, og.Engine), int4 and float16
bundles. og.Generator's greedy tokens alone: test_bundles.py.
"""

from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np
import onnx_ir as ir
import pytest

import mobius_genai
from mobius_genai import packager
from mobius_genai.components import latent_attention
from mobius_genai.components.sparse_indexer import LightningIndexer
from mobius_genai.errors import ConfigError, UnsupportedModelError
from mobius_genai.models import FAMILIES
from tests._bundles import (
    assert_og_batches_continue_each_prompt,
    bundle_checkpoint,
    int4_bundle_ops,
)
from tests._hf import edit_config, hf_reference_logits, write_tiny_checkpoint
from tests._ort import (
    case_diffs,
    left_padded_diffs,
    mutant_diffs,
    ort_session,
    run_like_reference,
)

TOLERANCE = 1e-4
EPS = ("default", "cpu")
#: The checkpoints' seed. Their prompts hold no tie at a query's top-k boundary: a key whose
#: every head's dot product is negative scores exactly 0, and ONNX TopK keeps the earliest of
#: equal scores where torch's order is open (with 8 indexer heads, glm_moe_dsa's seed 1 tied
#: at one decode step; tests/_hf.py gives the rows 16).
SEED = 1

CASES = {
    # the indexer's rope slice turns halves; the first layer dense (first_k_dense_replace)
    "deepseek_v32": ("deepseek_v32", {}, EPS),
    # the indexer's rope slice turns pairs; the dense layer in the middle (mlp_layer_types);
    # cpu's graph alone (the portable one with cpu's fusions) to keep the default run short
    "glm_moe_dsa": ("glm_moe_dsa", {}, ("cpu",)),
}
SLOW_CASES = {
    # every key kept (index_topk above the 16 keys of the last step): the plain latent attention
    "deepseek_v32_every_key_kept": ("deepseek_v32", {"index_topk": 64}, EPS),
    # one key kept, biased projections, both graphs
    "glm_moe_dsa_one_key_attention_bias": (
        "glm_moe_dsa",
        {"index_topk": 1, "attention_bias": True},
        EPS,
    ),
}


def _ids() -> np.ndarray:
    return np.random.default_rng(0).integers(3, 128, size=(2, 12))


@pytest.mark.parametrize(
    "case",
    [*sorted(CASES), *(pytest.param(c, marks=pytest.mark.slow) for c in sorted(SLOW_CASES))],
)
def test_sparse_attention_graphs_match_transformers(case, tmp_path):
    family, overrides, eps = {**CASES, **SLOW_CASES}[case]
    diffs = case_diffs(tmp_path, family, _ids(), eps, seed=SEED, **overrides)
    assert max(diffs.values()) <= TOLERANCE, diffs


@pytest.mark.slow
def test_left_padded_batch_matches_transformers(tmp_path):
    """A batch of two, the first left-padded by 4: the indexer masks padding keys as the
    attention does, before it picks."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "deepseek_v32", seed=SEED)
    first, rest = left_padded_diffs(ckpt, tmp_path / "graph")
    assert max(first, rest) <= TOLERANCE, (first, rest)


class _TopKIgnored(LightningIndexer):
    """Scores every key, then lets each query attend to all of them."""

    def forward(self, op, x, q_latent, keys, rotary, position_ids, bias):
        super().forward(op, x, q_latent, keys, rotary, position_ids, bias)
        return bias


class _NoRelu(LightningIndexer):
    """Weights the raw dot products, negative ones included."""

    def scores(self, op, x, q_latent, keys, rotary, position_ids):
        relu = op.Relu
        op.Relu = lambda value: value
        try:
            return super().scores(op, x, q_latent, keys, rotary, position_ids)
        finally:
            op.Relu = relu


def _indexer_rope_flipped(family: str):
    """The row with its indexer's rope slice turning pairs for halves (or the reverse)."""
    row = FAMILIES[family]
    read = row.config_overrides["latent_attention"]

    def mutant(raw):
        mla = read(raw)
        indexer = dataclasses.replace(mla.indexer, interleaved=not mla.indexer.interleaved)
        return dataclasses.replace(mla, indexer=indexer)

    return dataclasses.replace(
        row, config_overrides={**row.config_overrides, "latent_attention": mutant}
    )


MUTANTS = {
    "top_k_ignored": ("deepseek_v32", (latent_attention, "LightningIndexer", _TopKIgnored)),
    "indexer_relu_dropped": ("glm_moe_dsa", (latent_attention, "LightningIndexer", _NoRelu)),
    "v32_indexer_rope_pairs": ("deepseek_v32", _indexer_rope_flipped("deepseek_v32")),
    "glm_indexer_rope_halves": ("glm_moe_dsa", _indexer_rope_flipped("glm_moe_dsa")),
}


@pytest.mark.parametrize(
    "case",
    [c if c == "top_k_ignored" else pytest.param(c, marks=pytest.mark.slow) for c in MUTANTS],
)
def test_parity_fails_with_one_detail_wrong(case, tmp_path, monkeypatch):
    family, mutant = MUTANTS[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=SEED)
    ours, mutated = mutant_diffs(ckpt, _ids(), tmp_path, family, mutant, monkeypatch)
    assert ours <= TOLERANCE
    assert mutated > 10 * TOLERANCE


def test_the_cache_carries_the_indexer_keys_and_gqa_declines(tmp_path):
    """One latent head of kv_lora_rank + qk_rope_head_dim + index_head_dim (32 + 8 + 16)
    channels: og 0.18 carries no growing cache besides the KV pair, so the indexer's keys ride
    in it. Every EP keeps standard Attention (GroupQueryAttention's shared buffer is not the
    concatenated past the indexer reads), with its TopK, and builds without a GQA warning
    (dml, webgpu and onnx-standard too: test_gpu_graphs_keep_attention_and_the_indexer)."""
    _graphs_keep_attention_and_the_indexer(tmp_path, ("cpu", "cuda"))


@pytest.mark.slow
def test_gpu_graphs_keep_attention_and_the_indexer(tmp_path):
    _graphs_keep_attention_and_the_indexer(tmp_path, ("dml", "webgpu", "onnx-standard"))


def _graphs_keep_attention_and_the_indexer(tmp_path, eps: tuple[str, ...]) -> None:
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "deepseek_v32")
    for ep in eps:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            graph = mobius_genai.build(ckpt, ep, "f32", load_weights=False)["model"].graph
        ops = [node.op_type for node in graph]
        assert (ops.count("Attention"), ops.count("GroupQueryAttention")) == (3, 0), ep
        assert ops.count("ScatterElements") >= 3 and "TopK" in ops, ep
        caches = [value for value in graph.inputs if value.name.startswith("past_key_values")]
        assert {(value.shape[1], value.shape[3]) for value in caches} == {(1, 56)}, ep


@pytest.mark.slow
def test_cpu_bundle_declares_the_wider_latent_head(tmp_path):
    """genai_config's decoder: one key/value head of 56 channels, no shared buffer."""
    folder = packager.package(
        bundle_checkpoint(tmp_path / "og", "glm_moe_dsa"), "cpu", tmp_path / "bundle", quiet=True
    )
    config = json.loads((folder / "genai_config.json").read_text())
    decoder = config["model"]["decoder"]
    assert (decoder["num_key_value_heads"], decoder["head_size"]) == (1, 56)
    assert config["search"]["past_present_share_buffer"] is False


REFUSALS = {
    "shared_indexer_layers": (
        UnsupportedModelError,
        "indexer_types is \\['full', 'shared', 'full'\\]",
        {"indexer_types": ["full", "shared", "full"]},
    ),
    "shared_by_pattern": (
        UnsupportedModelError,
        "indexer_types is \\['full', 'shared', 'full'\\]",
        {"indexer_types": None, "index_topk_pattern": "FSF"},
    ),
    "one_q_proj": (UnsupportedModelError, "q_lora_rank is None", {"q_lora_rank": None}),
    "indexer_head_narrower_than_rope": (
        ConfigError,
        "index_head_dim is 4; accepted: at least qk_rope_head_dim",
        {"index_head_dim": 4},
    ),
    "other_layer_types": (
        UnsupportedModelError,
        "layer_types is \\['full_attention'",
        {"layer_types": ["full_attention"] * 3},
    ),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_what_the_rows_cannot_build_is_refused_in_one_line(case, tmp_path):
    error, match, changes = REFUSALS[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "glm_moe_dsa")
    edit_config(ckpt, **changes)
    with pytest.raises(error, match=match):
        mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)


@pytest.mark.slow
@pytest.mark.parametrize("family", ["deepseek_v32", "glm_moe_dsa"])
def test_cpu_int4_bundle_generates(family, tmp_path):
    """int4 for cpu: the projections (the indexer's among them) in MatMulNBits, the routed
    experts in QMoE, and onnxruntime-genai generates every token asked for."""
    ops = int4_bundle_ops(family, tmp_path)
    assert (ops["QMoE"], ops["MoE"]) == (2, 0)
    assert ops["MatMulNBits"] > 0 and ops["TopK"] >= 3


@pytest.mark.slow
def test_float16_graph_keeps_the_head_weights_float32(tmp_path):
    """float16 (`_keep_in_fp32_modules`): weights_proj stays float32 and multiplies the hidden
    state cast to float32, and the graph runs to finite logits. Its logits are not compared
    with float32 ones: float16 queries move scores by more than the tiny model's closest gaps
    between the 4th and 5th key (0.01), and another pick moves the logits by up to 0.6."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "deepseek_v32", seed=SEED)
    package = mobius_genai.build(ckpt, "cpu", "f16", progress=False)
    graph = package["model"].graph
    weight = graph.initializers["model.layers.0.self_attn.indexer.weights_proj.weight"]
    assert weight.dtype == ir.DataType.FLOAT
    (matmul,) = [use.node for use in weight.uses()]
    cast = matmul.inputs[0].producer()
    assert (cast.op_type, cast.attributes["to"].value) == ("Cast", ir.DataType.FLOAT)
    reference = hf_reference_logits(ckpt, _ids(), decode_steps=2)
    ours = run_like_reference(ort_session(package, tmp_path / "graph"), reference)
    assert all(np.isfinite(logits).all() for logits in ours)


@pytest.mark.slow
def test_og_batch_of_prompts_of_different_lengths_generates_like_transformers(tmp_path):
    """og.Generator's batch (the shorter prompt padded on the right, the padding keys hidden
    from the indexer as from the attention) and og.Engine's requests of different lengths (each
    row's keys placed in the cache, components/kv_slots.py, where the indexer reads them) each
    continue as transformers continues that prompt alone, on the cpu bundle. (glm_moe_dsa's:
    deepseek_v32's tiny model generates token 0, the bundle's pad token, which og.Engine 0.18
    treats as padding: its tokens equal transformers' once genai_config names another pad.)"""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", "glm_moe_dsa")
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    assert_og_batches_continue_each_prompt(ckpt, folder)
