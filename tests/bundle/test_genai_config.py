"""genai_config.json from ArchitectureConfig + EP capabilities + graph, per EP, parsed by genai."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import onnxruntime_genai as og
import pytest

from mobius_genai.bundle.genai_config import (
    FUSED_INT4_ACCURACY_ENTRY,
    make_genai_config,
    provider_options,
    read_generation_config,
    search_defaults,
    token_ids,
)
from mobius_genai.bundle.schema import validate_genai_config
from mobius_genai.config import ArchitectureConfig
from mobius_genai.ep import get_ep
from mobius_genai.errors import BundleError, ConfigError, UnsupportedModelError
from mobius_genai.models import FAMILIES
from mobius_genai.runtime.generate import greedy_tokens
from tests.bundle.conftest import toy_graph
from tests.conftest import TINY_QWEN2

CONFIG = ArchitectureConfig(
    model_type="qwen2",
    vocab_size=384,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=128,
    bos_token_id=1,
    eos_token_id=(2,),
)

# The EP table (spec + DESIGN.md) as genai provider_options, without and with GQA in the graph.
# Graph capture is on only where the EP enables it AND the graph shares the KV buffer (GQA).
EXPECTED_PROVIDER_OPTIONS = {
    "cpu": ([], []),
    "default": ([], []),
    "portable": ([], []),
    "onnx-standard": ([], []),
    "cuda": ([{"cuda": {"enable_cuda_graph": "0"}}], [{"cuda": {"enable_cuda_graph": "0"}}]),
    "dml": ([{"dml": {"enable_graph_capture": "0"}}], [{"dml": {"enable_graph_capture": "0"}}]),
    "webgpu": (
        [{"webgpu": {"enableGraphCapture": "0"}}],
        [{"webgpu": {"enableGraphCapture": "0"}}],
    ),
    "trt-rtx": (
        [{"NvTensorRtRtx": {"enable_cuda_graph": "0"}}],
        [{"NvTensorRtRtx": {"enable_cuda_graph": "1"}}],
    ),
    "mlx": ([{"MLXExecutionProvider": {}}], [{"MLXExecutionProvider": {}}]),
}


def _og_parses(document: dict, folder: Path) -> None:
    """onnxruntime-genai's own (strict) parser reads the config; raises on unknown keys."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "genai_config.json").write_text(json.dumps(document))
    og.Config(str(folder))


@pytest.mark.parametrize("gqa", [False, True], ids=["no-gqa", "gqa"])
@pytest.mark.parametrize("ep", sorted(EXPECTED_PROVIDER_OPTIONS))
def test_config_per_ep_matches_the_ep_table(ep: str, gqa: bool, tmp_path: Path):
    document = make_genai_config(CONFIG, get_ep(ep), toy_graph(gqa=gqa))
    session = document["model"]["decoder"]["session_options"]
    assert session["provider_options"] == EXPECTED_PROVIDER_OPTIONS[ep][gqa]
    assert document["search"]["past_present_share_buffer"] is gqa
    validate_genai_config(document)
    _og_parses(document, tmp_path)


def test_graph_capture_needs_shared_buffer():
    trt = get_ep("trt-rtx")
    assert trt.enable_graph_capture
    assert provider_options(trt, share_buffer=False) == [
        {"NvTensorRtRtx": {"enable_cuda_graph": "0"}}
    ]
    cuda_on = get_ep("cuda").with_graph_capture(True)
    assert provider_options(cuda_on, share_buffer=True) == [{"cuda": {"enable_cuda_graph": "1"}}]


@pytest.mark.parametrize("level", [0, 4])
def test_dequantize_linear_graph_fixes_onnxruntimes_fused_accuracy_level(level, tmp_path):
    """onnxruntime fuses DequantizeLinear + MatMul into a MatMulNBits of accuracy level 4 unless
    told: the bundle says the int4 plan's level (tests/quantize/test_dequantize_linear_runtimes.py
    shows why), and og's strict parser takes the entry."""
    graph = toy_graph()
    standard = get_ep("onnx-standard")
    plain = make_genai_config(CONFIG, standard, graph, int4_accuracy_level=level)
    assert FUSED_INT4_ACCURACY_ENTRY not in plain["model"]["decoder"]["session_options"]
    graph = dataclasses.replace(graph, ops=graph.ops | {"ai.onnx::DequantizeLinear"})
    document = make_genai_config(CONFIG, standard, graph, int4_accuracy_level=level)
    session = document["model"]["decoder"]["session_options"]
    assert session == {"provider_options": [], FUSED_INT4_ACCURACY_ENTRY: str(level)}
    validate_genai_config(document)
    _og_parses(document, tmp_path)


def test_decoder_section_and_names_come_from_config_and_graph():
    document = make_genai_config(CONFIG, get_ep("cpu"), toy_graph(), context_length=48)
    model = document["model"]
    assert model["type"] == "qwen2"
    assert model["context_length"] == 48
    assert document["search"]["max_length"] == 48
    assert model["vocab_size"] == 384
    decoder = model["decoder"]
    assert {key: decoder[key] for key in ("filename", "head_size", "hidden_size")} == {
        "filename": "model.onnx",
        "head_size": 16,
        "hidden_size": 64,
    }
    assert (decoder["num_attention_heads"], decoder["num_key_value_heads"]) == (4, 2)
    assert decoder["num_hidden_layers"] == 2
    assert decoder["inputs"] == {
        "input_ids": "input_ids",
        "attention_mask": "attention_mask",
        "position_ids": "position_ids",
        "past_key_names": "past_key_values.%d.key",
        "past_value_names": "past_key_values.%d.value",
    }
    assert decoder["outputs"] == {
        "logits": "logits",
        "present_key_names": "present.%d.key",
        "present_value_names": "present.%d.value",
    }


def test_context_length_defaults_to_max_position_embeddings():
    document = make_genai_config(CONFIG, get_ep("cpu"), toy_graph())
    assert document["model"]["context_length"] == 128
    assert document["search"]["max_length"] == 128


def test_graph_without_position_ids_leaves_them_out():
    document = make_genai_config(CONFIG, get_ep("cpu"), toy_graph(position_ids=False))
    assert "position_ids" not in document["model"]["decoder"]["inputs"]


def test_graph_with_other_layer_count_is_refused():
    with pytest.raises(BundleError, match="num_hidden_layers=2"):
        make_genai_config(CONFIG, get_ep("cpu"), toy_graph(layers=3))


def test_graph_without_logits_is_refused():
    graph = toy_graph()
    graph.outputs.pop("logits")  # type: ignore[attr-defined]
    with pytest.raises(BundleError, match="'logits'"):
        make_genai_config(CONFIG, get_ep("cpu"), graph)


def test_model_type_map_and_unknown_type():
    llama = dataclasses.replace(CONFIG, model_type="llama")
    assert make_genai_config(llama, get_ep("cpu"), toy_graph())["model"]["type"] == "llama"
    gpt2 = dataclasses.replace(CONFIG, model_type="gpt2")
    assert make_genai_config(gpt2, get_ep("cpu"), toy_graph())["model"]["type"] == "decoder"
    odd = dataclasses.replace(CONFIG, model_type="bert")
    with pytest.raises(UnsupportedModelError, match="model_type 'bert'"):
        make_genai_config(odd, get_ep("cpu"), toy_graph())


def test_token_ids_prefer_generation_config():
    generation = {"bos_token_id": 7, "eos_token_id": [9, 2, 9], "pad_token_id": 5}
    assert token_ids(CONFIG, generation) == {
        "bos_token_id": 7,
        "eos_token_id": [9, 2],
        "pad_token_id": 5,
    }


def test_token_ids_fall_back_to_config_json_and_pad_to_eos():
    assert token_ids(CONFIG, {}) == {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2}
    no_bos = dataclasses.replace(CONFIG, bos_token_id=None, eos_token_id=())
    assert token_ids(no_bos, {}) == {}


def test_bad_token_id_names_the_field():
    with pytest.raises(ConfigError, match="eos_token_id"):
        token_ids(CONFIG, {"eos_token_id": ["2"]})


@pytest.mark.parametrize("field", ["bos_token_id", "eos_token_id", "pad_token_id"])
def test_token_ids_outside_the_vocabulary_are_refused(field: str):
    with pytest.raises(ConfigError, match=rf"{field}: \[384\] outside the vocabulary \[0, 384\)"):
        token_ids(CONFIG, {field: 384})


def test_a_negative_pad_means_none_and_falls_back_to_eos():
    assert token_ids(CONFIG, {"pad_token_id": -1})["pad_token_id"] == 2


def test_search_defaults_from_generation_config():
    search = search_defaults(
        {
            "do_sample": True,
            "top_k": 20,
            "top_p": 0.8,
            "temperature": 0.7,
            "repetition_penalty": 1.05,
            "early_stopping": "never",
            "max_new_tokens": 512,
        }
    )
    assert search["do_sample"] is True
    assert (search["top_k"], search["top_p"], search["temperature"]) == (20, 0.8, 0.7)
    assert search["repetition_penalty"] == 1.05
    assert "early_stopping" not in search and "max_new_tokens" not in search
    assert search_defaults({"top_k": "many", "temperature": None})["top_k"] == 50


def test_tiny_checkpoint_generation_config():
    generation = read_generation_config(TINY_QWEN2)
    ids = token_ids(CONFIG, generation)
    assert ids["eos_token_id"] == [383, 381]
    assert ids["pad_token_id"] == 381


def test_unreadable_generation_config_names_the_file(tmp_path: Path):
    (tmp_path / "generation_config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="generation_config.json"):
        read_generation_config(tmp_path)
    assert read_generation_config(tmp_path / "missing") == {}


@pytest.mark.parametrize("genai_type", sorted({f.genai_type for f in FAMILIES.values()}))
def test_every_mapped_model_type_runs_the_standard_decoder(bundle_copy, genai_type: str):
    folder = bundle_copy("cpu")
    path = folder / "genai_config.json"
    document = json.loads(path.read_text())
    document["model"]["type"] = genai_type
    decoder = document["model"]["decoder"]
    # hybrid model types (lfm2) need layer_types; a decoder of attention layers only is one
    decoder["layer_types"] = ["full_attention"] * decoder["num_hidden_layers"]
    path.write_text(json.dumps(document))
    model = og.Model(str(folder))
    assert len(greedy_tokens(model, [1, 2, 3], 6)) == 3
