"""Which text decoder a vision-language row builds for config.json's text_config.model_type,
as transformers builds it: a class whose text config's class is fixed (Gemma 3, Qwen2-VL,
Qwen2.5-VL, Qwen3-VL and its MoE, Gemma 4) ignores the value, so the row builds its own
decoder whatever it says; a class that builds text_config by its model_type (AutoConfig:
Mistral 3, LFM2-VL) gets the decoder of that type, or a one-line refusal naming the value and
what is accepted, and a given text_config is filled by its type's class defaults (its own
init_kwargs only stand in for an absent one)."""

from __future__ import annotations

import pytest
from transformers import CONFIG_MAPPING

from mobius_genai.errors import UnsupportedModelError
from mobius_genai.models.vision_language import VISION_LANGUAGE, vision_language_family
from tests.models.families.test_defaults import _config_json

_FIXED_TEXT_CLASS = ("gemma3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "gemma4")


def _with_text_type(raw: dict, text_type: str) -> dict:
    return {**raw, "text_config": {**raw["text_config"], "model_type": text_type}}


@pytest.mark.parametrize("model_type", _FIXED_TEXT_CLASS)
def test_a_fixed_text_class_ignores_text_config_model_type(model_type):
    raw = _config_json(model_type)
    other = _with_text_type(raw, "llama")
    text_class = type(CONFIG_MAPPING[model_type].from_dict(raw).text_config)
    assert type(CONFIG_MAPPING[model_type].from_dict(other).text_config) is text_class
    row = VISION_LANGUAGE[model_type]
    assert vision_language_family(model_type, other).text_family == row.text_family
    assert row.parse_config(other).text == row.parse_config(raw).text


def test_lfm2_vl_refuses_another_text_decoder_in_one_line():
    raw = _with_text_type(_config_json("lfm2_vl"), "llama")
    assert type(CONFIG_MAPPING["lfm2_vl"].from_dict(raw).text_config).__name__ == "LlamaConfig"
    with pytest.raises(UnsupportedModelError) as error:
        VISION_LANGUAGE["lfm2_vl"].parse_config(raw)
    message = str(error.value)
    assert "\n" not in message
    assert "'text_config.model_type' is 'llama'" in message
    assert "accepted for lfm2_vl: ['lfm2']" in message


def test_lfm2_vl_builds_its_lfm2_text_config():
    raw = _config_json("lfm2_vl")
    assert raw["text_config"]["model_type"] == "lfm2"
    text = VISION_LANGUAGE["lfm2_vl"].parse_config(raw).text
    assert text.model_type == "lfm2"
    assert text.short_conv is not None


def test_mistral3_fills_a_given_text_config_by_mistral_defaults():
    """Mistral3Config's Mistral-Small defaults (no window) stand in for an absent text_config
    only; a given one lacking sliding_window slides by MistralConfig's 4096, as transformers
    builds it."""
    raw = _config_json("mistral3")
    raw["text_config"].pop("sliding_window")
    assert CONFIG_MAPPING["mistral3"].from_dict(raw).text_config.sliding_window == 4096
    text = VISION_LANGUAGE["mistral3"].parse_config(raw).text
    assert text.sliding_window == 4096
    assert set(text.layer_types) == {"sliding_attention"}
    absent = {key: value for key, value in raw.items() if key != "text_config"}
    assert CONFIG_MAPPING["mistral3"].from_dict(absent).text_config.sliding_window is None
    assert VISION_LANGUAGE["mistral3"].parse_config(absent).text.sliding_window is None
