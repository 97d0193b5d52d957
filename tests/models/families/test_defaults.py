"""Every row reads a config.json as transformers does, keys left out included.

For each row of the family table and of VISION_LANGUAGE: a tiny config.json cut to the keys
our row requires (each other key dropped in turn while the row still parses it), parsed by our
row, must give the ArchitectureConfig of the same config.json filled in by transformers' config
class (`from_dict(...).to_dict()`: every key explicit, its class default where it was left
out), also parsed by our row. A row default that differs from its class's shows up as a field
that differs. Token ids are not compared: they shape neither the graph nor its numbers (the
bundle reads generation_config.json first).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Callable
from typing import Any

import pytest
from transformers import CONFIG_MAPPING

from mobius_genai.errors import MobiusError
from mobius_genai.models.families import FAMILIES
from mobius_genai.models.vision_language import VISION_LANGUAGE
from tests._hf import FAMILIES as HF_FAMILIES
from tests._hf import tiny_config

_NOT_COMPARED = {"torch_dtype", "bos_token_id", "eos_token_id", "pad_token_id"}
#: What transformers writes besides the config (never read as a setting).
_BOOKKEEPING = ("transformers_version", "architectures", "dtype", "torch_dtype")
#: The text family of each row that nests its decoder's keys in text_config (the text-only
#: rows of the family table and the vision-language rows), as tests/_hf.py names it.
_NESTED_TEXT = {
    "gemma3n": "gemma3n_text",
    "llama4": "llama4_text",
    "qwen3_5": "qwen3_5_text",
    "qwen3_5_moe": "qwen3_5_moe_text",
    "gemma3": "gemma3_text",
    "qwen2_5_vl": "qwen2",
    "qwen2_vl": "qwen2",
    "mistral3": "mistral",
    "qwen3_vl": "qwen3",
    "qwen3_vl_moe": "qwen3_moe",
    "lfm2_vl": "lfm2",
    "gemma4": "gemma4_text",
}
#: Keys whose class default does not fit a tiny model, set for every row of the family
#: (Gemma 3n shares the caches of its last 15 layers by default: 20 layers leave 5 of its own).
_FITS_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3n_text": {
        "num_hidden_layers": 20,
        "intermediate_size": 96,
        "layer_types": None,
        "activation_sparsity_pattern": None,
    },
}
_MROPE = {"rope_type": "default", "rope_theta": 10000.0}
#: Keys a row requires that the tiny text config lacks: the Qwen VL decoders' rope sections
#: (qwen2's tiny heads turn 16 channels, qwen3's 32).
_TEXT_SETTINGS: dict[str, dict[str, Any]] = {
    "qwen2_5_vl": {"rope_parameters": {**_MROPE, "mrope_section": [2, 3, 3]}},
    "qwen2_vl": {"rope_parameters": {**_MROPE, "mrope_section": [2, 3, 3]}},
    "qwen3_vl": {"rope_parameters": {**_MROPE, "mrope_section": [4, 6, 6]}},
    "qwen3_vl_moe": {"rope_parameters": {**_MROPE, "mrope_section": [4, 6, 6]}},
}
#: Vision settings where the class's defaults do not fit together (Gemma3Config's default
#: SigLIP tower has 14 x 14 patches, its 256 image tokens need 16 x 16 or more: Gemma 3's own
#: 896-pixel images of 14-pixel patches); Gemma4Config has no default tower.
_VISION: dict[str, dict[str, Any]] = {
    "gemma3": {"image_size": 896, "patch_size": 14},
    "gemma4": CONFIG_MAPPING["gemma4_vision"]().to_dict(),
}


def _key_value_heads_default(config_class: type) -> int:
    parameter = inspect.signature(config_class.__init__).parameters.get("num_key_value_heads")
    default = None if parameter is None else parameter.default
    return default if isinstance(default, int) else 1


def _tiny_text(family: str, config_class: type) -> dict[str, Any]:
    """tiny_config's config.json for `family`, with twice as many query heads as are needed
    for the class's default key/value head count to divide them (and never equal them), the
    hidden size grown with the heads where the head size follows from it or the heads would
    not divide it."""
    tiny = tiny_config(family, **_FITS_DEFAULTS.get(family, {}))
    heads = tiny.to_dict().get("num_attention_heads")  # none in an attention-free model
    wanted = heads and 2 * math.lcm(heads, _key_value_heads_default(config_class))
    if wanted != heads:
        grow: dict[str, Any] = {"num_attention_heads": wanted}
        derived = tiny.to_dict().get("head_dim") in (None, tiny.hidden_size // heads)
        if derived or tiny.hidden_size % wanted:
            grow["hidden_size"] = tiny.hidden_size * wanted // heads
        tiny = tiny_config(family, **_FITS_DEFAULTS.get(family, {}), **grow)
    raw = tiny.to_dict()
    for key in _BOOKKEEPING:
        raw.pop(key, None)
    return raw


def _config_json(model_type: str, text_type: str | None = None) -> dict[str, Any]:
    """A tiny config.json of `model_type` as transformers writes it (a multimodal one: its
    class's defaults around a tiny text_config, of `text_type` where given: one of the row's
    `text_families`)."""
    text_family = text_type or _NESTED_TEXT.get(model_type)
    if text_family is None:
        return _tiny_text(model_type, CONFIG_MAPPING[model_type])
    raw = CONFIG_MAPPING[model_type]().to_dict()
    for key in _BOOKKEEPING:
        raw.pop(key, None)
    text_type = text_type or raw["text_config"]["model_type"]
    text_class = CONFIG_MAPPING[text_type]
    text = {**_tiny_text(text_family, text_class), **_TEXT_SETTINGS.get(model_type, {})}
    text["model_type"] = text_type
    vision = {**(raw.get("vision_config") or {}), **_VISION.get(model_type, {})}
    return {**raw, "text_config": text, **({"vision_config": vision} if vision else {})}


def _parser(model_type: str) -> Callable[[dict[str, Any]], Any]:
    """Our row's parse of a config.json → the decoder's ArchitectureConfig."""
    row = VISION_LANGUAGE.get(model_type)
    if row is None:
        return FAMILIES[model_type].parse_config
    return lambda raw: row.parse_config(raw).text


def _parses(parse: Callable[[dict[str, Any]], Any], raw: dict[str, Any]) -> bool:
    try:
        parse(raw)
    except MobiusError:
        return False
    return True


def _required_keys_only(parse: Callable, raw: dict[str, Any]) -> dict[str, Any]:
    """`raw` less every key (at the top level and in text_config) `parse` reads without."""
    raw = dict(raw)
    for key in sorted(raw):
        trial = {k: v for k, v in raw.items() if k != key}
        if key not in ("model_type", "text_config", "vision_config") and _parses(parse, trial):
            raw = trial
    text = raw.get("text_config")
    for key in sorted(text or {}):
        trial_text = {k: v for k, v in raw["text_config"].items() if k != key}
        if _parses(parse, {**raw, "text_config": trial_text}):
            raw = {**raw, "text_config": trial_text}
    return raw


def _filled_by_transformers(model_type: str, raw: dict[str, Any]) -> dict[str, Any]:
    return CONFIG_MAPPING[model_type].from_dict(dict(raw)).to_dict()


def _differences(ours: Any, theirs: Any) -> dict[str, tuple[Any, Any]]:
    return {
        field.name: (getattr(ours, field.name), getattr(theirs, field.name))
        for field in dataclasses.fields(ours)
        if field.name not in _NOT_COMPARED
        and getattr(ours, field.name) != getattr(theirs, field.name)
    }


_ROWS = sorted(FAMILIES) + sorted(VISION_LANGUAGE)


def test_every_row_has_a_transformers_class_and_a_tiny_config():
    """No row without a transformers config class, and each row's tiny config.json comes from
    tests/_hf.py: its own, or for a row nesting text_config its text family's (_NESTED_TEXT),
    so the comparison below covers every row."""
    assert [row for row in _ROWS if row not in CONFIG_MAPPING] == []
    nested = {row for row, family in FAMILIES.items() if family.text_only is not None}
    assert nested | set(VISION_LANGUAGE) == set(_NESTED_TEXT)
    assert set(FAMILIES) - nested <= set(HF_FAMILIES)


@pytest.mark.parametrize("model_type", _ROWS)
def test_absent_keys_read_as_transformers_fills_them(model_type: str) -> None:
    parse = _parser(model_type)
    raw = _config_json(model_type)
    parse(raw)  # the whole config.json parses
    minimal = _required_keys_only(parse, raw)
    differences = _differences(parse(minimal), parse(_filled_by_transformers(model_type, minimal)))
    assert differences == {}, f"config.json keys kept: {sorted(minimal)}"


#: (a row nesting text_config, a text_config model_type of its `text_families`; None: its
#: default).
_NESTED_CASES = [(row, None) for row in sorted(_NESTED_TEXT)] + [
    (name, text_type)
    for name, row in sorted(VISION_LANGUAGE.items())
    for text_type in row.text_families or ()
]


def _parsed_fill(parse: Callable, model_type: str, raw: dict[str, Any]) -> Any:
    """Our parse of `raw` as transformers fills it; None where transformers refuses `raw` or
    fills in a value the rest of `raw` does not fit (num_hidden_layers beside a shorter
    layer_types, a hidden_size the rope sections do not divide), which our row refuses."""
    try:
        filled = _filled_by_transformers(model_type, raw)
    except Exception:  # transformers' own refusal (a validator's ValueError, ...)
        return None
    try:
        return parse(filled)
    except MobiusError:
        return None


@pytest.mark.parametrize(("model_type", "text_type"), _NESTED_CASES)
def test_each_key_left_out_of_text_config_reads_as_transformers_fills_it(model_type, text_type):
    """A nested text_config (a vision-language row's, or a multimodal checkpoint's built
    text-only) without any one of its keys parses as the same config.json filled in by
    transformers' text config class (its class's default for the key), as a flat config.json
    does through its row's defaults: never refused for a key transformers fills."""
    parse = _parser(model_type)
    raw = _config_json(model_type, text_type)
    assert text_type is None or parse(raw).model_type == text_type
    compared = []
    for key in sorted(set(raw["text_config"]) - {"model_type"}):
        text = {k: v for k, v in raw["text_config"].items() if k != key}
        trial = {**raw, "text_config": text}
        theirs = _parsed_fill(parse, model_type, trial)
        if theirs is not None:
            assert _differences(parse(trial), theirs) == {}, f"text_config without {key!r}"
            compared.append(key)
    assert {"hidden_size", "num_hidden_layers", "vocab_size"} & set(compared)


def test_mistral_without_sliding_window_slides_every_layer_by_4096():
    """MistralConfig's sliding_window default (4096) is every layer's window, as transformers
    reads a config.json without the key."""
    raw = _tiny_text("mistral", CONFIG_MAPPING["mistral"])
    raw.pop("sliding_window")
    config = FAMILIES["mistral"].parse_config(raw)
    assert CONFIG_MAPPING["mistral"].from_dict(raw).sliding_window == 4096
    assert [config.window_of_layer(i) for i in range(config.num_hidden_layers)] == [4096] * 3
    # an explicit null keeps full attention, as in MistralConfig
    assert FAMILIES["mistral"].parse_config({**raw, "sliding_window": None}).sliding_window is None


@pytest.mark.parametrize("model_type", ["gemma4_text", "gemma3n_text"])
def test_layer_lists_shorter_than_the_layers_are_refused_in_one_line(model_type):
    """A layer count the per-layer lists do not cover (a text_config whose num_hidden_layers
    the row's default fills in) is a ConfigError naming the list, never an IndexError."""
    raw = tiny_config(model_type).to_dict()
    raw["num_hidden_layers"] = 30
    with pytest.raises(MobiusError) as error:
        FAMILIES[model_type].parse_config(raw)
    assert "for 30 layers" in str(error.value)
    assert "\n" not in str(error.value)
