"""Qwen3-VL config.json: the hub's layout (Qwen3-VL-8B's keys), interleaved mrope channels
as transformers lays them out, and one-line errors naming the vision field."""

from __future__ import annotations

import pytest
import torch

from mobius_genai import ConfigError
from mobius_genai.components.rope import channel_axes
from mobius_genai.models.vision_language import vision_language_family

TEXT = {
    "vocab_size": 160,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 512,
    # the hub's key: transformers interleaves whatever it says
    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [2, 3, 3], "rope_type": "default"},
}
VISION = {
    "depth": 3,
    "hidden_size": 32,
    "num_heads": 2,
    "patch_size": 4,
    "out_hidden_size": 64,
    "num_position_embeddings": 16,
    "deepstack_visual_indexes": [0, 2],
}

MOE = {"moe_intermediate_size": 48, "num_local_experts": 4, "num_experts_per_tok": 2}


def _parse(raw: dict):
    return vision_language_family("qwen3_vl").parse_config(raw)


def _raw(**change) -> dict:
    return {"model_type": "qwen3_vl", "text_config": TEXT, "vision_config": VISION, **change}


def test_the_hub_layout_parses_with_interleaved_mrope_and_deepstack():
    config = _parse(_raw())
    assert config.text.rope.mrope_section == (2, 3, 3)
    assert config.text.rope.mrope_interleaved
    assert config.text.rope.theta == 500_000.0  # Qwen3VLTextConfig's default
    assert config.text.head_dim == 16 and config.text.qk_norm
    assert (config.deepstack_layers, config.embedding_width) == (2, 64 * 3)
    assert config.vision.grid_side == 4 and config.vision.patch_dim == 3 * 2 * 4 * 4
    assert config.image_token_id == 151_655


@pytest.mark.parametrize(("sections", "pairs"), [((24, 20, 20), 64), ((2, 3, 3), 8)])
def test_interleaved_channel_axes_are_transformers_layout(sections, pairs):
    """Qwen3VLTextRotaryEmbedding.recomposition_frequencies on frequencies that are their axis."""
    from transformers.models.qwen3_vl.modeling_qwen3_vl import Qwen3VLTextRotaryEmbedding

    rope = _parse(_raw()).text.rope.__class__(mrope_section=sections, mrope_interleaved=True)
    layer = Qwen3VLTextRotaryEmbedding.__new__(Qwen3VLTextRotaryEmbedding)
    layer.mrope_section = list(sections)
    axes = torch.arange(3.0)[:, None, None, None].expand(3, 1, 1, pairs).clone()
    expected = layer.recomposition_frequencies(axes)[0, 0, :pairs].long().tolist()
    assert channel_axes(rope, pairs) == expected
    assert channel_axes(rope, pairs) != channel_axes(rope.__class__(mrope_section=sections), pairs)


@pytest.mark.parametrize(
    ("vision", "message"),
    [
        (
            {"num_position_embeddings": 15},
            "vision_config.num_position_embeddings 15 is not a square",
        ),
        (
            {"deepstack_visual_indexes": [2, 0]},
            r"deepstack_visual_indexes \[2, 0\]: accepted: increasing block indexes in 0..2",
        ),
        (
            {"deepstack_visual_indexes": [3]},
            r"deepstack_visual_indexes \[3\]: accepted: increasing block indexes in 0..2",
        ),
        ({"hidden_act": "swish"}, "vision_config.hidden_act' is 'swish'"),
    ],
)
def test_bad_vision_fields_are_named(vision, message):
    with pytest.raises(ConfigError, match=message):
        _parse(_raw(vision_config={**VISION, **vision}))


@pytest.mark.parametrize("model_type", ["qwen3_vl", "qwen3_vl_moe"])
@pytest.mark.parametrize(
    ("top", "text"), [(True, None), (None, True), (False, True), (True, False)]
)
def test_the_top_level_ties_the_lm_head_as_transformers_does(model_type, top, text):
    """Qwen3-VL's models tie by the top level's tie_word_embeddings (false when absent),
    whatever text_config says."""
    import transformers

    moe = model_type.endswith("moe")
    name = "Qwen3VLMoe" if moe else "Qwen3VL"
    config_class = getattr(transformers, f"{name}Config")
    model_class = getattr(transformers, f"{name}ForConditionalGeneration")
    text_config = {key: value for key, value in TEXT.items() if key != "rope_scaling"}
    text_config["rope_parameters"] = TEXT["rope_scaling"]
    text_config.update(MOE if moe else {})
    raw = _raw(model_type=model_type, text_config=text_config)
    if top is not None:
        raw["tie_word_embeddings"] = top
    if text is not None:
        raw["text_config"] = {**text_config, "tie_word_embeddings": text}
    keys = {k: v for k, v in raw.items() if k != "model_type"}
    with torch.device("meta"):
        model = model_class(config_class(**keys))
    tied = model.lm_head.weight is model.model.language_model.embed_tokens.weight
    assert vision_language_family(model_type).parse_config(raw).text.tie_word_embeddings is tied


def test_the_moe_text_config_reads_transformers_5_expert_keys():
    """transformers 5 writes num_local_experts; Qwen3-VL-MoE's router always renormalizes."""
    config = vision_language_family("qwen3_vl_moe").parse_config(
        _raw(model_type="qwen3_vl_moe", text_config={**TEXT, **MOE})
    )
    assert (config.text.moe.num_experts, config.text.moe.top_k) == (4, 2)
    assert config.text.moe.normalize_top_k and config.text.moe.intermediate_size == 48
    assert config.deepstack_layers == 2 and config.text.rope.mrope_interleaved


@pytest.mark.parametrize(
    "experts", [{}, {"num_experts": 4}, {"num_local_experts": 4}, {"num_local_experts": 6}]
)
def test_the_moe_expert_count_is_transformers_whatever_key_or_none(experts):
    """num_experts absent: Qwen3VLMoeTextConfig's default; num_local_experts sets it too."""
    from transformers import Qwen3VLMoeConfig

    text = {**TEXT, "moe_intermediate_size": 48, "num_experts_per_tok": 2, **experts}
    raw = _raw(model_type="qwen3_vl_moe", text_config=text)
    expected = Qwen3VLMoeConfig(text_config=text, vision_config=VISION).text_config.num_experts
    config = vision_language_family("qwen3_vl_moe").parse_config(raw)
    assert config.text.moe.num_experts == expected
