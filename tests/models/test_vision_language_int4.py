"""INT4 for a vision-language bundle: the decoder's MatMuls become MatMulNBits, the embedding
graph's token table GatherBlockQuantized, the vision tower stays in the bundle's float dtype;
the bundle runs with an image."""

from __future__ import annotations

import json
from pathlib import Path

import onnx

from mobius_genai.packager import package
from tests._ort import saved_ops

MATMUL_NBITS = ("com.microsoft", "MatMulNBits")
FLOAT_TYPES = {onnx.TensorProto.FLOAT}


def _initializer_types(path: Path) -> set[int]:
    return {
        tensor.data_type
        for tensor in onnx.load(str(path), load_external_data=False).graph.initializer
    }


def test_int4_quantizes_the_decoder_and_keeps_the_vision_tower_float(
    gemma3_checkpoint, tmp_path, capfd
):
    bundle = package(gemma3_checkpoint[1], "cpu", tmp_path / "bundle", precision="int4")
    assert MATMUL_NBITS in saved_ops(bundle / "decoder.onnx")
    assert ("", "MatMul") not in saved_ops(bundle / "decoder.onnx")
    assert MATMUL_NBITS not in saved_ops(bundle / "vision.onnx")
    assert _initializer_types(bundle / "vision.onnx") <= FLOAT_TYPES | {onnx.TensorProto.INT64}
    assert ("", "MatMul") in saved_ops(bundle / "vision.onnx")
    # the token table, read by the ids with the image tokens' mapped to row 0
    embedding = saved_ops(bundle / "embedding.onnx")
    assert ("com.microsoft", "GatherBlockQuantized") in embedding and MATMUL_NBITS not in embedding
    manifest = json.loads((bundle / "mobius_manifest.json").read_text())
    assert manifest["build"]["precision"] == "int4"
    # the decoder looks up no table (its tied head is MatMulNBits): the embedding graph's
    assert manifest["build"]["quantization"]["embedding"] == "int4"
    assert "with a 64x64 image" in capfd.readouterr().err  # the smoke test ran with an image
