"""MobiusFinalize: after later passes changed the model, a valid bundle again, or a clear error."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import onnx
import pytest

pytest.importorskip("olive", reason="the olive extra is not installed: pip install -e '.[olive]'")

from olive.hardware.accelerator import DEFAULT_CPU_ACCELERATOR
from olive.model import ONNXModelHandler
from olive.passes.olive_pass import create_pass_from_dict

from mobius_genai.bundle.manifest import MANIFEST_FILENAME, sha256_file
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.errors import BundleError, ConfigError
from mobius_genai.olive import MobiusFinalize
from tests.olive.conftest import export_tiny


def _finalize(model: ONNXModelHandler, workdir: Path, smoke_test: bool = True) -> ONNXModelHandler:
    final = create_pass_from_dict(
        MobiusFinalize, {"smoke_test": smoke_test}, True, DEFAULT_CPU_ACCELERATOR
    )
    return final.run(model, str(workdir / "final"))


def _later_pass(
    model: ONNXModelHandler, workdir: Path, edit: Callable[[onnx.ModelProto], None]
) -> ONNXModelHandler:
    """What an Olive ONNX pass returns: a rewritten graph (weights inline), same attributes."""
    proto = onnx.load(model.model_path)
    edit(proto)
    path = workdir / "later" / "model.onnx"
    path.parent.mkdir()
    onnx.save(proto, path)
    return ONNXModelHandler(model_path=str(path), model_attributes=model.model_attributes)


def _set_doc_string(proto: onnx.ModelProto) -> None:
    proto.doc_string = "rewritten by a later pass"


def test_a_rewritten_model_becomes_a_bundle_whose_manifest_matches_again(tmp_path):
    exported = export_tiny(tmp_path, {})
    changed = _later_pass(exported, tmp_path, _set_doc_string)
    with pytest.raises(BundleError, match="model.onnx.data: listed in mobius_manifest.json"):
        validate_bundle(_gather(changed, tmp_path / "unfinalized"))

    final = _finalize(changed, tmp_path)
    folder = Path(final.model_path).parent
    assert folder.name == "tiny-qwen2-cpu-fp32"
    report = validate_bundle(folder)  # genai_config vs graph, every checksum
    files = report.manifest["files"]
    assert "model.onnx.data" not in files  # the later pass put the weights inline
    assert files["model.onnx"]["sha256"] == sha256_file(changed.model_path)
    assert report.manifest["dependencies"]["olive-ai"]
    assert "`model.onnx.data`" in (Path(exported.model_path).parent / "README.md").read_text()
    assert "`model.onnx.data`" not in (folder / "README.md").read_text()  # card refreshed
    additional = {Path(path).name for path in final.model_attributes["additional_files"]}
    assert {"genai_config.json", MANIFEST_FILENAME, "README.md", "tokenizer.json"} <= additional
    assert all(Path(path).parent == folder for path in final.model_attributes["additional_files"])
    exported_manifest = Path(exported.model_path).parent / MANIFEST_FILENAME
    assert "model.onnx.data" in json.loads(exported_manifest.read_text())["files"]  # cache intact


def _gather(model: ONNXModelHandler, folder: Path) -> Path:
    """The folder Olive would save without MobiusFinalize: the model beside the old sidecars."""
    folder.mkdir()
    (folder / "model.onnx").write_bytes(Path(model.model_path).read_bytes())
    for path in model.model_attributes["additional_files"]:
        (folder / Path(path).name).write_bytes(Path(path).read_bytes())
    return folder


def test_a_graph_that_no_longer_fits_genai_config_is_refused(tmp_path):
    def rename_logits(proto: onnx.ModelProto) -> None:
        for node in proto.graph.node:
            node.output[:] = ["scores" if name == "logits" else name for name in node.output]
        proto.graph.output[0].name = "scores"

    exported = export_tiny(tmp_path, {})
    changed = _later_pass(exported, tmp_path, rename_logits)
    with pytest.raises(BundleError, match="'logits' is not a graph output") as info:
        _finalize(changed, tmp_path, smoke_test=False)
    assert isinstance(info.value, ValueError)


def test_a_model_without_genai_config_is_refused(tmp_path):
    exported = export_tiny(tmp_path, {})
    bare = ONNXModelHandler(model_path=exported.model_path)
    with pytest.raises(ConfigError, match="no genai_config.json among its additional_files"):
        _finalize(bare, tmp_path)


@pytest.mark.parametrize("name", ["genai_config.json", MANIFEST_FILENAME])
def test_a_sidecar_of_another_shape_is_one_error(tmp_path, name):
    exported = export_tiny(tmp_path, {})
    sidecar = next(
        Path(path) for path in exported.model_attributes["additional_files"] if path.endswith(name)
    )
    sidecar.write_text("[]")
    with pytest.raises(BundleError) as info:
        _finalize(exported, tmp_path, smoke_test=False)
    assert str(info.value) == f"MobiusFinalize: {name}: (top level): [] is not of type 'object'"
