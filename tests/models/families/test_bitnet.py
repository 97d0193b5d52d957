"""BitNet b1.58 in its ternary forms (tests/models/families/_bitnet.py) against transformers:
packed 2-bit weights with AutoBitLinear's and BitLinear's weight_scale, and bf16 master
weights ternarized online. The float form (no quantization_config) is a row of
tests/_hf.py, run by test_parity.py's and test_bundles.py's family lists.

The int8 activations are a rounding step: a value whose x * 127 / absmax lies within a float
rounding of .5 rounds one way in transformers and possibly the other after a different
matmul's rounding upstream, moving that token's logits by ~1e-2. The prompts below have no
such value; the quantize-dequantize itself is checked bit for bit on its own.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import onnxruntime_genai as og
import pytest
import torch
from onnxscript import GraphBuilder
from safetensors.numpy import load_file, save_file
from transformers.integrations.bitnet import ActQuant

import mobius_genai
from mobius_genai.checkpoint.prequantized import bitnet as stored
from mobius_genai.components import bitlinear
from mobius_genai.errors import ConfigError
from mobius_genai.quantize import Int4Options
from tests._hf import hf_greedy_tokens, hf_reference_logits, write_tiny_checkpoint
from tests._ort import graph_diffs, mutant_diffs
from tests.conftest import TINY_QWEN2
from tests.models.families._bitnet import FORMS, ternary_checkpoint, ternary_values

TOLERANCE = 1e-4  # f32, max abs logits difference over the prefill and 4 decode steps
IDS = np.random.default_rng(2).integers(3, 128, size=(2, 12))


def _ternary(tmp_path: Path, form: str, **overrides) -> Path:
    ckpt = write_tiny_checkpoint(tmp_path / "float", "bitnet", seed=1, **overrides)
    return ternary_checkpoint(ckpt, tmp_path / form, form)


@pytest.mark.parametrize("form", sorted(FORMS))
def test_ternary_forms_match_transformers(form, tmp_path):
    ckpt = _ternary(tmp_path, form)
    reference = hf_reference_logits(ckpt, IDS, decode_steps=4)
    diffs = graph_diffs(ckpt, reference, ("default", "cpu"), tmp_path, progress=False)
    assert max(diffs.values()) <= TOLERANCE, diffs


def test_unpacking_is_transformers_order():
    fields = np.random.default_rng(0).integers(0, 3, size=(4, 6, 32), dtype=np.uint8)
    packed = np.bitwise_or.reduce(fields << (2 * np.arange(4, dtype=np.uint8))[:, None, None])
    np.testing.assert_array_equal(stored.unpack_ternary(packed), ternary_values(packed))


def test_a_zero_weight_scale_is_named(tmp_path):
    ckpt = _ternary(tmp_path, "bitlinear", vocab_size=384)
    tensors = load_file(ckpt / "model.safetensors")
    tensors["model.layers.2.self_attn.k_proj.weight_scale"][:] = 0
    save_file(tensors, ckpt / "model.safetensors")
    _tokenizer(ckpt)
    with pytest.raises(mobius_genai.WeightsError, match=r"k_proj\.weight_scale is \[0\.0\]"):
        mobius_genai.package(ckpt, "cpu", tmp_path / "out", smoke_test=False, quiet=True)
    assert not (tmp_path / "out").exists()


def test_int8_activations_are_bit_exact_against_activation_quant():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((3, 5, 64)).astype(np.float32)
    x[0, 0, :] = 0  # the absmax floor
    x[1, 0, :2] = [127.0, 0.5]  # 0.5 * 127 / 127: a tie, rounded to even
    x[2, 1, :] *= 1e-7
    graph = _one_op_graph(bitlinear.int8_quant_dequant)
    session = ort.InferenceSession(graph, providers=["CPUExecutionProvider"])
    (ours,) = session.run(None, {"x": x})
    expected = ActQuant.forward(None, torch.from_numpy(x)).numpy()
    # the int8 grid is the same integers; torch.compile divides by a reciprocal (1 ulp)
    scale = np.float32(127) / np.maximum(np.abs(x).max(-1, keepdims=True), np.float32(1e-5))
    np.testing.assert_array_equal(np.round(ours * scale), np.round(expected * scale))
    np.testing.assert_allclose(ours, expected, rtol=3e-7, atol=0)


def _one_op_graph(function) -> bytes:
    """A graph y = function(op, x) over x [3, 5, 64] float32, serialized."""
    graph = ir.Graph([], [], nodes=[], opset_imports={"": 24}, name="g")
    builder = GraphBuilder(graph)
    x = builder.input("x", ir.DataType.FLOAT, [3, 5, 64])
    graph.outputs.append(function(builder.op, x))
    return ir.to_proto(ir.Model(graph, ir_version=10)).SerializeToString()


def _drop_sub_norm(self, op, x):
    """The sub-norm computed (its weight stays read) but not applied."""
    if self.sub_norm is not None:
        zero = op.CastLike(op.Constant(value_float=0.0), x)
        x = op.Add(x, op.Mul(self.sub_norm(op, x), zero))
    return bitlinear.int8_quant_dequant(op, x) if self.int8 else x


def _rows_interleaved(packed):
    """The wrong order: output row 4 r + i from bits 2 i of packed row r."""
    values = (packed[:, None] >> (np.arange(4, dtype=np.uint8)[None, :, None] * 2)) & 3
    return values.reshape(-1, packed.shape[-1]).astype(np.int8) - 1


MUTANTS = {
    "sub_norm_dropped": (bitlinear.BitLinearInput, "forward", _drop_sub_norm),
    "activation_quant_dropped": (bitlinear, "int8_quant_dequant", lambda op, x: x),
    "unpack_order_wrong": (stored, "unpack_ternary", _rows_interleaved),
}


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_parity_fails_without_each_mechanism(mutant, tmp_path, monkeypatch):
    ckpt = _ternary(tmp_path, "autobitlinear")
    ours, changed = mutant_diffs(ckpt, IDS, tmp_path, "bitnet", MUTANTS[mutant], monkeypatch)
    assert ours <= TOLERANCE < changed, (ours, changed)


def _tokenizer(folder: Path) -> None:
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((TINY_QWEN2 / name).read_bytes())


def test_og_generates_transformers_tokens_from_packed_weights(tmp_path):
    ckpt = _ternary(tmp_path, "autobitlinear", vocab_size=384, bos_token_id=381, eos_token_id=383)
    _tokenizer(ckpt)
    bundle = mobius_genai.package(
        ckpt,
        "cpu",
        tmp_path / "bundle",
        int4=Int4Options(accuracy_level=0),
        smoke_test=False,
        quiet=True,
    )
    prompt, new = [381, 17, 92, 250, 33, 301, 8, 140], 16
    model = og.Model(str(bundle))
    params = og.GeneratorParams(model)
    params.set_search_options(do_sample=False, max_length=len(prompt) + new)
    generator = og.Generator(model, params)
    generator.append_tokens(np.asarray([prompt], np.int32))
    tokens = []
    while not generator.is_done():
        generator.generate_next_token()
        tokens.append(int(generator.get_next_tokens()[0]))
    assert tokens == hf_greedy_tokens(ckpt, prompt, new)

    graph = onnx.load(str(bundle / "model.onnx"), load_external_data=False).graph
    nbits = [node for node in graph.node if node.op_type == "MatMulNBits"]
    assert len(nbits) >= 3 * 5  # 3 layers x (q/k/v, o, gate/up, down), packed or not
    assert {a.i for n in nbits for a in n.attribute if a.name == "bits"} == {4}
    manifest = json.loads((bundle / "mobius_manifest.json").read_text())
    assert "BitNet" in json.dumps(manifest["build"]["prequantized"])


def test_projections_are_a_quarter_of_their_16_bit_size(tmp_path):
    ckpt = _ternary(
        tmp_path, "autobitlinear", hidden_size=256, intermediate_size=512, vocab_size=384
    )
    _tokenizer(ckpt)
    _tokenizer(tmp_path / "float")
    sizes = {}
    for name, source, precision in (("ternary", ckpt, None), ("fp16", tmp_path / "float", "fp16")):
        out = tmp_path / f"bundle_{name}"
        bundle = mobius_genai.package(
            source, "cpu", out, precision=precision, smoke_test=False, quiet=True
        )
        sizes[name] = _projection_bytes(bundle)
    # 4-bit integers and a float32 scale per 256 of them, against 16 bits a weight
    assert 3.5 < sizes["fp16"] / sizes["ternary"] <= 4, sizes


def _projection_bytes(bundle: Path) -> int:
    """The bytes of the layers' projection weights (their integers and scales) in a bundle."""
    model = onnx.load(str(bundle / "model.onnx"))
    return sum(
        onnx.numpy_helper.to_array(t).nbytes for t in model.graph.initializer if "_proj" in t.name
    )


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"linear_class": "fancy"}, "linear_class"),
        ({"quantization_mode": "sometimes"}, "quantization_mode"),
        ({"use_rms_norm": True}, "use_rms_norm"),
        ({"modules_to_not_convert": ["model.layers.0.mlp.down_proj"]}, "modules_to_not_convert"),
    ],
)
def test_unhandled_quantization_config_is_named(tmp_path, change, named):
    ckpt = _ternary(tmp_path, "autobitlinear")
    config = json.loads((ckpt / "config.json").read_text())
    config["quantization_config"].update(change)
    (ckpt / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=named):
        mobius_genai.build(ckpt, "default", "f32", progress=False)


def test_packed_weight_of_the_wrong_shape_is_named(tmp_path):
    ckpt = _ternary(tmp_path, "autobitlinear")
    tensors = load_file(ckpt / "model.safetensors")
    name = "model.layers.1.mlp.up_proj.weight"
    tensors[name] = tensors[name][:-1]
    save_file(tensors, ckpt / "model.safetensors")
    with pytest.raises(mobius_genai.WeightsError, match=r"up_proj\.weight has shape"):
        mobius_genai.build(ckpt, "default", "f32", progress=False)
