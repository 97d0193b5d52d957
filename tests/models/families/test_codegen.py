"""codegen: what its row reads from config.json as CodeGenConfig reads it, and a hidden size
that does not split into qkv_proj's four shards refused in one line.

Logits against transformers (the shards regrouped, rotary by adjacent pairs) and the mutants
are test_parity.py's CASES and MUTANTS; the bundle's greedy tokens are test_bundles.py's (slow).
"""

from __future__ import annotations

import pytest
from transformers import CodeGenConfig

from mobius_genai.errors import ConfigError
from mobius_genai.models import get_family


def test_defaults_as_codegenconfig_fills_them():
    """A config.json without the keys CodeGenConfig fills in: rotary on 64 channels, 4 * hidden
    MLP, gelu_new, 2048 positions, an untied biased head, GPT-2's bos and eos."""
    raw = {"n_embd": 512, "n_head": 4, "n_layer": 2, "vocab_size": 50400}
    theirs = CodeGenConfig(**raw)
    config = get_family("codegen").parse_config({**raw, "model_type": "codegen"})
    assert config.head_dim * config.rope.partial_rotary_factor == theirs.rotary_dim == 64
    assert config.rope.interleaved and config.rope.theta == 10000.0
    assert config.intermediate_size == 4 * theirs.n_embd
    assert config.hidden_act == theirs.activation_function == "gelu_new"
    assert config.norm_eps == theirs.layer_norm_epsilon
    assert config.max_position_embeddings == theirs.n_positions == 2048
    assert config.tie_word_embeddings == theirs.tie_word_embeddings is False
    assert (config.bos_token_id, config.eos_token_id) == (theirs.bos_token_id, (50256,))
    assert config.num_key_value_heads == config.num_attention_heads == theirs.n_head
    assert config.packed_qkv and config.parallel_residual and config.lm_head_bias


def test_a_hidden_size_off_the_four_shards_is_refused_in_one_line():
    raw = {"model_type": "codegen", "n_embd": 66, "n_head": 3, "n_layer": 2, "rotary_dim": 8}
    with pytest.raises(ConfigError, match=r"^config.json: field 'n_embd' must be a multiple of 4"):
        get_family("codegen").parse_config(raw)
