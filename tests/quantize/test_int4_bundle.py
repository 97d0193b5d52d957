"""onnxruntime-genai runs a cpu int4 bundle assembled by hand (build → quantize → bundle).

The packager's smoke test checks that og's greedy tokens equal a plain onnxruntime greedy loop
over the same int4 graph (MatMulNBits at accuracy level 4, GatherBlockQuantized sharing the tied
table). Until the packager calls quantize_int4 itself, the bundle is written here.
"""

from __future__ import annotations

import pytest

import mobius_genai
from mobius_genai.bundle import validate_bundle
from mobius_genai.ep import get_ep
from mobius_genai.packager import write_bundle
from mobius_genai.quantize import Int4Options, quantize_int4
from mobius_genai.quantize.calibrate import Calibration
from mobius_genai.runtime.smoke import smoke_test
from tests.conftest import TINY_QWEN2


@pytest.mark.parametrize(
    ("quality", "embedding"),
    [
        ("builder", "int4-shared"),
        ("balanced", "int8-shared"),
        ("mixed", "int4-shared"),
        ("calibrated", "int4-shared"),
        ("calibrated-mixed", "int4-shared"),
    ],
)
def test_onnxruntime_genai_generates_with_the_cpu_int4_bundle(quality, embedding, tmp_path):
    caps = get_ep("cpu")
    built = mobius_genai.build(TINY_QWEN2, caps, "f32")
    calibration = Calibration(tokens=128)  # (the model's positions; used by `calibrated`)
    report = quantize_int4(
        built["model"], Int4Options(quality=quality), caps, calibration=calibration
    )
    assert report.embedding == embedding
    folder = tmp_path / "bundle"
    folder.mkdir()
    write_bundle(built, folder, name=folder.name, precision="int4", progress=False)
    validate_bundle(folder)
    result = smoke_test(folder, caps, max_new_tokens=16)
    assert result.ran, result.note
    assert len(result.tokens) == 16
    assert "same as a plain onnxruntime loop" in result.note
