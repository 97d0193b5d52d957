"""`validate` checks a vision-language bundle's vision and embedding graphs against
genai_config's `vision` / `embedding` sections: files, weights, input and output names."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.errors import BundleError


def _rename(section: str, side: str, key: str, name: str) -> Callable[[Path], None]:
    def tamper(folder: Path) -> None:
        path = folder / "genai_config.json"
        config = json.loads(path.read_text())
        config["model"][section].setdefault(side, {})[key] = name
        path.write_text(json.dumps(config))

    return tamper


def _remove(name: str) -> Callable[[Path], None]:
    return lambda folder: (folder / name).unlink()


def _vision_file(name: str) -> Callable[[Path], None]:
    def tamper(folder: Path) -> None:
        path = folder / "genai_config.json"
        config = json.loads(path.read_text())
        config["model"]["vision"]["filename"] = name
        path.write_text(json.dumps(config))

    return tamper


@pytest.mark.parametrize(
    ("tamper", "named"),
    [
        (_vision_file("missing.onnx"), "model.vision.filename: 'missing.onnx' is not a file"),
        (_remove("embedding.onnx"), "model.embedding.filename: 'embedding.onnx' is not a file"),
        (_remove("vision.onnx.data"), "vision.onnx.data: missing"),
        (_remove("processor_config.json"), "model.vision.config_filename"),
        (
            _rename("vision", "outputs", "image_features", "features"),
            "model.vision.outputs.image_features: 'features' is not a graph output",
        ),
        (
            _rename("vision", "inputs", "pixel_values", "pixels"),
            "model.vision.inputs.pixel_values: 'pixels' is not a graph input",
        ),
        (
            _rename("embedding", "inputs", "image_features", "features"),
            "model.embedding.inputs.image_features: 'features' is not a graph input",
        ),
        (
            _rename("embedding", "outputs", "inputs_embeds", "embeds"),
            "model.embedding.outputs.inputs_embeds: 'embeds' is not a graph output",
        ),
        (
            _rename("decoder", "inputs", "inputs_embeds", "embeds"),
            "model.decoder.inputs.inputs_embeds: 'embeds' is not a graph input",
        ),
        (
            _rename("vision", "inputs", "image_sizes", "image_sizes"),
            "model.vision.inputs.image_sizes: 'image_sizes' is not a graph input",
        ),
    ],
)
def test_validate_names_what_the_vision_and_embedding_graphs_lack(
    gemma3_bundle: Path, tmp_path: Path, tamper: Callable[[Path], None], named: str
):
    folder = shutil.copytree(gemma3_bundle, tmp_path / "bundle")
    validate_bundle(folder)
    tamper(folder)
    with pytest.raises(BundleError) as caught:
        validate_bundle(folder, check_hashes=False)
    assert named in str(caught.value)


def test_a_graph_input_the_config_does_not_feed_is_named(gemma3_bundle: Path, tmp_path: Path):
    """onnxruntime-genai feeds only the inputs its section names (or their defaults)."""
    folder = shutil.copytree(gemma3_bundle, tmp_path / "bundle")
    path = folder / "genai_config.json"
    config = json.loads(path.read_text())
    config["model"]["embedding"]["inputs"] = {"input_ids": "input_ids"}
    config["model"]["embedding"]["inputs"]["image_features"] = "other"
    path.write_text(json.dumps(config))
    with pytest.raises(BundleError) as caught:
        validate_bundle(folder, check_hashes=False)
    message = str(caught.value)
    assert "embedding.onnx: graph input 'image_features' is not fed by onnxruntime-genai" in message
