"""Property: any small config of any family builds graphs that match transformers.

Hypothesis draws a family and small random settings (sizes, GQA ratio, head_dim, layer count,
tied or untied embeddings, rope type and scaling, partial rotary, sliding windows, prompt
length); each example writes a tiny checkpoint with transformers and compares the portable and
cpu graphs over a prefill and decode steps (f32, <= 1e-4). The search is derandomized and
bounded (max_examples) so CI time stays fixed; raise MOBIUS_PROPERTY_EXAMPLES to search longer.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import mobius_genai
from tests._hf import _FAMILY_CONFIG as FAMILY_CONFIG
from tests._hf import hf_reference_logits, write_tiny_checkpoint
from tests._ort import max_abs_diff, ort_session, run_like_reference

TOLERANCE = 1e-4
EXAMPLES = int(os.environ.get("MOBIUS_PROPERTY_EXAMPLES", "10"))
MAX_POSITIONS = 32

FAMILIES = (
    "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "gemma3_text", "phi3", "phi",
    "gpt2", "granite", "olmo2", "smollm3", "starcoder2", "stablelm", "olmo", "gpt_neox",
    "nemotron", "exaone", "gptj", "cohere", "glm", "arcee", "helium", "ernie4_5", "seed_oss",
    "olmo3", "exaone4", "hunyuan_v1_dense", "internlm3", "vaultgemma", "cohere2", "glm4",
)  # fmt: skip
# Families whose config takes an explicit head_dim != hidden / heads.
EXPLICIT_HEAD_DIM = {
    "llama", "mistral", "qwen3", "gemma", "gemma2", "gemma3_text", "olmo2", "starcoder2", "olmo",
    "nemotron", "exaone", "cohere", "glm", "arcee", "ernie4_5", "seed_oss", "olmo3",
    "hunyuan_v1_dense", "internlm3", "vaultgemma", "cohere2", "glm4",
}  # fmt: skip
# Families without grouped-query attention (no num_key_value_heads key).
NO_GQA = {"gpt2", "gpt_neox", "gptj"}
# Rope types each family's transformers config accepts (gpt2 has learned positions).
ROPE_TYPES = {
    "phi3": ("default", "longrope"),
    "gemma3_text": ("default", "linear"),
    "gpt2": (),
    "gptj": (),  # GPTJRotaryEmbedding has no scaling
    "olmo3": ("default", "linear", "dynamic", "llama3", "yarn"),  # longrope is refused
}
ALL_ROPE_TYPES = ("default", "linear", "dynamic", "llama3", "yarn", "longrope")


@st.composite
def rope_scaling(draw, rotary_dim: int, types: tuple[str, ...]) -> dict[str, Any] | None:
    rope_type = draw(st.sampled_from(types))
    original = draw(st.sampled_from([8, 16]))
    factor = draw(st.sampled_from([2.0, 4.0]))
    if rope_type == "default":
        return None
    if rope_type in ("linear", "dynamic"):
        return {"rope_type": rope_type, "factor": factor}
    if rope_type == "llama3":
        return {
            "rope_type": "llama3",
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": original,
        }
    if rope_type == "yarn":
        return {"rope_type": "yarn", "factor": factor, "original_max_position_embeddings": original}
    pairs = rotary_dim // 2
    factors = st.lists(st.floats(1.0, 8.0), min_size=pairs, max_size=pairs)
    return {
        "rope_type": "longrope",
        "short_factor": draw(factors),
        "long_factor": draw(factors),
        "original_max_position_embeddings": original,
    }


@st.composite
def family_configs(draw) -> tuple[str, dict[str, Any]]:
    """(family, transformers config overrides) for a small random model."""
    family = draw(st.sampled_from(FAMILIES))
    heads = draw(st.sampled_from([2, 4]))
    kv_heads = (
        heads
        if family in NO_GQA
        else draw(st.sampled_from([h for h in (1, 2, 4) if heads % h == 0]))
    )
    hidden = draw(st.sampled_from([32, 64]))
    # the head_dim tiny_config gives the family (qwen3's 32, gemma's 16) unless drawn below
    head_dim = FAMILY_CONFIG[family].get("head_dim", hidden // heads)
    config: dict[str, Any] = {
        "hidden_size": hidden,
        "num_attention_heads": heads,
        "num_hidden_layers": draw(st.integers(1, 3)),
        "vocab_size": draw(st.sampled_from([64, 128])),
        "max_position_embeddings": MAX_POSITIONS,
        "tie_word_embeddings": draw(st.booleans()),
    }
    if family in ("gpt2", "gptj"):
        config["n_inner"] = draw(st.sampled_from([48, 96]))
    else:
        config["intermediate_size"] = draw(st.sampled_from([48, 96]))
    if family not in NO_GQA:
        config["num_key_value_heads"] = kv_heads
    if family in EXPLICIT_HEAD_DIM and draw(st.booleans()):
        head_dim = draw(st.sampled_from([8, 16, 24]))
        config["head_dim"] = head_dim
    if family == "helium":  # o_proj maps hidden_size to hidden_size: heads * head_dim == hidden
        head_dim = hidden // heads
        config["head_dim"] = head_dim
    partial = 1.0
    if family in ("phi", "phi3") and draw(st.booleans()):
        partial = 0.5
        config["partial_rotary_factor"] = partial
    if family in ("stablelm", "nemotron", "gpt_neox"):
        # at least 4 rotated channels: transformers' dynamic rope divides by rotary_dim - 2
        partial = draw(st.sampled_from([p for p in (0.25, 0.5, 1.0) if head_dim * p >= 4]))
        config["rotary_pct" if family == "gpt_neox" else "partial_rotary_factor"] = partial
    if family in ("glm", "glm4"):
        partial = draw(st.sampled_from([p for p in (0.25, 0.5, 1.0) if head_dim * p >= 4]))
        config["partial_rotary_factor"] = partial
    if family == "gptj":
        rotary_dim = draw(st.sampled_from(sorted({4, head_dim // 2, head_dim})))
        config["rotary_dim"] = rotary_dim
        partial = rotary_dim / head_dim
    if family == "gemma3_text":
        config["rope_local_base_freq"] = draw(st.sampled_from([100.0, 10000.0]))
    types = ROPE_TYPES.get(family, ALL_ROPE_TYPES)
    if types:
        scaling = draw(rope_scaling(int(head_dim * partial) // 2 * 2, types))
        if scaling is not None and scaling["rope_type"] == "longrope":
            original = scaling.pop("original_max_position_embeddings")
            config["original_max_position_embeddings"] = original
        if scaling is not None:
            config["rope_scaling"] = scaling
    window = draw(st.sampled_from([None, 3, 6]))
    if family in ("mistral", "gemma2", "gemma3_text", "phi3", "vaultgemma"):
        config["sliding_window"] = window or 4096
    elif family == "starcoder2":
        config["sliding_window"] = window
    elif family in ("qwen2", "smollm3") and window:
        config.update(use_sliding_window=True, sliding_window=window, max_window_layers=1)
    if family == "smollm3":
        layers = config["num_hidden_layers"]
        config["no_rope_layers"] = draw(
            st.lists(st.sampled_from([0, 1]), min_size=layers, max_size=layers)
        )
    if family in ("gemma2", "vaultgemma"):
        config["attn_logit_softcapping"] = draw(st.sampled_from([None, 1.5, 50.0]))
        config["final_logit_softcapping"] = draw(st.sampled_from([None, 2.0]))
    if family == "granite":
        config.update(
            embedding_multiplier=draw(st.sampled_from([1.0, 3.0])),
            residual_multiplier=draw(st.sampled_from([0.25, 1.0])),
            logits_scaling=draw(st.sampled_from([1.0, 8.0])),
            attention_multiplier=draw(st.sampled_from([0.05, 0.2])),
        )
    if family in ("llama", "qwen3", "olmo2", "granite", "olmo", "exaone") and draw(st.booleans()):
        config["attention_bias"] = True
    if family == "starcoder2":
        config["use_bias"] = draw(st.booleans())
    if family == "stablelm":
        for switch in ("use_qkv_bias", "qk_layernorm", "use_parallel_residual"):
            config[switch] = draw(st.booleans())
    if family == "olmo":
        config["clip_qkv"] = draw(st.sampled_from([None, 0.5, 4.0]))
    if family == "gpt_neox":
        for switch in ("use_parallel_residual", "attention_bias"):
            config[switch] = draw(st.booleans())
    if family == "nemotron":
        for switch in ("attention_bias", "mlp_bias"):
            config[switch] = draw(st.booleans())
    if family == "cohere2":  # every `pattern`-th layer full attention, without rotary
        config.update(sliding_window=window or 4096, sliding_window_pattern=draw(st.integers(1, 3)))
    if family in ("cohere", "cohere2"):
        for switch in ("attention_bias", "use_qk_norm"):
            config[switch] = draw(st.booleans())
        config["logit_scale"] = draw(st.sampled_from([0.0625, 0.5, 1.0]))
    if family in ("glm", "glm4"):
        config["attention_bias"] = draw(st.booleans())
    if family in ("arcee", "helium", "seed_oss") and draw(st.booleans()):
        config["mlp_bias"] = True
    if family in ("arcee", "helium", "seed_oss", "olmo3", "hunyuan_v1_dense"):
        config["attention_bias"] = draw(st.booleans())
    if family == "seed_oss":
        config["attention_out_bias"] = draw(st.booleans())
    if family == "internlm3":  # one switch for attention and MLP biases, as its config requires
        bias = draw(st.booleans())
        config.update(attention_bias=bias, mlp_bias=bias)
    if family == "ernie4_5":
        config["use_bias"] = draw(st.booleans())
    if family == "olmo3":
        layers = config["num_hidden_layers"]
        config["sliding_window"] = window or 4096
        config["layer_types"] = draw(
            st.lists(
                st.sampled_from(["sliding_attention", "full_attention"]),
                min_size=layers,
                max_size=layers,
            )
        )
    if family == "exaone4":
        layers = config["num_hidden_layers"]
        if window:
            pattern = draw(st.integers(1, 3))
            config.update(sliding_window=window, sliding_window_pattern=pattern)
        else:  # Exaone4Config derives no layer types without a window
            config.update(sliding_window=None, layer_types=["full_attention"] * layers)
    return family, config


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(case=family_configs(), prefill=st.integers(1, 10), seed=st.integers(0, 2**16))
def test_random_family_configs_match_transformers(case, prefill, seed):
    family, overrides = case
    vocab = overrides["vocab_size"]
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = write_tiny_checkpoint(Path(tmp) / "ckpt", family, seed=seed, **overrides)
        ids = np.random.default_rng(seed).integers(3, vocab, size=(2, prefill))
        reference = hf_reference_logits(ckpt, ids, decode_steps=3)
        for ep in ("default", "cpu"):
            package = mobius_genai.build(ckpt, ep, "f32")
            ours = run_like_reference(ort_session(package, Path(tmp) / ep), reference)
            diff = max_abs_diff(ours, reference.logits)
            assert diff <= TOLERANCE, (family, ep, overrides, diff)
