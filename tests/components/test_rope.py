"""Rope tables vs transformers' own rope init functions, for every scaling type and its options.

transformers computes frequencies in float32 and mobius in float64, hence rtol 1e-6.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from transformers import LlamaConfig, Phi3Config
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from mobius_genai import ArchitectureConfig
from mobius_genai.components.rope import (
    RotaryEmbedding,
    attention_factor,
    inverse_frequencies,
    uses_long_factors,
)

SIZES = {
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "vocab_size": 32,
    "max_position_embeddings": 256,
}
SHORT = [1.0 + 0.1 * i for i in range(16)]
LONG = [1.0 + 0.7 * i for i in range(16)]

# case → (rope_parameters, extra config kwargs)
CASES: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {
    "default": ({"rope_type": "default", "rope_theta": 500.0}, {}),
    "partial": ({"rope_type": "default", "partial_rotary_factor": 0.5}, {}),
    "linear": ({"rope_type": "linear", "factor": 3.0}, {}),
    "dynamic": ({"rope_type": "dynamic", "factor": 2.0}, {}),
    "llama3": (
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 32,
        },
        {},
    ),
    "yarn": ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}, {}),
    "yarn_untruncated_betas": (
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 64,
            "truncate": False,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
        },
        {},
    ),
    "yarn_mscale": (
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 64,
            "mscale": 0.707,
            "mscale_all_dim": 1.0,
        },
        {},
    ),
    "yarn_without_factor": (
        {"rope_type": "yarn", "factor": None, "original_max_position_embeddings": 64},
        {},
    ),
    "yarn_partial": (
        {
            "rope_type": "yarn",
            "factor": 2.0,
            "original_max_position_embeddings": 64,
            "partial_rotary_factor": 0.5,
        },
        {},
    ),
    # Gemma 4's full layers: a quarter of the channel pairs turn, over the whole head
    "proportional": ({"rope_type": "proportional", "partial_rotary_factor": 0.25}, {}),
    "proportional_scaled": (
        {"rope_type": "proportional", "partial_rotary_factor": 0.5, "factor": 2.0},
        {},
    ),
    "longrope": (
        {
            "rope_type": "longrope",
            "short_factor": SHORT,
            "long_factor": LONG,
            "original_max_position_embeddings": 64,
        },
        {},
    ),
    "longrope_factor_and_attention_factor": (
        {
            "rope_type": "longrope",
            "short_factor": SHORT,
            "long_factor": LONG,
            "original_max_position_embeddings": 64,
            "factor": 2.0,
            "attention_factor": 1.3,
        },
        {},
    ),
}


def _configs(case: str):
    params, extra = CASES[case]
    params = {"rope_theta": 10000.0, **params}
    hf = LlamaConfig(**SIZES, rope_parameters=dict(params), **extra)
    ours = ArchitectureConfig.from_dict(hf.to_dict())
    return hf, ours


@pytest.mark.parametrize("case", sorted(CASES))
def test_frequencies_and_attention_factor_match_transformers(case):
    hf, ours = _configs(case)
    rope_type = hf.rope_parameters["rope_type"]
    init = ROPE_INIT_FUNCTIONS.get(rope_type)
    if init is None:  # "default" lives on each model's rotary class in transformers 5; phi3's
        # honours partial_rotary_factor (llama's ignores it)
        from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

        init = Phi3RotaryEmbedding.compute_default_rope_parameters
    inv_freq, factor = init(hf)
    np.testing.assert_allclose(
        inverse_frequencies(ours.rope, ours.rotary_dim), inv_freq.double().numpy(), rtol=1e-6
    )
    assert attention_factor(ours.rope) == pytest.approx(factor, rel=1e-7)
    if rope_type == "longrope":
        original = hf.rope_parameters["original_max_position_embeddings"]
        long_freq, long_factor = init(hf, seq_len=original + 1)
        np.testing.assert_allclose(
            inverse_frequencies(ours.rope, ours.rotary_dim, long=True),
            long_freq.double().numpy(),
            rtol=1e-6,
        )
        assert attention_factor(ours.rope) == pytest.approx(long_factor, rel=1e-7)


def test_longrope_attention_factor_does_not_depend_on_the_bundle_length():
    """transformers scales by max_position_embeddings / original whatever the run's length."""
    _, ours = _configs("longrope")
    assert ours.rope.factor == 256 / 64
    short_cos = RotaryEmbedding(ours.rope, ours.rotary_dim, 32).cos_cache.const_value.numpy()
    stacked = RotaryEmbedding(ours.rope, ours.rotary_dim, 256).cos_cache.const_value.numpy()
    full_cos = stacked[0]  # the short factors' table (the long one follows)
    np.testing.assert_array_equal(short_cos, full_cos[:32])
    assert short_cos[0, 0] == pytest.approx(attention_factor(ours.rope)) != 1.0
    assert not uses_long_factors(ours.rope, 64)
    assert uses_long_factors(ours.rope, 65)


def test_phi3_top_level_original_length_takes_precedence():
    hf = Phi3Config(
        **SIZES,
        original_max_position_embeddings=32,
        rope_parameters={
            "rope_type": "longrope",
            "rope_theta": 10000.0,
            "short_factor": SHORT,
            "long_factor": LONG,
        },
    )
    raw = hf.to_dict()
    raw["rope_parameters"]["original_max_position_embeddings"] = 999  # ignored, as transformers
    ours = ArchitectureConfig.from_dict(raw)
    assert ours.rope.original_max_position_embeddings == 32
    assert ours.rope.factor == 256 / 32
