"""`package(..., precision="int4")`: a cpu INT4 bundle that onnxruntime-genai loads and runs."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import onnx

import mobius_genai
from mobius_genai.cli import main
from mobius_genai.quantize import Int4Options
from tests._ort import og_sequence
from tests.conftest import TINY_QWEN2


def _int4_bundle(folder, quality: str, **options) -> tuple[Path, dict]:
    """TINY_QWEN2 packaged for cpu int4 with `quality`, and its manifest's `build.quantization`."""
    out = mobius_genai.package(
        TINY_QWEN2, "cpu", folder, precision="int4", int4=Int4Options(quality=quality), quiet=True,
        **options,
    )  # fmt: skip
    manifest = json.loads((out / "mobius_manifest.json").read_text())
    return out, manifest["build"]["quantization"]


def test_cpu_int4_bundle_generates_and_records_its_choices(tmp_path):
    out, quantization = _int4_bundle(tmp_path / "b", "balanced")
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    ops = Counter(node.op_type for node in graph.node)
    # 2 layers x (packed q/k/v, o, gate, up, down) + tied lm_head sharing the table
    assert ops["MatMulNBits"] == 11
    assert ops["GatherBlockQuantized"] == 1
    levels = {
        attr.i
        for node in graph.node
        if node.op_type == "MatMulNBits"
        for attr in node.attribute
        if attr.name == "accuracy_level"
    }
    assert levels == {4}  # the cpu EP's default accuracy level
    # the balanced recipe: zero points, searched scales, the tied table in 8 bits
    assert (quantization["block_size"], quantization["symmetric"]) == (32, False)
    assert (quantization["quality"], quantization["rounding"]) == ("balanced", "search")
    assert quantization["embedding"] == "int8-shared"
    assert quantization["weights_8bit"] == {"model.embed_tokens.weight": 64}  # K 64
    assert (
        "INT4 MatMulNBits, quality balanced (search rounding), block size 32"
        in (out / "README.md").read_text()
    )
    assert len(og_sequence(out, [1, 2, 3, 4], max_length=24)) == 24


def test_calibrated_bundle_records_its_calibration_and_generates(tmp_path):
    """The `calibrated` recipe: the manifest says the search was activation-weighted (random
    token ids: the model's 128 positions, fewer than the default 256; seed 0)."""
    out, quantization = _int4_bundle(tmp_path / "b", "calibrated")
    assert (quantization["quality"], quantization["rounding"]) == ("calibrated", "search")
    assert quantization["calibration"] == {"tokens": 128, "seed": 0}
    assert (
        "quality calibrated (search rounding weighted by the activations of 128 random tokens, "
        "seed 0)" in (out / "README.md").read_text()
    )
    assert len(og_sequence(out, [1, 2, 3, 4], max_length=20)) == 20


def test_calibration_stays_within_a_shorter_context_length(tmp_path):
    """`--context-length` below max_position_embeddings (128) shortens the rope tables: the
    random prefill takes that many tokens, not the model's positions."""
    _, quantization = _int4_bundle(
        tmp_path / "b", "calibrated", context_length=48, smoke_test=False
    )
    assert quantization["calibration"] == {"tokens": 48, "seed": 0}


def test_cli_int4_options_reach_the_graph(tmp_path, capsys):
    out = tmp_path / "b"
    code = main(
        [
            "package",
            str(TINY_QWEN2),
            "--ep",
            "cpu",
            "-o",
            str(out),
            "--quiet",
            "--no-smoke-test",
            "--precision",
            "int4",
            "--int4-block-size",
            "16",
            "--int4-asymmetric",
            "--int4-accuracy-level",
            "1",
            "--int4-quality",
            "builder",
        ]
    )
    assert code == 0, capsys.readouterr().err
    graph = onnx.load(str(out / "model.onnx"), load_external_data=False).graph
    nbits = [n for n in graph.node if n.op_type == "MatMulNBits"]
    attrs = [{a.name: a.i for a in n.attribute} for n in nbits]
    assert all(a["block_size"] == 16 and a["accuracy_level"] == 1 and a["bits"] == 4 for a in attrs)
    assert all(len(n.input) >= 4 and n.input[3] for n in nbits)  # zero points: asymmetric
