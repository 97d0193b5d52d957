"""MobiusExport of a vision-language checkpoint: the workflow's output is the same multimodal
bundle `package` writes (vision, embedding and decoder graphs, processor config), valid and
run by onnxruntime-genai with an image."""

from __future__ import annotations

import pytest

from mobius_genai.bundle.smoke import smoke_test
from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.ep import get_ep
from tests.olive.conftest import local_recipe

#: What Olive writes beside every workflow's output model.
OLIVE_FILES = {"model_config.json", "footprint.json", "output_footprint.json", "run_history.txt"}


@pytest.mark.filterwarnings("ignore::DeprecationWarning:opentelemetry.*")
def test_mobius_export_writes_the_multimodal_bundle(
    olive_workflow, gemma3_checkpoint, gemma3_bundle, tmp_path
):
    out = olive_workflow(local_recipe("cpu-fp32", tmp_path, model=gemma3_checkpoint[1]))
    report = validate_bundle(out)  # schema, every graph against genai_config, checksums
    assert report.genai_config["model"]["type"] == "gemma3"
    same = {"README.md", "mobius_manifest.json"}  # name the folder / its own files
    written = {path.name for path in out.iterdir()} - OLIVE_FILES
    assert written == {path.name for path in gemma3_bundle.iterdir()}
    for name in sorted(written - same):
        assert (out / name).read_bytes() == (gemma3_bundle / name).read_bytes(), name
    assert "with a 64x64 image" in smoke_test(out, get_ep("cpu")).note
