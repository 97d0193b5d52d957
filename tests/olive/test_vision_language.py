"""MobiusExport of a vision-language checkpoint (Gemma 3, Qwen2.5-VL, Qwen3-VL, Mistral 3,
LFM2-VL, Gemma 4): the workflow's output is the same multimodal bundle `package` writes (vision, embedding
and decoder graphs, processor config), valid and run by onnxruntime-genai with an image."""

from __future__ import annotations

import pytest

from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.ep import get_ep
from mobius_genai.runtime.smoke import smoke_test
from tests.olive.conftest import local_recipe

#: What Olive writes beside every workflow's output model.
OLIVE_FILES = {"model_config.json", "footprint.json", "output_footprint.json", "run_history.txt"}


@pytest.mark.filterwarnings("ignore::DeprecationWarning:opentelemetry.*")
@pytest.mark.parametrize(
    ("family", "vision_inputs", "image"),
    [
        ("gemma3", {"pixel_values"}, "a 64x64 image"),
        ("qwen2_5_vl", {"pixel_values", "image_grid_thw"}, "a 32x32 image"),
        ("qwen3_vl", {"pixel_values", "image_grid_thw"}, "a 32x32 image"),
        ("mistral3", {"pixel_values"}, "a 16x16 image"),
        ("lfm2_vl", {"pixel_values", "attention_mask", "image_sizes"}, "a 16x16 image"),
        ("gemma4", {"pixel_values", "pixel_position_ids"}, "a 96x96 image"),
    ],
)
def test_mobius_export_writes_the_multimodal_bundle(
    olive_workflow, request, family, vision_inputs, image, tmp_path
):
    _, checkpoint = request.getfixturevalue(f"{family}_checkpoint")
    bundle = request.getfixturevalue(f"{family}_bundle")
    out = olive_workflow(local_recipe("cpu-fp32", tmp_path, model=checkpoint))
    report = validate_bundle(out)  # schema, every graph against genai_config, checksums
    config = report.genai_config["model"]
    assert config["type"] == family
    assert {"vision", "embedding", "decoder"} <= set(config)
    assert set(config["vision"]["inputs"]) == vision_inputs
    same = {"README.md", "mobius_manifest.json"}  # name the folder / its own files
    written = {path.name for path in out.iterdir()} - OLIVE_FILES
    assert written == {path.name for path in bundle.iterdir()}
    for name in sorted(written - same):
        assert (out / name).read_bytes() == (bundle / name).read_bytes(), name
    assert f"with {image}" in smoke_test(out, get_ep("cpu")).note
