"""Delta-rule hybrids beyond the family tables (test_parity.py holds their cases and row
mutants): OLMo hybrid (q, k, v projected and convolved apart, post-norm attention layers between
pre-norm delta nets), Lara-Mini (delta nets between windowed rotary and global NoPE attention,
MoE) and Kimi Linear (Kimi delta attention: a decay per key channel, low-rank gates, a
sigmoid-gated norm; NoPE latent attention; DeepSeek-V3's MoE). A prefill longer than
transformers' 64-token chunks, a left-padded batch, mutants of the delta attention's math, the
GPU EP graphs' ops, config.json as transformers reads it, int4 and og's greedy tokens in a batch
(slow; alone: test_bundles.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import onnx
import pytest
from transformers import KimiLinearConfig, LaraMiniConfig, OlmoHybridConfig

import mobius_genai
from mobius_genai import packager
from mobius_genai.components.kimi_delta import KimiDeltaAttention
from mobius_genai.models import FAMILIES
from mobius_genai.models.families.linear_hybrids import olmo_hybrid_linear_attention
from mobius_genai.models.families.preprocess import NORM_WEIGHTS, offset_norm_weights
from mobius_genai.quantize import Int4Options
from mobius_genai.runtime.generate import greedy_tokens, load_model
from tests._bundles import PROMPT, batch_greedy_tokens, bundle_checkpoint
from tests._hf import hf_greedy_tokens, hf_reference_logits, tiny_config, write_tiny_checkpoint
from tests._mutants import with_moe, with_overrides
from tests._ort import (
    left_padded_diffs,
    long_prefill_reference,
    max_abs_diff,
    ort_session,
    parity_diffs,
    run_like_reference,
)

TOLERANCE = 1e-4  # f32


@pytest.fixture(scope="module")
def olmo_hybrid(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("olmo_hybrid") / "ckpt", "olmo_hybrid")


@pytest.fixture(scope="module")
def lara_mini(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("lara_mini") / "ckpt", "lara_mini")


@pytest.fixture(scope="module")
def kimi_linear(tmp_path_factory):
    return write_tiny_checkpoint(tmp_path_factory.mktemp("kimi_linear") / "ckpt", "kimi_linear")


# Variants beyond the default cases of test_parity.py's CASES: OLMo hybrid NoPE (rope_parameters
# without rope_theta, as the released checkpoints), beta not doubled, the attention first;
# Lara-Mini's top-k not renormalized, equal key and value heads, a tied head; Kimi Linear's
# biased latent projections, a low-rank q, every MLP sparse, the attention first.
VARIANTS = {
    "olmo_hybrid_nope_positive_beta_attention_first": (
        "olmo_hybrid",
        {
            "rope_parameters": {"rope_type": "default", "rope_theta": None},
            "linear_allow_neg_eigval": False,
            "layer_types": ["full_attention", "linear_attention", "linear_attention"],
        },
    ),
    "lara_mini_unnormalized_equal_linear_heads_tied": (
        "lara_mini",
        {"norm_topk_prob": False, "linear_num_value_heads": 2, "tie_word_embeddings": True},
    ),
    "kimi_linear_biased_low_rank_q_all_sparse_attention_first": (
        "kimi_linear",
        {
            "attention_bias": True,
            "q_lora_rank": 24,
            "mlp_layer_types": ["sparse"] * 3,
            "layer_types": ["full_attention", "linear_attention", "linear_attention"],
        },
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_variants_match_transformers(case, tmp_path):
    family, overrides = VARIANTS[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1, **overrides)
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 12))
    diffs = parity_diffs(tmp_path, ckpt, ids)
    assert max(diffs.values()) <= TOLERANCE, diffs


# Each row difference undone (as test_parity.py's MUTANTS): the parity check must then fail.
# case → (family, mutant row[, config overrides of the checkpoint]).
MUTANTS = {
    # OLMo hybrid's beta = 2 * sigmoid (linear_allow_neg_eigval); its gated norm at 1e-5 (a
    # large rms_norm_eps shows it); its delta-net layers pre-norm (read as sums normed after
    # the add, the same tensors); NoPE without rope_theta
    "olmo_hybrid_beta_not_doubled": (
        "olmo_hybrid",
        lambda: with_overrides(
            "olmo_hybrid",
            linear_attention=lambda raw: dataclasses.replace(
                olmo_hybrid_linear_attention(raw), beta_scale=1.0
            ),
        ),
    ),
    "olmo_hybrid_gated_norm_at_rms_norm_eps": (
        "olmo_hybrid",
        lambda: with_overrides(
            "olmo_hybrid",
            linear_attention=lambda raw: dataclasses.replace(
                olmo_hybrid_linear_attention(raw),
                gated_norm_eps=None,
            ),
        ),
        {"rms_norm_eps": 0.1},
    ),
    "olmo_hybrid_delta_nets_normed_after_the_add": (
        "olmo_hybrid",
        lambda: with_overrides("olmo_hybrid", recurrent_norm_placement="post_residual"),
    ),
    "olmo_hybrid_rotary_without_rope_theta": (
        "olmo_hybrid",
        lambda: with_overrides("olmo_hybrid", no_rope_layers=()),
        {"rope_parameters": {"rope_type": "default", "rope_theta": None}},
    ),
    # Lara-Mini: rotary only in the windowed layers; the top-k renormalized; in_proj's b and a
    # rows in their order; norms scaling by w (not Qwen3.5's 1 + w)
    "lara_mini_rotary_in_global_layers": (
        "lara_mini",
        lambda: with_overrides("lara_mini", no_rope_layers=()),
    ),
    "lara_mini_unnormalized_top_k": (
        "lara_mini",
        lambda: with_moe(FAMILIES["lara_mini"], normalize_top_k=False),
    ),
    "lara_mini_in_proj_a_before_b": (
        "lara_mini",
        lambda: dataclasses.replace(
            FAMILIES["lara_mini"],
            fused_weights=(
                dataclasses.replace(
                    FAMILIES["lara_mini"].fused_weights[0], parts=("qkv", "z", "a", "b")
                ),
            ),
        ),
    ),
    "lara_mini_norms_offset": (
        "lara_mini",
        lambda: dataclasses.replace(
            FAMILIES["lara_mini"],
            preprocess_weight=offset_norm_weights,
            preprocessed_weights=NORM_WEIGHTS,
        ),
    ),
    # Kimi Linear's latent attention without rotary; its top-k renormalized (moe_renormalize)
    "kimi_linear_rotary_latent_attention": (
        "kimi_linear",
        lambda: with_overrides("kimi_linear", no_rope_layers=()),
    ),
    "kimi_linear_unnormalized_top_k": (
        "kimi_linear",
        lambda: with_moe(FAMILIES["kimi_linear"], normalize_top_k=False),
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(MUTANTS))
def test_parity_fails_without_the_row_difference(case, tmp_path, monkeypatch):
    family, mutant, *overrides = MUTANTS[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1, **(overrides or [{}])[0])
    ids = np.random.default_rng(0).integers(3, 128, size=(1, 12))
    reference = hf_reference_logits(ckpt, ids, decode_steps=1)
    monkeypatch.setitem(FAMILIES, family, mutant())
    package = mobius_genai.build(ckpt, "default", "f32")
    ours = run_like_reference(ort_session(package, tmp_path / "onnx"), reference)
    assert max_abs_diff(ours, reference.logits) > 10 * TOLERANCE


def _per_head_decay(gates):
    """KDA's gates with each head's decay averaged over its key channels (a per-head decay)."""

    def mutant(self, op, hidden_states, current):
        decay, beta = gates(self, op, hidden_states, current)
        sizes = self.sizes
        heads = op.Reshape(decay, op.Constant(value_ints=[0, 0, sizes.key_heads, -1]))
        mean = op.ReduceMean(heads, op.Constant(value_ints=[-1]), keepdims=1)
        flat = op.Reshape(op.Expand(mean, op.Shape(heads)), op.Constant(value_ints=[0, 0, -1]))
        return flat, beta

    return mutant


def _silu_gate(_output_gate):
    """KDA's norm gated by silu (Qwen3.5's gate) instead of sigmoid."""
    return lambda self, op, gate: op.Mul(gate, op.Sigmoid(gate))


def _no_decay(gates):
    """KDA's state never forgetting (the forget gate dropped)."""

    def mutant(self, op, hidden_states, current):
        decay, beta = gates(self, op, hidden_states, current)
        return op.Mul(decay, op.Constant(value_float=0.0)), beta

    return mutant


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "mutate"),
    [("_gates", _per_head_decay), ("_output_gate", _silu_gate), ("_gates", _no_decay)],
)
def test_kimi_delta_attention_mutants_fail_parity(
    kimi_linear, method, mutate, tmp_path, monkeypatch
):
    """Each of KDA's mechanisms (a decay per key channel, the forget gate, the sigmoid output
    gate) matters on the test model: the graph without it misses transformers' logits."""
    ids = np.random.default_rng(0).integers(3, 128, size=(1, 12))
    reference = hf_reference_logits(kimi_linear, ids, decode_steps=2)
    monkeypatch.setattr(KimiDeltaAttention, method, mutate(getattr(KimiDeltaAttention, method)))
    package = mobius_genai.build(kimi_linear, "default", "f32")
    ours = run_like_reference(ort_session(package, tmp_path), reference)
    assert not max_abs_diff(ours, reference.logits) <= 10 * TOLERANCE


@pytest.mark.slow
def test_long_prefill_then_decode_matches_transformers(olmo_hybrid, tmp_path):
    """70 tokens (transformers' chunked delta rule) then 4 decode steps, on the cpu graph."""
    reference = long_prefill_reference(olmo_hybrid)
    package = mobius_genai.build(olmo_hybrid, "cpu", "f32")
    ours = run_like_reference(ort_session(package, tmp_path), reference)
    assert max_abs_diff(ours, reference.logits) <= TOLERANCE


@pytest.mark.parametrize(
    "family",
    [
        "olmo_hybrid",
        *(pytest.param(f, marks=pytest.mark.slow) for f in ("lara_mini", "kimi_linear")),
    ],
)
def test_left_padded_batch_matches_transformers(family, request, tmp_path):
    """Padding stays out of the conv states (q, k and v apart in OLMo hybrid and Kimi Linear)
    and the recurrent state; Lara-Mini's window slides over the padded row's real tokens."""
    first, rest = left_padded_diffs(request.getfixturevalue(family), tmp_path)
    assert first <= TOLERANCE and rest <= TOLERANCE, (first, rest)


# family → (attention layers, delta nets, convs): OLMo hybrid and Kimi Linear convolve q, k
# and v apart
_LAYERS = {"olmo_hybrid": (1, 2, 6), "lara_mini": (2, 2, 2), "kimi_linear": (1, 2, 6)}


# by default Kimi Linear's cuda graph (both new blocks, the latent cache); the others slow
_GPU_CASES = [
    pytest.param(
        family, ep, marks=[] if (family, ep) == ("kimi_linear", "cuda") else [pytest.mark.slow]
    )
    for family in sorted(_LAYERS)
    for ep in ("cuda", "dml", "webgpu")
]


@pytest.mark.parametrize(("family", "ep"), _GPU_CASES)
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


def test_kimi_linear_hub_config_reads_linear_attn_config():
    """The hub's config.json nests the delta attention's sizes and its 1-indexed layer lists in
    `linear_attn_config`, as KimiLinearConfig reads them."""
    section = {
        "head_dim": 16,
        "num_heads": 2,
        "short_conv_kernel_size": 3,
        "full_attn_layers": [2, 4],
        "kda_layers": [1, 3],
    }
    raw = KimiLinearConfig(num_hidden_layers=4, pad_token_id=0).to_dict()
    for key in ("layer_types", "linear_head_dim", "linear_num_heads", "linear_conv_kernel_dim"):
        del raw[key]
    raw["linear_attn_config"] = section
    expected = KimiLinearConfig(num_hidden_layers=4, pad_token_id=0, linear_attn_config=section)
    config = FAMILIES["kimi_linear"].parse_config(raw)
    assert list(config.layer_types) == expected.layer_types
    sizes = config.linear_attention
    assert (sizes.key_heads, sizes.key_head_dim, sizes.conv_kernel_size) == (2, 16, 3)
    assert (expected.linear_num_heads, expected.linear_head_dim) == (2, 16)
    assert config.no_rope_layers == (0, 1, 2, 3)


@pytest.mark.parametrize("family", ["olmo_hybrid", "kimi_linear"])
def test_a_conv_activation_other_than_silu_is_refused(family):
    raw = tiny_config(family).to_dict()
    with pytest.raises(mobius_genai.UnsupportedModelError, match="hidden_act is 'gelu'"):
        FAMILIES[family].parse_config({**raw, "hidden_act": "gelu"})


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(_LAYERS))
def test_og_generates_a_batch_of_prompts_of_different_lengths(family, tmp_path):
    ckpt = bundle_checkpoint(tmp_path / "ckpt", family)
    folder = packager.package(ckpt, "cpu", tmp_path / "bundle", quiet=True)
    prompts = [PROMPT, PROMPT[:4]]
    rows = batch_greedy_tokens(folder, prompts, 8)
    assert rows == [hf_greedy_tokens(ckpt, prompt, 8) for prompt in prompts]


@pytest.mark.slow
@pytest.mark.parametrize("family", sorted(_LAYERS))
def test_int4_bundle_generates(family, tmp_path):
    """Every projection of both layer kinds becomes MatMulNBits (the experts QMoE; Kimi's
    latent up-projection stays float, as DeepSeek's); the states stay float32."""
    ckpt = bundle_checkpoint(tmp_path / "ckpt", family)
    int4 = Int4Options(block_size=16)
    folder = packager.package(
        ckpt, "cpu", tmp_path / "bundle", precision="int4", int4=int4, quiet=True
    )
    assert len(greedy_tokens(load_model(folder), PROMPT, len(PROMPT) + 8)) == 8
    graph = onnx.load(str(folder / "model.onnx"), load_external_data=False).graph
    ops = [node.op_type for node in graph.node]
    # float MatMuls left: the routers' (kept float32) and Kimi's latent up-projections
    floats = [i for n in graph.node if n.op_type == "MatMul" for i in n.input]
    assert not [name for name in floats if name.endswith("_proj.weight")]
    assert ops.count("MatMulNBits") > 10  # the delta nets' and more
    states = [value for value in graph.input if value.name.endswith("_state")]
    assert len(states) == 4
    assert {value.type.tensor_type.elem_type for value in states} == {onnx.TensorProto.FLOAT}
