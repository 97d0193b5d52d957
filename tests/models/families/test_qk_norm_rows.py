"""persimmon and nanochat: what their rows read from config.json as PersimmonConfig and
NanoChatConfig read it.

Logits against transformers (persimmon's per-head query_key_value regrouped, q/k LayerNorms,
partial rotary; nanochat's weightless norms, reversed rotation, softcap) and the mutants are test_parity.py's CASES and MUTANTS; the bundle's greedy tokens are
test_bundles.py's (slow).
"""

from __future__ import annotations

from transformers import NanoChatConfig, PersimmonConfig

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


def test_nanochat_defaults_as_nanochatconfig_fills_them():
    """A config.json without the keys NanoChatConfig fills in: a key/value head per query
    head, relu2, its MLP width, eps and context, a softcap of 15, no biases, untied, its
    special tokens."""
    raw = {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 64}
    theirs = NanoChatConfig(**raw)
    config = get_family("nanochat").parse_config({**raw, "model_type": "nanochat"})
    assert config.num_key_value_heads == theirs.num_key_value_heads == 4
    assert config.hidden_act == theirs.hidden_act == "relu2"
    assert config.intermediate_size == theirs.intermediate_size == 8192
    assert config.norm_eps == theirs.rms_norm_eps == 1e-6
    assert config.max_position_embeddings == theirs.max_position_embeddings
    assert config.final_logit_softcapping == theirs.final_logit_softcapping == 15.0
    assert not (config.qkv_bias or config.o_bias or config.mlp_bias)
    assert config.tie_word_embeddings == theirs.tie_word_embeddings is False
    assert config.rope.theta == theirs.rope_parameters["rope_theta"]
    assert (config.bos_token_id, config.eos_token_id, config.pad_token_id) == (0, (1,), 1)
    assert (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id) == (0, 1, 1)
    assert config.norm_type == "rms_no_affine" and config.embedding_norm and config.qk_norm
