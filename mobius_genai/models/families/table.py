"""The family table: one FamilyAdapter row per supported model_type, read top to bottom.

A row holds only what its family changes over the generic llama-style decoder (adapter.py says
what each field means). The functions and shared fragments rows name live beside this module,
one module per kind of quirk: readers (one-key switches and numbers), heads, scales, rope,
layers, preprocess (checkpoint value changes) and gpt2_names. The rows of other model kinds
live in modules of their own (moe_rows, hybrid_rows) and join the table here, as do rows
derived from another row (cohere_glm: cohere2 from cohere, glm4 from glm; alias_rows: a
config class of its own over another family's model classes) and a family's rows that build
on one another (mistral_rows, gemma_rows, derived_moe_rows: MoE rows of transformers 5.25
derived from ours). Adding a family is adding a row.
"""

from __future__ import annotations

import dataclasses

from mobius_genai.config import fields
from mobius_genai.config.differential import read_differential
from mobius_genai.errors import UnsupportedModelError
from mobius_genai.models.families.adapter import FamilyAdapter, FusedWeight
from mobius_genai.models.families.alias_rows import alias_rows
from mobius_genai.models.families.alibi_rows import ALIBI_FAMILIES
from mobius_genai.models.families.bitnet import BITNET
from mobius_genai.models.families.codegen import CODEGEN
from mobius_genai.models.families.cohere_compass import COHERE_COMPASS_TEXT
from mobius_genai.models.families.cohere_glm import COHERE_GLM_FAMILIES
from mobius_genai.models.families.corrected_moe_rows import CORRECTED_MOE_FAMILIES
from mobius_genai.models.families.ctrl import CTRL
from mobius_genai.models.families.deepseek import DEEPSEEK_FAMILIES
from mobius_genai.models.families.derived_moe_rows import DERIVED_MOE_FAMILIES
from mobius_genai.models.families.doge import DOGE
from mobius_genai.models.families.fairseq_rows import FAIRSEQ_FAMILIES
from mobius_genai.models.families.family_keys import (
    READS_MLP_BIAS,
    READS_PARTIAL_ROTARY,
    READS_SLIDING_SWITCH,
    UNBIASED_ATTENTION,
)
from mobius_genai.models.families.fused_qkv_rows import FUSED_QKV_FAMILIES
from mobius_genai.models.families.gemma4_rows import GEMMA4_FAMILIES
from mobius_genai.models.families.gemma_rows import GEMMA2_OVERRIDES, GEMMA_FAMILIES
from mobius_genai.models.families.gpt2_names import (
    GPT2_BLOCK,
    GPT2_BLOCK_NAMES,
    GPT2_BUFFERS,
    GPT2_CONFIG_NAMES,
    GPT2_DEFAULTS,
    GPT2_FUSED_QKV,
    GPT2_LAYOUT,
    GPTJ_BLOCK,
    GPTJ_DEFAULTS,
    GPTJ_LAYOUT,
)
from mobius_genai.models.families.gpt_neo import GPT_NEO
from mobius_genai.models.families.gpt_oss import GPT_OSS
from mobius_genai.models.families.heads import exaone_kv_heads, hidden_over_heads, kv_head_per_head
from mobius_genai.models.families.hybrid_rows import HYBRID_FAMILIES
from mobius_genai.models.families.hyperclovax import HYPERCLOVAX
from mobius_genai.models.families.jetmoe import JETMOE
from mobius_genai.models.families.laguna_rows import LAGUNA_FAMILIES
from mobius_genai.models.families.layers import (
    alternating_layer_types,
    exaone4_layer_types,
    exaone4_no_rope_layers,
    smollm3_layer_types,
    smollm3_no_rope_layers,
)
from mobius_genai.models.families.llama4 import LLAMA4, LLAMA4_TEXT
from mobius_genai.models.families.mistral_rows import MISTRAL_FAMILIES
from mobius_genai.models.families.moe_rows import MOE_FAMILIES
from mobius_genai.models.families.openai_gpt import OPENAI_GPT
from mobius_genai.models.families.preprocess import (
    NORM_WEIGHTS,
    PACKED_QKV,
    offset_norm_weights,
    qkv_blocks_from_head_rows,
)
from mobius_genai.models.families.qk_norm_rows import QK_NORM_FAMILIES
from mobius_genai.models.families.readers import (
    internlm3_bias,
    optional_positive,
    switch,
    when_absent,
)
from mobius_genai.models.families.rope import (
    apertus_rope,
    ntk_alpha_rope,
    olmo3_rope_local,
)
from mobius_genai.models.families.scales import (
    GRANITE_MULTIPLIERS,
)
from mobius_genai.models.families.windowed_rows import WINDOWED_FAMILIES
from mobius_genai.models.families.zamba2 import ZAMBA2

# One row per model_type; genai_type only where not onnxruntime-genai's "decoder" (adapter.py).
_FAMILIES = (
    FamilyAdapter(model_type="llama", genai_type="llama", family_keys=READS_MLP_BIAS),
    *MISTRAL_FAMILIES,  # mistral, ministral, ministral3
    FamilyAdapter(
        model_type="qwen2",
        family_keys=READS_SLIDING_SWITCH,
        genai_type="qwen2",
        config_defaults={"num_key_value_heads": when_absent("num_key_value_heads", 32)},
        config_overrides={"qkv_bias": True, "o_bias": False},
    ),
    FamilyAdapter(
        model_type="qwen3",
        family_keys=READS_SLIDING_SWITCH,
        genai_type="qwen3",
        config_defaults={
            "head_dim": when_absent("head_dim", 128),
            "num_key_value_heads": when_absent("num_key_value_heads", 32),
        },
        config_overrides={"qk_norm": True},
    ),
    *GEMMA_FAMILIES,  # gemma, gemma2, gemma3_text, gemma3n_text, gemma3n
    FamilyAdapter(
        model_type="phi3",
        family_keys=READS_PARTIAL_ROTARY,
        genai_type="phi3",
        config_defaults={"rms_norm_eps": 1e-5, "original_max_position_embeddings": 4096},
        config_overrides=UNBIASED_ATTENTION,
        fused_weights=(
            FusedWeight(
                r"\.self_attn\.(?P<part>q|k|v)_proj\.weight$",
                ".self_attn.qkv_proj.weight",
                ("q", "k", "v"),
            ),
            FusedWeight(
                r"\.mlp\.(?P<part>gate|up)_proj\.weight$",
                ".mlp.gate_up_proj.weight",
                ("gate", "up"),
            ),
        ),
    ),
    FamilyAdapter(
        model_type="phi",
        family_keys=READS_PARTIAL_ROTARY,
        genai_type="phi",
        config_defaults={
            "hidden_act": "gelu_new",
            "layer_norm_eps": 1e-5,
            "partial_rotary_factor": 0.5,
        },
        config_overrides={
            "norm_type": "layer",
            "parallel_residual": True,
            "gated_mlp": False,
            "qkv_bias": True,
            "o_bias": True,
            "mlp_bias": True,
            "lm_head_bias": True,
            "qk_norm": switch("qk_layernorm", False),
        },
        weight_renames=(
            (r"\.self_attn\.o_proj\.", ".self_attn.dense."),
            (r"\.self_attn\.(q|k)_norm\.", r".self_attn.\1_layernorm."),
            (r"^model\.norm\.", "model.final_layernorm."),
        ),
    ),
    FamilyAdapter(
        model_type="gpt2",
        # the default "decoder": onnxruntime-genai's "gpt2" expects another I/O contract
        config_aliases=GPT2_CONFIG_NAMES,
        config_defaults={**GPT2_DEFAULTS, "hidden_act": "gelu_new"},
        config_overrides=GPT2_BLOCK,
        refused_keys=("scale_attn_by_inverse_layer_idx", "add_cross_attention"),
        fused_weights=(GPT2_FUSED_QKV,),
        weight_renames=(
            *GPT2_BLOCK_NAMES,
            (r"\.post_attention_layernorm\.", ".ln_2."),
            (r"^model\.embed_positions\.", "transformer.wpe."),
            *GPT2_LAYOUT,
        ),
        in_out_weights=r"\.(c_attn|c_proj|c_fc)\.weight$",
        optional_prefix="transformer.",
        unused_weights=GPT2_BUFFERS,
    ),
    FamilyAdapter(
        model_type="granite",
        family_keys=READS_MLP_BIAS,
        genai_type="granite",
        config_overrides=GRANITE_MULTIPLIERS,
    ),
    HYPERCLOVAX,
    FamilyAdapter(
        model_type="olmo2",
        genai_type="olmo",  # onnxruntime-genai has no "olmo2"; its generic path runs the graph
        config_defaults={"rms_norm_eps": 1e-5},
        config_overrides={"norm_placement": "post", "qk_norm": True, "qk_norm_per_head": False},
    ),
    FamilyAdapter(
        model_type="starcoder2",
        config_defaults={
            "tie_word_embeddings": True,
            "hidden_act": "gelu_pytorch_tanh",
            "norm_epsilon": 1e-5,
            "num_key_value_heads": when_absent("num_key_value_heads", 2),
        },
        config_overrides={
            "norm_type": "layer",
            "gated_mlp": False,
            "qkv_bias": switch("use_bias", True),
            "o_bias": switch("use_bias", True),
            "mlp_bias": switch("use_bias", True),
        },
        weight_renames=((r"\.mlp\.fc1\.", ".mlp.c_fc."), (r"\.mlp\.fc2\.", ".mlp.c_proj.")),
    ),
    FamilyAdapter(
        model_type="stablelm",
        family_keys=READS_PARTIAL_ROTARY,
        config_defaults={
            "partial_rotary_factor": 0.25,
            "layer_norm_eps": 1e-5,
            "num_key_value_heads": when_absent("num_key_value_heads", 32),
        },
        config_overrides={
            "head_dim": hidden_over_heads,
            "norm_type": "layer",
            "qkv_bias": switch("use_qkv_bias", False),
            "o_bias": False,
            "mlp_bias": False,
            "parallel_residual": switch("use_parallel_residual", False),
            "qk_norm": switch("qk_layernorm", False),
            "qk_norm_head_weights": switch("qk_layernorm", False),
        },
        weight_renames=((r"\.self_attn\.(q|k)_norm\.", r".self_attn.\1_layernorm."),),
    ),
    FamilyAdapter(
        model_type="olmo",
        genai_type="olmo",
        config_overrides={
            "norm_type": "layer_no_affine",
            "norm_eps": 1e-5,  # OlmoLayerNorm's fixed epsilon; config.json names none
            "mlp_bias": False,
            "clip_qkv": optional_positive("clip_qkv"),
        },
    ),
    FamilyAdapter(
        model_type="gpt_neox",
        family_keys=READS_PARTIAL_ROTARY,
        config_aliases={"rotary_pct": "partial_rotary_factor", "rotary_emb_base": "rope_theta"},
        config_defaults={
            "partial_rotary_factor": 0.25,
            "layer_norm_eps": 1e-5,
            "hidden_act": "gelu",
            "attention_bias": True,
        },
        config_overrides={
            "head_dim": hidden_over_heads,
            "num_key_value_heads": kv_head_per_head,
            "norm_type": "layer",
            "gated_mlp": False,
            "mlp_bias": True,
            "packed_qkv": True,
            "parallel_residual": switch("use_parallel_residual", True),
            "parallel_mlp_norm": switch("use_parallel_residual", True),
        },
        weight_renames=(
            (r"\.self_attn\.qkv_proj\.", ".attention.query_key_value."),
            (r"\.self_attn\.o_proj\.", ".attention.dense."),
            (r"\.mlp\.fc1\.", ".mlp.dense_h_to_4h."),
            (r"\.mlp\.fc2\.", ".mlp.dense_4h_to_h."),
            (r"^model\.layers\.", "gpt_neox.layers."),
            (r"^model\.embed_tokens\.", "gpt_neox.embed_in."),
            (r"^model\.norm\.", "gpt_neox.final_layer_norm."),
            (r"^lm_head\.", "embed_out."),
        ),
        # GPTNeoXPreTrainedModel's _keys_to_ignore_on_load_unexpected
        unused_weights=(r"\.attention\.(bias|masked_bias)$",),
        preprocess_weight=qkv_blocks_from_head_rows,
        preprocessed_weights=PACKED_QKV,
    ),
    *FUSED_QKV_FAMILIES,  # gpt_bigcode, falcon
    *ALIBI_FAMILIES,  # bloom, mpt
    GPT_NEO,
    *FAIRSEQ_FAMILIES,  # opt, xglm, biogpt
    CTRL,
    OPENAI_GPT,
    *QK_NORM_FAMILIES,  # persimmon, nanochat
    FamilyAdapter(
        model_type="nemotron",
        family_keys=READS_PARTIAL_ROTARY | READS_MLP_BIAS,
        genai_type="nemotron",
        config_defaults={"partial_rotary_factor": 0.5, "norm_eps": 1e-5, "hidden_act": "relu2"},
        config_overrides={"norm_type": "layer", "gated_mlp": False},
        weight_renames=((r"\.mlp\.fc1\.", ".mlp.up_proj."), (r"\.mlp\.fc2\.", ".mlp.down_proj.")),
        # NemotronLayerNorm1P scales by 1 + weight, as gemma's RMSNorm does
        preprocess_weight=offset_norm_weights,
        preprocessed_weights=NORM_WEIGHTS,
    ),
    FamilyAdapter(
        model_type="jais2",
        family_keys=READS_MLP_BIAS,
        config_defaults={"hidden_act": "relu2", "max_position_embeddings": 8192},
        # llama's attention, LayerNorms and nemotron's up/down MLP, biased unless switched off
        config_overrides={
            "norm_type": "layer",
            "norm_eps": lambda raw: fields.number(
                raw.get("layer_norm_eps"), "layer_norm_eps", 1e-5
            ),
            "gated_mlp": False,
            "qkv_bias": switch("attention_bias", True),
            "o_bias": switch("attention_bias", True),
            "mlp_bias": switch("mlp_bias", True),
        },
        weight_renames=((r"\.mlp\.fc1\.", ".mlp.up_proj."), (r"\.mlp\.fc2\.", ".mlp.down_proj.")),
    ),
    FamilyAdapter(
        model_type="exaone",
        family_keys=READS_MLP_BIAS,
        # (layer_norm_epsilon, EXAONE's name for rms_norm_eps, is one of config's eps keys)
        config_aliases={"num_layers": "num_hidden_layers", "activation_function": "hidden_act"},
        config_defaults={
            "rope_theta": 500_000.0,
            "norm_eps": 1e-5,  # the last eps key config reads: used when no other is given
            # ExaoneConfig's default is 8 heads; an explicit null means one per query head
            "num_key_value_heads": exaone_kv_heads,
        },
        # transformers runs exaone as llama; checkpoints keep EXAONE's GPT-2-style names
        weight_renames=(
            (r"\.self_attn\.o_proj\.", ".attn.attention.out_proj."),
            (r"\.self_attn\.", ".attn.attention."),
            (r"\.mlp\.gate_proj\.", ".mlp.c_fc_0."),
            (r"\.mlp\.up_proj\.", ".mlp.c_fc_1."),
            (r"\.mlp\.down_proj\.", ".mlp.c_proj."),
            (r"\.post_attention_layernorm\.", ".ln_2."),
            *GPT2_LAYOUT,
        ),
    ),
    FamilyAdapter(
        model_type="gptj",
        family_keys=READS_PARTIAL_ROTARY,
        config_aliases=GPT2_CONFIG_NAMES,
        config_defaults=GPTJ_DEFAULTS,
        config_overrides=GPTJ_BLOCK,
        weight_renames=GPTJ_LAYOUT,
        unused_weights=GPT2_BUFFERS,
    ),
    CODEGEN,
    BITNET,
    *COHERE_GLM_FAMILIES,
    COHERE_COMPASS_TEXT,
    FamilyAdapter(
        model_type="arcee",
        family_keys=READS_MLP_BIAS,
        config_defaults={"hidden_act": "relu2", "rms_norm_eps": 1e-5},
        config_overrides={"gated_mlp": False},  # down(act(up(x))): llama without the gate
        weight_renames=((r"\.mlp\.fc1\.", ".mlp.up_proj."), (r"\.mlp\.fc2\.", ".mlp.down_proj.")),
    ),
    FamilyAdapter(
        model_type="helium",
        family_keys=READS_MLP_BIAS,
        config_defaults={
            "head_dim": 128,
            "num_key_value_heads": 20,
            "rms_norm_eps": 1e-8,
            "rope_theta": 100_000.0,  # HeliumConfig's default_theta
        },
        # rotate_half on adjacent pairs with repeat_interleave'd tables; o_proj never has a bias
        config_overrides={"o_bias": False, "rope_interleaved": True},
    ),
    FamilyAdapter(
        model_type="ernie4_5",
        config_defaults={
            "head_dim": when_absent("head_dim", 128),
            "num_key_value_heads": when_absent("num_key_value_heads", 2),
            "rms_norm_eps": 1e-5,
            "rope_theta": 500_000.0,  # Ernie4_5Config's default_theta
            "tie_word_embeddings": True,
        },
        config_overrides={
            "qkv_bias": switch("use_bias", False),
            "o_bias": switch("use_bias", False),
            "mlp_bias": switch("use_bias", False),
            "rope_interleaved": True,  # glm's rotate_half with repeat_interleave'd tables
        },
    ),
    FamilyAdapter(
        model_type="seed_oss",
        family_keys=READS_MLP_BIAS,
        config_defaults={
            "head_dim": when_absent("head_dim", 128),
            "num_key_value_heads": when_absent("num_key_value_heads", 8),
        },
        config_overrides={
            "qkv_bias": switch("attention_bias", True),
            "o_bias": switch("attention_out_bias", False),
        },
    ),
    FamilyAdapter(
        model_type="olmo3",
        genai_type="olmo",  # as olmo2: onnxruntime-genai's generic path runs the graph
        config_defaults={
            "rms_norm_eps": 1e-5,
            "rope_theta": 500_000.0,  # Olmo3Config's default_theta
            "sliding_window": 4096,
            "layer_types": alternating_layer_types(4),  # every 4th layer full attention
        },
        config_overrides={
            "norm_placement": "post",
            "qk_norm": True,
            "qk_norm_per_head": False,
            "rope_local": olmo3_rope_local,
        },
    ),
    FamilyAdapter(
        model_type="exaone4",
        config_defaults={
            "num_key_value_heads": 32,
            "rms_norm_eps": 1e-5,
            "sliding_window": lambda raw: None if "sliding_window" in raw else 4096,
        },
        config_overrides={
            # olmo2's layer: block → norm → add, per-head q/k RMSNorms shared by the heads
            "norm_placement": "post",
            "qk_norm": True,
            "qkv_bias": False,
            "o_bias": False,
            "mlp_bias": False,
            "layer_types": exaone4_layer_types,
            "no_rope_layers": exaone4_no_rope_layers,
        },
    ),
    FamilyAdapter(
        model_type="hunyuan_v1_dense",
        config_defaults={"rms_norm_eps": 1e-5},
        config_overrides={
            # per-head RMSNorms shared by the heads, applied to the rotated q and k
            "qk_norm": True,
            "qk_norm_after_rope": True,
            "mlp_bias": False,
            "rope": ntk_alpha_rope,
        },
        weight_renames=(
            (r"\.self_attn\.q_norm\.", ".self_attn.query_layernorm."),
            (r"\.self_attn\.k_norm\.", ".self_attn.key_layernorm."),
        ),
    ),
    FamilyAdapter(
        model_type="internlm3",
        family_keys=READS_MLP_BIAS,
        config_aliases={"qkv_bias": "attention_bias", "bias": "mlp_bias"},
        config_defaults={
            "head_dim": when_absent("head_dim", 128),
            "num_key_value_heads": when_absent("num_key_value_heads", 2),
            "rms_norm_eps": 1e-5,
        },
        # transformers runs internlm3 checkpoints as llama
        config_overrides={"qkv_bias": internlm3_bias},
    ),
    FamilyAdapter(
        model_type="vaultgemma",
        config_defaults={
            "tie_word_embeddings": True,
            "head_dim": 256,
            "num_key_value_heads": 4,
            "sliding_window": when_absent("sliding_window", 4096),
            "layer_types": alternating_layer_types(2),
        },
        # gemma2 without the post-attention and post-MLP norms: a pre-norm layer whose MLP
        # norm keeps gemma2's name, pre_feedforward_layernorm
        config_overrides={**GEMMA2_OVERRIDES, "norm_placement": "pre"},
        weight_renames=((r"\.post_attention_layernorm\.", ".pre_feedforward_layernorm."),),
        preprocess_weight=offset_norm_weights,
        preprocessed_weights=NORM_WEIGHTS,
    ),
    FamilyAdapter(
        model_type="smollm3",
        family_keys=READS_SLIDING_SWITCH | READS_MLP_BIAS,
        genai_type="smollm3",
        config_defaults={
            "tie_word_embeddings": True,
            "layer_types": smollm3_layer_types,
            "num_key_value_heads": when_absent("num_key_value_heads", 4),
            "rope_theta": 2_000_000.0,  # SmolLM3Config's default_theta
        },
        config_overrides={"no_rope_layers": smollm3_no_rope_layers},
    ),
    FamilyAdapter(
        model_type="apertus",
        config_defaults={
            "hidden_act": "xielu",
            "rms_norm_eps": 1e-5,
            "rope_parameters": apertus_rope,
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 3,
        },
        # up, xIELU (components/xielu.py), down; per-head q/k RMSNorms
        config_overrides={"gated_mlp": False, "qk_norm": True},
        weight_renames=(
            (r"\.input_layernorm\.", ".attention_layernorm."),
            (r"\.post_attention_layernorm\.", ".feedforward_layernorm."),
            (r"\.mlp\.fc1\.", ".mlp.up_proj."),
            (r"\.mlp\.fc2\.", ".mlp.down_proj."),
        ),
    ),
    FamilyAdapter(
        model_type="diffllama",
        config_defaults={"rms_norm_eps": 1e-5},
        # llama's layer with differential attention (components/differential_attention.py)
        config_overrides={"differential_attention": read_differential},
    ),
    DOGE,  # dynamic mask attention, scaled residuals (doge.py)
    *WINDOWED_FAMILIES,  # cwm, granite_swa, granitemoe_swa
    *MOE_FAMILIES,
    JETMOE,  # mixture of attention heads and of MLP experts (jetmoe.py)
    *DEEPSEEK_FAMILIES,
    *HYBRID_FAMILIES,
    GPT_OSS,
    LLAMA4_TEXT,
    LLAMA4,
    *CORRECTED_MOE_FAMILIES,
    *LAGUNA_FAMILIES,  # laguna, mellum, mimo_v2_flash
    *GEMMA4_FAMILIES,
    *DERIVED_MOE_FAMILIES,
    ZAMBA2,
)

#: model_type → the row transformers runs it as: GPT-SW3's config.json names "gpt-sw3", which
#: transformers maps to GPT2Config and GPT2LMHeadModel (GPT-2's weights, names and switches).
_ALIASES = {"gpt-sw3": "gpt2"}

FAMILIES: dict[str, FamilyAdapter] = {family.model_type: family for family in _FAMILIES}
FAMILIES |= {
    alias: dataclasses.replace(FAMILIES[row], model_type=alias) for alias, row in _ALIASES.items()
}
FAMILIES |= alias_rows(FAMILIES)  # config classes of their own over another row (alias_rows.py)


def get_family(model_type: str) -> FamilyAdapter:
    """The adapter for `model_type`, or an error listing the supported ones."""
    fields.model_type(model_type)
    try:
        return FAMILIES[model_type]
    except KeyError:
        raise UnsupportedModelError(
            f"model_type {model_type!r} is not supported; supported: {sorted(FAMILIES)}"
        ) from None
