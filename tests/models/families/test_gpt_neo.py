"""gpt_neo: what its row reads from config.json as GPTNeoConfig reads it (defaults, the local
layers of attention_types), and attention_types that do not fit the layers refused in one line
(the cpu graph windowing the local layers only is test_rows_5_25.py's).

Logits against transformers and the mutants are test_parity.py's CASES and MUTANTS; the
bundle's greedy tokens are test_bundles.py's (slow).
"""

from __future__ import annotations

import pytest
from transformers import GPTNeoConfig

from mobius_genai.errors import ConfigError
from mobius_genai.models import get_family
from tests._hf import tiny_config


def test_defaults_as_gptneoconfig_fills_them():
    """A config.json without the keys GPTNeoConfig fills in: 24 layers, global and local
    alternating over a window of 256, 4 * hidden MLP, gelu_new, a tied head, GPT-2's eos."""
    raw = {"num_layers": 24, "hidden_size": 64, "num_heads": 4, "vocab_size": 50257}
    theirs = GPTNeoConfig(**raw)
    config = get_family("gpt_neo").parse_config({**raw, "model_type": "gpt_neo"})
    kinds = {"global": "full_attention", "local": "sliding_attention"}
    assert list(config.layer_types) == [kinds[kind] for kind in theirs.attention_layers]
    assert config.sliding_window == theirs.window_size == 256
    assert config.intermediate_size == 4 * theirs.hidden_size
    assert config.hidden_act == theirs.activation_function == "gelu_new"
    assert config.norm_eps == theirs.layer_norm_epsilon
    assert config.tie_word_embeddings == theirs.tie_word_embeddings is True
    assert config.max_position_embeddings == theirs.max_position_embeddings == 2048
    assert config.num_key_value_heads == config.num_attention_heads == theirs.num_heads
    assert (config.bos_token_id, config.eos_token_id) == (theirs.bos_token_id, (50256,))
    assert config.attention_scale == 1.0 and not config.qkv_bias and config.o_bias


@pytest.mark.parametrize(
    "attention_types",
    [[[["global", "local"], 2]], [[["global", "sparse"], 1], [["local"], 1]], "global"],
)
def test_attention_types_that_do_not_fit_the_layers_are_refused_in_one_line(attention_types):
    raw = {**tiny_config("gpt_neo").to_dict(), "attention_types": attention_types}
    with pytest.raises(ConfigError, match=r"^config.json: field 'attention_types' must expand"):
        get_family("gpt_neo").parse_config(raw)
