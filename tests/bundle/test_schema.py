"""The JSON Schemas: strict where onnxruntime-genai 0.18 is strict, open where it is open."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import onnxruntime_genai as og
import pytest

from mobius_genai import _resources
from mobius_genai.bundle.genai_config import make_genai_config
from mobius_genai.bundle.schema import validate_genai_config, validate_manifest
from mobius_genai.ep import get_ep
from mobius_genai.errors import BundleError
from mobius_genai.models import FAMILIES
from tests.bundle.test_genai_config import CONFIG, toy_graph

GOOD = make_genai_config(CONFIG, get_ep("cuda"), toy_graph(gqa=True))


def _with(path: str, value: object) -> dict:
    """GOOD with `path` ("a/b/0/c") set to `value`; a `value` of DELETE removes the key."""
    document = copy.deepcopy(GOOD)
    *parents, last = path.split("/")
    node = document
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if value is DELETE:
        del node[last]
    else:
        node[last] = value
    return document


DELETE = object()

#: Every key onnxruntime-genai 0.18 parses in model.vision and model.embedding.
VISION = {
    "filename": "vision.onnx",
    "config_filename": "processor_config.json",
    "adapter_filename": "vision.onnx_adapter",
    "spatial_merge_size": 2,
    "patch_size": 14,
    "window_size": 112,
    "tokens_per_second": 2.0,
    "inputs": {
        "pixel_values": "pixel_values",
        "pixel_position_ids": "pixel_position_ids",
        "image_sizes": "image_sizes",
        "image_grid_thw": "image_grid_thw",
        "attention_mask": "pixel_attention_mask",
    },
    "outputs": {"image_features": "image_features"},
    "session_options": {"log_id": "vision", "provider_options": []},
    "run_options": {"x": "1"},
}
PIPELINE_MODEL = {
    "filename": "patch_embed.onnx",
    "run_on_cpu": True,
    "inputs": ["pixel_values"],
    "outputs": ["patches"],
    "session_options": {"log_id": "patch_embed"},
    "run_options": {"x": "1"},
}
EMBEDDING = {
    "filename": "embedding.onnx",
    "inputs": {
        "input_ids": "input_ids",
        "image_features": "image_features",
        "audio_features": "audio_features",
    },
    "outputs": {"inputs_embeds": "inputs_embeds"},
    "session_options": {"log_id": "embedding"},
    "run_options": {"x": "1"},
}


def _og_rejects(document: dict, folder: Path) -> bool:
    (folder / "genai_config.json").write_text(json.dumps(document))
    try:
        og.Config(str(folder))
    except Exception:
        return True
    return False


def test_both_schemas_are_valid_2020_12():
    import jsonschema

    for name in ("genai_config", "manifest"):
        schema = _resources.read_json(f"schemas/{name}.schema.json")
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        jsonschema.Draft202012Validator.check_schema(schema)


@pytest.mark.parametrize(
    ("path", "value", "named"),
    [
        ("model/decoder/head_size", "16", "model.decoder.head_size: '16' is not of type 'integer'"),
        ("model/context_length", DELETE, "model.context_length: required field is missing"),
        ("model/type", DELETE, "model.type: required field is missing"),
        (
            "model/decoder/num_key_value_heads",
            DELETE,
            "model.decoder.num_key_value_heads: required",
        ),
        ("model/decoder/filename", "", "model.decoder.filename"),
        ("model/context_length", 0, "model.context_length: 0 is less than the minimum of 1"),
        ("model/eos_token_id", ["2"], "model.eos_token_id"),
        ("search/do_sample", 0, "search.do_sample: 0 is not of type 'boolean'"),
        (
            "model/decoder/session_options/provider_options/0/cuda/enable_cuda_graph",
            1,
            "model.decoder.session_options.provider_options.0.cuda.enable_cuda_graph",
        ),
        (
            "model/decoder/session_options/custom_entry",
            1,
            "model.decoder.session_options.custom_entry: 1 is not of type 'string'",
        ),
        ("model/decoder/bogus", 1, "model.decoder.bogus: unknown field"),
        (
            "model/decoder/inputs/past_names_typo",
            "x",
            "model.decoder.inputs.past_names_typo: unknown field",
        ),
        ("search/max_new_tokens", 5, "search.max_new_tokens: unknown field"),
        ("model/prompt_templates", {}, "model.prompt_templates: unknown field"),
        (
            "serach",
            {},
            "serach: unknown field; accepted: ['engine', 'model', 'search', 'speculative']",
        ),
        (
            "model/context_length",
            2**31,
            "model.context_length: 2147483648 is greater than the maximum of 2147483647",
        ),
        ("model/type", "Qwen2", "model.type: 'Qwen2' is not one of ['chatglm', 'decoder'"),
    ],
)
def test_schema_rejects_broken_configs_naming_the_field(path, value, named):
    with pytest.raises(BundleError) as caught:
        validate_genai_config(_with(path, value))
    message = str(caught.value)
    assert message.startswith("genai_config.json: ")
    assert named in message


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("model/decoder/bogus", 1),
        ("model/decoder/inputs/bogus", "x"),
        ("model/decoder/outputs/bogus", "x"),
        ("search/bogus", 1),
        ("model/bogus", 1),
        ("model/prompt_templates", {}),
        ("model/decoder/session_options/custom_entry", 1),
        ("model/decoder/session_options/provider_options/0/cuda/enable_cuda_graph", 1),
        ("search/do_sample", 0),
        ("model/context_length", "64"),
        ("model/context_length", 64.5),
        ("serach", {}),
        ("max_length", [64]),
        ("model/context_length", 2**31),
        ("model/vocab_size", 2**40),
        ("model/eos_token_id", [2, 2**31]),
        ("model/bos_token_id", -(2**31) - 1),
        ("model/decoder/head_size", 2**31),
        ("search/max_length", 2**31),
        ("search/top_k", 2**31),
        ("model/decoder/session_options/intra_op_num_threads", 2**31),
        ("model/vision", {"filename": "vision.onnx", "bogus": 1}),
        ("model/vision", {"filename": 3}),
        ("model/vision", {"component": "vision"}),
        ("model/vision", {"inputs": {"image_features": "x"}}),
        ("model/vision", {"outputs": {"image_embeds": "x"}}),
        ("model/vision", {"patch_size": "14"}),
        ("model/vision", {"pipeline": {"patch_embed": {"bogus": 1}}}),
        ("model/vision", {"pipeline": [{"patch_embed": {"run_on_cpu": "yes"}}]}),
        ("model/embedding", {"config_filename": "processor_config.json"}),
        ("model/embedding", {"inputs": {"pixel_values": "x"}}),
        ("model/embedding", {"outputs": {"embeddings": "x"}}),
        ("model/embedding", {"pipeline": []}),
        ("model/embedding", {"filename": "embedding.onnx", "session_options": {"log_id": 1}}),
    ],
)
def test_what_genai_rejects_the_schema_rejects(path, value, tmp_path: Path):
    document = _with(path, value)
    assert _og_rejects(document, tmp_path)
    with pytest.raises(BundleError):
        validate_genai_config(document)


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("engine", {}),
        ("model/tokenizer_dir", "."),
        ("model/sep_token_id", 3),
        ("model/eos_token_id", 2),
        ("model/embedding", {}),
        ("model/decoder/sliding_window", {"window_size": 8}),
        ("model/decoder/run_options", {"x": "1"}),
        ("model/decoder/session_options/log_id", "onnxruntime-genai"),
        ("model/decoder/session_options/intra_op_num_threads", 4),
        ("model/decoder/session_options/session.intra_op.allow_spinning", "0"),
        ("model/decoder/session_options/graph_optimization_level", "ORT_ENABLE_ALL"),
        ("model/decoder/inputs/past_sequence_length", "past_sequence_length"),
        ("model/decoder/outputs/present_names", "present_%d"),
        ("search/random_seed", 42),
        ("search/early_stopping", True),
        ("search/chunk_size", 128),
        ("model/context_length", 2**31 - 1),
        ("search/random_seed", -1),
        ("model/vision", VISION),
        ("model/vision", {"pipeline": {"patch_embed": PIPELINE_MODEL}}),
        ("model/vision", {"pipeline": [{"patch_embed": PIPELINE_MODEL}]}),
        ("model/embedding", EMBEDDING),
    ],
)
def test_schema_accepts_extras_genai_accepts(path, value, tmp_path: Path):
    document = _with(path, value)
    assert not _og_rejects(document, tmp_path)
    validate_genai_config(document)


def test_an_unknown_top_level_scalar_is_refused_although_genai_ignores_it(tmp_path: Path):
    """genai skips unknown top-level scalars: `"max_length": 64` there does nothing, silently."""
    document = _with("max_length", 64)
    assert not _og_rejects(document, tmp_path)
    with pytest.raises(BundleError, match="max_length: unknown field"):
        validate_genai_config(document)


def _model_types() -> list[str]:
    """The model types whose one graph is a standard decoder: those of the schema but the
    vision-language pipelines (which its `allOf` requires vision and embedding sections for)."""
    model = _resources.read_json("schemas/genai_config.schema.json")["$defs"]["model"]
    pipelines = {t for rule in model["allOf"] for t in rule["if"]["properties"]["type"]["enum"]}
    return [t for t in model["properties"]["type"]["enum"] if t not in pipelines]


def test_every_family_writes_a_model_type_of_the_schema():
    assert {family.genai_type for family in FAMILIES.values()} <= set(_model_types())


def test_the_model_types_are_those_genai_runs_a_standard_decoder_with(bundle_copy):
    """Each type of the schema loads and generates with onnxruntime-genai; some that do not."""
    folder = bundle_copy("default")
    document = json.loads((folder / "genai_config.json").read_text())
    outcomes = {}
    # hybrid types (lfm2) read layer_types; every type accepts it
    decoder = document["model"]["decoder"]
    decoder["layer_types"] = ["full_attention"] * decoder["num_hidden_layers"]
    for model_type in [*_model_types(), "gpt2", "olmo2", "Qwen2", "starcoder2"]:
        document["model"]["type"] = model_type
        (folder / "genai_config.json").write_text(json.dumps(document))
        try:
            model = og.Model(str(folder))
            params = og.GeneratorParams(model)
            params.set_search_options(max_length=8)
            generator = og.Generator(model, params)
            generator.append_tokens([1, 2, 3])
            generator.generate_next_token()
            outcomes[model_type] = True
        except Exception:  # og raises RuntimeError (unknown type) or another error (contract)
            outcomes[model_type] = False
    assert sorted(t for t, runs in outcomes.items() if runs) == sorted(_model_types())


def test_manifest_of_a_bundle_is_valid_and_bad_hash_is_named(packaged):
    manifest = json.loads((packaged("cpu") / "mobius_manifest.json").read_text())
    validate_manifest(manifest)
    manifest["files"]["model.onnx"]["sha256"] = "not-a-hash"
    manifest["build"].pop("precision")
    with pytest.raises(BundleError) as caught:
        validate_manifest(manifest)
    assert "build.precision: required field is missing" in str(caught.value)
    assert "files.model.onnx.sha256" in str(caught.value)
