"""`package model.gguf --precision P`: one precision, resolved with what the GGUF stores,
names the folder, fills the manifest and the card, and is what the bundle holds.

Without `--precision` a GGUF of 4-bit blocks is an int4 bundle (its integers kept); a float
precision dequantizes every block, and the float bundle's logits equal transformers' on the
same GGUF (which dequantizes it to float32 too).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from mobius_genai.checkpoint.opening import stored_bits
from mobius_genai.cli import main
from mobius_genai.target import resolve_target
from tests._hf import hf_reference_logits
from tests._ort import run_like_reference
from tests.checkpoint.gguf._tiny import write_tiny_gguf
from tests.checkpoint.gguf.test_smollm2 import _gguf as smollm2_gguf

PROMPT = np.array([[5, 17, 33, 8, 200, 91, 383]])
#: float32 summation order only: the blocks are dequantized as transformers dequantizes them.
LOGITS_ATOL = 1e-4
_QUANTIZED_OPS = {"MatMulNBits", "GatherBlockQuantized"}


def _package(gguf: Path, *options: str) -> int:
    return main(["package", str(gguf), "--ep", "cpu", "--no-smoke-test", "--quiet", *options])


def _ops(bundle: Path) -> set[str]:
    return {
        n.op_type for n in onnx.load(bundle / "model.onnx", load_external_data=False).graph.node
    }


def _precision_words(bundle: Path) -> tuple[str, str]:
    manifest = json.loads((bundle / "mobius_manifest.json").read_text())
    card = (bundle / "README.md").read_text()
    weights = next(line for line in card.splitlines() if line.startswith("| Weights |"))
    return manifest["build"]["precision"], weights


def test_a_float_precision_dequantizes_the_gguf_and_the_name_says_so(tmp_path, monkeypatch):
    gguf = write_tiny_gguf(tmp_path / "model.gguf", "llama")
    monkeypatch.chdir(tmp_path)
    assert _package(gguf, "--precision", "fp32") == 0
    bundle = tmp_path / "model-cpu-fp32"
    assert not _ops(bundle) & _QUANTIZED_OPS
    assert _precision_words(bundle) == ("fp32", "| Weights | fp32, precision fp32 |")
    assert "dequantized: a float bundle" in (bundle / "README.md").read_text()
    run = hf_reference_logits(gguf, PROMPT, decode_steps=3)
    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    ours = run_like_reference(session, run)
    for step, (logits, reference) in enumerate(zip(ours, run.steps, strict=True)):
        diff = np.abs(logits[:, -1] - reference.logits[:, -1]).max()
        assert diff <= LOGITS_ATOL, (step, diff)


@pytest.mark.parametrize("options", [(), ("--precision", "int4")])
def test_a_gguf_of_4_bit_blocks_is_an_int4_bundle_by_name_too(tmp_path, monkeypatch, options):
    gguf = write_tiny_gguf(tmp_path / "model.gguf", "llama")
    monkeypatch.chdir(tmp_path)
    assert _package(gguf, *options) == 0
    bundle = tmp_path / "model-cpu-int4"
    assert _ops(bundle) >= _QUANTIZED_OPS
    assert _precision_words(bundle) == ("int4", "| Weights | fp32, precision int4 |")


#: Every matrix of the tiny llama GGUF in Q8_0 (its table and output are Q8_0 already).
_ALL_Q8_0 = {name: "Q8_0" for name in ("attn_q", "attn_k", "attn_v", "attn_output")} | {
    name: "Q8_0" for name in ("ffn_gate", "ffn_up", "ffn_down")
}


def test_a_gguf_of_8_bit_blocks_alone_is_an_int8_bundle_by_name_too(tmp_path, monkeypatch):
    """Q8_0 blocks are kept 8-bit in MatMulNBits: the folder, the manifest and the card say
    int8 (not fp32, which the bundle's weights are not); a float precision still dequantizes."""
    gguf = write_tiny_gguf(tmp_path / "model.gguf", "llama", types=_ALL_Q8_0)
    assert stored_bits(gguf) == {8}
    monkeypatch.chdir(tmp_path)
    assert _package(gguf) == 0
    bundle = tmp_path / "model-cpu-int8"
    assert "MatMulNBits" in _ops(bundle)
    assert _precision_words(bundle) == ("int8", "| Weights | fp32, precision int8 |")
    assert _package(gguf, "--precision", "fp32") == 0
    assert not _ops(tmp_path / "model-cpu-fp32") & _QUANTIZED_OPS


@pytest.mark.parametrize(
    ("stored", "precision", "expected"),
    [({8}, None, "int8"), ({4, 8}, None, "int4"), ({8}, "int4", "int4"), ({8}, "fp16", "fp16")],
)
def test_the_kept_integers_name_the_precision(stored, precision, expected):
    """The narrowest kept width names it; a precision asked wins. The EP without MatMulNBits
    (onnx-standard) dequantizes them: its dtype's name."""
    assert resolve_target("cpu", precision=precision, stored=stored).precision == expected
    assert resolve_target("onnx-standard", stored={8}).precision == "fp32"


def test_a_float_precision_and_int4_give_different_bundles(tmp_path):
    gguf = write_tiny_gguf(tmp_path / "model.gguf", "llama")
    for precision in ("fp32", "int4"):
        assert _package(gguf, "--precision", precision, "-o", str(tmp_path / precision)) == 0
    data = [(tmp_path / p / "model.onnx.data").read_bytes() for p in ("fp32", "int4")]
    assert data[0] != data[1]
    assert len(data[0]) > 2 * len(data[1])  # float32 weights against 4-bit blocks


def test_smollm2_q4_1_is_int4_unless_a_float_precision_is_asked():
    """The first-hour case: SmolLM2-135M-Instruct.Q4_1.gguf (Q4_1 matrices, a Q8_0 table)."""
    stored = stored_bits(smollm2_gguf())
    assert stored == {4, 8}
    assert resolve_target("cpu", stored=stored).precision == "int4"
    fp32 = resolve_target("cpu", precision="fp32", stored=stored)
    assert (fp32.precision, fp32.dequantize_stored) == ("fp32", True)
