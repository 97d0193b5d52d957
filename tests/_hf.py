"""Test-only helpers around transformers: tiny random checkpoints and reference outputs.

``write_tiny_checkpoint`` writes a small random-weight checkpoint for one family;
``hf_reference_logits`` runs transformers (float32, eager attention) over a prefill and several
KV-cache decode steps and records every call's inputs and logits, so a parity test can feed an
ONNX graph exactly the same inputs; ``hf_greedy_tokens`` is transformers' greedy continuation.

Written against transformers 5, which keeps rope settings in ``config.rope_parameters`` (legacy
``rope_theta`` / ``rope_scaling`` keyword arguments are still accepted and converted) and saves
``dtype`` instead of ``torch_dtype``. ``hub_layout=True`` rewrites config.json the way hub
checkpoints written by transformers 4 have it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from huggingface_hub.file_download import (
    _cache_commit_hash_for_specific_revision,
    _create_symlink,
    _get_pointer_path,
    repo_folder_name,
)
from safetensors.numpy import load_file, save_file
from transformers import (
    AfmoeConfig,
    Apertus1p5TextConfig,
    ApertusConfig,
    ArceeConfig,
    AriaTextConfig,
    AutoConfig,
    AutoModelForCausalLM,
    AXK1Config,
    BambaConfig,
    BioGptConfig,
    BitNetConfig,
    BloomConfig,
    CodeGenConfig,
    Cohere2Config,
    Cohere2MoeConfig,
    CohereCompassTextConfig,
    CohereConfig,
    CTRLConfig,
    CwmConfig,
    DbrxConfig,
    DeepseekV2Config,
    DeepseekV3Config,
    DeepseekV32Config,
    DiffLlamaConfig,
    DogeConfig,
    Dots1Config,
    Ernie4_5_MoeConfig,
    Ernie4_5Config,
    Exaone4Config,
    ExaoneConfig,
    ExaoneMoeConfig,
    FalconConfig,
    FalconH1Config,
    FalconMambaConfig,
    FlexOlmoConfig,
    FlintConfig,
    Gemma2Config,
    Gemma3nTextConfig,
    Gemma3TextConfig,
    Gemma4TextConfig,
    GemmaConfig,
    Glm4Config,
    Glm4MoeConfig,
    Glm4MoeLiteConfig,
    GlmConfig,
    GlmMoeDsaConfig,
    GPT2Config,
    GPTBigCodeConfig,
    GPTJConfig,
    GPTNeoConfig,
    GPTNeoXConfig,
    GptOssConfig,
    GraniteConfig,
    GraniteMoeConfig,
    GraniteMoeHybridConfig,
    GraniteMoeSharedConfig,
    GraniteMoeSWAConfig,
    GraniteSWAConfig,
    HeliumConfig,
    HunYuanDenseV1Config,
    HunYuanMoEV1Config,
    HyperCLOVAXConfig,
    HYV3Config,
    InternLM3Config,
    IQuestCoderConfig,
    Jais2Config,
    JambaConfig,
    JetMoeConfig,
    KimiLinearConfig,
    Kolibri1Config,
    LagunaConfig,
    LaraMiniConfig,
    Lfm2Config,
    Lfm2MoeConfig,
    Llama4TextConfig,
    LlamaConfig,
    Mamba2Config,
    MambaConfig,
    MellumConfig,
    MiMoV2FlashConfig,
    MiniCPM3Config,
    MiniCPM5MoeConfig,
    MiniMaxConfig,
    MiniMaxM2Config,
    Ministral3Config,
    MinistralConfig,
    MistralConfig,
    MixtralConfig,
    MptConfig,
    NanoChatConfig,
    NemotronConfig,
    NemotronHConfig,
    Olmo2Config,
    Olmo3Config,
    OlmoConfig,
    OlmoeConfig,
    OlmoHybridConfig,
    OpenAIGPTConfig,
    OPTConfig,
    Param2MoeConfig,
    PersimmonConfig,
    Phi3Config,
    PhiConfig,
    PhimoeConfig,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen2MoeConfig,
    Qwen3_5MoeTextConfig,
    Qwen3_5TextConfig,
    Qwen3Config,
    Qwen3MoeConfig,
    Qwen3NextConfig,
    RecurrentGemmaConfig,
    SarvamMLAConfig,
    SarvamMoEConfig,
    SeedOssConfig,
    SmolLM3Config,
    SolarOpenConfig,
    StableLmConfig,
    Starcoder2Config,
    VaultGemmaConfig,
    XGLMConfig,
    YoutuConfig,
    Zamba2Config,
)
from transformers.cache_utils import DynamicCache
from transformers.utils import logging as hf_logging

hf_logging.disable_progress_bar()  # keep test output readable

FAMILIES: dict[str, type[PretrainedConfig]] = {
    "llama": LlamaConfig,
    "mistral": MistralConfig,
    "ministral": MinistralConfig,
    "ministral3": Ministral3Config,
    "qwen2": Qwen2Config,
    "qwen3": Qwen3Config,
    "gemma": GemmaConfig,
    "gemma2": Gemma2Config,
    "gemma3_text": Gemma3TextConfig,
    "gemma3n_text": Gemma3nTextConfig,
    "gemma4_text": Gemma4TextConfig,
    "phi3": Phi3Config,
    "phi": PhiConfig,
    "gpt2": GPT2Config,
    "granite": GraniteConfig,
    "olmo2": Olmo2Config,
    "smollm3": SmolLM3Config,
    "starcoder2": Starcoder2Config,
    "stablelm": StableLmConfig,
    "olmo": OlmoConfig,
    "gpt_neox": GPTNeoXConfig,
    "nemotron": NemotronConfig,
    "exaone": ExaoneConfig,
    "gptj": GPTJConfig,
    "cohere": CohereConfig,
    "glm": GlmConfig,
    "cohere2": Cohere2Config,
    "glm4": Glm4Config,
    "arcee": ArceeConfig,
    "helium": HeliumConfig,
    "ernie4_5": Ernie4_5Config,
    "seed_oss": SeedOssConfig,
    "olmo3": Olmo3Config,
    "exaone4": Exaone4Config,
    "hunyuan_v1_dense": HunYuanDenseV1Config,
    "internlm3": InternLM3Config,
    "vaultgemma": VaultGemmaConfig,
    "gpt_oss": GptOssConfig,
    "minimax": MiniMaxConfig,
    "mixtral": MixtralConfig,
    "qwen3_moe": Qwen3MoeConfig,
    "qwen2_moe": Qwen2MoeConfig,
    "olmoe": OlmoeConfig,
    "granitemoe": GraniteMoeConfig,
    "jetmoe": JetMoeConfig,
    "phimoe": PhimoeConfig,
    "lfm2": Lfm2Config,
    "lfm2_moe": Lfm2MoeConfig,
    "qwen3_5_text": Qwen3_5TextConfig,
    "qwen3_next": Qwen3NextConfig,
    "qwen3_5_moe_text": Qwen3_5MoeTextConfig,
    "deepseek_v3": DeepseekV3Config,
    "deepseek_v2": DeepseekV2Config,
    "granitemoehybrid": GraniteMoeHybridConfig,
    "nemotron_h": NemotronHConfig,
    "falcon_h1": FalconH1Config,
    "llama4_text": Llama4TextConfig,
    "glm4_moe": Glm4MoeConfig,
    "ernie4_5_moe": Ernie4_5_MoeConfig,
    "minimax_m2": MiniMaxM2Config,
    "apertus": ApertusConfig,
    "granitemoeshared": GraniteMoeSharedConfig,
    "hunyuan_v1_moe": HunYuanMoEV1Config,
    "dots1": Dots1Config,
    "bamba": BambaConfig,
    "zamba2": Zamba2Config,
    "glm4_moe_lite": Glm4MoeLiteConfig,
    "deepseek_v32": DeepseekV32Config,
    "glm_moe_dsa": GlmMoeDsaConfig,
    "exaone_moe": ExaoneMoeConfig,
    "solar_open": SolarOpenConfig,
    "flex_olmo": FlexOlmoConfig,
    "dbrx": DbrxConfig,
    "cohere2_moe": Cohere2MoeConfig,
    "gpt_bigcode": GPTBigCodeConfig,
    "falcon": FalconConfig,
    "bloom": BloomConfig,
    "mpt": MptConfig,
    "minicpm3": MiniCPM3Config,
    "cwm": CwmConfig,
    "gpt_neo": GPTNeoConfig,
    "codegen": CodeGenConfig,
    "opt": OPTConfig,
    "xglm": XGLMConfig,
    "biogpt": BioGptConfig,
    "gpt-sw3": GPT2Config,
    "ctrl": CTRLConfig,
    "openai-gpt": OpenAIGPTConfig,
    "hyperclovax": HyperCLOVAXConfig,
    "jais2": Jais2Config,
    "persimmon": PersimmonConfig,
    "nanochat": NanoChatConfig,
    "bitnet": BitNetConfig,
    "mamba": MambaConfig,
    "falcon_mamba": FalconMambaConfig,
    "jamba": JambaConfig,
    "mamba2": Mamba2Config,
    "recurrent_gemma": RecurrentGemmaConfig,
    "granite_swa": GraniteSWAConfig,
    "granitemoe_swa": GraniteMoeSWAConfig,
    "diffllama": DiffLlamaConfig,
    "iquestcoder": IQuestCoderConfig,
    "param2moe": Param2MoeConfig,
    "sarvam_moe": SarvamMoEConfig,
    "sarvam_mla": SarvamMLAConfig,
    "aria_text": AriaTextConfig,
    "apertus1p5_text": Apertus1p5TextConfig,
    "youtu": YoutuConfig,
    "cohere_compass_text": CohereCompassTextConfig,
    "olmo_hybrid": OlmoHybridConfig,
    "lara_mini": LaraMiniConfig,
    "kimi_linear": KimiLinearConfig,
    "laguna": LagunaConfig,
    "mellum": MellumConfig,
    "mimo_v2_flash": MiMoV2FlashConfig,
    "doge": DogeConfig,
    "afmoe": AfmoeConfig,
    "axk1": AXK1Config,
    "minicpm5_moe": MiniCPM5MoeConfig,
    "kolibri1": Kolibri1Config,
    "flint": FlintConfig,
    "hy_v3": HYV3Config,
}

_ARCHITECTURES = {
    "llama": "LlamaForCausalLM",
    "mistral": "MistralForCausalLM",
    "ministral": "MinistralForCausalLM",
    "ministral3": "Ministral3ForCausalLM",
    "qwen2": "Qwen2ForCausalLM",
    "qwen3": "Qwen3ForCausalLM",
    "gemma": "GemmaForCausalLM",
    "gemma2": "Gemma2ForCausalLM",
    "gemma3_text": "Gemma3ForCausalLM",
    "gemma3n_text": "Gemma3nForCausalLM",
    "gemma4_text": "Gemma4ForCausalLM",
    "phi3": "Phi3ForCausalLM",
    "phi": "PhiForCausalLM",
    "gpt2": "GPT2LMHeadModel",
    "granite": "GraniteForCausalLM",
    "olmo2": "Olmo2ForCausalLM",
    "smollm3": "SmolLM3ForCausalLM",
    "starcoder2": "Starcoder2ForCausalLM",
    "stablelm": "StableLmForCausalLM",
    "olmo": "OlmoForCausalLM",
    "gpt_neox": "GPTNeoXForCausalLM",
    "nemotron": "NemotronForCausalLM",
    "exaone": "LlamaForCausalLM",  # transformers runs exaone checkpoints as llama
    "gptj": "GPTJForCausalLM",
    "cohere": "CohereForCausalLM",
    "glm": "GlmForCausalLM",
    "cohere2": "Cohere2ForCausalLM",
    "glm4": "Glm4ForCausalLM",
    "arcee": "ArceeForCausalLM",
    "helium": "HeliumForCausalLM",
    "ernie4_5": "Ernie4_5ForCausalLM",
    "seed_oss": "SeedOssForCausalLM",
    "olmo3": "Olmo3ForCausalLM",
    "exaone4": "Exaone4ForCausalLM",
    "hunyuan_v1_dense": "HunYuanDenseV1ForCausalLM",
    "internlm3": "LlamaForCausalLM",  # transformers runs internlm3 checkpoints as llama
    "vaultgemma": "VaultGemmaForCausalLM",
    "gpt_oss": "GptOssForCausalLM",
    "minimax": "MiniMaxForCausalLM",
    "mixtral": "MixtralForCausalLM",
    "qwen3_moe": "Qwen3MoeForCausalLM",
    "qwen2_moe": "Qwen2MoeForCausalLM",
    "olmoe": "OlmoeForCausalLM",
    "granitemoe": "GraniteMoeForCausalLM",
    "jetmoe": "JetMoeForCausalLM",
    "phimoe": "PhimoeForCausalLM",
    "lfm2": "Lfm2ForCausalLM",
    "lfm2_moe": "Lfm2MoeForCausalLM",
    "qwen3_5_text": "Qwen3_5ForCausalLM",
    "qwen3_next": "Qwen3NextForCausalLM",
    "qwen3_5_moe_text": "Qwen3_5MoeForCausalLM",
    "deepseek_v3": "DeepseekV3ForCausalLM",
    "deepseek_v2": "DeepseekV2ForCausalLM",
    "granitemoehybrid": "GraniteMoeHybridForCausalLM",
    "nemotron_h": "NemotronHForCausalLM",
    "falcon_h1": "FalconH1ForCausalLM",
    "llama4_text": "Llama4ForCausalLM",
    "glm4_moe": "Glm4MoeForCausalLM",
    "ernie4_5_moe": "Ernie4_5_MoeForCausalLM",
    "minimax_m2": "MiniMaxM2ForCausalLM",
    "apertus": "ApertusForCausalLM",
    "granitemoeshared": "GraniteMoeSharedForCausalLM",
    "hunyuan_v1_moe": "HunYuanMoEV1ForCausalLM",
    "dots1": "Dots1ForCausalLM",
    "bamba": "BambaForCausalLM",
    "zamba2": "Zamba2ForCausalLM",
    "glm4_moe_lite": "Glm4MoeLiteForCausalLM",
    "deepseek_v32": "DeepseekV32ForCausalLM",
    "glm_moe_dsa": "GlmMoeDsaForCausalLM",
    "exaone_moe": "ExaoneMoeForCausalLM",
    "solar_open": "SolarOpenForCausalLM",
    "flex_olmo": "FlexOlmoForCausalLM",
    "dbrx": "DbrxForCausalLM",
    "cohere2_moe": "Cohere2MoeForCausalLM",
    "gpt_bigcode": "GPTBigCodeForCausalLM",
    "falcon": "FalconForCausalLM",
    "bloom": "BloomForCausalLM",
    "mpt": "MptForCausalLM",
    "minicpm3": "MiniCPM3ForCausalLM",
    "cwm": "CwmForCausalLM",
    "gpt_neo": "GPTNeoForCausalLM",
    "codegen": "CodeGenForCausalLM",
    "opt": "OPTForCausalLM",
    "xglm": "XGLMForCausalLM",
    "biogpt": "BioGptForCausalLM",
    "gpt-sw3": "GPT2LMHeadModel",
    "ctrl": "CTRLLMHeadModel",
    "openai-gpt": "OpenAIGPTLMHeadModel",
    "hyperclovax": "HyperCLOVAXForCausalLM",
    "jais2": "Jais2ForCausalLM",
    "persimmon": "PersimmonForCausalLM",
    "nanochat": "NanoChatForCausalLM",
    "bitnet": "BitNetForCausalLM",
    "mamba": "MambaForCausalLM",
    "falcon_mamba": "FalconMambaForCausalLM",
    "jamba": "JambaForCausalLM",
    "mamba2": "Mamba2ForCausalLM",
    "recurrent_gemma": "RecurrentGemmaForCausalLM",
    "granite_swa": "GraniteSWAForCausalLM",
    "granitemoe_swa": "GraniteMoeSWAForCausalLM",
    "diffllama": "DiffLlamaForCausalLM",
    "iquestcoder": "LlamaForCausalLM",
    "param2moe": "Glm4MoeForCausalLM",
    "sarvam_moe": "Glm4MoeForCausalLM",
    "sarvam_mla": "DeepseekV3ForCausalLM",
    "aria_text": "AriaTextForCausalLM",
    "apertus1p5_text": "Apertus1p5TextForCausalLM",
    "youtu": "YoutuForCausalLM",
    "cohere_compass_text": "CohereCompassForCausalLM",
    "olmo_hybrid": "OlmoHybridForCausalLM",
    "lara_mini": "LaraMiniForCausalLM",
    "kimi_linear": "KimiLinearForCausalLM",
    "laguna": "LagunaForCausalLM",
    "mellum": "MellumForCausalLM",
    "mimo_v2_flash": "MiMoV2FlashForCausalLM",
    "doge": "DogeForCausalLM",
    "afmoe": "AfmoeForCausalLM",
    "axk1": "AXK1ForCausalLM",
    "minicpm5_moe": "MiniCPM5MoeForCausalLM",
    "kolibri1": "Kolibri1ForCausalLM",
    "flint": "FlintForCausalLM",
    "hy_v3": "HYV3ForCausalLM",
}

# Marks a base key the family's config does not have (it must not reach config.json).
UNSET: Any = object()

_BASE_CONFIG: dict[str, Any] = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 128,
    "max_position_embeddings": 64,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "pad_token_id": 0,
    "tie_word_embeddings": False,
}

#: Qwen3.5's tiny hybrid, shared by qwen3_5_text and qwen3_next (below).
_QWEN3_5_HYBRID: dict[str, Any] = {
    "head_dim": 16,
    "attention_bias": True,
    "max_position_embeddings": 128,
    "layer_types": ["linear_attention", "full_attention", "linear_attention"],
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 16,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
}
#: DeepSeek-V3's experts, small: 8 in 4 groups (2 kept), 2 per token, a shared expert, the
#: first layer dense (GLM-4 MoE routes the same way).
_GROUP_ROUTED: dict[str, Any] = {
    "n_routed_experts": 8,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "n_group": 4,
    "topk_group": 2,
}
#: DeepSeek's multi-head latent attention, small: a 32-channel latent (cached with the 8-channel
#: rotary key), 16 unrotated and 8 rotated q/k channels per head, 8 value channels; 8 experts in 4 groups,
#: 2 per token, a shared expert, the first layer dense; yarn rope with DeepSeek's mscales
#: (the softmax scale grows by mscale_all_dim's correction squared).
_DEEPSEEK: dict[str, Any] = {
    "num_key_value_heads": 4,
    "kv_lora_rank": 32,
    "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8,
    "v_head_dim": 8,
    **_GROUP_ROUTED,
    "rope_parameters": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 16,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale": 1.0,
        "mscale_all_dim": 0.8,
    },
}
#: DeepSeek sparse attention's lightning indexer, small: 16 heads of 16 keeping the best 4 keys.
_INDEXER: dict[str, Any] = {"index_topk": 4, "index_n_heads": 16, "index_head_dim": 16}
#: Ministral 3's rope (yarn, its llama_4_scaling_beta and original length read by the query
#: scale), small: the scale grows at positions 4, 12, 28, ...
MINISTRAL3_ROPE: dict[str, Any] = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 16.0,  # max_position_embeddings / original_max_position_embeddings
    "original_max_position_embeddings": 4,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "llama_4_scaling_beta": 0.5,
}
#: Mamba's tiny mixers (MambaConfig has no attention, MLP or length keys).
_MAMBA1: dict[str, Any] = {
    "num_attention_heads": UNSET,
    "num_key_value_heads": UNSET,
    "intermediate_size": UNSET,
    "max_position_embeddings": UNSET,
    "state_size": 8,
    "conv_kernel": 4,
    "expand": 2,
}
_GRANITE_SWA: dict[str, Any] = {
    "embedding_multiplier": 2.0,
    "residual_multiplier": 0.5,
    "logits_scaling": 4.0,
    "attention_multiplier": 0.1,
    "sliding_window": 5,
    "layer_rope_theta": [10000.0, 0, 100.0],
}
#: fairseq's sizes (opt, xglm): ffn_dim, one key/value head per head.
_FAIRSEQ: dict[str, Any] = {
    "ffn_dim": 96,
    "intermediate_size": UNSET,
    "num_key_value_heads": UNSET,
}

_FAMILY_CONFIG: dict[str, dict[str, Any]] = {
    "llama": {},
    "mistral": {"sliding_window": None},
    # sliding, full, sliding with a window of 4: the prompts of parity tests run past it
    # (MinistralAttention cannot run without an explicit head_dim)
    "ministral": {
        "head_dim": 16,
        "sliding_window": 4,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    },
    # Ministral3Config's yarn rope with an original length of 4 positions: the query scale
    # (beta 0.5, large enough to move logits) steps up every 4 positions of a short prompt
    "ministral3": {"head_dim": 16, "rope_parameters": MINISTRAL3_ROPE},
    "qwen2": {},
    "qwen3": {"head_dim": 32},  # deliberately != hidden_size / num_attention_heads
    # gemma's default head_dim is 256; query_pre_attn_scalar != head_dim exercises the scale;
    # softcaps small enough that tanh bends the logits of these tiny models.
    "gemma": {"head_dim": 16},
    "gemma2": {
        "head_dim": 16,
        "query_pre_attn_scalar": 24,
        "sliding_window": 5,
        "attn_logit_softcapping": 2.0,
        "final_logit_softcapping": 3.0,
    },
    # layers: sliding, full, sliding; local layers rotate with another base than global ones.
    "gemma3_text": {
        "head_dim": 16,
        "query_pre_attn_scalar": 24,
        "sliding_window": 5,
        "sliding_window_pattern": 2,
        "rope_theta": 10000.0,
        "rope_local_base_freq": 100.0,
        "final_logit_softcapping": 3.0,
    },
    # 6 layers: sliding, full, ...; the last two read layers 2 and 3's caches; sparse MLPs
    # and their own MLP sizes in the first two; a per-layer table smaller than the vocabulary
    "gemma3n_text": {
        "num_hidden_layers": 6,
        "head_dim": 16,
        "intermediate_size": [96, 80, 96, 64, 96, 80],
        "sliding_window": 5,
        "layer_types": ["sliding_attention", "full_attention"] * 3,
        "rope_theta": 10000.0,
        "rope_local_base_freq": 100.0,
        "final_logit_softcapping": 3.0,
        "hidden_size_per_layer_input": 16,
        "vocab_size_per_layer_input": 100,
        "laurel_rank": 16,
        "num_kv_shared_layers": 2,
        "activation_sparsity_pattern": [0.95, 0.7, 0.0, 0.0, 0.0, 0.0],
        "attention_bias": True,
    },
    # 6 layers: sliding, full, ...; full layers with their own head size (32) and one kv head
    # whose values are its keys, a proportional rope turning a quarter of their channel
    # pairs; the last two read layers 2 and 3's caches with MLPs twice as wide
    "gemma4_text": {
        "num_hidden_layers": 6,
        "head_dim": 16,
        "global_head_dim": 32,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
        "sliding_window": 5,
        "layer_types": ["sliding_attention", "full_attention"] * 3,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {
                "rope_type": "proportional",
                "partial_rotary_factor": 0.25,
                "rope_theta": 10000.0,
            },
        },
        "final_logit_softcapping": 3.0,
        "hidden_size_per_layer_input": 16,
        "vocab_size_per_layer_input": 128,  # transformers reads the table by any token id
        "num_kv_shared_layers": 2,
        "use_double_wide_mlp": True,
        "attention_bias": True,
    },
    "phi3": {"pad_token_id": 0},
    "phi": {"partial_rotary_factor": 0.5},
    "gpt2": {
        "n_inner": 96,
        "intermediate_size": UNSET,
        "num_key_value_heads": UNSET,
        "activation_function": "gelu_new",
    },
    "granite": {
        "embedding_multiplier": 2.0,
        "residual_multiplier": 0.5,
        "logits_scaling": 4.0,
        "attention_multiplier": 0.1,
    },
    "olmo2": {},
    "smollm3": {"no_rope_layers": [1, 0, 1]},  # the middle layer applies no rotary
    "starcoder2": {},  # biases on every projection (use_bias), LayerNorms, FC MLP
    "stablelm": {},  # partial rotary 0.25 of head_dim 16 (transformers' default)
    "olmo": {},  # LayerNorms without weights, nothing in the checkpoint to randomize
    # parallel residual with two norms, rotary on 0.25 of head_dim 16, per-head fused qkv
    "gpt_neox": {"num_key_value_heads": UNSET},
    "nemotron": {},  # LayerNorm1P (1 + weight), relu2 FC MLP, rotary on 0.5 of head_dim 16
    "exaone": {},  # llama with EXAONE's tensor names; rope_theta 500000 by default
    # parallel residual with one norm, interleaved rotary on 8 of head_dim 16, lm_head bias
    "gptj": {
        "n_inner": 96,
        "intermediate_size": UNSET,
        "num_key_value_heads": UNSET,
        "rotary_dim": 8,
    },
    # LayerNorms without bias, parallel residual, interleaved rotary; logit_scale != 1
    "cohere": {"logit_scale": 0.25},
    # GLM-4: fused gate_up, q/k/v biases, interleaved rotary on 0.5 of head_dim 16
    "glm": {"head_dim": 16},
    # sliding, full, sliding (sliding_window_pattern 2): rotary in the sliding layers only, a
    # window of 5; cohere's parallel block, interleaved rotary and a logit_scale != 1
    "cohere2": {"sliding_window": 5, "sliding_window_pattern": 2, "logit_scale": 0.25},
    # glm's layer (fused gate_up, q/k/v biases, interleaved rotary on 0.5 of head_dim 16) with
    # sandwich norms: post_self_attn_layernorm and post_mlp_layernorm
    "glm4": {"head_dim": 16},
    "arcee": {},  # llama with an ungated relu2 MLP (up_proj, down_proj)
    # interleaved rotary, o_proj without bias; head_dim's default 128 would not fit o_proj
    "helium": {"head_dim": 16},
    # interleaved rotary, use_bias on every projection; head_dim's default is 128
    "ernie4_5": {"head_dim": 16, "use_bias": True},
    # q/k/v biases by default, o_proj bias switched apart (attention_out_bias)
    "seed_oss": {"head_dim": 16},
    # olmo2 with sliding layers (by default every 4th layer is full; 3 layers would have none)
    "olmo3": {
        "sliding_window": 5,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
    },
    # post-norm layers, per-head q/k norms; sliding, full, sliding with rotary only in the
    # sliding layers (global NoPE)
    "exaone4": {"sliding_window": 5, "sliding_window_pattern": 2},
    # per-head q/k RMSNorms after the rotary embedding (query_layernorm, key_layernorm)
    "hunyuan_v1_dense": {"head_dim": 16},
    "internlm3": {"head_dim": 16},  # llama; head_dim's default is 128
    # gemma2 with pre-norm layers only (input_layernorm, pre_feedforward_layernorm)
    "vaultgemma": {
        "head_dim": 16,
        "query_pre_attn_scalar": 24,
        "sliding_window": 5,
        "attn_logit_softcapping": 2.0,
        "final_logit_softcapping": 3.0,
    },
    # MoE: 4 experts, 2 per token (enough that the tokens of a prompt pick different pairs)
    # sinks; sliding, full, sliding layers; yarn rope whose correction range ends at 1.09 (2 if
    # it were truncated); SwiGLU clamped at 1 (the tiny weights cross it often); biased router
    # and experts
    "gpt_oss": {
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "head_dim": 16,
        "sliding_window": 5,
        "swiglu_limit": 1.0,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 2.0,
            "original_max_position_embeddings": 32,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
        },
    },
    "mixtral": {"num_local_experts": 4, "num_experts_per_tok": 2, "sliding_window": None},
    # MiniMax: lightning, full (GQA), lightning, lightning attention over 4 heads of 16, 4
    # experts (2 per token) in every layer, every residual factor away from 1
    "minimax": {
        "num_hidden_layers": 4,
        "head_dim": 16,
        "layer_types": [
            "linear_attention",
            "full_attention",
            "linear_attention",
            "linear_attention",
        ],
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "full_attn_alpha_factor": 0.8,
        "full_attn_beta_factor": 1.3,
        "linear_attn_alpha_factor": 1.2,
        "linear_attn_beta_factor": 0.7,
        "mlp_alpha_factor": 0.9,
        "mlp_beta_factor": 1.1,
    },
    # renormalized top-k; the middle layer keeps a dense MLP (mlp_only_layers)
    "qwen3_moe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "head_dim": 32,
        "norm_topk_prob": True,
        "mlp_only_layers": [1],
    },
    # top-k of the softmax without renormalizing, a shared expert with its sigmoid gate
    "qwen2_moe": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
    },
    # q/k norms over the whole projections; OlmoeConfig's eos id lies outside the tiny vocab
    "olmoe": {"num_experts": 4, "num_experts_per_tok": 2, "eos_token_id": 2},
    # granite's multipliers; softmax over the top-k router logits; fused expert tensors
    "granitemoe": {
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "embedding_multiplier": 2.0,
        "residual_multiplier": 0.5,
        "logits_scaling": 4.0,
        "attention_multiplier": 0.1,
    },
    # 4 attention experts of 2 heads of 16 channels (width 32, not hidden_size) and 4 MLP
    # experts, 2 per token each; the final norm's epsilon apart from the layers' 1e-6
    "jetmoe": {
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "kv_channels": 16,
        "num_attention_heads": UNSET,
        "rms_norm_eps": 1e-3,
        "tie_word_embeddings": False,
    },
    # sparsemixer routing (two picks, each a softmax over the experts within a relative
    # 2 * router_jitter_noise of the current maximum: 0.1 makes some tokens' picks share their
    # weight), LayerNorms with biases, attention and lm_head biases
    "phimoe": {
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "router_jitter_noise": 0.1,
        "attention_bias": True,
        "lm_head_bias": True,
    },
    # conv, attention, conv: short-convolution layers with a 3-tap state and biases; the MLP
    # width is 2/3 of 96, times 1.3, rounded up to a multiple of 32 (96)
    "lfm2": {
        "conv_bias": True,
        "layer_types": ["conv", "full_attention", "conv"],
        "block_ffn_dim_multiplier": 1.3,
        "block_multiple_of": 32,
        "tie_word_embeddings": UNSET,
    },
    # lfm2's conv, attention, conv with a dense MLP first (num_dense_layers) and MoE blocks
    # after it: 8 experts, 2 per token, chosen by sigmoid + expert_bias (random here, so it
    # changes picks), renormalized and scaled by 1.5
    "lfm2_moe": {
        "conv_bias": True,
        "layer_types": ["conv", "full_attention", "conv"],
        "num_dense_layers": 1,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "routed_scaling_factor": 1.5,
        "tie_word_embeddings": UNSET,
    },
    # gated delta net, attention, gated delta net: 2 key heads of 16 repeat-interleaved onto 4
    # value heads of 8, a 4-tap conv; the attention layer has an output gate, q/k norms and
    # rotary on 0.25 of head_dim 16 (Qwen3_5TextConfig's partial_rotary_factor) and biases;
    # 128 positions for prefills longer than transformers' 64-token chunks
    "qwen3_5_text": _QWEN3_5_HYBRID,
    # qwen3_5_text's hybrid (its sizes) with q|k|v|z and b|a packed per key head, MoE blocks
    # (4 experts, 2 per token, renormalized, a shared expert with its sigmoid gate) in the
    # first two layers and a dense MLP in the last (mlp_only_layers)
    "qwen3_next": {
        **_QWEN3_5_HYBRID,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "norm_topk_prob": True,
        "mlp_only_layers": [2],
    },
    # qwen3_5_text's hybrid (its sizes, projections separate) with MoE blocks in every layer
    # (4 experts, 2 per token, always renormalized, a shared expert with its sigmoid gate)
    "qwen3_5_moe_text": {
        **_QWEN3_5_HYBRID,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "intermediate_size": UNSET,
    },
    # low-rank q, sigmoid routing corrected by e_score_correction_bias (random here, so it
    # changes picks), groups scored by their best two, renormalized and scaled by 2.5
    "deepseek_v3": {**_DEEPSEEK, "q_lora_rank": 32, "routed_scaling_factor": 2.5},
    # one q_proj, softmax routing limited to the group of the best expert (of 2 groups: a group
    # scored by its best expert changes picks only where fewer groups are kept than experts
    # picked), not renormalized
    "deepseek_v2": {
        **_DEEPSEEK,
        "q_lora_rank": None,
        "topk_method": "group_limited_greedy",
        "n_group": 2,
        "topk_group": 1,
        "routed_scaling_factor": 1.5,
    },
    # Granite-4.0-H's hybrid: Mamba2, attention (no rotary), Mamba2; 4 Mamba2 heads of 16 over 2
    # groups of an 8-wide state, a 4-tap conv with bias, transformers' scan in 16-token chunks;
    # MoE (4 experts, 2 per token, of 32) beside a shared MLP of 64; granite's multipliers; 128
    # positions for long prefills
    "granitemoehybrid": {
        "layer_types": ["mamba", "attention", "mamba"],
        "max_position_embeddings": 128,
        "intermediate_size": 32,
        "shared_intermediate_size": 64,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "mamba_n_heads": 4,
        "mamba_n_groups": 2,
        "mamba_d_state": 8,
        "mamba_d_conv": 4,
        "mamba_expand": 1,
        "mamba_chunk_size": 16,
        "embedding_multiplier": 2.0,
        "residual_multiplier": 0.5,
        "logits_scaling": 4.0,
        "attention_multiplier": 0.1,
    },
    # Nemotron-H: one block per layer, Mamba2, MLP, attention (no rotary), MLP, Mamba2, as
    # transformers 5 writes it (layers_block_type, no num_hidden_layers); 4 Mamba2 heads of 8
    # (heads x head_dim 32, not expand x hidden) over 2 groups of an 8-wide state, a 4-tap conv;
    # relu2 MLPs; scans in 16-token chunks; 128 positions for long prefills
    "nemotron_h": {
        "layers_block_type": [
            "linear_attention",
            "mlp",
            "full_attention",
            "mlp",
            "linear_attention",
        ],
        "num_hidden_layers": UNSET,
        "head_dim": 16,
        "max_position_embeddings": 128,
        "mamba_num_heads": 4,
        "mamba_head_dim": 8,
        "n_groups": 2,
        "ssm_state_size": 8,
        "conv_kernel": 4,
        "chunk_size": 16,
    },
    # Falcon-H1: attention and Mamba2 side by side in each layer; 4 Mamba2 heads of 12
    # (mamba_d_ssm 48, not expand x hidden) over 2 groups of an 8-wide state, the gated norm
    # normalizing before it gates; every µP multiplier away from 1 (each in_proj segment its
    # own); biases on attention, MLP and both Mamba2 projections; scans in 16-token chunks
    "falcon_h1": {
        "max_position_embeddings": 128,
        "mamba_n_heads": 4,
        "mamba_d_ssm": 48,
        "mamba_n_groups": 2,
        "mamba_d_state": 8,
        "mamba_chunk_size": 16,
        "mamba_rms_norm": True,
        "mamba_proj_bias": True,
        "projectors_bias": True,
        "attention_bias": True,
        "mlp_bias": True,
        "embedding_multiplier": 2.0,
        "lm_head_multiplier": 0.5,
        "key_multiplier": 0.7,
        "attention_in_multiplier": 1.3,
        "attention_out_multiplier": 0.8,
        "ssm_in_multiplier": 1.2,
        "ssm_out_multiplier": 0.6,
        "mlp_multipliers": [1.5, 0.7],
        "ssm_multipliers": [0.9, 1.1, 0.8, 1.3, 0.5],
    },
    # chunked (5 positions), NoPE full, chunked layers: rotation and L2 q/k norm in the chunked
    # ones, temperature tuning (floor_scale 4, large enough a scale to move logits) in the NoPE
    # one; MoE (4 experts of 32, one per token, the sigmoid score scaling the expert's input,
    # a shared expert) in the outer layers, a dense MLP of 96 in the middle
    "llama4_text": {
        "head_dim": 16,
        "intermediate_size": 32,
        "intermediate_size_mlp": 96,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "moe_layers": [0, 2],
        "no_rope_layers": [1, 0, 1],
        "attention_chunk_size": 5,
        "floor_scale": 4,
        "attn_scale": 0.5,
    },
    # DeepSeek-V3's routing (8 experts in 4 groups, 2 kept, 2 per token, the correction bias,
    # renormalized, scaled by 2.5) beside a shared expert, the first layer dense; ordinary
    # attention with q/k/v biases, per-head q/k norms, rotary on half of head_dim 16
    "glm4_moe": {
        "head_dim": 16,
        "attention_bias": True,
        "use_qk_norm": True,
        **_GROUP_ROUTED,
        "routed_scaling_factor": 2.5,
    },
    # softmax scores chosen with the [1, experts] correction bias (8 experts, 2 per token),
    # a shared expert, the first layer dense; interleaved rotary
    "ernie4_5_moe": {
        "moe_num_experts": 8,
        "moe_k": 2,
        "moe_intermediate_size": 32,
        "moe_num_shared_experts": 1,
    },
    # sigmoid scores chosen with the correction bias (8 experts, 2 per token), renormalized;
    # RMSNorms over the whole q and k projections, rotary on half of head_dim 16
    "minimax_m2": {
        "head_dim": 16,
        "intermediate_size": 32,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "partial_rotary_factor": 0.5,
    },
    # up, xIELU, down (its alpha_p, alpha_n random; beta, eps the buffers), per-head q/k norms;
    # ApertusConfig's llama3 rope, its factor crossing the tiny context
    "apertus": {
        "head_dim": 16,
        "rope_parameters": {
            "rope_type": "llama3",
            "rope_theta": 12000000.0,
            "factor": 8.0,
            "original_max_position_embeddings": 16,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
        },
    },
    "apertus1p5_text": {"head_dim": 16},  # Apertus1p5TextConfig's own llama3 rope
    # granitemoe's row with a shared MLP of 64 beside the experts
    "granitemoeshared": {
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "shared_intermediate_size": 64,
        "embedding_multiplier": 2.0,
        "residual_multiplier": 0.5,
        "logits_scaling": 4.0,
        "attention_multiplier": 0.1,
    },
    # q/k norms after the rotary; 4 experts of 32, 2 per token (renormalized softmax) beside
    # a shared MLP of 32
    "hunyuan_v1_moe": {
        "head_dim": 16,
        "intermediate_size": 32,
        "num_experts": 4,
        "moe_topk": 2,
        "attention_bias": True,
    },
    # DeepSeek-V3's routing (8 experts in 4 groups, 2 kept, 2 per token, raw weights scaled
    # by 2.5) beside a shared expert, the first layer dense; Qwen3's attention with biases and
    # per-head q/k norms; the last layer slides over 5 positions (max_window_layers 2)
    "dots1": {
        **_GROUP_ROUTED,
        "routed_scaling_factor": 2.5,
        "attention_bias": True,
        "sliding_window": 5,
        "max_window_layers": 2,
    },
    # Mamba2, hybrid, Mamba2, hybrid, hybrid: two shared blocks invoked in turn (0, 1, 0),
    # each invocation with its own rank-8 adapters on gate_up and on q, k, v (kv heads = heads,
    # as the adapters need); rotary in the blocks (use_mem_rope); 4 Mamba2 heads of 8 over 2
    # groups of an 8-wide state; the blocks' MLP of 96 (gelu); biases on the Mamba2 and MLP
    # projections (add_bias_linear); a tied head. Hidden 16: the
    # blocks' attention reads 32 channels, in heads of 8 (at hidden 64 the random scores are
    # so sharp that float32 runs, transformers' own, are ~1e-3 from float64; at 16, ~1e-5)
    "zamba2": {
        "hidden_size": 16,
        "num_hidden_layers": 5,
        "num_key_value_heads": UNSET,  # Zamba2Config's: the query heads
        "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid", "hybrid"],
        "num_mem_blocks": 2,
        "use_shared_attention_adapter": True,
        "adapter_rank": 8,
        "use_mem_rope": True,
        "n_mamba_heads": 4,
        "mamba_d_state": 8,
        "mamba_ngroups": 2,
        "mamba_expand": 2,
        "chunk_size": 16,
        "add_bias_linear": True,
        "max_position_embeddings": 128,
        "tie_word_embeddings": True,
    },
    # Mamba2, attention (rotary on half of each head), Mamba2: Granite-4.0-H's Mamba2 sizes,
    # biases everywhere; 128 positions for long prefills
    "bamba": {
        "attn_layer_indices": [1],
        "max_position_embeddings": 128,
        "mamba_n_heads": 4,
        "mamba_n_groups": 2,
        "mamba_d_state": 8,
        "mamba_d_conv": 4,
        "mamba_expand": 1,
        "mamba_chunk_size": 16,
        "mamba_proj_bias": True,
        "attention_bias": True,
        "mlp_bias": True,
    },
    # DeepSeek-V3's latent attention and routing (low-rank q, yarn with its mscales), the
    # dense layer in the middle (mlp_layer_types)
    "glm4_moe_lite": {
        **_DEEPSEEK,
        "q_lora_rank": 32,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": UNSET,
        "mlp_layer_types": ["sparse", "dense", "sparse"],
    },
    # full, sliding (window 5), sliding: keys of 24 (a third turned), values of 16 scaled by
    # 0.707; two key/value heads in the full layer, four and sinks in the sliding ones; a dense
    # first layer, then V3's routing (8 experts in 4 groups, 2 kept, 2 per token,
    # renormalized, scaled by 2.5) without shared experts
    "mimo_v2_flash": {
        **{
            k: v
            for k, v in _GROUP_ROUTED.items()
            if k not in ("n_shared_experts", "first_k_dense_replace")
        },
        "head_dim": 24,
        "v_head_dim": 16,
        "sliding_window": 5,
        "routed_scaling_factor": 2.5,
    },
    # DeepSeek-V3's latent attention and routing with a lightning indexer: 16 heads of 16
    # (the first 8 channels rotated) keeping the best 4 keys, so prompts of 12 tokens and
    # more select; the first layer dense (first_k_dense_replace)
    "deepseek_v32": {**_DEEPSEEK, **_INDEXER, "q_lora_rank": 32, "routed_scaling_factor": 2.5},
    # deepseek_v32's sizes, the dense layer in the middle (mlp_layer_types)
    "glm_moe_dsa": {
        **_DEEPSEEK,
        **_INDEXER,
        "q_lora_rank": 32,
        "routed_scaling_factor": 2.5,
        "first_k_dense_replace": UNSET,
        "mlp_layer_types": ["sparse", "dense", "sparse"],
    },
    # EXAONE 4's attention (sliding, full NoPE, sliding) in pre-norm layers; V3's routing (8
    # experts in 4 groups, 2 kept, 2 per token, renormalized, scaled by 2.5) beside a shared
    # expert, the first layer dense
    "exaone_moe": {
        **{k: v for k, v in _GROUP_ROUTED.items() if k != "n_routed_experts"},
        "num_experts": 8,
        "num_shared_experts": 1,
        "n_shared_experts": UNSET,
        "routed_scaling_factor": 2.5,
        "head_dim": 16,
        "sliding_window": 5,
        "sliding_window_pattern": 2,
    },
    # GLM-4 MoE's routing (8 experts in 4 groups, 2 kept, 2 per token) beside a shared expert
    # in every layer; llama attention with q/k/v biases (its rotary turns whole heads)
    "solar_open": {
        **{k: v for k, v in _GROUP_ROUTED.items() if k != "first_k_dense_replace"},
        "intermediate_size": UNSET,
        "head_dim": 16,
        "attention_bias": True,
        "routed_scaling_factor": 2.5,
    },
    # olmo2's post-norm layers and q/k norms, olmoe's routing (4 experts, 2 per token, not
    # renormalized); FlexOlmoConfig's eos id lies outside the tiny vocab
    "flex_olmo": {
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "attention_bias": True,
        "eos_token_id": 2,
    },
    # one fused Wqkv clipped at 1 (the tiny projections cross it often), 2 key/value heads;
    # 4 flat experts of 32, 2 per token, renormalized by their 2-norm (not their sum)
    # DbrxConfig sizes ffn_config by d_model before it reads hidden_size (its attribute_map)
    "dbrx": {
        "hidden_size": UNSET,
        "d_model": 64,
        "intermediate_size": UNSET,
        "num_key_value_heads": UNSET,
        "attn_config": {"kv_n_heads": 2, "clip_qkv": 1.0, "rope_theta": 500_000.0},
        "ffn_config": {
            "ffn_hidden_size": 32,
            "moe_num_experts": 4,
            "moe_top_k": 2,
            "moe_normalize_expert_weights": 2.0,
        },
        "rope_parameters": {"rope_type": "default", "rope_theta": 500_000.0},
    },
    # cohere2's parallel block; a dense first layer (its own width, rotary in full attention:
    # prefix_dense_sliding_window_pattern 1), then sliding and full NoPE MoE layers of 4
    # experts of 32, 2 per token, beside a shared expert averaged with them
    "cohere2_moe": {
        "head_dim": 16,
        "intermediate_size": 32,
        "prefix_dense_intermediate_size": 96,
        "first_k_dense_replace": 1,
        "sliding_window": 5,
        "sliding_window_pattern": 2,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "num_shared_experts": 1,
    },
    # GPT-2's layer (learned positions, LayerNorms, biases everywhere, gelu FC MLP) with one
    # key/value head (multi_query) in one fused c_attn
    "gpt_bigcode": {
        "n_inner": 96,
        "intermediate_size": UNSET,
        "num_key_value_heads": UNSET,
        "activation_function": "gelu_pytorch_tanh",
    },
    # Falcon-40B's layout: the new decoder architecture, 2 key/value groups in one fused
    # query_key_value, parallel attention and MLP with a norm each (ln_attn, ln_mlp), biases
    "falcon": {
        "ffn_hidden_size": 96,
        "intermediate_size": UNSET,
        "num_key_value_heads": UNSET,
        "num_kv_heads": 2,
        "new_decoder_architecture": True,
        "bias": True,
    },
    # ALiBi positions; bloom's per-head fused query_key_value, LayerNorm on the embeddings,
    # biases everywhere; mpt's unbiased [q | k | v] Wqkv, bias-free LayerNorms, 4 x d_model MLP
    "bloom": {
        "intermediate_size": UNSET,
        "num_key_value_heads": UNSET,
        "max_position_embeddings": UNSET,
    },
    "mpt": {
        "intermediate_size": UNSET,
        "num_key_value_heads": UNSET,
        "max_position_embeddings": UNSET,
        "max_seq_len": 64,
    },
    # DeepSeek-V2's latent attention (low-rank q, a 32-channel latent, 16 unrotated and 8
    # rotated q/k channels per head rotated by halves, 8 value channels, attention biases) in
    # a dense decoder; MiniCPM's scales: embeddings x 3, blocks x 1.4 / sqrt(3), the final
    # hidden states / (64 / 16)
    "minicpm3": {
        "num_key_value_heads": 4,  # MiniCPM3Config's 40 would leave no key head per group
        "q_lora_rank": 32,
        "kv_lora_rank": 32,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 8,
        "attention_bias": True,
        "scale_emb": 3,
        "dim_model_base": 16,
    },
    # llama's layer: full, sliding, sliding (CwmConfig's every fourth from the first) over a
    # window of 5; CwmConfig's llama3 rope (theta 1e6)
    "cwm": {"head_dim": 16, "sliding_window": 5},
    # GPT-2's layer without q/k/v biases, unscaled scores; local (a window of 5: the prompt runs
    # past it), global, local
    "gpt_neo": {
        "num_key_value_heads": UNSET,
        "attention_types": [[["local", "global"], 1], [["local"], 1]],
        "window_size": 5,
    },
    # GPT-J's layer (one shared norm, attention beside the MLP, interleaved rotary on 8 of
    # head_dim 16, lm_head bias) with qkv_proj in 4 shards of [q, v, k]
    "codegen": {
        "n_inner": 96,
        "intermediate_size": UNSET,
        "num_key_value_heads": UNSET,
        "rotary_dim": 8,
    },
    # fairseq's layer (LayerNorms, biases, an FC MLP: relu for opt, gelu for xglm), learned
    # (opt) or sinusoidal (xglm) positions from table row 2, a tied head
    "opt": {**_FAIRSEQ, "tie_word_embeddings": True},
    "xglm": {**_FAIRSEQ, "tie_word_embeddings": True},
    # xglm's layer with opt's learned positions from row 2, embeddings times sqrt(64)
    "biogpt": {"num_key_value_heads": UNSET, "tie_word_embeddings": True},
    # pre-LN layers, a relu FC MLP, sinusoids from row 0, embeddings times sqrt(64), a tied
    # head with its own bias
    "ctrl": {
        "dff": 96,
        "intermediate_size": UNSET,
        "num_key_value_heads": UNSET,
        "tie_word_embeddings": True,
    },
    # GPT-2's weights in post-LN blocks, learned positions, no final norm, a tied head
    "openai-gpt": {
        "intermediate_size": UNSET,
        "num_key_value_heads": UNSET,
        "tie_word_embeddings": True,
    },
    # granite's multipliers (logits multiplied), post norms on each block's output
    "hyperclovax": {
        "embedding_multiplier": 2.0,
        "residual_multiplier": 0.5,
        "logits_scaling": 4.0,
        "attention_multiplier": 0.1,
    },
    # llama's attention with LayerNorms, a relu2 up/down MLP, biases (Jais2Config's defaults)
    "jais2": {},
    # GPT-2 under GPT-SW3's model_type (config.json rewritten: ALIASED_TYPES), erf gelu
    "gpt-sw3": {
        "n_inner": 96,
        "intermediate_size": UNSET,
        "num_key_value_heads": UNSET,
        "activation_function": "gelu",
    },
    # gpt_neox's per-head fused query_key_value, LayerNorms of q and k per head (one weight
    # and bias shared by the heads), rotary on 8 of head_dim 16, relu2 FC MLP, biases
    "persimmon": {"num_key_value_heads": UNSET},
    # weightless RMSNorms (embeddings, layers, q/k after the reversed rotation, final), relu2
    # FC MLP, 2 key/value heads, logits softcapped at 15
    "nanochat": {},
    # BitNet's float layout: llama's layer, RMSNorms before o_proj and down_proj, relu2 gated
    # MLP (tests/models/families/test_bitnet.py writes its ternary forms)
    "bitnet": {},
    # Mamba: Mamba1 mixers alone (no attention keys, no MLP), a 128-channel scan of an 8-wide
    # state, a 4-tap conv with bias, dt through a rank of 4 ("auto": ceil(64 / 16)), biased
    # in_proj and out_proj
    "mamba": {**_MAMBA1, "use_bias": True},
    # FalconMamba: Mamba's layers with dt, B and C RMS-normalized without weights
    "falcon_mamba": {**_MAMBA1, "mixer_rms_eps": 1e-3},
    # Jamba: Mamba1 (dt, B and C normed with weights), attention (no rotary), Mamba1,
    # attention; MoE (4 experts, 2 per token, not renormalized) in layers 0 and 2, dense MLPs
    # in 1 and 3; biased Mamba1 projections
    "jamba": {
        "num_hidden_layers": 4,
        "attn_layer_period": 2,
        "attn_layer_offset": 1,
        "expert_layer_period": 2,
        "expert_layer_offset": 0,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "mamba_d_state": 8,
        "mamba_proj_bias": True,
    },
    # granite's multipliers; full, sliding, sliding (every fourth from the first) over a
    # window of 5; a sink per head; rope bases per layer: 10000, none, 100
    "granite_swa": {**_GRANITE_SWA, "tie_word_embeddings": False},
    # granitemoeshared's experts and shared MLP with the same attention
    "granitemoe_swa": {
        **_GRANITE_SWA,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "shared_intermediate_size": 64,
    },
    # llama's layer with differential attention: 4 query heads in 2 pairs, 2 value heads
    # (one per half), random lambdas (tests' N(0, 0.2))
    "diffllama": {},
    # sliding (window 5, whole heads turned, base 10000), full (half of each head turned, base
    # 500000), sliding; per-head softplus output gates; a dense first layer, then 8 experts, 2
    # per token, by sigmoid scores of tanh-capped logits chosen with the correction bias,
    # renormalized and scaled by 2.5, beside a shared MLP of 64
    "laguna": {
        "head_dim": 16,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "sliding_window": 5,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 64,
        "moe_router_logit_softcapping": 1.5,
        "moe_routed_scaling_factor": 2.5,
    },
    # Qwen3-MoE's attention and routing (4 experts, 2 per token, renormalized) in Laguna's
    # layout: sliding (window 5), full, sliding, each type its rope base; the middle MLP dense
    "mellum": {
        "head_dim": 16,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "sliding_window": 5,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "mlp_layer_types": ["sparse", "dense", "sparse"],
    },
    # dynamic mask attention with biases, random A (tests' N(0, 0.2)) and residual scales;
    # its window of kept keys: tests/models/families/test_doge.py
    "doge": {"attention_bias": True},
    # sliding (rotary), full (NoPE), sliding over a window of 5; per-head q/k norms, the output
    # gate's own projection, sandwich norms, attention biases; the first layer dense, then 8
    # experts (2 per token, sigmoid chosen with expert_bias, renormalized, times 2.5) beside a
    # shared expert
    "afmoe": {
        "head_dim": 16,
        "attention_bias": True,
        "sliding_window": 5,
        "global_attn_every_n_layers": 2,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "num_shared_experts": 1,
        "route_scale": 2.5,
    },
    # DeepSeek-V3's latent attention (low-rank q, attention biases) and routing, the MoE
    # blocks' output normed
    "axk1": {**_DEEPSEEK, "q_lora_rank": 32, "attention_bias": True},
    # V3 routing (8 experts in 4 groups, 2 kept, 2 per token, renormalized, times 2.5) beside a
    # shared expert after a dense layer; q_proj's per-head output gates, attention biases
    "minicpm5_moe": {
        **_GROUP_ROUTED,
        "head_dim": 16,
        "attention_bias": True,
        "routed_scaling_factor": 2.5,
    },
    # EXAONE 4's attention (sliding, full NoPE, sliding over 5) in GLM-4's sandwich layers; 8
    # experts in every layer, 2 per token chosen by logits + bias, beside a shared expert
    "kolibri1": {
        "head_dim": 16,
        "intermediate_size": UNSET,
        "sliding_window": 5,
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
    },
    # Qwen3-MoE's attention with sinks and biases: full NoPE, sliding (rotary, a window of 5), full NoPE;
    # a dense first layer, then 8 experts (sigmoid, 2 per token, renormalized) beside an
    # ungated shared expert
    "flint": {
        "head_dim": 16,
        "attention_bias": True,
        "sliding_window": 5,
        "layer_types": ["full_attention", "sliding_attention", "full_attention"],
        "mlp_only_layers": [0],
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 32,
    },
    # Apertus' attention (per-head q/k norms, biases); a dense first layer, then 8 experts
    # (sigmoid chosen with the correction bias, 2 per token, renormalized, times 2.826)
    # beside a shared expert
    "hy_v3": {
        "head_dim": 16,
        "attention_bias": True,
        "num_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "num_shared_experts": 1,
    },
    # Mamba2: Mamba2 mixers alone, 8 heads of 16 channels (expand 2) over 2 groups of an
    # 8-wide state, a 4-tap conv with bias, biased in_proj and out_proj, prefills chunked by 8
    "mamba2": {
        **_MAMBA1,
        "num_heads": 8,
        "head_dim": 16,
        "n_groups": 2,
        "chunk_size": 8,
        "use_bias": True,
    },
    # llama under IQuestCoderConfig (its head_dim default, 128, set to the tiny 16)
    "iquestcoder": {"head_dim": 16},
    # GLM-4 MoE under their own config classes: q/k norms and whole-head rotary by default,
    # GLM-4 MoE's routing (8 experts in 4 groups, 2 kept, 2 per token) scaled by 2.5 beside
    # a shared expert, the first layer dense; q/k/v biases
    "param2moe": {"head_dim": 16, "attention_bias": True, **_GROUP_ROUTED},
    "sarvam_moe": {"head_dim": 16, "attention_bias": True, **_GROUP_ROUTED},
    # DeepSeek-V3 under SarvamMLAConfig: one q_proj and one group of experts by default
    "sarvam_mla": {
        **_DEEPSEEK,
        "n_group": UNSET,
        "topk_group": UNSET,
        "routed_scaling_factor": 2.5,
    },
    # DeepSeek-V3's latent attention (low-rank q, yarn with its mscales) in dense layers
    # (YoutuConfig's pad_token_id, None: YoutuPreTrainedModel._init_weights zeros the pad row
    # of the embeddings it has loaded)
    "youtu": {
        **{k: v for k, v in _DEEPSEEK.items() if k not in _GROUP_ROUTED},
        "q_lora_rank": 32,
        "pad_token_id": UNSET,
    },
    # cohere2's parallel block: sliding (window 5, rope base 100, with Qwen3-VL's sections),
    # full unrotated, sliding; logits times 0.25
    "cohere_compass_text": {
        "layer_types": ["sliding_attention", "full_attention", "sliding_attention"],
        "sliding_window": 5,
        "rope_parameters": {
            "sliding_attention": {
                "rope_type": "default",
                "rope_theta": 100.0,
                "mrope_section": [2, 3, 3],
            },
            "full_attention": None,
        },
        "logit_scale": 0.25,
        "eos_token_id": 2,
    },
    # llama attention; every layer 8 experts (2 per token, softmax over the two picks) stored
    # [in, out] as fc1 [gate | up] and fc2, beside two shared experts' width (2 x 32)
    "aria_text": {
        "intermediate_size": 32,
        "moe_num_experts": 8,
        "moe_topk": 2,
        "moe_num_shared_experts": 2,
    },
    # delta net, post-norm attention (q/k norms over the whole projection), delta net: Qwen3.5's
    # tiny delta-net sizes with q/k/v apart and beta doubled; rotary attention (its NoPE:
    # test_parity.py's cases)
    "olmo_hybrid": {key: value for key, value in _QWEN3_5_HYBRID.items() if key != "head_dim"},
    # delta net, windowed rotary attention (a 4-token window), delta net, global NoPE attention
    # (per-head q/k norms, biases); MoE in every layer: 4 experts, 2 per token, renormalized, a
    # shared expert added without a gate
    "lara_mini": {
        **_QWEN3_5_HYBRID,
        "num_hidden_layers": 4,
        "layer_types": [
            "linear_attention",
            "sliding_attention",
            "linear_attention",
            "full_attention",
        ],
        "sliding_window": 4,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "shared_expert_intermediate_size": 48,
        "intermediate_size": UNSET,
    },
    # Kimi delta attention (2 heads of 16, a 4-tap conv), NoPE latent attention (a 32-channel
    # latent, 16 + 8 q/k channels, 8 value channels), delta attention; a dense first MLP, then
    # 8 experts in 4 groups (2 kept), 2 per token, a shared expert, corrected sigmoid routing
    "kimi_linear": {
        "num_key_value_heads": 4,  # as many as query heads: KimiLinearAttention expands them so
        "layer_types": ["linear_attention", "full_attention", "linear_attention"],
        "linear_num_heads": 2,
        "linear_head_dim": 16,
        "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 128,
        "kv_lora_rank": 32,
        "q_lora_rank": None,
        "qk_nope_head_dim": 16,
        "qk_rope_head_dim": 8,
        "v_head_dim": 8,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 32,
        "n_shared_experts": 1,
        "n_group": 4,
        "topk_group": 2,
    },
    # RecurrentGemma: RG-LRU, RG-LRU, local attention, RG-LRU over hidden 96 (sqrt(96) is not
    # a bfloat16: the embedding scale's rounding shows), RG-LRU 48 wide (gates in 4 blocks of
    # 12), a 4-tap conv, one key/value head of 24 channels, 12 of them rotated, a window of 6,
    # logits softcapped at 30
    "recurrent_gemma": {
        "hidden_size": 96,
        "num_hidden_layers": 4,
        "num_key_value_heads": 1,
        "lru_width": 48,
        "attention_window_size": 6,
        "max_position_embeddings": UNSET,
    },
}

#: Gemma 4's 26B-A4B layout over gemma4_text's tiny row: 4 GeGLU experts (2 per token) beside
#: every MLP, no per-layer inputs, no shared caches.
GEMMA4_MOE: dict[str, Any] = {
    "enable_moe_block": True,
    "num_experts": 4,
    "top_k_experts": 2,
    "moe_intermediate_size": 32,
    "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0,
    "use_double_wide_mlp": False,
}

WEIGHT_STD = 0.2
BIAS_STD = 0.2
NORM_STD = 0.1
#: Buffers a checkpoint stores as learned values (transformers initializes them to zeros):
#: DeepSeek-V3's and LFM2-MoE's per-expert routing corrections.
LEARNED_BUFFERS = ("e_score_correction_bias", "expert_bias")
#: Buffers a checkpoint stores as learned scales (transformers initializes them to ones):
#: Gemma 4's per-layer output multiplier.
SCALE_BUFFERS = ("layer_scalar",)


#: Families whose config.json names a model_type transformers maps to another family's config
#: class (whose own model_type it writes): write_tiny_checkpoint writes the family's.
ALIASED_TYPES = ("gpt-sw3",)


def tiny_config(family: str, **overrides: Any) -> PretrainedConfig:
    """The tiny transformers config for ``family`` with ``overrides`` applied.

    Overrides are config keyword arguments, e.g. ``sliding_window=5``,
    ``rope_scaling={"rope_type": "llama3", ...}``, ``tie_word_embeddings=True``,
    ``attention_bias=True``. For qwen2/qwen3 a sliding window needs ``use_sliding_window=True``
    and applies only to layers ``>= max_window_layers`` (default 28, i.e. none here).
    """
    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}; expected one of {sorted(FAMILIES)}")
    kwargs = {**_BASE_CONFIG, **_FAMILY_CONFIG[family], **overrides}
    kwargs = {key: value for key, value in kwargs.items() if value is not UNSET}
    config = FAMILIES[family](**kwargs)
    config.architectures = [_ARCHITECTURES[family]]
    return config


def randomize_weights(model: PreTrainedModel, seed: int = 0) -> None:
    """Give every parameter seeded random values, in place.

    Matrices and embeddings get N(0, WEIGHT_STD), biases N(0, BIAS_STD) and norm weights
    N(1, NORM_STD): transformers' own init (zero biases, unit norms, std 0.02) hides bugs.
    Tied parameters are visited once, so tying is preserved. `LEARNED_BUFFERS` get N(0,
    BIAS_STD) after the parameters.
    """
    gen = torch.Generator().manual_seed(seed)
    norm_params = {
        f"{mod_name}.{p_name}" if mod_name else p_name
        for mod_name, mod in model.named_modules()
        if "norm" in type(mod).__name__.lower()
        for p_name, _ in mod.named_parameters(recurse=False)
    }
    with torch.no_grad():
        for name, param in model.named_parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if name in norm_params:
                values = 1.0 + NORM_STD * noise
            elif name.endswith(".bias"):
                values = BIAS_STD * noise
            else:
                values = WEIGHT_STD * noise
            param.copy_(values.to(param.dtype))
        for name, buffer in model.named_buffers():
            if name.rsplit(".", 1)[-1] in LEARNED_BUFFERS:
                noise = torch.randn(buffer.shape, generator=gen, dtype=torch.float32)
                buffer.copy_((BIAS_STD * noise).to(buffer.dtype))
            if name.rsplit(".", 1)[-1] in SCALE_BUFFERS:
                noise = torch.randn(buffer.shape, generator=gen, dtype=torch.float32)
                buffer.copy_((1.0 + NORM_STD * noise).to(buffer.dtype))


def router_picks(model: PreTrainedModel, router: torch.nn.Module, ids: np.ndarray) -> list[tuple]:
    """The experts `router` (a TopKRouter of `model`: out[2] is its picks) picks for each token
    of `ids`, each token's sorted."""
    picks = []
    hook = router.register_forward_hook(lambda module, args, out: picks.append(out[2]))
    with torch.no_grad():
        model(torch.tensor(ids))
    hook.remove()
    return [tuple(sorted(row)) for row in picks[0].tolist()]


def edit_config(folder: Path, **changes: object) -> None:
    """Set `changes` in the config.json of the checkpoint in `folder`."""
    path = folder / "config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def write_tiny_checkpoint(
    dest: Path,
    family: str,
    seed: int = 0,
    *,
    hub_layout: bool = False,
    max_shard_size: str | None = None,
    **config_overrides: Any,
) -> Path:
    """Write a tiny random float32 checkpoint for ``family`` into ``dest`` and return ``dest``.

    Sizes: hidden 64, 3 layers, 4 heads, 2 kv heads, intermediate 96, vocab 128, 64 positions
    (family-specific settings in ``_FAMILY_CONFIG``, e.g. qwen3's head_dim 32, gemma's
    softcaps and windows, phi's partial rotary). ``config_overrides`` go to the config (see ``tiny_config``). Weights
    come from ``randomize_weights(seed)``; the same arguments give the same weights.
    ``hub_layout=True`` rewrites config.json in the transformers-4 hub layout (``torch_dtype``,
    ``rope_theta``, ``rope_scaling``) and checks transformers reads it back to the same config.
    ``max_shard_size`` (e.g. ``"50KB"``) writes shards and model.safetensors.index.json instead
    of one model.safetensors, as transformers does for large models.
    """
    config = tiny_config(family, **config_overrides)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    randomize_weights(model, seed)
    dest = Path(dest)
    if max_shard_size is None:
        model.save_pretrained(dest)  # transformers 5 always writes safetensors
    else:
        model.save_pretrained(dest, max_shard_size=max_shard_size)
    written = "model.safetensors" if max_shard_size is None else "model.safetensors.index.json"
    if not (dest / written).is_file():
        raise RuntimeError(f"save_pretrained did not write {dest / written}")
    if family in ALIASED_TYPES:
        edit_config(dest, model_type=family)
    if hub_layout:
        _rewrite_hub_layout(dest / "config.json")
    return dest


def _rewrite_hub_layout(path: Path) -> None:
    """Rewrite a transformers-5 config.json into the layout transformers 4 wrote to the hub."""
    data = json.loads(path.read_text())
    before = AutoConfig.from_pretrained(path.parent).to_dict()
    if "dtype" in data:
        data["torch_dtype"] = data.pop("dtype")
    rope = data.pop("rope_parameters", None)
    if rope is not None and "full_attention" in rope:  # gemma3: global rope + local base
        data["rope_local_base_freq"] = rope["sliding_attention"]["rope_theta"]
        rope = rope["full_attention"]
    if rope is not None:
        rope = dict(rope)
        data["rope_theta"] = rope.pop("rope_theta")
        data["rope_scaling"] = None if rope.get("rope_type", "default") == "default" else rope
    # derived from the keys below; Gemma 3n's hub configs list them
    keeps = data.get("model_type") == "gemma3n_text"
    layer_types = data.get("layer_types") if keeps else data.pop("layer_types", None)
    if data.get("model_type") in ("gemma3_text", "cohere2") and layer_types:
        data["sliding_window_pattern"] = layer_types.index("full_attention") + 1
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    after = AutoConfig.from_pretrained(path.parent).to_dict()
    for key in ("transformers_version", "dtype"):
        before.pop(key, None)
        after.pop(key, None)
    if before != after:
        diff = {k: (before.get(k), after.get(k)) for k in before.keys() | after.keys()}
        diff = {k: v for k, v in diff.items() if v[0] != v[1]}
        raise RuntimeError(f"hub-layout config.json reads back differently: {diff}")


def gemma_multimodal_layout(
    text: Path, folder: Path, model_type: str, towers: Sequence[str], extra: str | None = None
) -> Path:
    """`text`'s checkpoint as the hub stores a multimodal Gemma (`model_type` gemma3n or gemma4:
    the decoder's keys in `text_config`, its weights under model.language_model., the `towers`'
    tensors and `extra` beside them)."""
    folder.mkdir()
    text_config = json.loads((text / "config.json").read_text())
    config = {
        "architectures": [f"{model_type.capitalize()}ForConditionalGeneration"],
        "model_type": model_type,
        "text_config": text_config,
        "vision_config": {"model_type": f"{model_type}_vision"},
        # the multimodal classes tie by the top level (default true)
        "tie_word_embeddings": text_config["tie_word_embeddings"],
    }
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {
        name.replace("model.", "model.language_model.", 1): value
        for name, value in load_file(text / "model.safetensors").items()
    }
    for name in (*towers, *([extra] if extra else [])):
        tensors[name] = np.ones([2, 2], np.float32)
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


@dataclass(frozen=True)
class ReferenceStep:
    """One transformers forward call: what was fed and the logits it returned.

    All arrays are batch-first numpy: ``input_ids`` / ``position_ids`` int64 [batch, seq],
    ``attention_mask`` int64 [batch, past + seq], ``logits`` float32 [batch, seq, vocab].
    """

    input_ids: np.ndarray
    attention_mask: np.ndarray
    position_ids: np.ndarray
    logits: np.ndarray


@dataclass(frozen=True)
class ReferenceRun:
    """A prefill followed by greedy decode steps through the KV cache.

    ``steps[0]`` is the prefill, ``steps[1:]`` the single-token decode steps; each decode step
    is fed the argmax of the previous step's last logits. Logits at left-padding positions are
    not meaningful (transformers and ONNX Runtime fill fully masked rows differently).
    """

    steps: list[ReferenceStep]

    @property
    def prefill(self) -> ReferenceStep:
        """The prefill call."""
        return self.steps[0]

    @property
    def decode(self) -> list[ReferenceStep]:
        """The decode calls, one token each."""
        return self.steps[1:]

    @property
    def logits(self) -> list[np.ndarray]:
        """Logits of every call: [b, seq, vocab] for the prefill, then [b, 1, vocab] each."""
        return [s.logits for s in self.steps]

    @property
    def fed_tokens(self) -> np.ndarray:
        """Token ids fed in the decode steps, int64 [batch, decode_steps]."""
        batch = self.prefill.input_ids.shape[0]
        if not self.decode:
            return np.zeros((batch, 0), dtype=np.int64)
        return np.concatenate([s.input_ids for s in self.decode], axis=1)


def load_reference_model(
    ckpt_dir: Path, model_class: Any = AutoModelForCausalLM
) -> PreTrainedModel:
    """Load a checkpoint with transformers (`model_class`, e.g. a multimodal model's class) in
    float32 with eager attention, in eval mode.

    A path to a .gguf file is loaded with transformers' GGUF reader (dequantized to float32).
    """
    path = Path(ckpt_dir)
    gguf = {"gguf_file": path.name} if path.suffix == ".gguf" else {}
    model = model_class.from_pretrained(
        path.parent if gguf else path, dtype=torch.float32, attn_implementation="eager", **gguf
    )
    return model.eval()


def positions_from_mask(attention_mask: np.ndarray, seq: int) -> np.ndarray:
    """Position ids of the last ``seq`` tokens: count of attended tokens before each, minus one.

    Padding positions get 1, as in transformers' ``generate``.
    """
    mask = np.asarray(attention_mask, dtype=np.int64)
    pos = np.cumsum(mask, axis=-1) - 1
    pos = np.where(mask == 0, 1, pos)
    return np.ascontiguousarray(pos[:, -seq:])


#: Families whose transformers class keeps no KV cache (OpenAIGPTModel): each reference call
#: runs the whole sequence so far (`_Recomputed` holds it) and keeps the new positions' logits.
_RECOMPUTED = ("openai-gpt",)
#: Families whose transformers class keeps its recurrent states in its modules and returns no
#: cache (RecurrentGemma's): the first call gets a DynamicCache (without one each call starts
#: over), and every call returns it.
_STATE_IN_MODULES = ("recurrent_gemma",)


@dataclass(frozen=True)
class _Recomputed:
    """The token and position ids fed so far to a model without a cache."""

    input_ids: torch.Tensor
    position_ids: torch.Tensor


def _recompute(
    model: PreTrainedModel, past: _Recomputed | None, **inputs: torch.Tensor
) -> tuple[torch.Tensor, _Recomputed]:
    seq = inputs["input_ids"].shape[1]
    if past is not None:
        for name in ("input_ids", "position_ids"):
            inputs[name] = torch.cat([getattr(past, name), inputs[name]], dim=1)
    logits = model(**inputs).logits[:, -seq:]
    return logits, _Recomputed(inputs["input_ids"], inputs["position_ids"])


def hf_forward(
    model: PreTrainedModel, cache: Any, **inputs: torch.Tensor
) -> tuple[torch.Tensor, Any]:
    """One cached forward call; returns (logits, cache).

    transformers 5.2x renamed ``past_key_values`` to ``cache`` (the old name warns); use
    whichever this version's ``forward`` declares. A `_RECOMPUTED` family's "cache" is the
    sequence so far.
    """
    if model.config.model_type in _RECOMPUTED:
        return _recompute(model, cache, **inputs)
    if cache is None and model.config.model_type in _STATE_IN_MODULES:
        cache = DynamicCache(config=model.config)
    if "cache" in inspect.signature(model.forward).parameters:
        out = model(**inputs, cache=cache, use_cache=True)
        return out.logits, getattr(out, "cache", cache)
    out = model(**inputs, past_key_values=cache, use_cache=True)
    return out.logits, out.past_key_values


def hf_reference_logits(
    ckpt_dir: Path,
    input_ids: np.ndarray,
    decode_steps: int,
    attention_mask: np.ndarray | None = None,
) -> ReferenceRun:
    """Run a prefill on ``input_ids`` [batch, seq] then ``decode_steps`` greedy cached steps.

    ``attention_mask`` [batch, seq] defaults to all ones; pass zeros on the left for a
    left-padded batch. Position ids are derived from the mask (``positions_from_mask``) and
    passed explicitly, as onnxruntime-genai does. Returns every call's inputs and logits.
    """
    model = load_reference_model(ckpt_dir)
    ids = np.asarray(input_ids, dtype=np.int64)
    if ids.ndim != 2:
        raise ValueError(f"input_ids must be [batch, seq], got shape {ids.shape}")
    mask = np.ones_like(ids) if attention_mask is None else np.asarray(attention_mask, np.int64)
    if mask.shape != ids.shape:
        raise ValueError(f"attention_mask shape {mask.shape} != input_ids shape {ids.shape}")

    steps: list[ReferenceStep] = []
    past = None
    with torch.no_grad():
        for _ in range(decode_steps + 1):
            pos = positions_from_mask(mask, ids.shape[1])
            logits_t, past = hf_forward(
                model,
                past,
                input_ids=torch.from_numpy(ids),
                attention_mask=torch.from_numpy(mask),
                position_ids=torch.from_numpy(pos),
            )
            logits = logits_t.to(torch.float32).numpy()
            steps.append(ReferenceStep(ids, mask, pos, logits))
            ids = logits[:, -1, :].argmax(axis=-1).astype(np.int64)[:, None]
            mask = np.concatenate([mask, np.ones_like(ids)], axis=1)
    return ReferenceRun(steps)


def hf_float64_logits(ckpt_dir: Path, run: ReferenceRun) -> list[np.ndarray]:
    """transformers' logits in float64 for the same calls as ``run`` (the exact math, where a
    long recurrence puts float32 runs, transformers' own among them, ~1e-4 apart).

    The experts run eagerly: the default grouped_mm takes no float64.
    """
    model = AutoModelForCausalLM.from_pretrained(
        ckpt_dir, dtype=torch.float64, attn_implementation="eager", experts_implementation="eager"
    ).eval()
    logits = []
    past = None
    with torch.no_grad():
        for step in run.steps:
            out, past = hf_forward(
                model,
                past,
                input_ids=torch.from_numpy(step.input_ids),
                attention_mask=torch.from_numpy(step.attention_mask),
                position_ids=torch.from_numpy(step.position_ids),
            )
            logits.append(out.numpy())
    return logits


def eos_token_ids(model: PreTrainedModel) -> set[int]:
    """The eos ids a generator should stop at: generation_config's, else the config's."""
    eos = getattr(model.generation_config, "eos_token_id", None)
    if eos is None:
        eos = model.config.eos_token_id
    if eos is None:
        return set()
    return {int(eos)} if isinstance(eos, int) else {int(e) for e in eos}


def hf_greedy_tokens(
    ckpt_dir: Path,
    prompt_ids: Sequence[int],
    max_new_tokens: int,
    *,
    stop_at_eos: bool = True,
    model_class: Any = AutoModelForCausalLM,
) -> list[int]:
    """Greedy continuation of one prompt with transformers (float32, eager, KV cache).

    Returns only the new tokens. With ``stop_at_eos`` generation stops after the first eos
    token (``eos_token_ids``), which is included, as in onnxruntime-genai's sequence. Positions
    are passed, as generate() passes them: BambaModel numbers a call's tokens from 0 without.
    """
    model = load_reference_model(ckpt_dir, model_class)
    stop = eos_token_ids(model) if stop_at_eos else set()
    ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
    past = None
    new: list[int] = []
    with torch.no_grad():
        while len(new) < max_new_tokens:
            start = len(prompt_ids) + len(new) - ids.shape[1]
            positions = torch.arange(start, start + ids.shape[1]).unsqueeze(0)
            logits, past = hf_forward(model, past, input_ids=ids, position_ids=positions)
            token = int(logits[0, -1].argmax())
            new.append(token)
            if token in stop:
                break
            ids = torch.tensor([[token]], dtype=torch.long)
    return new


def generated_tokens(
    model: PreTrainedModel, input_ids: torch.Tensor, new_tokens: int, **inputs: Any
) -> list[int]:
    """transformers' greedy `generate`, exactly `new_tokens` of them after `input_ids` (one
    unpadded row), with the model's other `inputs` (pixel values, grids, ...)."""
    with torch.no_grad():
        output = model.generate(
            input_ids=input_ids,
            attention_mask=torch.ones_like(input_ids),
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            **inputs,
        )
    return output[0, input_ids.shape[1] :].tolist()


#: The commit `hub_cache` files its snapshots under.
HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(cache: Path, repo_id: str, files: Path) -> Path:
    """Put the files of folder `files` into `cache` the way huggingface_hub downloads them.

    Made with huggingface_hub's own cache functions: each file is a blob named by its sha256
    under blobs/, and the snapshot holds relative symlinks to the blobs (``../../blobs/<sha>``);
    refs/main names the snapshot.
    """
    storage = cache / repo_folder_name(repo_id=repo_id, repo_type="model")
    for file in sorted(files.iterdir()):
        blob = storage / "blobs" / hashlib.sha256(file.read_bytes()).hexdigest()
        blob.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(file, blob)
        pointer = Path(_get_pointer_path(str(storage), HUB_COMMIT, file.name))
        pointer.parent.mkdir(parents=True, exist_ok=True)
        _create_symlink(str(blob), str(pointer), new_blob=True)
    _cache_commit_hash_for_specific_revision(str(storage), "main", HUB_COMMIT)
    return storage / "snapshots" / HUB_COMMIT


#: The checkpoint tensors that write a residual branch (attention, delta net, MLP and expert
#: outputs): zero, a layer adds nothing.
_BRANCH_OUTPUTS = r"(o_proj|out_proj|down_proj)(\.weight|\.bias)?$"


def add_mtp_head(folder: Path, seed: int = 1, *, copy: bool = False) -> Path:
    """Give the Qwen3.5-shaped checkpoint in `folder` (qwen3_5_text, qwen3_5_moe_text,
    qwen3_next: `write_tiny_checkpoint`; or a hub layout with a `text_config`, one file) a
    multi-token-prediction head as the hub stores one: `mtp.fc.weight` [hidden, 2 * hidden],
    `mtp.pre_fc_norm_embedding/hidden.weight` and `mtp.norm.weight` (zero-centred: the model
    scales by 1 + weight), and `mtp.layers.0.*`, the family's first full-attention layer of a
    model randomized with `seed`; config.json (its text_config) gets `mtp_num_hidden_layers: 1`.

    `copy=True` makes the head predict exactly what the main model will: every residual branch
    of the model and of the head writes zero (the main model is then a bigram,
    lm_head(norm(embed(t)))), `fc` keeps the embedding half, the pre-fc norm and the head's
    final norm are the main model's final norm, so the head's draft for the token after t is
    the main model's next token after t (the runtime's acceptance ceiling); the hidden state's
    pre-fc norm, which fc then ignores, scales far from 1.
    """
    text = AutoConfig.from_pretrained(folder).get_text_config()
    full = list(text.layer_types).index("full_attention")
    layers = {"num_hidden_layers": full + 1, "layer_types": text.layer_types[: full + 1]}
    cut = type(text)(**{**text.to_dict(), **layers})
    other = AutoModelForCausalLM.from_config(cut, dtype=torch.float32)
    randomize_weights(other, seed)
    with tempfile.TemporaryDirectory() as saved:  # as transformers saves them (experts apart)
        other.save_pretrained(saved)
        layer = {
            f"mtp.layers.0.{name.split('.', 3)[3]}": tensor
            for name, tensor in load_file(Path(saved) / "model.safetensors").items()
            if name.startswith(f"model.layers.{full}.")
        }
    tensors = load_file(folder / "model.safetensors")
    hidden = text.hidden_size
    gen = np.random.default_rng(seed)
    head = {
        "mtp.fc.weight": gen.normal(0, WEIGHT_STD, (hidden, 2 * hidden)),
        "mtp.pre_fc_norm_embedding.weight": gen.normal(0, NORM_STD, hidden),
        "mtp.pre_fc_norm_hidden.weight": gen.normal(0, NORM_STD, hidden),
        "mtp.norm.weight": gen.normal(0, NORM_STD, hidden),
        **layer,
    }
    if copy:
        for name in [*tensors, *head]:
            store = tensors if name in tensors else head
            if re.search(_BRANCH_OUTPUTS, name):
                store[name] = np.zeros_like(store[name])
        head["mtp.fc.weight"] = np.concatenate([np.eye(hidden), np.zeros((hidden, hidden))], axis=1)
        head["mtp.pre_fc_norm_embedding.weight"] = np.zeros(hidden)
        # unused by fc; far from 1 so a head that norms the embedding with it goes astray
        head["mtp.pre_fc_norm_hidden.weight"] = gen.normal(0, 2.0, hidden)
        norm = next(
            name
            for name in tensors
            if re.fullmatch(r"model\.(language_model\.)?norm\.weight", name)
        )
        head["mtp.norm.weight"] = tensors[norm]
    tensors.update({name: np.asarray(value, np.float32) for name, value in head.items()})
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})
    raw = json.loads((folder / "config.json").read_text())
    raw.get("text_config", raw)["mtp_num_hidden_layers"] = 1
    (folder / "config.json").write_text(json.dumps(raw))
    return folder
