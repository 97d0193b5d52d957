"""cohere2 (Command R7B, Command A) and glm4 (GLM-4-0414) against transformers.

cohere2: cohere's parallel block and logit scale over sliding and full-attention layers, the
sliding layers rotating and the full ones not (Cohere2Attention), read from config.json as
Cohere2Config reads it (layer_types, else sliding_window_pattern; keys of the hub's configs it
never reads change nothing). glm4: glm's layer with sandwich norms under Glm4DecoderLayer's
names. f32, <= 1e-4 on the portable, cpu and onnx-standard graphs over prompts longer than the
window; float16 graphs within FLOAT16_TOLERANCE of transformers' float32 logits; the bundles'
tokens from og.Engine and int4 bundles generating. The mutants (no post norms, rotary in the
full layers, no logit scale) are test_parity.py's MUTANTS.
"""

from __future__ import annotations

import json

import numpy as np
import onnxruntime_genai as og
import pytest
import torch
from transformers import AutoModelForCausalLM, Cohere2Config, Glm4Config

import mobius_genai
from mobius_genai import UnsupportedModelError
from mobius_genai.bundle.og_support import bundle_og_limits
from mobius_genai.models import get_family
from mobius_genai.packager import package
from tests._bundles import NEW_TOKENS, PROMPT, bundle_checkpoint, int4_bundle_ops
from tests._hf import (
    edit_config,
    hf_greedy_tokens,
    hf_reference_logits,
    tiny_config,
    write_tiny_checkpoint,
)
from tests._ort import graph_diffs, max_abs_diff, ort_session, run_like_reference
from tests.models.families.test_float32 import FLOAT16_TOLERANCE
from tests.runtime._og import engine_tokens

TOLERANCE = 1e-4
EPS = ("default", "cpu", "onnx-standard")
FAMILIES = ("cohere2", "glm4")
#: config.json keys of Command R7B's hub config that Cohere2Config stores and never reads
#: (values that would change the graph, were they read)
_UNREAD_HUB_KEYS = {
    "rotary_pct": 0.5,
    "position_embedding_type": "rope_gptj",
    "use_qk_norm": True,
    "layer_switch": 3,
    "use_parallel_block": False,
    "use_gated_activation": False,
    "use_embedding_sharing": False,
    "order_of_interleaved_layers": "local_attn_first",
    "cache_implementation": "hybrid",
}


def _parse(family: str, **overrides):
    return get_family(family).parse_config(tiny_config(family, **overrides).to_dict())


def _ids(length: int) -> np.ndarray:
    return np.random.default_rng(0).integers(3, 128, size=(2, length))


def test_cohere2_layers_as_cohere2config_reads_them():
    """Sliding layers rotate, full ones do not; no q/k norms whatever use_qk_norm says; the
    defaults of a config.json without layer_types, window, logit scale or rope are
    Cohere2Config's."""
    config = _parse("cohere2", use_qk_norm=True)
    assert config.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    assert config.no_rope_layers == (1,) and config.sliding_window == 5
    assert config.rope.interleaved and config.rotary_dim == 16 and not config.qk_norm
    assert (config.norm_type, config.parallel_residual, config.logits_scaling) == (
        "layer_no_bias",
        True,
        4.0,
    )
    raw = tiny_config("cohere2", num_hidden_layers=8).to_dict()
    for key in ("layer_types", "sliding_window", "logit_scale", "layer_norm_eps"):
        del raw[key]
    for key in ("rope_parameters", "tie_word_embeddings", "bos_token_id", "eos_token_id"):
        del raw[key]
    hub = get_family("cohere2").parse_config(raw)
    theirs = Cohere2Config(**raw)
    assert hub.layer_types == tuple(theirs.layer_types)  # every 4th layer full
    assert hub.no_rope_layers == (3, 7)
    assert hub.sliding_window == theirs.sliding_window == 4096
    assert hub.logits_scaling == 1 / theirs.logit_scale == 16.0
    assert hub.rope.theta == theirs.rope_parameters["rope_theta"] == 10_000.0
    assert hub.norm_eps == theirs.layer_norm_eps and hub.tie_word_embeddings
    assert (hub.bos_token_id, hub.eos_token_id) == (5, (255_001,))


def test_cohere2_prompt_longer_than_the_window_over_both_layer_kinds(tmp_path):
    """A 20-token prompt (the window is 5) and 6 cached steps; the cpu graph windows and
    rotates in GroupQueryAttention in the sliding layers only."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "cohere2", seed=1)
    reference = hf_reference_logits(ckpt, _ids(20), decode_steps=6)
    diffs = graph_diffs(ckpt, reference, EPS, tmp_path, progress=False)
    assert max(diffs.values()) <= TOLERANCE, diffs
    graph = mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)["model"].graph
    layers = [
        (node.attributes.get_int("local_window_size", -1), node.attributes.get_int("do_rotary", 0))
        for node in graph
        if node.op_type == "GroupQueryAttention"
    ]
    assert layers == [(5, 1), (-1, 0), (5, 1)]
    assert "RotaryEmbedding" not in {node.op_type for node in graph}


def test_cohere2_hub_config(tmp_path):
    """Command R7B's layout: sliding_window_pattern instead of layer_types, rope_theta at the
    top level, and keys Cohere2Config keeps but never reads."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "cohere2", seed=1, hub_layout=True)
    written = json.loads((ckpt / "config.json").read_text())
    assert "layer_types" not in written and written["sliding_window_pattern"] == 2
    edit_config(ckpt, **_UNREAD_HUB_KEYS)
    reference = hf_reference_logits(ckpt, _ids(12), decode_steps=4)
    diffs = graph_diffs(ckpt, reference, ("cpu",), tmp_path, progress=False)
    assert diffs["cpu"] <= TOLERANCE, diffs


@pytest.mark.parametrize("layer_types", [None, ["full_attention"] * 3])
def test_cohere2_without_a_window_is_refused(layer_types, tmp_path):
    """A null sliding_window: transformers' Cohere2Model cannot run (its sliding mask and
    cache need one, even where every layer is full attention); the build refuses it in one
    line."""
    ckpt = write_tiny_checkpoint(
        tmp_path / "ckpt", "cohere2", sliding_window=None, layer_types=layer_types
    )
    model = AutoModelForCausalLM.from_pretrained(ckpt)
    with pytest.raises((TypeError, ValueError)):
        model(torch.tensor(_ids(4)), use_cache=True)
    with pytest.raises(UnsupportedModelError, match="sliding_window is null; cohere2 models"):
        mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)


def test_glm4_is_glm_with_sandwich_norms():
    """glm's attention, rotary and fused MLP; the sandwich layer's norms read under
    Glm4DecoderLayer's names; Glm4Config's defaults for keys a config.json may leave out."""
    glm4 = get_family("glm4")
    config = _parse("glm4")
    assert config.norm_placement == "sandwich" and config.norm_type == "rms"
    assert config.qkv_bias and not (config.o_bias or config.mlp_bias)
    assert config.rope.interleaved and config.rotary_dim == 8  # 0.5 of head_dim 16
    layer = "model.layers.2"
    names = {
        "input_layernorm": "input_layernorm",
        "post_attention_layernorm": "post_self_attn_layernorm",
        "pre_feedforward_layernorm": "post_attention_layernorm",
        "post_feedforward_layernorm": "post_mlp_layernorm",
    }
    for graph_name, stored in names.items():
        assert glm4.checkpoint_name(f"{layer}.{graph_name}.weight") == f"{layer}.{stored}.weight"
    raw = tiny_config("glm4").to_dict()
    for key in ("head_dim", "num_key_value_heads", "rms_norm_eps", "attention_bias"):
        del raw[key]
    del raw["rope_parameters"]["partial_rotary_factor"]
    hub = glm4.parse_config({**raw, "eos_token_id": None})
    theirs = Glm4Config(**{**raw, "eos_token_id": None})
    assert (hub.head_dim, hub.num_key_value_heads) == (theirs.head_dim, theirs.num_key_value_heads)
    assert hub.norm_eps == theirs.rms_norm_eps and hub.qkv_bias == theirs.attention_bias
    assert hub.rotary_dim == theirs.head_dim * theirs.rope_parameters["partial_rotary_factor"]
    assert hub.eos_token_id == tuple(theirs.eos_token_id)


@pytest.mark.parametrize("family", FAMILIES)
def test_longer_prompt_and_more_decode_steps(family, tmp_path):
    """A 24-token prompt and 8 cached steps on every graph."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=2)
    reference = hf_reference_logits(ckpt, _ids(24), decode_steps=8)
    diffs = graph_diffs(ckpt, reference, EPS, tmp_path, progress=False)
    assert max(diffs.values()) <= TOLERANCE, diffs


@pytest.mark.parametrize("family", FAMILIES)
def test_float16_graph_within_tolerance_of_transformers(family, tmp_path):
    """Neither class keeps a parameter in float32 (test_float32.py checks the rows); the
    float16 cpu graph (norms normalizing in float32, logits scaled in float16) stays near
    transformers' float32 logits."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1)
    reference = hf_reference_logits(ckpt, _ids(12), decode_steps=4)
    built = mobius_genai.build(ckpt, "cpu", "f16", progress=False)
    ours = run_like_reference(ort_session(built, tmp_path / "f16"), reference)
    assert max_abs_diff(ours, reference.logits) <= FLOAT16_TOLERANCE


@pytest.mark.parametrize(
    ("family", "ep"),
    [("cohere2", ep) for ep in ("cuda", "dml", "webgpu", "mlx", "trt-rtx")] + [("glm4", "cuda")],
)
def test_gpu_ep_float16_graphs(family, ep, tmp_path):
    """The GPU EPs' float16 graphs (run by ORT CPU, which has every op they use) stay near
    transformers' logits past cohere2's window, GroupQueryAttention in every layer."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1)
    reference = hf_reference_logits(ckpt, _ids(12), decode_steps=4)
    built = mobius_genai.build(ckpt, ep, "f16", progress=False)
    ops = [node.op_type for node in built["model"].graph]
    assert ops.count("GroupQueryAttention") == 3 and "Attention" not in ops
    ours = run_like_reference(ort_session(built, tmp_path / ep), reference)
    assert max_abs_diff(ours, reference.logits) <= FLOAT16_TOLERANCE


@pytest.mark.parametrize("family", FAMILIES)
def test_og_engine_request_gives_transformers_tokens(family, tmp_path):
    """One og.Engine request on the cpu bundle continues as transformers does, past cohere2's
    window; its model.type is decoder, og 0.18 knowing neither family by name."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", family)
    folder = package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    assert bundle_og_limits(folder) == {}
    model = og.Model(str(folder))
    assert model.type == "decoder"
    (tokens,), failures = engine_tokens(model, [PROMPT], NEW_TOKENS)
    assert failures == []
    assert tokens == hf_greedy_tokens(ckpt, PROMPT, NEW_TOKENS)
    assert len(tokens) == NEW_TOKENS
    config = json.loads((folder / "genai_config.json").read_text())
    config["model"]["type"] = family
    (folder / "genai_config.json").write_text(json.dumps(config))
    with pytest.raises(RuntimeError, match=f"Unsupported model_type in config.json: {family}"):
        og.Model(str(folder))


@pytest.mark.parametrize("family", FAMILIES)
def test_int4_bundle_generates(family, tmp_path):
    """Every projection and the LM head in MatMulNBits; og.Generator generates every token."""
    ops = int4_bundle_ops(family, tmp_path)
    assert ops["MatMulNBits"] >= 3 * 3 + 1 and ops["MatMul"] == 0, ops
