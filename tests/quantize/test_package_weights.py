"""`quantize_package` follows the target's int4 plan alone, and the precision it returns, the
one that names the bundle folder, is what the bundle holds, for float, GGUF and GPTQ sources."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import onnx
import onnx_ir as ir
import pytest

from mobius_genai import build, resolve_target
from mobius_genai.checkpoint.opening import stored_bits
from mobius_genai.cli import main
from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.packager import bundle_name
from mobius_genai.quantize import Int4Options
from mobius_genai.quantize.package_weights import quantize_package
from mobius_genai.quantize.plan import DEQUANTIZE_LINEAR
from mobius_genai.target import Target
from tests._prequantized import write_quantized_pair
from tests.checkpoint.gguf._tiny import write_tiny_gguf
from tests.checkpoint.prequantized.test_gptq_awq import FORMATS, _float_checkpoint
from tests.conftest import TINY_QWEN2

#: Quick rounding: these tests are about which ops are written, not about their accuracy.
QUICK = Int4Options(quality="builder")


def _quantized(source: Path, target: Target) -> ir.Model:
    built = build(source, target=target, progress=False)
    quantize_package(built, target)
    return built[built.decoder_key]


def _levels(model: ir.Model) -> set[int]:
    """The accuracy level of each MatMulNBits (0: the attribute's default, left out)."""
    return {
        node.attributes.get_int("accuracy_level", 0)
        for node in model.graph
        if node.domain == MS_DOMAIN and node.op_type == "MatMulNBits"
    }


def _ops(model: ir.Model) -> set[str]:
    return {node.op_type for node in model.graph}


def _replanned(target: Target, **changes) -> Target:
    return dataclasses.replace(target, int4_plan=dataclasses.replace(target.int4_plan, **changes))


def test_int4_asked_follows_the_plan_not_the_eps_capabilities():
    """The CPU EP has GatherBlockQuantized and level 4; a plan saying otherwise is what the
    graph gets, so nothing after resolve_target asks the capabilities again."""
    target = resolve_target("cpu", int4=QUICK)
    as_resolved = _quantized(TINY_QWEN2, target)
    assert {"MatMulNBits", "GatherBlockQuantized"} <= _ops(as_resolved)
    assert _levels(as_resolved) == {4}

    replanned = _quantized(TINY_QWEN2, _replanned(target, gather=False, accuracy_level=1))
    assert "MatMulNBits" in _ops(replanned) and "GatherBlockQuantized" not in _ops(replanned)
    assert _levels(replanned) == {1}

    standard = _quantized(TINY_QWEN2, _replanned(target, matmul=DEQUANTIZE_LINEAR))
    assert "DequantizeLinear" in _ops(standard)
    assert not {"MatMulNBits", "GatherBlockQuantized"} & _ops(standard)


def test_a_sources_stored_integers_follow_the_plan(tmp_path):
    gguf = write_tiny_gguf(tmp_path / "model.gguf", "llama")
    target = resolve_target("cpu", stored=stored_bits(gguf))
    kept = _quantized(gguf, target)
    assert {"MatMulNBits", "GatherBlockQuantized"} <= _ops(kept) and _levels(kept) == {4}
    replanned = _quantized(gguf, _replanned(target, gather=False, accuracy_level=2))
    assert "GatherBlockQuantized" not in _ops(replanned) and _levels(replanned) == {2}


def _gptq_8bit(tmp_path: Path) -> Path:
    float_ckpt = _float_checkpoint(tmp_path / "float")
    write_quantized_pair(float_ckpt, tmp_path / "q", tmp_path / "ref", FORMATS["gptq-8bit"])
    return tmp_path / "q"


def _held(bundle: Path) -> str:
    """'int4' when the bundle's graph holds 4-bit weights, 'int8' when its quantized weights
    are all 8-bit, else its float dtype's name."""
    graph = onnx.load(bundle / "model.onnx", load_external_data=False).graph
    widths = {
        next((a.i for a in node.attribute if a.name == "bits"), 4)
        for node in graph.node
        if node.op_type in ("MatMulNBits", "GatherBlockQuantized")
    }
    if widths:
        return "int4" if 4 in widths else f"int{min(widths)}"
    initializers = {tensor.name: tensor.data_type for tensor in graph.initializer}
    four_bit = {onnx.TensorProto.INT4, onnx.TensorProto.UINT4}
    if any(
        initializers.get(node.input[0]) in four_bit
        for node in graph.node
        if node.op_type == "DequantizeLinear"
    ):
        return "int4"
    manifest = json.loads((bundle / "mobius_manifest.json").read_text())
    return manifest["build"]["dtype"]


@pytest.mark.parametrize(
    ("source", "options", "precision"),
    [
        ("float", (), "fp32"),
        ("float", ("--int4-quality", "builder"), "int4"),
        ("float", ("--precision", "int4", "--ep", "onnx-standard"), "int4"),
        ("gguf", (), "int4"),  # its 4-bit blocks kept
        ("gguf", ("--precision", "fp16"), "fp16"),  # dequantized
        ("gptq-8bit", (), "int8"),  # 8-bit integers kept
        ("gptq-8bit", ("--precision", "fp32"), "fp32"),  # dequantized
    ],
)
def test_the_folder_is_named_for_the_precision_the_bundle_holds(
    tmp_path, monkeypatch, source, options, precision
):
    model = {
        "float": lambda: TINY_QWEN2,
        "gguf": lambda: write_tiny_gguf(tmp_path / "model.gguf", "llama"),
        "gptq-8bit": lambda: _gptq_8bit(tmp_path),
    }[source]()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    args = ["package", str(model), "--no-smoke-test", "--quiet"]
    assert main([*args, *(() if "--ep" in options else ("--ep", "cpu")), *options]) == 0
    (bundle,) = work.iterdir()
    ep = "onnx-standard" if "onnx-standard" in options else "cpu"
    assert bundle.name == bundle_name(model, ep, precision)
    manifest = json.loads((bundle / "mobius_manifest.json").read_text())
    assert manifest["build"]["precision"] == precision
    assert _held(bundle) == precision
