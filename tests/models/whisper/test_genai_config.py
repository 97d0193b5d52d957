"""genai_config.json sections and audio_processor_config.json of a Whisper bundle: the names
match the graphs', onnxruntime-genai 0.18 parses the document, and the processor pipeline has
the checkpoint's mel bins."""

from __future__ import annotations

import json

import onnx_ir as ir
import onnxruntime_genai as og
import pytest

from mobius_genai.bundle.whisper_config import (
    AUDIO_PROCESSOR_CONFIG,
    audio_processor_config,
    whisper_genai_config,
)
from mobius_genai.config.whisper import WhisperConfig
from mobius_genai.ep.context import build_context
from mobius_genai.ep.registry import get_ep
from mobius_genai.errors import ConfigError
from mobius_genai.models.whisper import whisper_graphs
from tests.models.whisper._whisper import LAYOUTS, TINY

CONFIG = WhisperConfig.from_dict({"model_type": "whisper", **TINY, **LAYOUTS["large-v3"]})


def _pattern_names(pattern: str, layers: int) -> set[str]:
    return {pattern % i for i in range(layers)}


def test_sections_name_the_graphs_inputs_and_outputs():
    with build_context("cpu", ir.DataType.FLOAT):
        graphs = whisper_graphs(CONFIG, None)
    document = whisper_genai_config(CONFIG, get_ep("cpu"))
    model = document["model"]
    layers = CONFIG.decoder_layers
    for key in ("encoder", "decoder"):
        section, graph = model[key], graphs[key].graph
        declared = set()
        for value in [*section["inputs"].values(), *section["outputs"].values()]:
            declared |= _pattern_names(value, layers) if "%d" in value else {value}
        actual = {v.name for v in graph.inputs} | {v.name for v in graph.outputs}
        assert declared == actual, key
    assert model["decoder"]["head_size"] == 16 and model["decoder"]["num_hidden_layers"] == 2
    assert model["type"] == "whisper" and model["context_length"] == 448
    assert document["search"]["past_present_share_buffer"] is False
    assert model["decoder"]["session_options"]["provider_options"] == []


def test_token_ids_come_from_generation_config_first():
    generation = {"decoder_start_token_id": 50_257, "eos_token_id": 50_256, "max_length": 448}
    model = whisper_genai_config(CONFIG, get_ep("cpu"), generation=generation)["model"]
    assert (model["decoder_start_token_id"], model["eos_token_id"]) == (50_257, 50_256)
    assert model["bos_token_id"] == CONFIG.bos_token_id
    with pytest.raises(ConfigError, match="outside the vocabulary"):
        whisper_genai_config(CONFIG, get_ep("cpu"), generation={"eos_token_id": 60_000})


def test_cuda_sections_carry_the_provider():
    model = whisper_genai_config(CONFIG, get_ep("cuda"))["model"]
    for key in ("encoder", "decoder"):
        (options,) = model[key]["session_options"]["provider_options"]
        assert list(options) == ["cuda"]


def test_onnxruntime_genai_parses_the_document(tmp_path):
    (tmp_path / "genai_config.json").write_text(
        json.dumps(whisper_genai_config(CONFIG, get_ep("cpu")))
    )
    config = og.Config(str(tmp_path))  # strict parser: an unknown key fails here
    assert config is not None


def test_processor_config_has_the_mel_bins_and_chunk():
    sequence = audio_processor_config(CONFIG)["feature_extraction"]["sequence"]
    types = [step["operation"]["type"] for step in sequence]
    assert types == ["AudioDecoder", "STFTNorm", "LogMelSpectrum"]
    attrs = sequence[2]["operation"]["attrs"]
    assert (attrs["n_mel"], attrs["chunk_size"]) == (128, 30)
    assert AUDIO_PROCESSOR_CONFIG == "audio_processor_config.json"


def test_processor_refuses_positions_that_are_not_whole_seconds():
    odd = WhisperConfig.from_dict({"model_type": "whisper", **TINY, "max_source_positions": 1234})
    with pytest.raises(ConfigError, match="max_source_positions 1234"):
        audio_processor_config(odd)
