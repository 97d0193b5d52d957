"""Gated-delta-net hybrids beyond the family tables (test_parity.py holds their cases and
mutants): OLMo hybrid (q, k, v projected and convolved apart, post-norm attention layers between
pre-norm delta nets) and Lara-Mini (delta nets between windowed rotary and global NoPE
attention, MoE). A prefill longer than transformers' 64-token chunks, a left-padded batch, the
GPU EP graphs' ops, config.json as transformers reads it, int4 and og's greedy tokens in a batch
(slow; alone: test_bundles.py).
"""

from __future__ import annotations

import onnx
import pytest
from transformers import LaraMiniConfig, OlmoHybridConfig

import mobius_genai
from mobius_genai import packager
from mobius_genai.models import FAMILIES
from mobius_genai.quantize import Int4Options
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._hf import hf_greedy_tokens, write_tiny_checkpoint
from tests._ort import (
    left_padded_diffs,
    long_prefill_reference,
    max_abs_diff,
    ort_session,
    run_like_reference,
)
from tests.models.families.test_bundles import PROMPT, _batch_greedy_tokens, _checkpoint

TOLERANCE = 1e-4  # f32


@pytest.fixture(scope="module")
def olmo_hybrid(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("olmo_hybrid") / "ckpt", "olmo_hybrid")


@pytest.fixture(scope="module")
def lara_mini(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("lara_mini") / "ckpt", "lara_mini")


def test_long_prefill_then_decode_matches_transformers(olmo_hybrid, tmp_path):
    """70 tokens (transformers' chunked delta rule) then 4 decode steps, on the cpu graph."""
    reference = long_prefill_reference(olmo_hybrid)
    package = mobius_genai.build(olmo_hybrid, "cpu", "f32")
    ours = run_like_reference(ort_session(package, tmp_path), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE


@pytest.mark.parametrize("family", ["olmo_hybrid", "lara_mini"])
def test_left_padded_batch_matches_transformers(family, request, tmp_path):
    """Padding stays out of the conv states (OLMo hybrid's q, k and v apart) and the
    recurrent state; Lara-Mini's window slides over the padded row's real tokens."""
    first, rest = left_padded_diffs(request.getfixturevalue(family), tmp_path)
    assert first <= TOLERANCE and rest <= TOLERANCE, (first, rest)


# family → (attention layers, delta nets, convs): OLMo hybrid convolves q, k and v apart
_LAYERS = {"olmo_hybrid": (1, 2, 6), "lara_mini": (2, 2, 2)}


@pytest.mark.parametrize(
    "ep", ["cuda", *(pytest.param(ep, marks=pytest.mark.slow) for ep in ("dml", "webgpu"))]
)
@pytest.mark.parametrize("family", sorted(_LAYERS))
def test_gpu_ep_graphs_keep_the_recurrent_ops_and_attend_with_gqa(family, ep, request):
    ckpt = request.getfixturevalue(family)
    graph = mobius_genai.build(ckpt, ep, "f16", load_weights=False)["model"].graph
    ops = [node.op_type for node in graph]
    attention, delta_nets, convs = _LAYERS[family]
    assert ops.count("GroupQueryAttention") == attention and "Attention" not in ops
    assert ops.count("LinearAttention") == delta_nets
    assert ops.count("CausalConvWithState") == convs


def test_config_defaults_as_olmo_hybrid_config_fills_them():
    """Without layer_types and the linear_* sizes: every 4th layer attends, as many delta-net
    heads as attention heads, key heads of 0.75 * hidden / heads, value heads twice that."""
    raw = OlmoHybridConfig(hidden_size=64, num_hidden_layers=6, num_attention_heads=4).to_dict()
    expected = OlmoHybridConfig(**raw)
    for key in ("layer_types", "linear_num_key_heads", "linear_key_head_dim"):
        raw.pop(key)
    raw["linear_num_value_heads"] = raw["linear_value_head_dim"] = None
    config = FAMILIES["olmo_hybrid"].parse_config(raw)
    assert list(config.layer_types) == expected.layer_types
    sizes = config.linear_attention
    assert (sizes.key_heads, sizes.value_heads) == (4, 4)
    assert (sizes.key_head_dim, sizes.value_head_dim) == (12, 24)
    assert sizes.beta_scale == 2.0 and sizes.separate_qkv


def test_lara_mini_defaults_as_its_config_fills_them():
    """Without layer_types: delta net, windowed, delta net, global, windowed, repeated; the
    global layers alone without rotary."""
    raw = LaraMiniConfig(num_hidden_layers=7).to_dict()
    expected = LaraMiniConfig(**raw)
    del raw["layer_types"]
    config = FAMILIES["lara_mini"].parse_config(raw)
    assert list(config.layer_types) == expected.layer_types
    assert config.no_rope_layers == (3,)
    assert config.sliding_window == 512 and config.moe.shared_expert_gate is False


def test_a_conv_activation_other_than_silu_is_refused():
    raw = OlmoHybridConfig(hidden_size=64, num_hidden_layers=4, num_attention_heads=4).to_dict()
    with pytest.raises(mobius_genai.UnsupportedModelError, match="hidden_act is 'gelu'"):
        FAMILIES["olmo_hybrid"].parse_config({**raw, "hidden_act": "gelu"})


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(_LAYERS))
def test_og_generates_a_batch_of_prompts_of_different_lengths(family, tmp_path):
    ckpt = _checkpoint(tmp_path / "ckpt", family)
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    prompts = [PROMPT, PROMPT[:4]]
    rows = _batch_greedy_tokens(folder, prompts, 8)
    assert rows == [hf_greedy_tokens(ckpt, prompt, 8) for prompt in prompts]


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(_LAYERS))
def test_int4_bundle_generates(family, tmp_path):
    """Every projection of both layer kinds becomes MatMulNBits (Lara-Mini's experts QMoE);
    the states stay float32."""
    ckpt = _checkpoint(tmp_path / "ckpt", family)
    int4 = Int4Options(block_size=16)
    folder = packager.package(
        ckpt, "cpu", tmp_path / "bundle", precision="int4", int4=int4, quiet=True
    )
    assert len(greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + 8)) == 8
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    ops = [node.op_type for node in graph.node]
    assert "MatMul" not in ops and ops.count("MatMulNBits") > 10  # the delta nets' and more
    states = [value for value in graph.input if value.name.endswith("_state")]
    assert len(states) == 4
    assert {value.type.tensor_type.elem_type for value in states} == {onnx.TensorProto.FLOAT}
