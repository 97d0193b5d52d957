"""MobiusExport of a Whisper checkpoint: the workflow's output is the speech bundle `package`
writes (encoder and decoder graphs, audio processor config), valid and run by
onnxruntime-genai on generated audio."""

from __future__ import annotations

import pytest

from mobius_genai.bundle.validate import validate_bundle
from mobius_genai.ep import get_ep
from mobius_genai.packager import package
from mobius_genai.runtime.smoke import smoke_test
from tests.models.whisper._whisper import write_whisper_checkpoint, write_whisper_tokenizer
from tests.olive.conftest import local_recipe
from tests.olive.test_vision_language import OLIVE_FILES


@pytest.mark.filterwarnings("ignore::DeprecationWarning:opentelemetry.*")
def test_mobius_export_writes_the_speech_bundle(olive_workflow, tmp_path):
    checkpoint = tmp_path / "whisper"
    write_whisper_checkpoint(checkpoint, "multilingual")
    write_whisper_tokenizer(checkpoint, "multilingual")
    bundle = package(checkpoint, "cpu", tmp_path / "packaged", quiet=True, smoke_test=False)
    out = olive_workflow(local_recipe("cpu-fp32", tmp_path / "olive", model=checkpoint))
    config = validate_bundle(out).genai_config["model"]
    assert config["type"] == "whisper" and {"encoder", "decoder"} <= set(config)
    same = {"README.md", "mobius_manifest.json"}  # name the folder / its own files
    written = {path.name for path in out.iterdir()} - OLIVE_FILES
    assert written == {path.name for path in bundle.iterdir()}
    for name in sorted(written - same):
        assert (out / name).read_bytes() == (bundle / name).read_bytes(), name
    assert "from 2 s of generated audio" in smoke_test(out, get_ep("cpu")).note
