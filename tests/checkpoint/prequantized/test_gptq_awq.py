"""GPTQ and AWQ checkpoints → MatMulNBits with the stored integers (no second rounding).

The tests quantize a tiny random model themselves and pack it per each format's definition
(tests/_prequantized.py); the bundle's logits must equal transformers' on the same model with
the weights dequantized by the format's formula, and the MatMulNBits integers, scales and zero
points must be the stored ones.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import numpy_helper

import mobius_genai
from mobius_genai.cli import main
from mobius_genai.errors import ConfigError
from mobius_genai.quantize import Int4Options
from tests._hf import hf_reference_logits, write_tiny_checkpoint
from tests._ort import max_abs_diff, run_like_reference
from tests._prequantized import Format, Quantized, write_quantized_pair
from tests.conftest import TINY_QWEN2

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt")
PROMPT = np.array([[381, 17, 92, 250, 33, 301, 8, 140]], np.int64)


def _float_checkpoint(folder: Path, family: str = "qwen2") -> Path:
    ckpt = write_tiny_checkpoint(
        folder, family, seed=5, vocab_size=384, bos_token_id=381, eos_token_id=383
    )
    for name in TOKENIZER_FILES:
        shutil.copyfile(TINY_QWEN2 / name, ckpt / name)
    return ckpt


def _unpack(packed: np.ndarray, bits: int, count: int) -> np.ndarray:
    """[rows, ...] uint8 → [rows, count] values, low bits first."""
    rows = packed.reshape(packed.shape[0], -1)
    if bits == 8:
        return rows[:, :count]
    return np.stack([rows & 0x0F, rows >> 4], axis=-1).reshape(rows.shape[0], -1)[:, :count]


def _nbits_nodes(bundle: Path) -> list[dict[str, np.ndarray]]:
    model = onnx.load(str(bundle / "model.onnx"))
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    # float zero points z are written as integer zero points round(z) plus block mins
    # (round(z) - z) * scale [K/bs, N], added by a MatMul named after the MatMulNBits
    mins = {
        n.name: inits[n.input[1]]
        for n in model.graph.node
        if n.op_type == "MatMul" and n.name.endswith("_mins")
    }
    nodes = []
    for node in model.graph.node:
        if node.op_type != "MatMulNBits":
            continue
        attrs = {a.name: a.i for a in node.attribute}
        n, k, bits, bs = attrs["N"], attrs["K"], attrs["bits"], attrs["block_size"]
        found = {"values": _unpack(inits[node.input[1]], bits, k), "scales": inits[node.input[2]]}
        if f"{node.name}_mins" in mins:
            whole = _unpack(inits[node.input[3]], bits, k // bs).astype(np.float32)
            rest = -mins[f"{node.name}_mins"].T / found["scales"].reshape(n, -1)
            found["zeros"] = whole + rest
            assert np.array_equal(whole, np.clip(np.rint(found["zeros"]), 0, (1 << bits) - 1))
        elif len(node.input) > 3 and node.input[3]:
            zp = inits[node.input[3]]
            found["zeros"] = zp if zp.dtype != np.uint8 else _unpack(zp, bits, k // bs)
        else:
            found["zeros"] = np.full((n, k // bs), 1 << (bits - 1))
        found["level"] = attrs.get("accuracy_level", 0)
        nodes.append(found)
    return nodes


def _expected(integers: dict[str, Quantized]) -> list[dict[str, np.ndarray]]:
    """Stored integers per weight (and q/k/v concatenated), in the group-sorted input order."""
    rows = {}
    for name, quantized in integers.items():
        order = np.argsort(quantized.g_idx, kind="stable")
        rows[name] = {
            "values": quantized.q[:, order],
            "scales": quantized.scales.T.astype(np.float32),
            "zeros": quantized.zeros.T,
        }
    for name in list(rows):
        if ".q_proj." in name:
            parts = [rows[name.replace("q_proj", proj)] for proj in ("q_proj", "k_proj", "v_proj")]
            rows[f"{name}:qkv"] = {key: np.concatenate([p[key] for p in parts]) for key in parts[0]}
    return list(rows.values())


def _matches(found: dict[str, np.ndarray], expected: dict[str, np.ndarray]) -> bool:
    """Integers and scales equal; zero points equal up to the float rounding of block mins."""
    return all(
        found[key].shape == expected[key].shape
        and np.allclose(
            found[key].astype(np.float32),
            expected[key].astype(np.float32),
            rtol=1e-6 if key == "zeros" else 0,
            atol=0,
        )
        for key in ("values", "scales", "zeros")
    )


FORMATS = {
    "gptq-asym": Format("gptq"),
    "gptq-sym": Format("gptq", symmetric=True),
    "gptq-act-order-asym": Format("gptq", act_order=True),
    "gptq-act-order-sym": Format("gptq", act_order=True, symmetric=True),
    "gptq-v2-llama": Format("gptq", version="gptq_v2"),
    "gptq-8bit": Format("gptq", bits=8, version="gptq_v2", act_order=True),
    "awq": Format("awq", version="gemm"),
}


@pytest.mark.parametrize("name", list(FORMATS))
def test_bundle_equals_dequantized_model_and_keeps_the_integers(tmp_path, name):
    fmt = FORMATS[name]
    float_ckpt = _float_checkpoint(tmp_path / "float", "llama" if "llama" in name else "qwen2")
    integers = write_quantized_pair(float_ckpt, tmp_path / "q", tmp_path / "ref", fmt)
    bundle = mobius_genai.package(
        tmp_path / "q",
        "cpu",
        tmp_path / "bundle",
        precision="int4",
        int4=Int4Options(accuracy_level=0),
        prune_lm_head=False,
        smoke_test=fmt.method == "awq",
        quiet=True,
    )
    reference = hf_reference_logits(tmp_path / "ref", PROMPT, decode_steps=3)
    session = ort.InferenceSession(str(bundle / "model.onnx"), providers=["CPUExecutionProvider"])
    assert max_abs_diff(run_like_reference(session, reference), reference.logits) <= 1e-4

    nodes = _nbits_nodes(bundle)
    expected = _expected(integers)
    assert len(nodes) >= 3 * 5  # 3 layers x (q/k/v packed or not, o, gate, up, down)
    assert all(any(_matches(found, want) for want in expected) for found in nodes)
    assert {found["level"] for found in nodes} == {0}
    manifest = json.loads((bundle / "mobius_manifest.json").read_text())
    summary = manifest["build"]["prequantized"]
    assert summary["weights"] == len(nodes) and summary["bits"] == [fmt.bits]
    assert (summary["act_order_gathers"] > 0) == fmt.act_order
    kinds = summary["tensors"]  # 3 layers x q, k, v, o, gate, up, down kept; the rest float
    assert kinds.pop(f"{fmt.method.upper()} {fmt.bits}-bit") == {f"kept {fmt.bits}-bit": 21}
    assert all(set(outcomes) == {"float (fp32)"} for outcomes in kinds.values()), kinds
    card = (bundle / "README.md").read_text()
    assert f"pre-quantized source ({fmt.method.upper()} {fmt.bits}-bit" in card


def test_act_order_needs_no_g_idx_input_and_gathers_the_activations(tmp_path):
    float_ckpt = _float_checkpoint(tmp_path / "float")
    write_quantized_pair(
        float_ckpt, tmp_path / "q", tmp_path / "ref", FORMATS["gptq-act-order-asym"]
    )
    bundle = mobius_genai.package(
        tmp_path / "q", "cpu", tmp_path / "b", smoke_test=False, quiet=True
    )
    graph = onnx.load(str(bundle / "model.onnx"), load_external_data=False).graph
    nbits = [node for node in graph.node if node.op_type == "MatMulNBits"]
    assert nbits and all(len(node.input) <= 4 for node in nbits)  # no g_idx (input 4)
    producers = {out: node for node in graph.node for out in node.output}
    assert all(producers[node.input[0]].op_type == "Gather" for node in nbits)
    # the default accuracy level is the EP's, and the bundle says int4
    assert {a.i for node in nbits for a in node.attribute if a.name == "accuracy_level"} == {4}
    manifest = json.loads((bundle / "mobius_manifest.json").read_text())
    assert manifest["build"]["precision"] == "int4"
    assert manifest["build"].get("quantization") is None  # nothing rounded by us


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"quant_method": "bitsandbytes"}, "quant_method is 'bitsandbytes'"),
        ({"bits": 3}, "bits is 3"),
        ({"checkpoint_format": "marlin"}, "'marlin'"),
        ({"group_size": 24}, "group_size 24"),
    ],
)
def test_unhandled_quantization_config_is_named_and_nothing_written(tmp_path, change, named):
    float_ckpt = _float_checkpoint(tmp_path / "float")
    write_quantized_pair(float_ckpt, tmp_path / "q", tmp_path / "ref", FORMATS["gptq-asym"])
    config_path = tmp_path / "q" / "config.json"
    config = json.loads(config_path.read_text())
    config["quantization_config"].update(change)
    config_path.write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=named):
        mobius_genai.package(tmp_path / "q", "cpu", tmp_path / "out", quiet=True)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("options", "name"), [((), "q-cpu-int4"), (("--precision", "fp16"), "q-cpu-fp16")]
)
def test_without_precision_a_4_bit_checkpoint_is_named_int4_and_a_float_one_dequantizes(
    tmp_path, monkeypatch, options, name
):
    """The folder name, the manifest and the bundle say one precision: the checkpoint's int4
    when none is asked (its integers kept), else the one asked (its integers dequantized)."""
    float_ckpt = _float_checkpoint(tmp_path / "float")
    write_quantized_pair(float_ckpt, tmp_path / "q", tmp_path / "ref", FORMATS["gptq-asym"])
    monkeypatch.chdir(tmp_path)
    args = ["package", str(tmp_path / "q"), "--ep", "cpu", "--no-smoke-test", "--quiet"]
    assert main([*args, *options]) == 0
    bundle = tmp_path / name
    manifest = json.loads((bundle / "mobius_manifest.json").read_text())
    assert manifest["build"]["precision"] == name.rsplit("-", 1)[1]
    assert bool(_nbits_nodes(bundle)) == (name.endswith("int4"))
