"""persimmon: what its row reads from config.json as PersimmonConfig reads it.

Logits against transformers (the per-head query_key_value regrouped, q/k LayerNorms, partial
rotary) and the mutants are test_parity.py's CASES and MUTANTS; the bundle's greedy tokens are
test_bundles.py's (slow).
"""

from __future__ import annotations

from transformers import PersimmonConfig

from mobius_genai.models import get_family


def test_persimmon_defaults_as_persimmonconfig_fills_them():
    """A config.json without the keys PersimmonConfig fills in: q/k LayerNorms, rotary on half
    of each head, relu2, its MLP width and context, bos 1 and eos 2, an untied head."""
    raw = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 64}
    theirs = PersimmonConfig(**raw)
    config = get_family("persimmon").parse_config({**raw, "model_type": "persimmon"})
    assert config.qk_norm == theirs.qk_layernorm is True
    assert config.rope.partial_rotary_factor == theirs.rope_parameters["partial_rotary_factor"]
    assert config.rope.theta == theirs.rope_parameters["rope_theta"]
    assert config.hidden_act == theirs.hidden_act == "relu2"
    assert config.intermediate_size == theirs.intermediate_size == 16384
    assert config.max_position_embeddings == theirs.max_position_embeddings == 16384
    assert config.norm_eps == theirs.layer_norm_eps
    assert config.tie_word_embeddings == theirs.tie_word_embeddings is False
    assert (config.bos_token_id, config.eos_token_id) == (theirs.bos_token_id, (2,))
    assert config.num_key_value_heads == config.num_attention_heads
    assert config.packed_qkv and config.qkv_bias and config.o_bias and config.mlp_bias
