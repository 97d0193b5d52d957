"""The memory plan of a vision-language bundle's smoke test counts every graph."""

from __future__ import annotations

import pytest

from mobius_genai.bundle.smoke_plan import model_bytes

pytest.importorskip("onnxruntime_genai")

SECTIONS = ("vision", "embedding", "decoder")


def test_model_bytes_count_every_graph_of_a_vision_language_bundle(gemma3_bundle):
    files = [path for path in gemma3_bundle.iterdir() if ".onnx" in path.name]
    assert {path.name for path in files} == {
        f"{section}.onnx{suffix}" for section in SECTIONS for suffix in ("", ".data")
    }
    assert model_bytes(gemma3_bundle) == sum(path.stat().st_size for path in files)
