"""Family adapters as data: config parsing (both layouts), refusals, and the weight name map.

No ORT here: these check what each adapter says, on configs transformers writes.
"""

from __future__ import annotations

import collections
import dataclasses
import math

import numpy as np
import pytest

from mobius_genai import ArchitectureConfig, ConfigError, RopeConfig, UnsupportedModelError
from mobius_genai.checkpoint.weights import TensorSource
from mobius_genai.models import FAMILIES, FamilyAdapter, get_family
from mobius_genai.models.families.family_keys import FAMILY_KEYS
from tests._hf import FAMILIES as HF_FAMILIES
from tests._hf import tiny_config

# Every family added after the first four (llama, mistral, qwen2, qwen3), in table order.
NEW_FAMILIES = tuple(
    family for family in FAMILIES if family not in ("llama", "mistral", "qwen2", "qwen3")
)
# onnxruntime-genai 0.18's model types that run a standard decoder graph (DESIGN.md).
GENAI_TYPES = {
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi", "phi3",
    "granite", "olmo", "smollm3", "nemotron", "decoder", "lfm2", "phimoe", "qwen3_5_text",
    "gptoss",  # onnxruntime-genai 0.18's model_type.h; test_bundles.py loads a gpt_oss bundle
    "qwen3_5_moe_text",  # 0.18's type for Qwen3.5-MoE's decoder; qwen3_next runs under it
    "lfm2_moe",  # 0.18's LFM2 model class; test_lfm2_moe.py loads a bundle of it
    "gemma4_text",  # og's builder's Gemma 4 type; test_bundles.py loads a bundle of it
}  # fmt: skip


def _assert_checkpoint_names(family: FamilyAdapter, expected: dict[str, str]) -> None:
    for graph_name, name in expected.items():
        assert family.checkpoint_name(graph_name) == name, graph_name


def _parse(family: str, **overrides):
    return get_family(family).parse_config(tiny_config(family, **overrides).to_dict())


def test_every_family_has_a_test_checkpoint_and_a_genai_type():
    assert set(NEW_FAMILIES) <= set(FAMILIES)
    # rows of multimodal checkpoints built text-only make theirs (test_qwen3_5_hub.py,
    # test_gemma3n.py)
    text_only = {name for name, row in FAMILIES.items() if row.text_only is not None}
    assert text_only == {"qwen3_5", "qwen3_5_moe", "llama4", "gemma3n"}
    assert set(FAMILIES) - text_only == set(HF_FAMILIES)
    for family in FAMILIES.values():
        assert family.genai_type in GENAI_TYPES, family.model_type
    assert FAMILIES["gpt2"].genai_type == "decoder"
    # onnxruntime-genai 0.18 knows neither starcoder2 nor stablelm
    assert FAMILIES["starcoder2"].genai_type == FAMILIES["stablelm"].genai_type == "decoder"
    assert FAMILIES["olmo"].genai_type == "olmo"
    assert FAMILIES["gpt_neox"].genai_type == "decoder"  # onnxruntime-genai has no gpt_neox
    assert FAMILIES["nemotron"].genai_type == "nemotron"
    assert FAMILIES["exaone"].genai_type == "decoder"  # onnxruntime-genai has no exaone
    # onnxruntime-genai has no gptj or cohere; its "chatglm" is another model than glm
    for family in ("gptj", "cohere", "glm"):
        assert FAMILIES[family].genai_type == "decoder", family
    # onnxruntime-genai 0.18 knows none of these; olmo3 runs as olmo, like olmo2
    new = (
        "arcee",
        "helium",
        "ernie4_5",
        "seed_oss",
        "exaone4",
        "hunyuan_v1_dense",
        "internlm3",
        "vaultgemma",
    )
    for family in new:
        assert FAMILIES[family].genai_type == "decoder", family
    assert FAMILIES["olmo3"].genai_type == FAMILIES["olmo2"].genai_type == "olmo"


def test_genai_type_defaults_to_what_most_rows_use():
    # rows whose onnxruntime-genai model.type is the generic decoder leave genai_type out
    default = FamilyAdapter(model_type="any").genai_type
    assert default == "decoder"
    counts = collections.Counter(family.genai_type for family in FAMILIES.values())
    assert counts.most_common(1)[0][0] == default


def test_gemma_family_facts():
    gemma = _parse("gemma")
    assert gemma.embedding_multiplier == math.sqrt(64)
    assert gemma.norm_placement == "pre" and gemma.hidden_act == "gelu_pytorch_tanh"
    gemma2 = _parse("gemma2")
    assert gemma2.norm_placement == "sandwich"
    assert gemma2.scale == pytest.approx(24**-0.5)
    assert gemma2.attn_logit_softcapping == 2.0 and gemma2.final_logit_softcapping == 3.0
    assert [gemma2.window_of_layer(i) for i in range(3)] == [5, None, 5]
    gemma3 = _parse("gemma3_text", attn_logit_softcapping=7.0)
    assert gemma3.qk_norm and gemma3.qk_norm_per_head
    assert gemma3.attn_logit_softcapping is None  # transformers' Gemma3Attention ignores it
    assert gemma3.rope.theta == 10000.0 and gemma3.rope_local.theta == 100.0
    assert [gemma3.rope_of_layer(i) for i in range(3)] == [
        gemma3.rope_local,
        gemma3.rope,
        gemma3.rope_local,
    ]


_SOFTCAPS = ("final_logit_softcapping", "attn_logit_softcapping")


@pytest.mark.parametrize(
    ("family", "keys"),
    [
        ("gemma2", _SOFTCAPS),
        ("vaultgemma", _SOFTCAPS),
        ("gemma3_text", _SOFTCAPS[:1]),  # Gemma3Attention never applies its attention cap
        ("gemma3n_text", _SOFTCAPS[:1]),
    ],
)
def test_absent_softcaps_are_what_the_transformers_config_fills_in(family, keys):
    raw = tiny_config(family).to_dict()
    for key in _SOFTCAPS:
        raw.pop(key, None)
    ours = get_family(family).parse_config(raw)
    theirs = HF_FAMILIES[family](**raw)
    for key in keys:
        assert getattr(ours, key) == getattr(theirs, key), key
    off = get_family(family).parse_config({**raw, **dict.fromkeys(_SOFTCAPS)})
    assert (off.final_logit_softcapping, off.attn_logit_softcapping) == (None, None)
    with pytest.raises(ConfigError, match="'final_logit_softcapping'.*number.*'x'"):
        get_family(family).parse_config({**raw, "final_logit_softcapping": "x"})


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3_5_text", "qwen3_next", "granite"])
def test_families_whose_transformers_class_ignores_softcaps_ignore_them(family):
    config = _parse(family, final_logit_softcapping=2.0, attn_logit_softcapping=2.0)
    assert (config.final_logit_softcapping, config.attn_logit_softcapping) == (None, None)


@pytest.mark.parametrize("family", ["llama", "qwen2", "mistral", "gemma3_text", "cohere"])
def test_families_whose_rotary_turns_whole_heads_ignore_partial_rotary_factor(family):
    raw = tiny_config(family, partial_rotary_factor=0.5).to_dict()
    hub = {key: value for key, value in raw.items() if key != "rope_parameters"}
    for layout in (raw, {**hub, "partial_rotary_factor": 0.5}):  # transformers 5's, the hub's
        config = get_family(family).parse_config(layout)
        assert config.rotary_dim == config.head_dim
        assert config.rope_local is None or config.rope_local.partial_rotary_factor == 1.0


@pytest.mark.parametrize("family", ["phi3", "stablelm", "glm", "qwen3_5_text", "minimax_m2"])
def test_families_whose_rotary_reads_partial_rotary_factor_keep_it(family):
    config = _parse(family, partial_rotary_factor=0.5)
    assert config.rotary_dim == config.head_dim // 2


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "smollm3"])
def test_a_window_without_its_switch_is_off_where_the_config_class_defaults_it_off(family):
    raw = {**tiny_config(family).to_dict(), "sliding_window": 4, "max_window_layers": 0}
    raw.pop("layer_types", None)  # the hub's layout: no layer_types, and here no switch
    del raw["use_sliding_window"]
    hf = type(tiny_config(family)).from_dict(raw)  # no window, or no layer that slides
    assert not hf.sliding_window or "sliding_attention" not in getattr(hf, "layer_types", [])
    config = get_family(family).parse_config(raw)
    assert [config.window_of_layer(i) for i in range(config.num_hidden_layers)] == [None] * 3


@pytest.mark.parametrize("family", ["qwen2", "qwen3", "qwen2_moe", "qwen3_moe", "smollm3"])
@pytest.mark.parametrize("max_window_layers", [None, 1, 3])
def test_a_window_switched_on_without_layer_types_slides_where_the_config_class_says(
    family, max_window_layers
):
    """Hub configs often list no layer_types: Qwen2Config and Qwen3Config slide from
    max_window_layers (28 when absent) on, Qwen2MoeConfig every other layer below it, SmolLM3Config
    its NoPE layers; Qwen3MoeConfig has no layer_types and slides in every layer."""
    raw = {
        **tiny_config(family).to_dict(),
        "use_sliding_window": True,
        "sliding_window": 4,
        "num_hidden_layers": 5,
        "no_rope_layers": [1, 0, 1, 0, 0],
        "max_window_layers": max_window_layers,
    }
    raw.pop("layer_types", None)
    if max_window_layers is None:
        del raw["max_window_layers"]
    hf = type(tiny_config(family)).from_dict(raw)
    kinds = getattr(hf, "layer_types", None) or ["sliding_attention"] * 5
    expected = [hf.sliding_window if kind == "sliding_attention" else None for kind in kinds]
    config = get_family(family).parse_config(raw)
    assert [config.window_of_layer(i) for i in range(5)] == expected


def test_a_row_that_fills_in_a_family_key_reads_it():
    """A default for a key the row does not list would be dropped before it is read."""
    unread = {
        name: sorted(set(row.config_defaults) & FAMILY_KEYS - row.family_keys)
        for name, row in FAMILIES.items()
    }
    assert {name: keys for name, keys in unread.items() if keys} == {}


@pytest.mark.parametrize(
    ("family", "reads"),
    [("llama", True), ("nemotron", True), ("smollm3", True), ("qwen2", False), ("gemma", False)],
)
def test_mlp_bias_only_where_the_mlp_reads_it(family, reads):
    assert _parse(family, mlp_bias=True).mlp_bias == reads


@pytest.mark.parametrize("family", ["mistral", "mixtral", "phi3", "lfm2", "minimax_m2"])
def test_attention_bias_ignored_where_the_projections_have_none(family):
    config = _parse(family, attention_bias=True)
    assert (config.qkv_bias, config.o_bias) == (False, False)


def test_gemma3_hub_layout_local_base_and_window_pattern():
    raw = tiny_config("gemma3_text").to_dict()
    del raw["rope_parameters"], raw["layer_types"]
    raw.update(
        rope_theta=1e6,
        rope_local_base_freq=1e4,
        rope_scaling={"rope_type": "linear", "factor": 8.0},
        sliding_window_pattern=2,
        num_hidden_layers=4,
    )
    config = get_family("gemma3_text").parse_config(raw)
    assert (config.rope.type, config.rope.theta, config.rope.factor) == ("linear", 1e6, 8.0)
    assert (config.rope_local.type, config.rope_local.theta) == ("default", 1e4)
    assert config.layer_types == ("sliding_attention", "full_attention") * 2
    del raw["sliding_window_pattern"]
    config = get_family("gemma3_text").parse_config({**raw, "num_hidden_layers": 6})
    assert config.layer_types == ("sliding_attention",) * 5 + ("full_attention",)


def test_gemma_refuses_bidirectional_attention():
    raw = tiny_config("gemma3_text").to_dict()
    with pytest.raises(UnsupportedModelError, match="use_bidirectional_attention"):
        get_family("gemma3_text").parse_config({**raw, "use_bidirectional_attention": True})


def test_gemma_hub_config_without_tie_word_embeddings_ties():
    raw = tiny_config("gemma").to_dict()
    del raw["tie_word_embeddings"]
    assert get_family("gemma").parse_config(raw).tie_word_embeddings


def test_phi_and_gpt2_layouts():
    phi = _parse("phi", qk_layernorm=True)
    assert (phi.norm_type, phi.parallel_residual, phi.gated_mlp) == ("layer", True, False)
    assert phi.qkv_bias and phi.o_bias and phi.mlp_bias and phi.lm_head_bias and phi.qk_norm
    assert phi.rotary_dim == 8  # partial_rotary_factor 0.5 of head_dim 16
    gpt2 = _parse("gpt2")
    assert (gpt2.hidden_size, gpt2.num_hidden_layers, gpt2.num_attention_heads) == (64, 3, 4)
    assert (gpt2.num_key_value_heads, gpt2.intermediate_size) == (4, 96)
    assert gpt2.max_position_embeddings == 64 and gpt2.position_embedding == "learned"
    assert gpt2.rope_of_layer(0) is None and gpt2.norm_eps == 1e-5
    raw = tiny_config("gpt2").to_dict()
    raw.pop("n_inner")
    raw.pop("tie_word_embeddings")
    gpt2 = get_family("gpt2").parse_config(raw)
    assert gpt2.intermediate_size == 4 * 64 and gpt2.tie_word_embeddings
    assert get_family("gpt2").parse_config({**raw, "scale_attn_weights": False}).scale == 1.0
    with pytest.raises(UnsupportedModelError, match="scale_attn_by_inverse_layer_idx"):
        get_family("gpt2").parse_config({**raw, "scale_attn_by_inverse_layer_idx": True})


def test_granite_olmo2_smollm3_facts():
    granite = _parse("granite")
    assert (granite.embedding_multiplier, granite.residual_multiplier) == (2.0, 0.5)
    assert (granite.logits_scaling, granite.scale) == (4.0, 0.1)
    olmo2 = _parse("olmo2")
    assert olmo2.norm_placement == "post" and olmo2.qk_norm and not olmo2.qk_norm_per_head
    smollm3 = _parse("smollm3")
    assert smollm3.no_rope_layers == (1,)
    assert [smollm3.rope_of_layer(i) is None for i in range(3)] == [False, True, False]
    raw = tiny_config("smollm3", num_hidden_layers=8, no_rope_layers=None).to_dict()
    raw.pop("no_rope_layers")
    assert get_family("smollm3").parse_config(raw).no_rope_layers == (3, 7)  # every 4th
    sliding = _parse("smollm3", use_sliding_window=True, sliding_window=5)
    assert [sliding.window_of_layer(i) for i in range(3)] == [None, 5, None]
    off = tiny_config("smollm3", use_sliding_window=True, sliding_window=5).to_dict()
    off["use_sliding_window"] = False  # transformers then ignores layer_types' sliding entries
    assert get_family("smollm3").parse_config(off).window_of_layer(1) is None


def test_starcoder2_facts():
    starcoder2 = _parse("starcoder2", sliding_window=5)
    assert (starcoder2.norm_type, starcoder2.gated_mlp) == ("layer", False)
    assert starcoder2.qkv_bias and starcoder2.o_bias and starcoder2.mlp_bias
    assert starcoder2.hidden_act == "gelu_pytorch_tanh" and starcoder2.norm_eps == 1e-5
    assert [starcoder2.window_of_layer(i) for i in range(3)] == [5, 5, 5]
    raw = tiny_config("starcoder2", use_bias=False, norm_epsilon=1e-3).to_dict()
    for key in ("tie_word_embeddings", "hidden_act", "sliding_window"):
        raw.pop(key)
    plain = get_family("starcoder2").parse_config(raw)
    assert not (plain.qkv_bias or plain.o_bias or plain.mlp_bias)
    assert plain.norm_eps == 1e-3 and plain.tie_word_embeddings  # the config class's default
    assert plain.hidden_act == "gelu_pytorch_tanh" and plain.window_of_layer(0) is None
    source = get_family("starcoder2").checkpoint_name("model.layers.1.mlp.fc1.bias")
    assert source == "model.layers.1.mlp.c_fc.bias"


def test_stablelm_facts():
    stablelm = _parse("stablelm")
    assert (stablelm.norm_type, stablelm.norm_eps, stablelm.rotary_dim) == ("layer", 1e-5, 4)
    assert stablelm.gated_mlp and not (stablelm.qkv_bias or stablelm.o_bias or stablelm.mlp_bias)
    assert not (stablelm.qk_norm or stablelm.parallel_residual or stablelm.qk_norm_head_weights)
    full = _parse("stablelm", qk_layernorm=True, use_parallel_residual=True, use_qkv_bias=True)
    assert full.qk_norm and full.qk_norm_per_head and full.qk_norm_head_weights
    assert full.parallel_residual and full.qkv_bias and not full.o_bias
    # hub configs: partial_rotary_factor at the top level, or left to the config class
    raw = tiny_config("stablelm").to_dict()
    del raw["rope_parameters"]
    assert get_family("stablelm").parse_config(raw).rope.partial_rotary_factor == 0.25
    raw["partial_rotary_factor"] = 0.5
    assert get_family("stablelm").parse_config(raw).rotary_dim == 8
    # StableLmAttention splits hidden_size over the heads; its rotary embedding reads head_dim
    with pytest.raises(ConfigError, match="head_dim 32"):
        get_family("stablelm").parse_config({**raw, "head_dim": 32})
    stablelm = get_family("stablelm")
    name = "model.layers.0.self_attn.k_norm.norms.1.weight"
    assert stablelm.checkpoint_name(name) == "model.layers.0.self_attn.k_layernorm.norms.1.weight"


def test_olmo_facts():
    olmo = _parse("olmo")
    assert (olmo.norm_type, olmo.norm_eps, olmo.norm_placement) == ("layer_no_affine", 1e-5, "pre")
    assert olmo.clip_qkv is None and not (olmo.qkv_bias or olmo.o_bias or olmo.mlp_bias)
    clipped = _parse("olmo", clip_qkv=8.0, attention_bias=True)
    assert clipped.clip_qkv == 8.0 and clipped.qkv_bias and clipped.o_bias
    raw = tiny_config("olmo").to_dict()
    assert get_family("olmo").parse_config({**raw, "clip_qkv": 8}).clip_qkv == 8.0
    assert get_family("olmo").parse_config({**raw, "rms_norm_eps": 1e-3}).norm_eps == 1e-5
    with pytest.raises(ConfigError, match="'clip_qkv'.*positive number.*0"):
        get_family("olmo").parse_config({**raw, "clip_qkv": 0})


def test_gpt_neox_facts():
    neox = _parse("gpt_neox")
    assert (neox.norm_type, neox.norm_eps, neox.hidden_act) == ("layer", 1e-5, "gelu")
    assert neox.parallel_residual and neox.parallel_mlp_norm and neox.packed_qkv
    assert not neox.gated_mlp and neox.qkv_bias and neox.o_bias and neox.mlp_bias
    assert (neox.num_key_value_heads, neox.head_dim, neox.rotary_dim) == (4, 16, 4)
    assert not neox.tie_word_embeddings
    plain = _parse("gpt_neox", use_parallel_residual=False, attention_bias=False)
    assert not (plain.parallel_residual or plain.parallel_mlp_norm)
    assert not (plain.qkv_bias or plain.o_bias) and plain.mlp_bias  # the MLP always has biases
    # hub configs (Pythia): rotary_pct and rotary_emb_base at the top level, or absent
    raw = tiny_config("gpt_neox").to_dict()
    del raw["rope_parameters"], raw["use_parallel_residual"], raw["attention_bias"]
    default = get_family("gpt_neox").parse_config(raw)
    assert (default.rope.partial_rotary_factor, default.rope.theta) == (0.25, 10000.0)
    assert default.parallel_mlp_norm and default.qkv_bias  # the config class's defaults
    neox = get_family("gpt_neox")
    hub = neox.parse_config({**raw, "rotary_pct": 0.5, "rotary_emb_base": 100})
    assert (hub.rotary_dim, hub.rope.theta) == (8, 100.0)
    # no grouped-query attention: a stray num_key_value_heads changes nothing
    assert neox.parse_config({**raw, "num_key_value_heads": 2}).num_key_value_heads == 4
    layer, ours = "gpt_neox.layers.1", "model.layers.1"
    expected = {
        f"{ours}.self_attn.qkv_proj.weight": f"{layer}.attention.query_key_value.weight",
        f"{ours}.self_attn.o_proj.bias": f"{layer}.attention.dense.bias",
        f"{ours}.mlp.fc1.weight": f"{layer}.mlp.dense_h_to_4h.weight",
        f"{ours}.mlp.fc2.bias": f"{layer}.mlp.dense_4h_to_h.bias",
        f"{ours}.post_attention_layernorm.weight": f"{layer}.post_attention_layernorm.weight",
        "model.embed_tokens.weight": "gpt_neox.embed_in.weight",
        "model.norm.bias": "gpt_neox.final_layer_norm.bias",
        "lm_head.weight": "embed_out.weight",
    }
    _assert_checkpoint_names(neox, expected)
    assert neox.preprocessed("model.layers.0.self_attn.qkv_proj.bias")
    assert not neox.preprocessed("model.layers.0.mlp.fc1.weight")


def test_gpt_neox_query_key_value_rows_regrouped_by_part():
    """Rows [q_0, k_0, v_0, q_1, ...] (head_dim each) become [q_0, q_1, ... | k_... | v_...]."""
    config = _parse("gpt_neox")  # 4 heads of 16
    heads, dim = 4, 16
    label = np.array([[10 * h + p] for h in range(heads) for p in range(3) for _ in range(dim)])
    preprocess = get_family("gpt_neox").preprocess_weight
    rows = preprocess("model.layers.0.self_attn.qkv_proj.weight", label * np.ones((1, 3)), config)
    expected = [10 * h + p for p in range(3) for h in range(heads) for _ in range(dim)]
    assert rows[:, 0].tolist() == expected and rows.shape == (3 * heads * dim, 3)
    bias = preprocess("model.layers.0.self_attn.qkv_proj.bias", label[:, 0], config)
    assert bias.tolist() == expected
    unchanged = preprocess("model.layers.0.mlp.fc1.bias", label[:, 0], config)
    assert unchanged.tolist() == label[:, 0].tolist()


def test_nemotron_facts():
    nemotron = _parse("nemotron")
    assert (nemotron.norm_type, nemotron.norm_eps, nemotron.hidden_act) == ("layer", 1e-5, "relu2")
    assert not nemotron.gated_mlp and nemotron.rotary_dim == 8  # 0.5 of head_dim 16
    assert not (nemotron.qkv_bias or nemotron.o_bias or nemotron.mlp_bias)
    biased = _parse("nemotron", attention_bias=True, mlp_bias=True, head_dim=24)
    assert biased.qkv_bias and biased.o_bias and biased.mlp_bias and biased.head_dim == 24
    raw = tiny_config("nemotron").to_dict()
    del raw["rope_parameters"]
    raw["norm_eps"] = 1e-3
    hub = get_family("nemotron").parse_config(raw)  # partial rotary left to the config class
    assert (hub.rope.partial_rotary_factor, hub.norm_eps) == (0.5, 1e-3)
    nemotron = get_family("nemotron")
    assert nemotron.checkpoint_name("model.layers.0.mlp.fc1.weight") == (
        "model.layers.0.mlp.up_proj.weight"
    )
    assert nemotron.checkpoint_name("model.layers.0.mlp.fc2.bias") == (
        "model.layers.0.mlp.down_proj.bias"
    )
    config = _parse("nemotron")
    weight = np.array([0.5, -1.0], dtype=np.float32)
    offset = nemotron.preprocess_weight("model.layers.0.input_layernorm.weight", weight, config)
    assert offset.tolist() == [1.5, 0.0]  # LayerNorm1P scales by 1 + weight
    bias = nemotron.preprocess_weight("model.layers.0.input_layernorm.bias", weight, config)
    assert bias.tolist() == weight.tolist()


def test_exaone_facts():
    exaone = get_family("exaone")
    config = _parse("exaone")
    assert (config.norm_type, config.hidden_act, config.gated_mlp) == ("rms", "silu", True)
    assert (config.rope.theta, config.norm_eps, config.num_key_value_heads) == (5e5, 1e-5, 2)
    # EXAONE's hub config.json: GPT-2-style keys, rope_theta left to the config class
    raw = tiny_config("exaone").to_dict()
    for key in ("rope_parameters", "num_hidden_layers", "rms_norm_eps", "hidden_act"):
        del raw[key]
    raw.update(num_layers=3, layer_norm_epsilon=1e-3, activation_function="gelu_new")
    hub = exaone.parse_config(raw)
    assert (hub.num_hidden_layers, hub.norm_eps, hub.hidden_act) == (3, 1e-3, "gelu_new")
    assert hub.rope.theta == 5e5
    no_eps = {k: v for k, v in raw.items() if k != "layer_norm_epsilon"}
    assert exaone.parse_config(no_eps).norm_eps == 1e-5  # ExaoneConfig's default
    without_kv = {k: v for k, v in raw.items() if k != "num_key_value_heads"}
    wide = exaone.parse_config({**without_kv, "num_attention_heads": 16})
    assert wide.num_key_value_heads == 8  # ExaoneConfig's default
    assert exaone.parse_config({**raw, "num_key_value_heads": None}).num_key_value_heads == 4
    expected = {
        "model.layers.1.self_attn.q_proj.weight": "transformer.h.1.attn.attention.q_proj.weight",
        "model.layers.1.self_attn.o_proj.bias": "transformer.h.1.attn.attention.out_proj.bias",
        "model.layers.1.mlp.gate_proj.weight": "transformer.h.1.mlp.c_fc_0.weight",
        "model.layers.1.mlp.up_proj.weight": "transformer.h.1.mlp.c_fc_1.weight",
        "model.layers.1.mlp.down_proj.weight": "transformer.h.1.mlp.c_proj.weight",
        "model.layers.1.input_layernorm.weight": "transformer.h.1.ln_1.weight",
        "model.layers.1.post_attention_layernorm.weight": "transformer.h.1.ln_2.weight",
        "model.embed_tokens.weight": "transformer.wte.weight",
        "model.norm.weight": "transformer.ln_f.weight",
        "lm_head.weight": "lm_head.weight",
    }
    _assert_checkpoint_names(exaone, expected)


def test_gptj_facts():
    gptj = get_family("gptj")
    config = _parse("gptj")
    assert (config.norm_type, config.norm_eps, config.hidden_act) == ("layer", 1e-5, "gelu_new")
    assert config.parallel_residual and not config.parallel_mlp_norm and not config.gated_mlp
    assert config.mlp_bias and config.lm_head_bias and not (config.qkv_bias or config.o_bias)
    assert (config.head_dim, config.num_key_value_heads, config.intermediate_size) == (16, 4, 96)
    assert config.rotary_dim == 8 and config.rope.interleaved and config.rope.theta == 10000.0
    raw = tiny_config("gptj").to_dict()
    del raw["rotary_dim"], raw["n_inner"]
    wide = gptj.parse_config({**raw, "n_embd": 256, "n_head": 2})  # head_dim 128
    assert wide.rotary_dim == 64 and wide.intermediate_size == 1024  # GPTJConfig's defaults
    assert gptj.parse_config({**raw, "rotary_dim": None}).rotary_dim == 16  # the whole head
    # rotary_dim / head_dim that floats round below the integer still rotates rotary_dim
    odd = gptj.parse_config({**raw, "n_embd": 44 * 4, "rotary_dim": 30})
    assert odd.head_dim == 44 and odd.rotary_dim == 30
    for rotary_dim in (18, 7):
        with pytest.raises(ConfigError, match=f"'rotary_dim'.*head size 16.*{rotary_dim}"):
            gptj.parse_config({**raw, "rotary_dim": rotary_dim})
    with pytest.raises(ConfigError, match="'rotary_dim'.*positive integer.*0"):
        gptj.parse_config({**raw, "rotary_dim": 0})
    scaling = {"rope_type": "linear", "factor": 2.0}
    with pytest.raises(UnsupportedModelError, match="rope_scaling.*gptj"):
        gptj.parse_config({**raw, "rotary_dim": 8, "rope_scaling": scaling})
    # transformers 5's spelling of the same ask; and a base GPTJRotaryEmbedding never reads
    with pytest.raises(UnsupportedModelError, match="rope_scaling.*'linear'.*gptj"):
        gptj.parse_config({**raw, "rotary_dim": 8, "rope_parameters": {**scaling}})
    based = {"rope_type": "default", "rope_theta": 5.0}
    based = gptj.parse_config({**raw, "rotary_dim": 8, "rope_parameters": based, "head_dim": 3})
    assert (based.rope.theta, based.rotary_dim, based.head_dim) == (10000.0, 8, 16)
    expected = {
        "model.layers.1.self_attn.q_proj.weight": "transformer.h.1.attn.q_proj.weight",
        "model.layers.1.self_attn.o_proj.weight": "transformer.h.1.attn.out_proj.weight",
        "model.layers.1.mlp.fc1.bias": "transformer.h.1.mlp.fc_in.bias",
        "model.layers.1.mlp.fc2.weight": "transformer.h.1.mlp.fc_out.weight",
        "model.layers.1.input_layernorm.bias": "transformer.h.1.ln_1.bias",
        "model.embed_tokens.weight": "transformer.wte.weight",
        "model.norm.weight": "transformer.ln_f.weight",
        "lm_head.bias": "lm_head.bias",
    }
    _assert_checkpoint_names(gptj, expected)


def test_cohere_facts():
    cohere = get_family("cohere")
    config = _parse("cohere")
    assert (config.norm_type, config.norm_eps, config.hidden_act) == ("layer_no_bias", 1e-5, "silu")
    assert config.parallel_residual and not config.parallel_mlp_norm and config.gated_mlp
    assert config.logits_scaling == 4.0  # 1 / logit_scale 0.25
    assert config.rope.interleaved and config.rotary_dim == 16 and not config.qk_norm
    full = _parse("cohere", use_qk_norm=True, attention_bias=True, tie_word_embeddings=True)
    assert full.qk_norm and full.qk_norm_head_weights and full.qk_norm_stacked_weights
    assert full.qkv_bias and full.o_bias and not full.mlp_bias and full.tie_word_embeddings
    # hub configs may leave these to CohereConfig
    raw = tiny_config("cohere").to_dict()
    for key in ("logit_scale", "layer_norm_eps", "tie_word_embeddings", "rope_parameters"):
        del raw[key]
    hub = cohere.parse_config(raw)
    assert (hub.logits_scaling, hub.norm_eps, hub.rope.theta) == (16.0, 1e-5, 5e5)
    assert hub.tie_word_embeddings
    with pytest.raises(ConfigError, match="'logit_scale'.*positive number.*-1"):
        cohere.parse_config({**raw, "logit_scale": -1})
    # per-head q/k norm weights are one [heads, head_dim] tensor, named as in the checkpoint
    name = "model.layers.0.self_attn.k_norm.weight"
    assert cohere.checkpoint_name(name) == name


def test_glm_facts():
    glm = get_family("glm")
    config = _parse("glm")
    assert (config.norm_type, config.hidden_act, config.gated_mlp) == ("rms", "silu", True)
    assert config.qkv_bias and not (config.o_bias or config.mlp_bias)
    assert config.rope.interleaved and config.rotary_dim == 8  # 0.5 of head_dim 16
    plain = _parse("glm", attention_bias=False, partial_rotary_factor=1.0)
    assert not plain.qkv_bias and plain.rotary_dim == 16
    # GlmConfig's defaults for keys a config.json may leave out
    raw = tiny_config("glm").to_dict()
    for key in ("head_dim", "num_key_value_heads", "rms_norm_eps", "attention_bias"):
        del raw[key]
    del raw["rope_parameters"]["partial_rotary_factor"]
    hub = glm.parse_config({**raw, "eos_token_id": None})
    assert (hub.head_dim, hub.num_key_value_heads, hub.norm_eps) == (128, 2, 1.5625e-7)
    assert hub.qkv_bias and hub.rotary_dim == 64
    assert hub.eos_token_id == (151329, 151336, 151338)
    layer = "model.layers.1"
    assert glm.checkpoint_name(f"{layer}.mlp.up_proj.weight") == TensorSource(
        names=(f"{layer}.mlp.gate_up_proj.weight",),
        parts=(f"{layer}.mlp.gate_proj.weight", f"{layer}.mlp.up_proj.weight"),
    )
    assert glm.checkpoint_name(f"{layer}.self_attn.q_proj.bias") == f"{layer}.self_attn.q_proj.bias"


def test_weight_names_of_fused_and_renamed_tensors():
    assert get_family("llama").checkpoint_name("model.norm.weight") == "model.norm.weight"
    layer = "model.layers.2"
    phi3 = get_family("phi3")
    assert phi3.checkpoint_name(f"{layer}.self_attn.k_proj.weight") == TensorSource(
        names=(f"{layer}.self_attn.qkv_proj.weight",),
        parts=tuple(f"{layer}.self_attn.{p}_proj.weight" for p in "qkv"),
    )
    assert phi3.checkpoint_name(f"{layer}.mlp.up_proj.weight") == TensorSource(
        names=(f"{layer}.mlp.gate_up_proj.weight",),
        parts=(f"{layer}.mlp.gate_proj.weight", f"{layer}.mlp.up_proj.weight"),
    )
    assert phi3.checkpoint_name(f"{layer}.mlp.down_proj.weight") == f"{layer}.mlp.down_proj.weight"
    phi = get_family("phi")
    assert phi.checkpoint_name(f"{layer}.self_attn.o_proj.bias") == f"{layer}.self_attn.dense.bias"
    assert phi.checkpoint_name(f"{layer}.self_attn.q_norm.weight").endswith("q_layernorm.weight")
    assert phi.checkpoint_name("model.norm.bias") == "model.final_layernorm.bias"
    gpt2 = get_family("gpt2")
    assert gpt2.checkpoint_name(f"{layer}.self_attn.v_proj.bias") == TensorSource(
        names=("transformer.h.2.attn.c_attn.bias", "h.2.attn.c_attn.bias"),
        parts=tuple(f"{layer}.self_attn.{p}_proj.bias" for p in "qkv"),
        axis=-1,
    )
    assert gpt2.checkpoint_name(f"{layer}.self_attn.q_proj.weight").in_out
    expected = {
        f"{layer}.self_attn.o_proj.weight": ("transformer.h.2.attn.c_proj.weight", True),
        f"{layer}.mlp.fc1.weight": ("transformer.h.2.mlp.c_fc.weight", True),
        f"{layer}.mlp.fc2.bias": ("transformer.h.2.mlp.c_proj.bias", False),
        f"{layer}.input_layernorm.weight": ("transformer.h.2.ln_1.weight", False),
        f"{layer}.post_attention_layernorm.bias": ("transformer.h.2.ln_2.bias", False),
        "model.embed_tokens.weight": ("transformer.wte.weight", False),
        "model.embed_positions.weight": ("transformer.wpe.weight", False),
        "model.norm.weight": ("transformer.ln_f.weight", False),
    }
    for graph_name, (name, in_out) in expected.items():
        source = gpt2.checkpoint_name(graph_name)
        assert (source.names[0], source.in_out) == (name, in_out), graph_name
    assert gpt2.checkpoint_name("lm_head.weight") == "lm_head.weight"


BASE = {
    "model_type": "llama",
    "vocab_size": 32,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "max_position_embeddings": 32,
}


@pytest.mark.parametrize(
    ("overrides", "words"),
    [
        ({"norm_type": "batch"}, ["norm_type", "'batch'", "rms"]),
        ({"norm_placement": "middle"}, ["norm_placement", "'middle'", "sandwich"]),
        ({"position_embedding": "relative"}, ["position_embedding", "'relative'", "alibi"]),
        ({"position_embedding": "alibi"}, ["position_embedding 'alibi'", "alibi None"]),
        ({"parallel_residual": True, "norm_placement": "post"}, ["parallel", "'post'"]),
        ({"no_rope_layers": (2,)}, ["no_rope_layers", "[2]", "0..1"]),
        ({"residual_multiplier": 0.0}, ["residual_multiplier", "positive"]),
        ({"logits_scaling": -1.0}, ["logits_scaling", "-1.0"]),
        ({"clip_qkv": -2.0}, ["clip_qkv", "-2.0", "positive"]),
        ({"qk_norm_head_weights": True}, ["per-head q/k norm weights", "qk_norm False"]),
        ({"parallel_mlp_norm": True}, ["parallel_mlp_norm", "parallel_residual False"]),
        (
            {"residual_after_norm": True, "norm_placement": "post"},
            ["residual_after_norm", "'post'"],
        ),
        (
            {"qk_norm_stacked_weights": True, "qk_norm": True},
            ["qk_norm_stacked_weights", "qk_norm_head_weights False"],
        ),
        (
            {"qk_norm_head_weights": True, "qk_norm": True, "qk_norm_per_head": False},
            ["per-head q/k norm weights", "qk_norm_per_head False"],
        ),
    ],
)
def test_invalid_generic_fields_name_field_value_and_accepted(overrides, words):
    with pytest.raises(ConfigError) as info:
        ArchitectureConfig.from_dict(BASE, **overrides)
    for word in words:
        assert word in str(info.value)


def test_longrope_factor_lists_must_cover_the_rotated_pairs():
    rope = {"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0] * 3}
    with pytest.raises(ConfigError, match="long_factor has 3 entries.*pair"):
        ArchitectureConfig.from_dict({**BASE, "rope_scaling": rope, "head_dim": 8})


def test_arcee_facts():
    arcee = get_family("arcee")
    config = _parse("arcee")
    assert (config.hidden_act, config.gated_mlp, config.norm_eps) == ("relu2", False, 1e-5)
    raw = tiny_config("arcee").to_dict()
    del raw["hidden_act"], raw["rms_norm_eps"]
    assert arcee.parse_config(raw).hidden_act == "relu2"  # ArceeConfig's default
    layer = "model.layers.0"
    assert arcee.checkpoint_name(f"{layer}.mlp.fc1.weight") == f"{layer}.mlp.up_proj.weight"
    assert arcee.checkpoint_name(f"{layer}.mlp.fc2.bias") == f"{layer}.mlp.down_proj.bias"


def test_helium_facts():
    helium = get_family("helium")
    config = _parse("helium", attention_bias=True)
    assert config.rope.interleaved and config.qkv_bias and not config.o_bias
    raw = tiny_config("helium").to_dict()
    for key in ("rope_parameters", "rms_norm_eps", "head_dim", "num_key_value_heads"):
        del raw[key]
    hub = helium.parse_config({**raw, "hidden_size": 2560, "num_attention_heads": 20})
    assert (hub.rope.theta, hub.norm_eps, hub.head_dim) == (1e5, 1e-8, 128)
    assert hub.num_key_value_heads == 20  # HeliumConfig's defaults


def test_ernie4_5_facts():
    ernie = get_family("ernie4_5")
    config = _parse("ernie4_5")
    assert config.qkv_bias and config.o_bias and config.mlp_bias and config.rope.interleaved
    plain = _parse("ernie4_5", use_bias=False)
    assert not (plain.qkv_bias or plain.o_bias or plain.mlp_bias)
    raw = tiny_config("ernie4_5").to_dict()
    for key in ("rope_parameters", "rms_norm_eps", "head_dim", "num_key_value_heads", "use_bias"):
        del raw[key]
    del raw["tie_word_embeddings"]
    hub = ernie.parse_config(raw)
    assert (hub.rope.theta, hub.norm_eps, hub.head_dim, hub.num_key_value_heads) == (
        5e5,
        1e-5,
        128,  # Ernie4_5Config's default when absent...
        2,
    )
    assert hub.tie_word_embeddings and not hub.qkv_bias
    null = ernie.parse_config({**raw, "head_dim": None, "num_key_value_heads": None})
    assert (null.head_dim, null.num_key_value_heads) == (16, 4)  # ...null: hidden / heads


def test_seed_oss_facts():
    seed = get_family("seed_oss")
    config = _parse("seed_oss")
    assert config.qkv_bias and not config.o_bias and not config.mlp_bias
    both = _parse("seed_oss", attention_out_bias=True, attention_bias=False)
    assert both.o_bias and not both.qkv_bias
    raw = tiny_config("seed_oss").to_dict()
    for key in ("attention_bias", "attention_out_bias", "head_dim", "num_key_value_heads"):
        del raw[key]
    hub = seed.parse_config({**raw, "num_attention_heads": 16})
    assert (hub.head_dim, hub.num_key_value_heads, hub.qkv_bias, hub.o_bias) == (
        128,
        8,
        True,
        False,
    )


def test_olmo3_facts():
    olmo3 = get_family("olmo3")
    config = _parse("olmo3")
    assert (config.norm_placement, config.qk_norm, config.qk_norm_per_head) == ("post", True, False)
    assert config.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    assert (config.sliding_window, config.rope.theta, config.rope_local) == (5, 5e5, None)
    # hub config.json: no layer_types (every 4th layer full), rope scaling at the top level
    raw = tiny_config("olmo3").to_dict()
    for key in ("layer_types", "rope_parameters", "sliding_window"):
        del raw[key]
    raw.update(num_hidden_layers=8, rope_scaling={"rope_type": "linear", "factor": 4.0})
    hub = olmo3.parse_config(raw)
    assert hub.layer_types == (("sliding_attention",) * 3 + ("full_attention",)) * 2
    assert hub.sliding_window == 4096 and (hub.rope.type, hub.rope.factor) == ("linear", 4.0)
    assert hub.rope_local == RopeConfig(theta=5e5)  # sliding layers: no scaling
    assert olmo3.parse_config({**raw, "rope_theta": 5e5}).rope_local == RopeConfig(theta=5e5)
    with pytest.raises(UnsupportedModelError, match="rope_theta"):
        olmo3.parse_config({**raw, "rope_theta": 1e4})


def test_exaone4_facts():
    exaone4 = get_family("exaone4")
    config = _parse("exaone4")
    assert (config.norm_placement, config.qk_norm, config.qk_norm_per_head) == ("post", True, True)
    assert config.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    assert config.no_rope_layers == (1,) and config.sliding_window == 5  # global NoPE
    assert not (config.qkv_bias or config.o_bias or config.mlp_bias)
    raw = tiny_config("exaone4").to_dict()
    del raw["layer_types"], raw["sliding_window_pattern"]
    hub = exaone4.parse_config({**raw, "num_hidden_layers": 8})
    assert hub.no_rope_layers == (3, 7) and hub.layer_types[3] == "full_attention"
    no_window = exaone4.parse_config({**raw, "sliding_window": None})
    assert no_window.layer_types == ("full_attention",) * 3 and no_window.no_rope_layers == ()
    del raw["sliding_window"]
    assert exaone4.parse_config(raw).sliding_window == 4096  # Exaone4Config's default
    with pytest.raises(UnsupportedModelError, match="sliding_window_pattern"):
        exaone4.parse_config({**raw, "sliding_window_pattern": "LLLG"})


def test_hunyuan_v1_dense_facts():
    hunyuan = get_family("hunyuan_v1_dense")
    config = _parse("hunyuan_v1_dense")
    assert config.qk_norm and config.qk_norm_per_head and config.qk_norm_after_rope
    assert not config.mlp_bias and config.norm_eps == 1e-5
    with pytest.raises(ConfigError, match="qk_norm_after_rope"):
        dataclasses.replace(config, qk_norm=False)
    # Hunyuan's hub config.json: "dynamic" rope with a fixed alpha is NTK-alpha rope
    raw = tiny_config("hunyuan_v1_dense").to_dict()
    del raw["rope_parameters"]
    scaling = {"type": "dynamic", "factor": 1.0, "alpha": 1000.0, "mscale": 1.0}
    hub = hunyuan.parse_config({**raw, "rope_theta": 1e4, "rope_scaling": scaling})
    assert hub.rope.type == "default"
    assert math.isclose(hub.rope.theta, 1e4 * 1000.0 ** (16 / 14))
    dynamic = hunyuan.parse_config({**raw, "rope_scaling": {"type": "dynamic", "factor": 2.0}})
    assert (dynamic.rope.type, dynamic.rope.factor) == ("dynamic", 2.0)
    layer = "model.layers.0.self_attn"
    assert hunyuan.checkpoint_name(f"{layer}.q_norm.weight") == f"{layer}.query_layernorm.weight"
    assert hunyuan.checkpoint_name(f"{layer}.k_norm.weight") == f"{layer}.key_layernorm.weight"


def test_internlm3_facts():
    internlm3 = get_family("internlm3")
    config = _parse("internlm3", qkv_bias=True, bias=True)
    assert config.qkv_bias and config.o_bias and config.mlp_bias
    # InternLM3's hub config.json: qkv_bias and bias, head_dim and kv heads left to the class
    raw = tiny_config("internlm3").to_dict()
    for key in ("attention_bias", "mlp_bias", "head_dim", "num_key_value_heads", "rms_norm_eps"):
        del raw[key]
    hub = internlm3.parse_config({**raw, "qkv_bias": True, "bias": True})
    assert hub.qkv_bias and hub.o_bias and hub.mlp_bias
    assert (hub.head_dim, hub.num_key_value_heads, hub.norm_eps) == (128, 2, 1e-5)
    null = internlm3.parse_config({**raw, "head_dim": None, "num_key_value_heads": None})
    assert (null.head_dim, null.num_key_value_heads) == (16, 4)
    with pytest.raises(UnsupportedModelError, match="qkv_bias"):
        internlm3.parse_config({**raw, "qkv_bias": True, "bias": False})


def test_vaultgemma_facts():
    vaultgemma = get_family("vaultgemma")
    config = _parse("vaultgemma")
    assert (config.norm_placement, config.hidden_act) == ("pre", "gelu_pytorch_tanh")
    assert config.embedding_multiplier == math.sqrt(64) and config.scale == 24**-0.5
    assert config.layer_types == ("sliding_attention", "full_attention", "sliding_attention")
    assert (config.attn_logit_softcapping, config.final_logit_softcapping) == (2.0, 3.0)
    raw = tiny_config("vaultgemma").to_dict()
    for key in ("layer_types", "sliding_window", "attn_logit_softcapping", "head_dim"):
        del raw[key]
    del raw["final_logit_softcapping"], raw["tie_word_embeddings"]
    hub = vaultgemma.parse_config(raw)
    assert (hub.sliding_window, hub.head_dim, hub.tie_word_embeddings) == (4096, 256, True)
    assert (hub.attn_logit_softcapping, hub.final_logit_softcapping) == (50.0, 30.0)
    off = vaultgemma.parse_config({**raw, "final_logit_softcapping": None})
    assert off.final_logit_softcapping is None
    layer = "model.layers.2"
    assert vaultgemma.checkpoint_name(f"{layer}.post_attention_layernorm.weight") == (
        f"{layer}.pre_feedforward_layernorm.weight"
    )
    assert vaultgemma.preprocessed(f"{layer}.post_attention_layernorm.weight")


def test_olmo3_refuses_longrope():
    raw = tiny_config("olmo3").to_dict()
    raw["rope_parameters"]["full_attention"] = {
        "rope_type": "longrope",
        "rope_theta": 5e5,
        "short_factor": [1.0] * 8,
        "long_factor": [1.0] * 8,
        "original_max_position_embeddings": 16,
    }
    with pytest.raises(UnsupportedModelError, match="longrope"):
        get_family("olmo3").parse_config(raw)
