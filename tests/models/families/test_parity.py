"""Each family's graphs vs transformers: 12-token prefill + 4 cached decode steps, f32, <= 1e-4.

The portable graph ("default") and the cpu-EP graph (GroupQueryAttention, SkipNorm, ... where
the rules accept the layer) are both compared, on tiny random checkpoints whose biases and norm
weights are random (tests/_hf.py).
"""

from __future__ import annotations

import dataclasses
import json
import re

import numpy as np
import pytest
from transformers import AutoConfig

import mobius_genai
from mobius_genai import RopeConfig, WeightsError
from mobius_genai.config.alibi import Alibi
from mobius_genai.config.differential import DifferentialAttention
from mobius_genai.config.embedding_layout import EmbeddingLayout
from mobius_genai.errors import UnsupportedModelError
from mobius_genai.models import FAMILIES, FamilyAdapter
from mobius_genai.models.families import FusedWeight
from mobius_genai.models.families.cohere2_moe import cohere2_moe
from mobius_genai.models.families.dbrx import dbrx_moe
from mobius_genai.models.families.preprocess import NORM_WEIGHTS, offset_norm_weights
from tests._hf import GEMMA4_MOE, hf_reference_logits, tiny_config, write_tiny_checkpoint
from tests._mutants import with_overrides
from tests._ort import max_abs_diff, ort_session, parity_diffs, run_like_reference

TOLERANCE = 1e-4  # f32, max abs diff of logits over the prefill and every decode step
EPS = ("default", "cpu")

_LONGROPE = {
    "rope_type": "longrope",
    "short_factor": [1.0, 1.1, 1.3, 1.6, 2.0, 2.5, 3.1, 3.8],
    "long_factor": [1.0, 1.5, 2.2, 3.0, 4.1, 5.5, 7.2, 9.0],
}

LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 4.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 16,
}

#: Softcaps small enough to bend a tiny model's logits, were a family to apply them.
_UNREAD_SOFTCAPS = {"final_logit_softcapping": 2.0, "attn_logit_softcapping": 2.0}
_UNREAD_KEYS = {**_UNREAD_SOFTCAPS, "partial_rotary_factor": 0.5}
#: A window of 4 that the 3-token prompts below fit and their 8 decode steps run past, with
#: the switches only Qwen2-like config classes read.
_WINDOW_SWITCHED_OFF = {"sliding_window": 4, "use_sliding_window": False, "max_window_layers": 1}

#: Falcon-RW's layout: ALiBi, six heads, one key/value head per query head, no parallel block.
FALCON_RW = {
    "alibi": True,
    "num_attention_heads": 6,
    "hidden_size": 96,
    "new_decoder_architecture": False,
    "multi_query": False,
    "parallel_attn": False,
    "num_kv_heads": None,
}

# case → (family, config overrides); every family appears with its defaults first.
CASES = {
    "gemma": ("gemma", {}),
    "gemma_tied": ("gemma", {"tie_word_embeddings": True}),
    "gemma2": ("gemma2", {}),
    "gemma2_no_softcap": (
        "gemma2",
        {"attn_logit_softcapping": None, "final_logit_softcapping": None},
    ),
    "gemma3_text": ("gemma3_text", {}),
    "gemma3_text_scaled_global_rope": (
        "gemma3_text",
        {"rope_scaling": {"rope_type": "linear", "factor": 4.0}, "tie_word_embeddings": True},
    ),
    "gemma3n_text": ("gemma3n_text", {}),
    "gemma4_text": ("gemma4_text", {}),
    # the 26B-A4B layout: GeGLU experts beside every MLP, keys equal to values in full layers
    "gemma4_text_moe": ("gemma4_text", GEMMA4_MOE),
    # the 26B-A4B's and 31B's setting: image tokens attend both ways, text causally
    "gemma4_text_vision_bidirectional": ("gemma4_text", {"use_bidirectional_attention": "vision"}),
    "phi3": ("phi3", {}),
    "phi3_partial_rotary_sliding": ("phi3", {"partial_rotary_factor": 0.5, "sliding_window": 6}),
    "phi3_longrope": (
        "phi3",
        {"rope_scaling": _LONGROPE, "original_max_position_embeddings": 16},
    ),
    "phi": ("phi", {}),
    "phi_qk_layernorm": ("phi", {"qk_layernorm": True, "partial_rotary_factor": 1.0}),
    "phi_tied_head_keeps_its_bias": ("phi", {"tie_word_embeddings": True}),
    "gpt2": ("gpt2", {}),
    "gpt2_untied": ("gpt2", {"tie_word_embeddings": False}),
    "granite": ("granite", {}),
    "olmo2": ("olmo2", {}),
    "smollm3": ("smollm3", {}),
    "smollm3_sliding_nope_layers": (
        "smollm3",
        {"use_sliding_window": True, "sliding_window": 5, "no_rope_layers": [1, 0, 0]},
    ),
    # the hub's layout lists no layer_types: SmolLM3Config slides in the NoPE layers
    "smollm3_sliding_nope_layers_hub_layout": (
        "smollm3",
        {"use_sliding_window": True, "sliding_window": 5, "no_rope_layers": [1, 0, 1]}
        | {"hub_layout": True},
    ),
    "starcoder2": ("starcoder2", {}),
    "starcoder2_sliding_window": ("starcoder2", {"sliding_window": 5}),
    "starcoder2_tied_without_bias": (
        "starcoder2",
        {"use_bias": False, "tie_word_embeddings": True},
    ),
    "stablelm": ("stablelm", {}),
    "stablelm_qk_layernorm_qkv_bias": ("stablelm", {"qk_layernorm": True, "use_qkv_bias": True}),
    "stablelm_parallel_residual_qk_layernorm": (
        "stablelm",
        {"use_parallel_residual": True, "qk_layernorm": True, "partial_rotary_factor": 0.5},
    ),
    "olmo": ("olmo", {}),
    "olmo_clip_qkv_bias": ("olmo", {"clip_qkv": 1.0, "attention_bias": True}),
    "olmo_tied": ("olmo", {"tie_word_embeddings": True}),
    "gpt_neox": ("gpt_neox", {}),
    "gpt_neox_sequential_residual_half_rotary": (
        "gpt_neox",
        {"use_parallel_residual": False, "rotary_pct": 0.5},
    ),
    "gpt_neox_tied_without_attention_bias_full_rotary": (
        "gpt_neox",
        {"tie_word_embeddings": True, "attention_bias": False, "rotary_pct": 1.0},
    ),
    "gpt_neox_linear_rope_scaling_gelu_new": (
        "gpt_neox",
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "hidden_act": "gelu_new"},
    ),
    "nemotron": ("nemotron", {}),
    "nemotron_biases_full_rotary": (
        "nemotron",
        {"attention_bias": True, "mlp_bias": True, "partial_rotary_factor": 1.0},
    ),
    "nemotron_tied_head_dim": ("nemotron", {"tie_word_embeddings": True, "head_dim": 24}),
    "exaone": ("exaone", {}),
    "exaone_bias_tied_llama3_rope": (
        "exaone",
        {
            "attention_bias": True,
            "tie_word_embeddings": True,
            "rope_scaling": LLAMA3_ROPE,
        },
    ),
    "gptj": ("gptj", {}),
    "gptj_tied_whole_head_rotary": ("gptj", {"tie_word_embeddings": True, "rotary_dim": 16}),
    # GPTJRotaryEmbedding's base is 10000 whatever rope_theta says; GPT2Attention's head size
    # is hidden_size / heads whatever head_dim says
    "gptj_ignores_rope_theta": (
        "gptj",
        {"rope_parameters": {"rope_type": "default", "rope_theta": 50.0}},
    ),
    "gpt2_ignores_head_dim": ("gpt2", {"head_dim": 7}),
    "cohere": ("cohere", {}),
    "cohere_qk_norm_bias_untied": (
        "cohere",
        {"use_qk_norm": True, "attention_bias": True, "tie_word_embeddings": False},
    ),
    "cohere_linear_rope_scaling": (
        "cohere",
        {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "logit_scale": 1.0},
    ),
    "glm": ("glm", {}),
    "glm_full_rotary_tied_without_bias": (
        "glm",
        {"partial_rotary_factor": 1.0, "tie_word_embeddings": True, "attention_bias": False},
    ),
    "glm_yarn_head_dim": (
        "glm",
        {
            "head_dim": 24,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
    ),
    # sliding, full, sliding: rotary only in the sliding layers, the 16 positions past the window
    # of 5 (tests/_hf.py); then biases on q/k/v/o, an untied head, a head_dim key
    # (Cohere2Config keeps it) and the full layer first; use_qk_norm, which Cohere2Attention
    # never reads; linear rope scaling
    # sliding (window 5, base 100, Qwen3-VL's sections), full unrotated, sliding; logits
    # times 0.25 (tests/_hf.py); then both types rotated, the full layers by linear scaling,
    # unscaled logits (logit_scale null)
    "cohere_compass_text": ("cohere_compass_text", {}),
    "cohere_compass_text_both_rotated_linear_full_unscaled": (
        "cohere_compass_text",
        {
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
                "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1000.0},
            },
            "logit_scale": None,
        },
    ),
    "cohere2": ("cohere2", {}),
    "cohere2_bias_untied_head_dim_full_first": (
        "cohere2",
        {
            "attention_bias": True,
            "tie_word_embeddings": False,
            "head_dim": 24,
            "layer_types": ["full_attention", "sliding_attention", "sliding_attention"],
        },
    ),
    "cohere2_ignores_use_qk_norm_linear_rope": (
        "cohere2",
        {"use_qk_norm": True, "rope_scaling": {"rope_type": "linear", "factor": 2.0}},
    ),
    # glm's layer with sandwich norms (tests/_hf.py); then glm's other switches
    "glm4": ("glm4", {}),
    "glm4_full_rotary_tied_without_bias_yarn": (
        "glm4",
        {
            "partial_rotary_factor": 1.0,
            "tie_word_embeddings": True,
            "attention_bias": False,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
    ),
    "arcee": ("arcee", {}),
    "arcee_biases_tied_yarn": (
        "arcee",
        {
            "attention_bias": True,
            "mlp_bias": True,
            "tie_word_embeddings": True,
            "rope_scaling": {
                "rope_type": "yarn",
                "factor": 4.0,
                "original_max_position_embeddings": 16,
            },
        },
    ),
    "helium": ("helium", {}),
    "helium_qkv_bias_mlp_bias_tied": (
        "helium",
        {"attention_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
    ),
    "ernie4_5": ("ernie4_5", {}),
    "ernie4_5_tied_without_bias": ("ernie4_5", {"use_bias": False, "tie_word_embeddings": True}),
    "seed_oss": ("seed_oss", {}),
    "seed_oss_out_bias_mlp_bias_tied": (
        "seed_oss",
        {"attention_out_bias": True, "mlp_bias": True, "tie_word_embeddings": True},
    ),
    "seed_oss_without_bias": ("seed_oss", {"attention_bias": False}),
    "exaone4": ("exaone4", {}),
    # no window: every layer full attention and rotating
    "exaone4_without_window_tied_llama3_rope": (
        "exaone4",
        {
            "sliding_window": None,
            "layer_types": ["full_attention"] * 3,  # Exaone4Config cannot derive them
            "tie_word_embeddings": True,
            "rope_scaling": LLAMA3_ROPE,
        },
    ),
    "hunyuan_v1_dense": ("hunyuan_v1_dense", {}),
    "hunyuan_v1_dense_ntk_alpha_rope_bias_tied": (
        "hunyuan_v1_dense",
        {
            "rope_scaling": {"rope_type": "dynamic", "factor": 1.0, "alpha": 50.0},
            "attention_bias": True,
            "tie_word_embeddings": True,
        },
    ),
    "hunyuan_v1_dense_dynamic_rope_head_dim": (
        "hunyuan_v1_dense",
        {"rope_scaling": {"rope_type": "dynamic", "factor": 4.0}, "head_dim": 24},
    ),
    "internlm3": ("internlm3", {}),
    "internlm3_biases_tied_dynamic_rope": (
        "internlm3",
        {
            "qkv_bias": True,
            "bias": True,
            "tie_word_embeddings": True,
            "rope_scaling": {"rope_type": "dynamic", "factor": 6.0},
        },
    ),
    "vaultgemma": ("vaultgemma", {}),
    "vaultgemma_untied_full_attention_no_softcap": (
        "vaultgemma",
        {
            "tie_word_embeddings": False,
            "layer_types": ["full_attention"] * 3,
            "attn_logit_softcapping": None,
            "final_logit_softcapping": None,
        },
    ),
    "olmo3": ("olmo3", {}),
    # conv (with biases), attention, conv (tests/_hf.py); no biases, untied head, 4-tap kernel
    "lfm2": ("lfm2", {}),
    "lfm2_without_conv_bias_untied_4_taps": (
        "lfm2",
        {"conv_bias": False, "tie_word_embeddings": False, "conv_L_cache": 4},
    ),
    # gated delta net, attention, gated delta net (tests/_hf.py: 2 key heads onto 4 value heads);
    # then as many key as value heads, a tied head and the attention layer first
    "qwen3_5_text": ("qwen3_5_text", {}),
    "qwen3_5_text_ignores_softcaps": ("qwen3_5_text", _UNREAD_SOFTCAPS),
    # ... nor a partial rotary factor (their rotary embedding turns whole heads)
    "llama_ignores_softcaps_and_partial_rotary": ("llama", _UNREAD_KEYS),
    "qwen2_ignores_softcaps_and_partial_rotary": ("qwen2", _UNREAD_KEYS),
    # windows shorter than the prompt in the families whose attention reads them
    "qwen2_sliding_from_max_window_layers": (
        "qwen2",
        {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1},
    ),
    "mistral_sliding_window": ("mistral", {"sliding_window": 4}),
    # Qwen2MLP has no biases whatever mlp_bias says; the checkpoint has none to read
    "qwen2_ignores_mlp_bias": ("qwen2", {"mlp_bias": True}),
    # ... nor have their attention projections whatever attention_bias says
    "mistral_ignores_attention_and_mlp_bias": (
        "mistral",
        {"attention_bias": True, "mlp_bias": True},
    ),
    "phi3_ignores_attention_and_mlp_bias": ("phi3", {"attention_bias": True, "mlp_bias": True}),
    "lfm2_ignores_attention_bias": ("lfm2", {"attention_bias": True}),
    "qwen3_5_text_equal_linear_heads_tied_attention_first": (
        "qwen3_5_text",
        {
            "linear_num_value_heads": 2,
            "tie_word_embeddings": True,
            "layer_types": ["full_attention", "linear_attention", "linear_attention"],
        },
    ),
    # head_dim 64: a rotary width of 16, so the cpu graph rotates inside GroupQueryAttention and
    # packs q (with its output gate) and k/v into one projection, as real checkpoints do
    "qwen3_5_text_rotary_in_gqa_packed_qkv": ("qwen3_5_text", {"head_dim": 64}),
    # qwen3_5_text's hybrid packed per key head, MoE blocks (tests/_hf.py); then as many key
    # as value heads, MoE every second layer only (decoder_sparse_step) without renormalizing
    "qwen3_next": ("qwen3_next", {}),
    # softcaps their transformers classes never read (only gemma2/3/3n/4 and vaultgemma do)
    "qwen3_next_ignores_softcaps": ("qwen3_next", _UNREAD_SOFTCAPS),
    "qwen3_next_equal_linear_heads_sparse_step_2_unnormalized": (
        "qwen3_next",
        {
            "linear_num_value_heads": 2,
            "decoder_sparse_step": 2,
            "mlp_only_layers": [],
            "norm_topk_prob": False,
        },
    ),
    # qwen3_5_text's hybrid with MoE blocks in every layer (tests/_hf.py); then as many key as
    # value heads, a tied head and the attention layer first
    "qwen3_5_moe_text": ("qwen3_5_moe_text", {}),
    "qwen3_5_moe_text_equal_linear_heads_tied_attention_first": (
        "qwen3_5_moe_text",
        {
            "linear_num_value_heads": 2,
            "tie_word_embeddings": True,
            "layer_types": ["full_attention", "linear_attention", "linear_attention"],
        },
    ),
    # fused Wqkv clipped at 1, the top-k renormalized by their 2-norm (tests/_hf.py); then the
    # top-k probabilities as picked (moe_normalize_expert_weights null)
    "dbrx": ("dbrx", {}),
    "dbrx_top_k_as_picked": (
        "dbrx",
        {
            "ffn_config": {
                "ffn_hidden_size": 32,
                "moe_num_experts": 4,
                "moe_top_k": 2,
                "moe_normalize_expert_weights": None,
            }
        },
    ),
    # a dense first layer rotating in full attention, softmax routing, a shared expert
    # averaged, LayerNorms (tests/_hf.py); then sigmoid scores as they are, RMSNorms, the
    # shared expert summed, a sliding dense layer, attention biases; then sigmoid scores renormalized, no shared
    # expert
    "cohere2_moe": ("cohere2_moe", {}),
    "cohere2_moe_sigmoid_rms_sum": (
        "cohere2_moe",
        {
            "expert_selection_fn": "sigmoid",
            "norm_topk_prob": False,
            "rms_norm_eps": 1e-5,
            "shared_expert_combination_strategy": "sum",
            "prefix_dense_sliding_window_pattern": 2,
            "attention_bias": True,
        },
    ),
    "cohere2_moe_sigmoid_renormalized_unshared": (
        "cohere2_moe",
        {"expert_selection_fn": "sigmoid", "num_shared_experts": 0},
    ),
    # Mamba2, attention, Mamba2 with MoE beside the shared MLP (tests/_hf.py); then the dense
    # layout (the shared MLP alone) with rotary, one group, Mamba2 and attention projection
    # biases, no conv bias and a tied head; then Granite-4.0-Micro's layout: attention only,
    # dense, rotary
    "granitemoehybrid": ("granitemoehybrid", {}),
    "granitemoehybrid_dense_rope_one_group_biases_tied": (
        "granitemoehybrid",
        {
            "num_local_experts": 0,
            "position_embedding_type": "rope",
            "mamba_n_groups": 1,
            "mamba_proj_bias": True,
            "mamba_conv_bias": False,
            "attention_bias": True,
            "tie_word_embeddings": True,
        },
    ),
    "granitemoehybrid_micro_attention_only": (
        "granitemoehybrid",
        {
            "layer_types": ["attention"] * 3,
            "num_local_experts": 0,
            "position_embedding_type": "rope",
        },
    ),
    # rope scaling applies to the full-attention layer only; sliding layers keep default rope
    # one key/value head in the fused c_attn (tests/_hf.py); then one per head, stored
    # [q, k, v] per head; then unscaled attention scores (scale_attn_weights false), erf gelu
    "gpt_bigcode": ("gpt_bigcode", {}),
    "gpt_bigcode_multi_head_tied": (
        "gpt_bigcode",
        {"multi_query": False, "tie_word_embeddings": True},
    ),
    "gpt_bigcode_unscaled_scores_gelu": (
        "gpt_bigcode",
        {"scale_attn_weights": False, "activation_function": "gelu"},
    ),
    # Falcon-40B's layout (tests/_hf.py); Falcon-7B's (multi-query, one shared parallel norm,
    # no biases, tied); Falcon2-11B's (the new architecture with one parallel norm, one group);
    # sequential layers with [q, k, v] per head and linear rope scaling
    "falcon": ("falcon", {}),
    "falcon_7b_multi_query_tied": (
        "falcon",
        {"new_decoder_architecture": False, "bias": False, "tie_word_embeddings": True},
    ),
    "falcon2_one_parallel_norm": ("falcon", {"num_ln_in_parallel_attn": 1, "num_kv_heads": 1}),
    "falcon_sequential_multi_head_linear_rope": (
        "falcon",
        {
            "new_decoder_architecture": False,
            "multi_query": False,
            "parallel_attn": False,
            "num_kv_heads": None,
            "rope_scaling": {"rope_type": "linear", "factor": 2.0},
        },
    ),
    # latent attention with MiniCPM's scales (tests/_hf.py); then one q_proj, no biases, a tied
    # head and MiniCPM3-4B's longrope (test_minicpm3.py runs it past the original length)
    "minicpm3": ("minicpm3", {}),
    # DeepSeek-V3's latent attention in dense layers (tests/_hf.py); then one q_proj, the rope
    # slice's halves rotated (rope_interleave false), a tied head
    "youtu": ("youtu", {}),
    "youtu_one_q_proj_rotate_half_tied": (
        "youtu",
        {"q_lora_rank": None, "rope_interleave": False, "tie_word_embeddings": True},
    ),
    "minicpm3_one_q_proj_longrope_tied": (
        "minicpm3",
        {
            "q_lora_rank": None,
            "attention_bias": False,
            "tie_word_embeddings": True,
            "rope_scaling": {
                "rope_type": "longrope",
                "short_factor": [1.0, 1.1, 1.3, 1.6],
                "long_factor": [1.0, 1.5, 2.2, 3.0],
                "original_max_position_embeddings": 16,
            },
        },
    ),
    # full, sliding, sliding over a window of 5 (the prompt runs past it), llama3 rope; then an
    # MLP bias, a tied head, the full layer in the middle, linear rope
    "cwm": ("cwm", {}),
    "cwm_mlp_bias_tied_linear_rope": (
        "cwm",
        {
            "mlp_bias": True,
            "tie_word_embeddings": True,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100.0},
        },
    ),
    # full, sliding, sliding over a window of 5, sinks, rope bases 10000, none, 100
    # (tests/_hf.py); then tied, biased, every layer on one scaled rope, sliding first
    "granite_swa": ("granite_swa", {}),
    "granite_swa_tied_biased_one_linear_rope": (
        "granite_swa",
        {
            "tie_word_embeddings": True,
            "attention_bias": True,
            "mlp_bias": True,
            "layer_rope_theta": None,
            "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
            "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100.0},
        },
    ),
    "granitemoe_swa": ("granitemoe_swa", {}),
    # GraniteMoeSWAConfig's default: no shared MLP; a tied head
    "granitemoe_swa_no_shared_mlp_tied": (
        "granitemoe_swa",
        {"shared_intermediate_size": 0, "tie_word_embeddings": True},
    ),
    # differential attention: 4 query heads in 2 pairs over 2 value heads (tests/_hf.py); then
    # 8 heads of 8 over 4 value heads (2 per half), biases, a tied head
    "diffllama": ("diffllama", {}),
    # dynamic mask attention (a bias per key from its values), q/k norms, scaled residuals
    "doge": ("doge", {}),
    # mixture of attention heads (2 of 4 experts) and of MLP experts, the layers' norms at 1e-6
    "jetmoe": ("jetmoe", {}),
    "diffllama_8_heads_4_value_heads_biased_tied": (
        "diffllama",
        {
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "head_dim": 8,
            "attention_bias": True,
            "tie_word_embeddings": True,
        },
    ),
    # local, global, local over a window of 5 (tests/_hf.py); then a tied head, erf gelu,
    # global layers after a local one over a window of 3
    "gpt_neo": ("gpt_neo", {}),
    "gpt_neo_tied_gelu_window_3": (
        "gpt_neo",
        {
            "tie_word_embeddings": True,
            "activation_function": "gelu",
            "attention_types": [[["local"], 1], [["global"], 2]],
            "window_size": 3,
        },
    ),
    # pre-LN layers, learned positions from row 2, a tied head (tests/_hf.py); then
    # opt-350m's layout: norms of the residual sums, no final norm, a 32-wide token table
    # projected in and out; then no biases, weightless norms, the final norm removed, untied
    "opt": ("opt", {}),
    "opt_350m_post_ln_projected": (
        "opt",
        {"do_layer_norm_before": False, "word_embed_proj_dim": 32},
    ),
    "opt_unbiased_weightless_norms_no_final_norm_untied": (
        "opt",
        {
            "enable_bias": False,
            "layer_norm_elementwise_affine": False,
            "_remove_final_layer_norm": True,
            "tie_word_embeddings": False,
        },
    ),
    # sinusoidal positions from row 2, embeddings times sqrt(64), gelu (tests/_hf.py); then
    # an odd width (63: a zero channel after the sinusoids), unscaled, untied
    "xglm": ("xglm", {}),
    "xglm_odd_width_unscaled_untied": (
        "xglm",
        {
            "hidden_size": 63,
            "num_attention_heads": 3,
            "scale_embedding": False,
            "tie_word_embeddings": False,
        },
    ),
    # xglm's layer with opt's learned positions from row 2, embeddings times sqrt(64)
    # (tests/_hf.py); then unscaled, untied, with a layer_norm_eps its LayerNorms never read
    "biogpt": ("biogpt", {}),
    "biogpt_unscaled_untied_unread_eps": (
        "biogpt",
        {"scale_embedding": False, "tie_word_embeddings": False, "layer_norm_eps": 0.5},
    ),
    # sinusoids from row 0 (CTRL's frequencies), embeddings times sqrt(64), a tied head with
    # a bias (tests/_hf.py); then untied, 8 heads of 8
    "ctrl": ("ctrl", {}),
    "ctrl_untied_8_heads": ("ctrl", {"tie_word_embeddings": False, "n_head": 8}),
    # post-LN blocks, learned positions, no final norm, a tied head, afn gelu (gelu_new)
    # (tests/_hf.py); then relu, untied
    "openai-gpt": ("openai-gpt", {}),
    "openai-gpt_relu_untied": ("openai-gpt", {"afn": "relu", "tie_word_embeddings": False}),
    # granite's multipliers, logits times 4, post norms (tests/_hf.py); then the default
    # attention scale (null attention_multiplier), head_dim 32, biases
    "hyperclovax": ("hyperclovax", {}),
    "hyperclovax_default_scale_head_dim_biases": (
        "hyperclovax",
        {"attention_multiplier": None, "head_dim": 32, "attention_bias": True, "mlp_bias": True},
    ),
    # LayerNorms, relu2 up/down MLP, biases (tests/_hf.py); then unbiased, another eps
    "jais2": ("jais2", {}),
    "jais2_unbiased": (
        "jais2",
        {"attention_bias": False, "mlp_bias": False, "layer_norm_eps": 0.1},
    ),
    # GPT-2 under model_type gpt-sw3 (tests/_hf.py: erf gelu)
    "gpt-sw3": ("gpt-sw3", {}),
    # 4 heads, rotary on 8 of 16 channels (tests/_hf.py); then 8 heads of 8, each shard of
    # qkv_proj holding two, rotated whole, erf gelu
    "codegen": ("codegen", {}),
    "codegen_two_heads_a_shard_whole_rotary_gelu": (
        "codegen",
        {"num_attention_heads": 8, "rotary_dim": 8, "activation_function": "gelu"},
    ),
    # q/k LayerNorms, rotary on half of each head (tests/_hf.py); then neither norm, a tied
    # head, rotary on a quarter with linear scaling
    "persimmon": ("persimmon", {}),
    "persimmon_without_qk_norm_tied_linear_rope": (
        "persimmon",
        {
            "qk_layernorm": False,
            "tie_word_embeddings": True,
            "rope_parameters": {
                "rope_type": "linear",
                "factor": 2.0,
                "rope_theta": 100.0,
                "partial_rotary_factor": 0.25,
            },
        },
    ),
    # weightless norms, q/k normed after the reversed rotation, softcap 15 (tests/_hf.py);
    # then attention biases, a tied head, a softcap of 2 (most logits capped), linear rope
    "nanochat": ("nanochat", {}),
    "bitnet": ("bitnet", {}),
    "bitnet_bias": ("bitnet", {"attention_bias": True}),
    "nanochat_bias_tied_softcap_2_linear_rope": (
        "nanochat",
        {
            "attention_bias": True,
            "tie_word_embeddings": True,
            "final_logit_softcapping": 2.0,
            "rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 100.0},
        },
    ),
    # ALiBi (tests/_hf.py: 4 heads, biases, untied); six heads interleave a second series of
    # slopes; mpt's attn_config clips q/k/v and scales the scores its own way
    "bloom": ("bloom", {}),
    "bloom_six_heads_tied": (
        "bloom",
        {"num_attention_heads": 6, "hidden_size": 96, "tie_word_embeddings": True},
    ),
    # Falcon-RW: ALiBi (bfloat16 slopes, scaled with the scores), per-head [q, k, v], sequential
    # layer; then ALiBi in the new decoder architecture (2 key/value groups, parallel norms)
    "falcon_rw_alibi": ("falcon", FALCON_RW),
    "falcon_alibi_new_architecture": ("falcon", {"alibi": True}),
    "bloom_residual_after_norm": ("bloom", {"apply_residual_connection_post_layernorm": True}),
    "mpt": ("mpt", {}),
    "mpt_six_heads_clip_qkv_softmax_scale": (
        "mpt",
        {
            "num_attention_heads": 6,
            "hidden_size": 96,
            "attn_config": {"clip_qkv": 0.3, "softmax_scale": 0.2},
        },
    ),
    "olmo3_scaled_full_rope_bias_tied": (
        "olmo3",
        {
            "rope_scaling": {"rope_type": "linear", "factor": 4.0},
            "rope_theta": 1000.0,
            "attention_bias": True,
            "tie_word_embeddings": True,
        },
    ),
    # delta net, post-norm attention, delta net (tests/_hf.py; variants and mutants:
    # test_linear_hybrids.py)
    "olmo_hybrid": ("olmo_hybrid", {}),
    # delta net, windowed rotary, delta net, global NoPE attention, MoE everywhere (tests/_hf.py)
    "lara_mini": ("lara_mini", {}),
    # delta attention, NoPE latent attention, delta attention, DeepSeek-V3's MoE after a dense
    # first layer (tests/_hf.py)
    "kimi_linear": ("kimi_linear", {}),
}


#: Variants of rows whose default case and mutants run by default (the CI budget)
SLOW_CASES = {
    "youtu_one_q_proj_rotate_half_tied",
    "cohere_compass_text_both_rotated_linear_full_unscaled",
}


@pytest.mark.parametrize(
    "case",
    [pytest.param(c, marks=[pytest.mark.slow] if c in SLOW_CASES else []) for c in sorted(CASES)],
)
def test_family_graphs_match_transformers(case, tmp_path):
    family, overrides = CASES[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1, **overrides)
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 12))
    diffs = parity_diffs(tmp_path, ckpt, ids)
    assert max(diffs.values()) <= TOLERANCE, diffs


@pytest.mark.parametrize(
    ("family", "windowed"),
    [("llama", True), ("mistral", True), ("olmoe", True), ("qwen2", False), ("smollm3", False)],
)
def test_sliding_window_switches_count_only_where_the_config_class_reads_them(
    family, windowed, tmp_path
):
    """LlamaConfig, MistralConfig, OlmoeConfig ignore use_sliding_window and max_window_layers,
    and transformers' cache keeps only the last `sliding_window` tokens of every layer: decoding
    past the window is windowed. Qwen2Config and SmolLM3Config read the switch: no window."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1, **_WINDOW_SWITCHED_OFF)
    config = FAMILIES[family].parse_config(json.loads((ckpt / "config.json").read_text()))
    assert (config.window_of_layer(0) == 4) == windowed
    ids = np.random.default_rng(0).integers(3, 128, size=(2, 3))
    diffs = parity_diffs(tmp_path, ckpt, ids, decode_steps=8)
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_qwen3_5_cpu_graph_rotates_in_gqa_from_one_qkv_projection(tmp_path):
    """The case above reaches the paths real Qwen3.5 checkpoints take on cpu (the tiny default
    head_dim 16 gives a rotary width of 4, which GQA's rotary declines)."""
    family, overrides = CASES["qwen3_5_text_rotary_in_gqa_packed_qkv"]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1, **overrides)
    package = mobius_genai.build(ckpt, "cpu", "f32")
    graph = package["model"].graph
    gqa = [node for node in graph if node.op_type == "GroupQueryAttention"]
    assert gqa and all(node.attributes.get_int("do_rotary", 0) == 1 for node in gqa)
    assert not [node for node in graph if node.op_type == "RotaryEmbedding"]
    assert package.reports["model"].matches["PackQKVSplit"] == len(gqa)


@pytest.mark.parametrize("family", ["gemma3_text", "phi3", "stablelm"])
def test_hub_layout_config_matches_transformers(family, tmp_path):
    """transformers-4 config.json: gemma3's rope_local_base_freq, phi3's top-level lengths,
    stablelm's partial rotary that hub configs may leave to the config class (0.25)."""
    overrides = {}
    if family == "phi3":
        overrides = {"rope_scaling": _LONGROPE, "original_max_position_embeddings": 16}
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, hub_layout=True, **overrides)
    assert "rope_parameters" not in (ckpt / "config.json").read_text()
    ids = np.random.default_rng(1).integers(3, 128, size=(1, 14))
    diffs = parity_diffs(tmp_path, ckpt, ids)
    assert max(diffs.values()) <= TOLERANCE, diffs


@pytest.mark.parametrize(
    ("prefill", "context_length"),
    [
        (14, None),  # calls end at positions 14..18: short factors, then long from 17 on
        (20, None),  # every call past the original 16 positions: long factors
        (12, 16),  # a bundle that fits the original length holds only the short table
    ],
)
def test_longrope_switches_factors_like_transformers(prefill, context_length, tmp_path):
    ckpt = write_tiny_checkpoint(
        tmp_path / "ckpt",
        "phi3",
        rope_scaling=_LONGROPE,
        original_max_position_embeddings=16,
    )
    ids = np.random.default_rng(2).integers(3, 128, size=(2, prefill))
    steps = 4 if context_length is None else context_length - prefill
    diffs = parity_diffs(tmp_path, ckpt, ids, decode_steps=steps, context_length=context_length)
    assert max(diffs.values()) <= TOLERANCE, diffs
    tables = mobius_genai.build(ckpt, "default", context_length=context_length, load_weights=False)
    cos = tables["model"].graph.initializers["model.rotary_emb.cos_cache"]
    expected = [2, 64, 8] if context_length is None else [16, 8]
    assert list(cos.shape) == expected


def test_gpt2_checkpoint_saved_from_base_model(tmp_path):
    """Hub gpt2 checkpoints name tensors without the "transformer." prefix."""
    from safetensors.numpy import load_file, save_file

    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "gpt2")
    tensors = load_file(ckpt / "model.safetensors")
    save_file(
        {k.removeprefix("transformer."): v for k, v in tensors.items()},
        ckpt / "model.safetensors",
        metadata={"format": "pt"},
    )
    ids = np.random.default_rng(3).integers(3, 128, size=(1, 12))
    diffs = parity_diffs(tmp_path, ckpt, ids)
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_gpt_neox_hub_config_rotary_pct_and_base(tmp_path):
    """Pythia's config.json: rotary_pct and rotary_emb_base at the top level, no rope keys
    (transformers 5 reads only these two there, not rope_theta or partial_rotary_factor)."""
    ckpt = write_tiny_checkpoint(
        tmp_path / "ckpt", "gpt_neox", rotary_pct=0.5, rotary_emb_base=100.0
    )
    path = ckpt / "config.json"
    before = AutoConfig.from_pretrained(ckpt).rope_parameters
    assert before["partial_rotary_factor"] == 0.5 and before["rope_theta"] == 100.0
    data = json.loads(path.read_text())
    data.pop("rope_parameters")
    data.update(rotary_pct=0.5, rotary_emb_base=100.0, torch_dtype=data.pop("dtype"))
    path.write_text(json.dumps(data))
    assert AutoConfig.from_pretrained(ckpt).rope_parameters == before
    ids = np.random.default_rng(4).integers(3, 128, size=(1, 12))
    diffs = parity_diffs(tmp_path, ckpt, ids)
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_cohere_compass_text_needs_a_rope_per_layer_type():
    """CohereCompassTextModel reads rope_parameters by layer type (a flat one fails there)."""
    raw = json.loads(json.dumps(tiny_config("cohere_compass_text").to_dict()))
    raw["rope_parameters"] = {"rope_type": "default", "rope_theta": 100.0}
    with pytest.raises(UnsupportedModelError, match="rope_parameters is .*one entry"):
        FAMILIES["cohere_compass_text"].parse_config(raw)


def test_exaone_hub_config(tmp_path, monkeypatch):
    """EXAONE's config.json: num_layers, layer_norm_epsilon, activation_function and no rope
    keys (rope_theta 500000, ExaoneConfig's default); the default must matter."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", "exaone", rms_norm_eps=1e-3)
    path = ckpt / "config.json"
    before = AutoConfig.from_pretrained(ckpt).to_dict()
    data = json.loads(path.read_text())
    for old, new in (
        ("num_hidden_layers", "num_layers"),
        ("rms_norm_eps", "layer_norm_epsilon"),
        ("hidden_act", "activation_function"),
    ):
        data[new] = data.pop(old)
    del data["rope_parameters"]
    path.write_text(json.dumps(data))
    after = AutoConfig.from_pretrained(ckpt).to_dict()
    for key in ("num_hidden_layers", "rms_norm_eps", "hidden_act", "rope_parameters"):
        assert after[key] == before[key], key
    assert after["rope_parameters"]["rope_theta"] == 5e5
    ids = np.random.default_rng(5).integers(3, 128, size=(1, 12))
    diffs = parity_diffs(tmp_path, ckpt, ids)
    assert max(diffs.values()) <= TOLERANCE, diffs
    defaults = {k: v for k, v in FAMILIES["exaone"].config_defaults.items() if k != "rope_theta"}
    mutant = dataclasses.replace(FAMILIES["exaone"], config_defaults=defaults)
    monkeypatch.setitem(FAMILIES, "exaone", mutant)
    diffs = parity_diffs(tmp_path / "mutant", ckpt, ids, decode_steps=1)
    assert min(diffs.values()) > 10 * TOLERANCE, diffs


def _without_offset(family: str) -> FamilyAdapter:
    """The family's learned position table (max_position_embeddings + 2 rows), read from row 0."""
    return with_overrides(
        family,
        embedding_layout=EmbeddingLayout(),
        max_position_embeddings=lambda raw: raw["max_position_embeddings"] + 2,
    )


def _as_stored(family: str) -> FamilyAdapter:
    """The family's row with its checkpoint tensors read as stored (no preprocess_weight)."""
    return dataclasses.replace(FAMILIES[family], preprocess_weight=lambda n, a, c: a)


def _unnormalized(family: str):
    """The family's MoE reader with the top-k renormalization turned off."""
    read = FAMILIES[family].config_overrides["moe"]
    return lambda raw: dataclasses.replace(read(raw), normalize_top_k=False)


def _unbiased(family: str):
    """The family's MoE reader without the bias on the experts' sum."""
    read = FAMILIES[family].config_overrides["moe"]
    return lambda raw: dataclasses.replace(read(raw), output_bias=False)


# Each adapter difference, undone: the parity check must then fail (so it can fail).
# case → (family, mutant adapter[, config overrides of the checkpoint]).
MUTANTS = {
    "gemma_without_norm_offset": (
        "gemma",
        lambda: _as_stored("gemma"),
    ),
    "youtu_rotate_half": ("youtu", lambda: with_overrides("youtu", rope_interleaved=False)),
    "cohere_compass_text_interleaved_rope": (
        "cohere_compass_text",
        lambda: with_overrides("cohere_compass_text", rope_interleaved=True),
    ),
    "cohere_compass_text_full_layers_rotated": (
        "cohere_compass_text",
        lambda: with_overrides("cohere_compass_text", no_rope_layers=()),
    ),
    "cohere_compass_text_logits_unscaled": (
        "cohere_compass_text",
        lambda: with_overrides("cohere_compass_text", logits_scaling=1.0),
    ),
    "gemma_without_embedding_scale": (
        "gemma",
        lambda: with_overrides("gemma", embedding_multiplier=1.0),
    ),
    "gemma2_without_attention_softcap": (
        "gemma2",
        lambda: with_overrides("gemma2", attn_logit_softcapping=None),
    ),
    "gemma2_with_head_dim_scale": (
        "gemma2",
        lambda: with_overrides("gemma2", attention_scale=None),
    ),
    "gemma3_text_one_rope": ("gemma3_text", lambda: with_overrides("gemma3_text", rope_local=None)),
    "granite_without_residual_multiplier": (
        "granite",
        lambda: with_overrides("granite", residual_multiplier=1.0),
    ),
    "granite_without_logits_scaling": (
        "granite",
        lambda: with_overrides("granite", logits_scaling=1.0),
    ),
    "smollm3_rope_everywhere": ("smollm3", lambda: with_overrides("smollm3", no_rope_layers=())),
    "stablelm_full_rotary": ("stablelm", lambda: with_overrides("stablelm", rope=RopeConfig())),
    "olmo_without_clip_qkv": (
        "olmo",
        lambda: with_overrides("olmo", clip_qkv=None),
        {"clip_qkv": 1.0},
    ),
    "gpt_neox_qkv_rows_as_stored": (
        "gpt_neox",
        lambda: _as_stored("gpt_neox"),
    ),
    "gpt_neox_one_shared_parallel_norm": (
        "gpt_neox",
        lambda: with_overrides("gpt_neox", parallel_mlp_norm=False),
    ),
    "gpt_neox_full_rotary": ("gpt_neox", lambda: with_overrides("gpt_neox", rope=RopeConfig())),
    "nemotron_without_norm_offset": (
        "nemotron",
        lambda: _as_stored("nemotron"),
    ),
    "nemotron_relu_not_squared": (
        "nemotron",
        lambda: with_overrides("nemotron", hidden_act="relu"),
    ),
    "gptj_rotate_half": ("gptj", lambda: with_overrides("gptj", rope_interleaved=False)),
    "gptj_without_lm_head_bias": ("gptj", lambda: with_overrides("gptj", lm_head_bias=False)),
    "cohere_rotate_half": ("cohere", lambda: with_overrides("cohere", rope_interleaved=False)),
    "cohere_without_logit_scale": ("cohere", lambda: with_overrides("cohere", logits_scaling=1.0)),
    "glm_rotate_half": ("glm", lambda: with_overrides("glm", rope_interleaved=False)),
    "glm_up_before_gate": (
        "glm",
        lambda: dataclasses.replace(
            FAMILIES["glm"],
            fused_weights=(
                FusedWeight(
                    r"\.mlp\.(?P<part>gate|up)_proj\.weight$",
                    ".mlp.gate_up_proj.weight",
                    ("up", "gate"),
                ),
            ),
        ),
    ),
    # the top-k renormalized to sum 1 (a softmax over them) instead of by their 2-norm
    "dbrx_softmax_renormalization": (
        "dbrx",
        lambda: with_overrides(
            "dbrx", moe=lambda raw: dataclasses.replace(dbrx_moe(raw), norm_p=1.0)
        ),
    ),
    "dbrx_without_clip_qkv": ("dbrx", lambda: with_overrides("dbrx", clip_qkv=None)),
    # each expert's w1 (gate) and v1 (up) rows read the other way round
    "dbrx_gate_and_up_swapped": (
        "dbrx",
        lambda: dataclasses.replace(
            FAMILIES["dbrx"],
            experts=dataclasses.replace(FAMILIES["dbrx"].experts, gate="mlp.v1", up="mlp.w1"),
        ),
    ),
    "cohere2_moe_shared_expert_summed": (
        "cohere2_moe",
        lambda: with_overrides(
            "cohere2_moe",
            moe=lambda raw: dataclasses.replace(cohere2_moe(raw), combined_scale=1.0),
        ),
    ),
    "cohere2_moe_dense_layer_without_rope": (
        "cohere2_moe",
        lambda: with_overrides("cohere2_moe", no_rope_layers=(0, 2)),
    ),
    "cohere2_moe_sigmoid_as_softmax": (
        "cohere2_moe",
        lambda: with_overrides(
            "cohere2_moe",
            moe=lambda raw: dataclasses.replace(
                cohere2_moe(raw), group_routing=None, normalize_top_k=True
            ),
        ),
        {"expert_selection_fn": "sigmoid", "norm_topk_prob": False},
    ),
    "cohere_without_qk_norm": (
        "cohere",
        lambda: with_overrides(
            "cohere", qk_norm=False, qk_norm_head_weights=False, qk_norm_stacked_weights=False
        ),
        {"use_qk_norm": True},
    ),
    "cohere2_rope_everywhere": ("cohere2", lambda: with_overrides("cohere2", no_rope_layers=())),
    "cohere2_without_logit_scale": (
        "cohere2",
        lambda: with_overrides("cohere2", logits_scaling=1.0),
    ),
    "cohere2_rotate_half": ("cohere2", lambda: with_overrides("cohere2", rope_interleaved=False)),
    "cohere2_without_sliding_window": (
        "cohere2",
        lambda: with_overrides("cohere2", layer_types=("full_attention",) * 3),
    ),
    # glm's pre-norm layer, the post-attention and post-MLP norms left unread
    "glm4_without_post_norms": (
        "glm4",
        lambda: dataclasses.replace(
            with_overrides("glm4", norm_placement="pre"),
            weight_renames=(),
            unused_weights=(r"\.post_(self_attn|mlp)_layernorm\.",),
        ),
    ),
    "arcee_relu_not_squared": ("arcee", lambda: with_overrides("arcee", hidden_act="relu")),
    "helium_rotate_half": ("helium", lambda: with_overrides("helium", rope_interleaved=False)),
    "ernie4_5_rotate_half": (
        "ernie4_5",
        lambda: with_overrides("ernie4_5", rope_interleaved=False),
    ),
    "olmo3_one_rope": (
        "olmo3",
        lambda: with_overrides("olmo3", rope_local=None),
        {"rope_scaling": {"rope_type": "linear", "factor": 4.0}},
    ),
    "exaone4_rope_everywhere": ("exaone4", lambda: with_overrides("exaone4", no_rope_layers=())),
    "hunyuan_v1_dense_alpha_ignored": (
        "hunyuan_v1_dense",
        lambda: with_overrides("hunyuan_v1_dense", rope=RopeConfig()),
        {"rope_scaling": {"rope_type": "dynamic", "factor": 1.0, "alpha": 50.0}},
    ),
    "hunyuan_v1_dense_qk_norm_before_rope": (
        "hunyuan_v1_dense",
        lambda: with_overrides("hunyuan_v1_dense", qk_norm_after_rope=False),
    ),
    "vaultgemma_without_norm_offset": (
        "vaultgemma",
        lambda: _as_stored("vaultgemma"),
    ),
    # the gated norm of the delta nets scales by w, the other norms by 1 + w
    "qwen3_5_text_gated_norm_offset_too": (
        "qwen3_5_text",
        lambda: dataclasses.replace(
            FAMILIES["qwen3_5_text"],
            preprocess_weight=offset_norm_weights,
            preprocessed_weights=NORM_WEIGHTS,
        ),
    ),
    # Qwen3_5MoeTopKRouter always renormalizes the top-k probabilities
    "qwen3_5_moe_text_unnormalized_top_k": (
        "qwen3_5_moe_text",
        lambda: with_overrides("qwen3_5_moe_text", moe=_unnormalized("qwen3_5_moe_text")),
    ),
    "olmo3_without_sliding_window": (
        "olmo3",
        lambda: with_overrides("olmo3", layer_types=("full_attention",) * 3),
    ),
    # c_attn's [q, k, v] rows of each head read as if they were [q | k | v] blocks
    "gpt_bigcode_qkv_rows_as_stored": (
        "gpt_bigcode",
        lambda: _as_stored("gpt_bigcode"),
        {"multi_query": False},
    ),
    # query_key_value's [q.. k v] groups read as [q | k | v] blocks
    "falcon_qkv_groups_as_stored": (
        "falcon",
        lambda: _as_stored("falcon"),
    ),
    # ln_attn before attention, ln_mlp before the MLP, one after the other
    "falcon_sequential_layers": (
        "falcon",
        lambda: with_overrides("falcon", parallel_residual=False, parallel_mlp_norm=False),
    ),
    "bloom_qkv_rows_as_stored": ("bloom", lambda: _as_stored("bloom")),
    "bloom_without_embedding_layernorm": (
        "bloom",
        lambda: with_overrides("bloom", embedding_layernorm=False),
    ),
    "bloom_residual_before_norm": (
        "bloom",
        lambda: with_overrides("bloom", residual_after_norm=False),
        {"apply_residual_connection_post_layernorm": True},
    ),
    "falcon_alibi_not_scaled_with_the_scores": (
        "falcon",
        lambda: with_overrides("falcon", alibi=Alibi(bfloat16=True)),
        FALCON_RW,
    ),
    "mpt_without_clip_qkv": (
        "mpt",
        lambda: with_overrides("mpt", clip_qkv=None),
        {"attn_config": {"clip_qkv": 0.05}},
    ),
    "mpt_default_softmax_scale": (
        "mpt",
        lambda: with_overrides("mpt", attention_scale=None),
        {"attn_config": {"softmax_scale": 0.5}},
    ),
    "falcon_one_shared_parallel_norm": (
        "falcon",
        lambda: with_overrides("falcon", parallel_mlp_norm=False),
    ),
    "minicpm3_without_embedding_scale": (
        "minicpm3",
        lambda: with_overrides("minicpm3", embedding_multiplier=1.0),
    ),
    "minicpm3_without_residual_scale": (
        "minicpm3",
        lambda: with_overrides("minicpm3", residual_multiplier=1.0),
    ),
    "minicpm3_without_logit_scale": (
        "minicpm3",
        lambda: with_overrides("minicpm3", logits_scaling=1.0),
    ),
    "minicpm3_rotating_pairs": (
        "minicpm3",
        lambda: with_overrides("minicpm3", rope_interleaved=True),
    ),
    "cwm_without_sliding_window": (
        "cwm",
        lambda: with_overrides("cwm", layer_types=("full_attention",) * 3),
    ),
    "granite_swa_one_rope_theta": (
        "granite_swa",
        lambda: with_overrides("granite_swa", layer_rope_thetas=()),
    ),
    "granitemoe_swa_one_rope_theta": (
        "granitemoe_swa",
        lambda: with_overrides("granitemoe_swa", layer_rope_thetas=()),
    ),
    "granitemoe_swa_without_sliding_window": (
        "granitemoe_swa",
        lambda: with_overrides("granitemoe_swa", layer_types=("full_attention",) * 3),
    ),
    "diffllama_lambda_init_one_layer_deeper": (
        "diffllama",
        lambda: with_overrides(
            "diffllama", differential_attention=DifferentialAttention(depth_offset=1)
        ),
    ),
    "diffllama_without_head_norm": (
        "diffllama",
        lambda: with_overrides(
            "diffllama", differential_attention=DifferentialAttention(head_norm=False)
        ),
    ),
    "granite_swa_without_sinks": (
        "granite_swa",
        lambda: with_overrides("granite_swa", attention_sinks=False),
    ),
    "gpt_neo_without_local_window": (
        "gpt_neo",
        lambda: with_overrides("gpt_neo", layer_types=("full_attention",) * 3),
    ),
    # qkv_proj's shards of [q, v, k] read as [q | k | v] blocks
    "codegen_qkv_shards_as_stored": (
        "codegen",
        lambda: _as_stored("codegen"),
    ),
    "codegen_rotating_halves": (
        "codegen",
        lambda: with_overrides("codegen", rope_interleaved=False),
    ),
    # query_key_value's [q, k, v] rows of each head read as [q | k | v] blocks
    "persimmon_qkv_rows_as_stored": (
        "persimmon",
        lambda: _as_stored("persimmon"),
    ),
    "persimmon_without_qk_norm": ("persimmon", lambda: with_overrides("persimmon", qk_norm=False)),
    # the rotation turned the usual way
    "nanochat_rotation_as_llama": (
        "nanochat",
        lambda: _as_stored("nanochat"),
    ),
    "nanochat_without_embedding_norm": (
        "nanochat",
        lambda: with_overrides("nanochat", embedding_norm=False),
    ),
    "nanochat_without_softcap": (
        "nanochat",
        lambda: with_overrides("nanochat", final_logit_softcapping=None),
    ),
    "gpt_neo_scores_over_sqrt_head_dim": (
        "gpt_neo",
        lambda: with_overrides("gpt_neo", attention_scale=None),
    ),
    # the same table of max_position_embeddings + 2 rows, read from row 0
    "opt_positions_without_offset": ("opt", lambda: _without_offset("opt")),
    # opt-350m's norms of the residual sums applied before each block instead
    "opt_350m_post_ln_read_as_pre_ln": (
        "opt",
        lambda: with_overrides("opt", norm_placement="pre"),
        {"do_layer_norm_before": False},
    ),
    "xglm_positions_without_offset": (
        "xglm",
        lambda: with_overrides("xglm", embedding_layout=EmbeddingLayout()),
    ),
    "xglm_without_embedding_scale": (
        "xglm",
        lambda: with_overrides("xglm", embedding_multiplier=1.0),
    ),
    # as opt's
    "biogpt_positions_without_offset": ("biogpt", lambda: _without_offset("biogpt")),
    "biogpt_without_embedding_scale": (
        "biogpt",
        lambda: with_overrides("biogpt", embedding_multiplier=1.0),
    ),
    # config.json's layer_norm_eps, which BioGptDecoderLayer's nn.LayerNorms never read
    "biogpt_norm_eps_from_config": (
        "biogpt",
        lambda: with_overrides("biogpt", norm_eps=lambda raw: raw["layer_norm_eps"]),
        {"layer_norm_eps": 0.5},
    ),
    # XGLM's sinusoids (their frequencies spread over half - 1 steps) in place of CTRL's
    "ctrl_with_fairseq_sinusoids": (
        "ctrl",
        lambda: with_overrides("ctrl", embedding_layout=EmbeddingLayout()),
    ),
    "ctrl_without_embedding_scale": (
        "ctrl",
        lambda: with_overrides("ctrl", embedding_multiplier=1.0),
    ),
    # GPT-1's norms of the residual sums applied before each block
    "openai-gpt_post_ln_read_as_pre_ln": (
        "openai-gpt",
        lambda: with_overrides("openai-gpt", norm_placement="pre"),
    ),
    # afn "relu" read as gpt2's default activation
    "openai-gpt_afn_unread": (
        "openai-gpt",
        lambda: with_overrides("openai-gpt", hidden_act="gelu_new"),
        {"afn": "relu"},
    ),
    "hyperclovax_without_post_norms": (
        "hyperclovax",
        lambda: with_overrides("hyperclovax", norm_placement="pre"),
    ),
    # logits divided by logits_scaling, as granite's are
    "hyperclovax_logits_divided": (
        "hyperclovax",
        lambda: with_overrides("hyperclovax", logits_scaling=lambda raw: raw["logits_scaling"]),
    ),
    # config.json's layer_norm_eps (0.1 here) left for Jais2Config's default
    "jais2_layer_norm_eps_unread": (
        "jais2",
        lambda: with_overrides("jais2", norm_eps=1e-5),
        {"layer_norm_eps": 0.1},
    ),
    "doge_without_residual_scales": ("doge", lambda: with_overrides("doge", residual_scales=False)),
    "jetmoe_layer_norms_at_rms_norm_eps": (
        "jetmoe",
        lambda: with_overrides("jetmoe", block_norm_eps=None),
    ),
    "jetmoe_experts_without_bias": (
        "jetmoe",
        lambda: with_overrides("jetmoe", moe=_unbiased("jetmoe")),
    ),
    # config.json's activation_function (relu here) ignored for gpt2's default (gelu_new)
    "gpt-sw3_activation_as_gpt2_default": (
        "gpt-sw3",
        lambda: with_overrides("gpt-sw3", hidden_act="gelu_new"),
        {"activation_function": "relu"},
    ),
}


# Mutants whose graph reads fewer tensors than the checkpoint holds: the build refuses them
# before any parity check (weight_checks.require_all_used).
UNREAD_BY_MUTANT = {
    "bloom_without_embedding_layernorm": "'transformer.word_embeddings_layernorm.",
    "cohere_without_qk_norm": "'model.layers.0.self_attn.k_norm.weight'",
    "gpt_neox_one_shared_parallel_norm": "'gpt_neox.layers.0.post_attention_layernorm.bias'",
    "gptj_without_lm_head_bias": "'lm_head.bias'",
    "falcon_one_shared_parallel_norm": "'transformer.h.0.ln_mlp.bias'",
    "persimmon_without_qk_norm": "'model.layers.0.self_attn.k_layernorm.bias'",
    "granite_swa_without_sinks": "'model.layers.0.self_attn.sinks'",
    "hyperclovax_without_post_norms": "'model.layers.0.post_attention_layernorm.weight'",
    "jetmoe_experts_without_bias": "'model.layers.0.mlp.bias'",
    "doge_without_residual_scales": "'model.layers.0.input_residual'",
}


@pytest.mark.parametrize("case", sorted(set(MUTANTS) - set(UNREAD_BY_MUTANT)))
def test_parity_fails_without_the_adapter_difference(case, tmp_path, monkeypatch):
    family, mutant, *overrides = MUTANTS[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1, **(overrides or [{}])[0])
    ids = np.random.default_rng(0).integers(3, 128, size=(1, 12))
    reference = hf_reference_logits(ckpt, ids, decode_steps=1)
    monkeypatch.setitem(FAMILIES, family, mutant())
    package = mobius_genai.build(ckpt, "default", "f32")
    ours = run_like_reference(ort_session(package, tmp_path / "onnx"), reference)
    assert max_abs_diff(ours, reference.logits) > 10 * TOLERANCE


@pytest.mark.parametrize("case", sorted(UNREAD_BY_MUTANT))
def test_a_mutant_that_leaves_checkpoint_tensors_unread_is_refused(case, tmp_path, monkeypatch):
    family, mutant, *overrides = MUTANTS[case]
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1, **(overrides or [{}])[0])
    monkeypatch.setitem(FAMILIES, family, mutant())
    with pytest.raises(
        WeightsError, match="reads no tensor .*" + re.escape(UNREAD_BY_MUTANT[case])
    ):
        mobius_genai.build(ckpt, "default", "f32")


@pytest.mark.parametrize("family", sorted({family for family, _ in CASES.values()}))
def test_cpu_graph_runs_group_query_attention_in_every_layer(family, tmp_path):
    """The GQA fusion keeps each family's math (parity above) and leaves no Attention op; the
    recurrent layers of hybrid families (lfm2's conv layers, qwen3.5's gated delta nets) keep
    their own ops."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family)
    graph = mobius_genai.build(ckpt, "cpu", "f32", load_weights=False)["model"].graph
    ops = [node.op_type for node in graph]
    written = json.loads((ckpt / "config.json").read_text())
    kinds = written.get("layer_types") or []
    recurrent = sum(kind in ("conv", "linear_attention") for kind in kinds)
    layers = AutoConfig.from_pretrained(ckpt).num_hidden_layers  # gpt2's n_layer too
    parsed = FAMILIES[family].parse_config(written)
    # differential attention's second call reads the first's whole present cache: no GQA
    differential = parsed.differential_attention is not None
    # a dynamic mask biases every key: the causal GQA fusion declines the layer
    unfused = layers if parsed.dynamic_mask is not None else 0
    # q, k and v convolved apart (OLMo hybrid): three convs in each delta net
    delta = parsed.linear_attention
    convs = 3 if delta is not None and delta.separate_qkv else 1
    assert ops.count("GroupQueryAttention") == layers - recurrent - unfused
    assert ops.count("Attention") == (layers if differential or unfused else 0)
    assert ops.count("CausalConvWithState") == recurrent * convs
    assert ops.count("LinearAttention") == kinds.count("linear_attention")
