"""Qwen2.5-VL config.json: both layouts (transformers 5's nested text_config, the hub's flat
one with rope_scaling type "mrope"), and one-line errors naming the field."""

from __future__ import annotations

import pytest

from mobius_genai import ConfigError
from mobius_genai.models.vision_language import vision_language_family

TEXT = {
    "vocab_size": 160,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}
VISION = {"depth": 2, "hidden_size": 32, "num_heads": 2, "patch_size": 4, "window_size": 16}


def _parse(raw: dict):
    return vision_language_family("qwen2_5_vl").parse_config(raw)


def test_nested_and_flat_layouts_give_the_same_config():
    nested = {
        "model_type": "qwen2_5_vl",
        "tie_word_embeddings": True,
        "text_config": {
            **TEXT,
            "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3]},
        },
        "vision_config": VISION,
    }
    flat = {
        "model_type": "qwen2_5_vl",
        "tie_word_embeddings": True,
        **TEXT,
        "rope_theta": 1_000_000.0,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "vision_config": VISION,
    }
    config = _parse(nested)
    assert config == _parse(flat)
    assert config.text.rope.mrope_section == (2, 3, 3)
    assert config.text.rope.theta == 1_000_000.0  # Qwen2_5_VLTextConfig's default
    assert config.text.tie_word_embeddings  # the top level's, which text_config lacks
    assert (config.image_token_id, config.video_token_id, config.vision_start_token_id) == (
        151_655,
        151_656,
        151_652,
    )
    assert config.vision.window_tokens == 2 and config.vision.patch_dim == 3 * 2 * 4 * 4


@pytest.mark.parametrize(
    ("top", "text"), [(True, False), (False, True), (None, True), (True, None)]
)
def test_tie_word_embeddings_set_at_either_level_ties_as_transformers_does(top, text):
    """transformers' Qwen2_5_VLConfig forwards a true text_config value to the top level, and
    the model ties by the top level's."""
    from transformers import Qwen2_5_VLConfig

    rope = {"rope_type": "default", "mrope_section": [2, 3, 3]}
    text_config = {**TEXT, "rope_parameters": rope}
    raw = {"model_type": "qwen2_5_vl", "text_config": text_config, "vision_config": VISION}
    if top is not None:
        raw["tie_word_embeddings"] = top
    if text is not None:
        raw["text_config"]["tie_word_embeddings"] = text
    keys = {k: v for k, v in raw.items() if k != "model_type"}
    expected = Qwen2_5_VLConfig(**keys).tie_word_embeddings
    assert expected is True
    assert _parse(raw).text.tie_word_embeddings is expected


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            {"rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 4]}},
            r"mrope_section \[2, 3, 4\] must be positive channel pair counts summing to half "
            r"the rotated channels \(8\)",
        ),
        ({"rope_scaling": None}, "has no 'mrope_section'"),
        (
            {"vision_config": {**VISION, "window_size": 4}},
            "vision_config.window_size 4 is smaller than one merged token",
        ),
    ],
)
def test_bad_fields_are_named(change, message):
    raw = {
        "model_type": "qwen2_5_vl",
        **TEXT,
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "vision_config": VISION,
        **change,
    }
    with pytest.raises(ConfigError, match=message):
        _parse(raw)


#: Qwen2-VL-2B-Instruct's config.json (the hub's flat layout; `in_chans`, which transformers
#: ignores, as the hub writes it), text sizes cut down.
QWEN2_VL = {
    "model_type": "qwen2_vl",
    **TEXT,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-6,
    "rope_theta": 1_000_000.0,
    "tie_word_embeddings": True,
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
    "vision_config": {
        "depth": 32,
        "embed_dim": 1280,
        "mlp_ratio": 4,
        "num_heads": 16,
        "in_chans": 3,
        "hidden_size": 64,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "spatial_patch_size": 14,
        "temporal_patch_size": 2,
    },
}


def test_qwen2_vl_tower_is_read_by_transformers_names():
    """embed_dim is the tower's width, hidden_size the merger's output, mlp_ratio the MLP's
    width over the tower's; LayerNorms, quick_gelu, no windows (Qwen2VLVisionConfig's)."""
    from transformers import Qwen2VLConfig

    expected = Qwen2VLConfig(**{k: v for k, v in QWEN2_VL.items() if k != "model_type"})
    config = vision_language_family("qwen2_vl").parse_config(QWEN2_VL)
    vision, theirs = config.vision, expected.vision_config
    assert (vision.hidden_size, vision.out_hidden_size, vision.depth) == (
        theirs.embed_dim,
        theirs.hidden_size,
        theirs.depth,
    )
    assert vision.intermediate_size == int(theirs.embed_dim * theirs.mlp_ratio) == 5120
    assert (vision.num_heads, vision.patch_size, vision.hidden_act) == (16, 14, theirs.hidden_act)
    assert vision.rope_theta == theirs.rope_parameters["rope_theta"]
    assert (vision.norm_type, vision.gated_mlp, vision.window_size) == ("layer", False, None)
    assert config.text.tie_word_embeddings is expected.tie_word_embeddings is True
    assert config.text.rope.mrope_section == (2, 3, 3)
    assert config.text.norm_eps == expected.text_config.rms_norm_eps
