"""package()'s default output name and provenance (target resolution: tests/test_target.py)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import onnx_ir as ir
import pytest

from mobius_genai import _resources, packager
from mobius_genai.bundle.graph import GQA_OP, GraphInfo
from mobius_genai.checkpoint.source import Source
from mobius_genai.ep import get_ep
from mobius_genai.errors import BundleError, ExecutionProviderError
from tests.conftest import TINY_QWEN2

F32, F16, BF16 = ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16


def test_default_output_name(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    cuda = get_ep("cuda")
    assert packager.default_output("Qwen/Qwen2.5-7B", cuda, "fp16") == (
        tmp_path / "Qwen2.5-7B-cuda-fp16"
    )
    assert packager.default_output(TINY_QWEN2, get_ep("cpu"), "fp32") == (
        tmp_path / "tiny-qwen2-cpu-fp32"
    )
    gguf = tmp_path / "SmolLM2-135M.Q4_1.gguf"
    gguf.touch()
    assert packager.default_output(gguf, get_ep("cpu"), "int4").name == "SmolLM2-135M.Q4_1-cpu-int4"


def test_revision_of_a_hub_snapshot(tmp_path: Path):
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "models--Qwen--Qwen2.5-7B" / "snapshots" / commit
    assert packager.source_revision(Source(snapshot, "Qwen/Qwen2.5-7B")) == commit
    assert packager.source_revision(Source(snapshot, "Qwen/Qwen2.5-7B", "main")) == "main"
    assert packager.source_revision(Source(TINY_QWEN2, str(TINY_QWEN2))) is None


def test_output_may_not_be_the_current_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(BundleError, match="would replace the current folder"):
        packager.package(TINY_QWEN2, "cpu", ".", force=True, quiet=True)
    assert list(tmp_path.iterdir()) == []


def test_missing_data_file_is_named():
    with pytest.raises(FileNotFoundError, match="schemas/nope.json"):
        _resources.read_text("schemas/nope.json")


def test_unregistered_capabilities_object(tmp_path: Path):
    """package() takes an EpCapabilities that was never registered, as its signature says."""
    caps = dataclasses.replace(get_ep("cpu"), name="private-cpu")
    with pytest.raises(ExecutionProviderError):
        get_ep("private-cpu")
    out = packager.package(TINY_QWEN2, caps, tmp_path / "bundle", quiet=True, smoke_test=False)
    manifest = json.loads((out / "mobius_manifest.json").read_text())
    assert manifest["build"]["execution_provider"] == "private-cpu"
    assert GQA_OP in GraphInfo.from_file(out / "model.onnx").ops


def _notes(stderr: str) -> list[str]:
    return [line.split("note: ", 1)[1] for line in stderr.splitlines() if "note: " in line]


def test_a_plain_bundle_comes_with_no_notes(tmp_path: Path, capsys):
    packager.package(TINY_QWEN2, "cpu", tmp_path / "b", smoke_test=False)
    assert _notes(capsys.readouterr().err) == []


def test_notes_on_custom_code_long_contexts_and_capture_that_cannot_be_on(tmp_path: Path, capsys):
    checkpoint = tmp_path / "ckpt"
    shutil.copytree(TINY_QWEN2, checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.Evil"}
    (checkpoint / "config.json").write_text(json.dumps(config))
    out = packager.package(
        checkpoint,
        "trt-rtx",
        tmp_path / "b",
        precision="fp32",
        context_length=256,
        smoke_test=False,
    )
    notes = _notes(capsys.readouterr().err)
    assert notes == [
        "config.json names custom code (auto_map: AutoModelForCausalLM); it was not run: the "
        "bundle uses mobius-genai's own 'qwen2' graph",
        "context length 256 is above max_position_embeddings 128: positions past it are outside "
        "what the model was trained on",
        "graph capture is off: it needs GroupQueryAttention's shared KV buffer, which trt-rtx "
        "uses for fp16, bf16 models, not fp32",
    ]
    options = json.loads((out / "genai_config.json").read_text())["model"]["decoder"]
    assert options["session_options"]["provider_options"] == [
        {"NvTensorRtRtx": {"enable_cuda_graph": "0"}}
    ]
    packager.package(checkpoint, "trt-rtx", tmp_path / "q", smoke_test=False, quiet=True)
    assert capsys.readouterr().err == ""  # --quiet silences notes too
