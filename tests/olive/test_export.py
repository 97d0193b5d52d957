"""MobiusExport run as Olive runs a pass: config checks, the EP it picks, the handler it returns."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("olive", reason="the olive extra is not installed: pip install -e '.[olive]'")

from olive.hardware.accelerator import DEFAULT_CPU_ACCELERATOR
from olive.model import HfModelHandler, ONNXModelHandler
from olive.passes.olive_pass import create_pass_from_dict

from mobius_genai.bundle.manifest import MANIFEST_FILENAME, bundle_files
from mobius_genai.errors import ConfigError
from mobius_genai.olive import MobiusExport
from tests.olive.conftest import TINY_QWEN2, export_tiny


def _build(handler: ONNXModelHandler) -> dict:
    folder = Path(handler.model_path).parent
    return json.loads((folder / MANIFEST_FILENAME).read_text())["build"]


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            {"precision": "int8"},
            "precision 'int8' is not supported; accepted: fp32, fp16, bf16, int4",
        ),
        ({"dtype": "f64"}, "dtype 'f64' is not supported; accepted: fp32, fp16, bf16"),
        ({"ep": "tpu"}, "Unknown execution provider 'tpu'"),
        ({"precision": "int4", "int4_block_size": 48}, "block size 48"),
        ({"precision": "int4", "int4_accuracy_level": 7}, "accuracy level 7"),
        ({"precision": "fp16", "int4_asymmetric": True}, "int4 options .* precision 'fp16'"),
        ({"context_length": 0}, "context length 0"),
    ],
)
def test_bad_config_fails_when_the_workflow_is_read(config, message):
    with pytest.raises(ValueError, match=message):
        MobiusExport.generate_config(DEFAULT_CPU_ACCELERATOR, config, disable_search=True)


def test_the_default_config_is_valid():
    config = MobiusExport.generate_config(DEFAULT_CPU_ACCELERATOR, {}, disable_search=True)
    assert config.ep is None and config.precision is None and config.smoke_test is True


@pytest.mark.parametrize(
    ("olive_ep", "config", "built_for"),
    [
        ("CUDAExecutionProvider", {}, ("cuda", "fp16")),
        ("WebGpuExecutionProvider", {"precision": "fp32"}, ("webgpu", "fp32")),
        (None, {}, ("cpu", "fp32")),
        ("CUDAExecutionProvider", {"ep": "cpu"}, ("cpu", "fp32")),
        ("CUDAExecutionProvider", {"ep": "CPU"}, ("cpu", "fp32")),
        (None, {"ep": "DmlExecutionProvider"}, ("dml", "fp16")),
    ],
)
def test_the_ep_is_the_pass_option_else_the_accelerators_else_cpu(
    tmp_path, olive_ep, config, built_for
):
    build = _build(export_tiny(tmp_path, config, olive_ep))
    assert (build["execution_provider"], build["precision"]) == built_for


@pytest.mark.parametrize("precision", [{"precision": "int4"}, {}])  # int4 options imply int4
def test_int4_options_reach_the_quantizer(tmp_path, precision):
    config = {
        **precision,
        "int4_block_size": 16,
        "int4_asymmetric": True,
        "int4_accuracy_level": 2,
    }
    handler = export_tiny(tmp_path, config)
    assert Path(handler.model_path).parent.name == "tiny-qwen2-cpu-int4"
    quantization = _build(handler)["quantization"]
    assert quantization["block_size"] == 16
    assert quantization["symmetric"] is False
    assert quantization["accuracy_level"] == 2


def test_graph_capture_reaches_the_provider_options(tmp_path):
    handler = export_tiny(tmp_path, {"ep": "cuda", "graph_capture": True})
    config = json.loads((Path(handler.model_path).parent / "genai_config.json").read_text())
    options = config["model"]["decoder"]["session_options"]["provider_options"]
    assert options == [{"cuda": {"enable_cuda_graph": "1"}}]


def test_the_output_is_model_onnx_with_every_other_bundle_file_additional(tmp_path):
    handler = export_tiny(tmp_path, {})
    assert isinstance(handler, ONNXModelHandler)
    model = Path(handler.model_path)
    folder = model.parent
    assert model.name == "model.onnx"
    assert folder.name == "tiny-qwen2-cpu-fp32"  # the name the card's run instructions use
    additional = {Path(path) for path in handler.model_attributes["additional_files"]}
    assert {path.parent for path in additional} == {folder}
    expected = set(bundle_files(folder)) | {MANIFEST_FILENAME}
    expected -= {"model.onnx", "model.onnx.data"}  # weights travel with the model
    assert {path.name for path in additional} == expected
    assert {"genai_config.json", "tokenizer.json", "README.md", MANIFEST_FILENAME} <= expected
    assert handler.model_attributes["num_hidden_layers"] == 2  # the HF attributes are kept


def test_an_onnx_input_is_refused(tmp_path):
    handler = export_tiny(tmp_path, {})
    export = create_pass_from_dict(MobiusExport, {}, True, DEFAULT_CPU_ACCELERATOR)
    with pytest.raises(
        ConfigError, match="input model type ONNXModelHandler; accepted: an HfModel"
    ):
        export.run(handler, str(tmp_path / "again"))


def _run_on(model: HfModelHandler, tmp_path: Path, config: dict | None = None) -> dict:
    export = create_pass_from_dict(
        MobiusExport, {"smoke_test": False, **(config or {})}, True, DEFAULT_CPU_ACCELERATOR
    )
    handler = export.run(model, str(tmp_path / "run"))
    return json.loads((Path(handler.model_path).parent / MANIFEST_FILENAME).read_text())


@pytest.mark.parametrize(
    ("config", "recorded"), [({}, "from-load-kwargs"), ({"revision": "v2"}, "v2")]
)
def test_the_revision_is_the_pass_option_else_the_load_kwargs_one(tmp_path, config, recorded):
    model = HfModelHandler(model_path=str(TINY_QWEN2), load_kwargs={"revision": "from-load-kwargs"})
    assert _run_on(model, tmp_path, config)["source"]["revision"] == recorded


def test_an_input_adapter_that_is_no_peft_adapter_is_refused(tmp_path):
    """The input model's adapter_path ships as an adapter (tests/adapters/test_lora_olive.py);
    a folder that is no PEFT LoRA adapter is refused as `package --adapter` refuses it."""
    model = HfModelHandler(model_path=str(TINY_QWEN2), adapter_path=str(tmp_path))
    with pytest.raises(ValueError, match="adapter_config.json"):
        _run_on(model, tmp_path)


def test_an_input_loaded_with_quantization_is_refused(tmp_path):
    load_kwargs = {
        "quantization_method": "bitsandbytes",
        "quantization_config": {"load_in_4bit": True},
    }
    model = HfModelHandler(model_path=str(TINY_QWEN2), load_kwargs=load_kwargs)
    with pytest.raises(ConfigError, match="'bitsandbytes'.*precision 'int4' instead"):
        _run_on(model, tmp_path)


def test_an_unmapped_accelerator_ep_is_refused(tmp_path):
    with pytest.raises(ValueError, match="'QNNExecutionProvider' has no mobius-genai counterpart"):
        export_tiny(tmp_path, {}, "QNNExecutionProvider")


def test_the_pass_does_not_call_olives_cache_the_bundles_destination(tmp_path, capsys, caplog):
    caplog.set_level("INFO")
    handler = export_tiny(tmp_path, {})
    said = capsys.readouterr().err + caplog.text
    cache = str(Path(handler.model_path).parent)
    assert "bundle written to" not in said
    assert f"built in Olive's cache {cache}" in said and "output_dir" in said
