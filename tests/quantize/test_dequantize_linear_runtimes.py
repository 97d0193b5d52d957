"""onnx-standard int4 (blocked DequantizeLinear + MatMul) on two runtimes: onnxruntime and onnx's
ReferenceEvaluator.

What differs between them is onnxruntime's own optimization, not the graph: at its default
optimization level the CPU EP fuses each blocked DequantizeLinear + MatMul into a MatMulNBits
whose accuracy_level comes from the session config entry
`session.qdq_matmulnbits_accuracy_level`, 4 when unset, i.e. activations quantized to int8 per
block (microsoft/onnxruntime#29849 is an open report of the same int8 path moving logits).
The ONNX spec's math is float: the reference evaluator computes it, and so does onnxruntime
at accuracy level 0, to fp32 noise. Our stored weights are what the spec reads (int4 low
nibble first, blocks along K), within the 4-bit rounding of the checkpoint's weights.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import onnxruntime_genai as og
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator
from safetensors.numpy import load_file

import mobius_genai
from mobius_genai.bundle.genai_config import FUSED_INT4_ACCURACY_ENTRY, fused_int4_entries
from mobius_genai.bundle.graph import GraphInfo
from mobius_genai.ep import get_ep
from mobius_genai.quantize import Int4Options, quantize_int4
from tests._hf import write_tiny_checkpoint
from tests._ort import prefill_feeds, reference_evaluator_logits, run_declared
from tests.conftest import TINY_QWEN2
from tests.quantize._reference import dequantized_reference

#: fp32 noise of a float graph against the same math elsewhere (measured <= 2e-5).
F32_TOLERANCE = 1e-4
#: The least that onnxruntime's int8 activations move these logits, relative to the largest
#: logit (measured 3.6-17%): far above fp32 noise.
INT8_ACTIVATIONS_MOVE = 1e-2
IDS = np.array([[1, 5, 9, 17, 33, 2, 70, 100, 3, 64]], np.int64)


def _unpack(raw: bytes, signed: bool, shape: tuple[int, int]) -> np.ndarray:
    """Spec packing, written here independently: two 4-bit values per byte, low nibble first."""
    data = np.frombuffer(raw, np.uint8)
    values = np.stack([data & 0x0F, data >> 4], axis=-1).reshape(-1)[: shape[0] * shape[1]]
    values = values.astype(np.int16)
    if signed:
        values = np.where(values > 7, values - 16, values)
    return values.reshape(shape)


def _session(model: onnx.ModelProto | str, entries: dict[str, str]) -> ort.InferenceSession:
    options = ort.SessionOptions()
    for key, value in entries.items():
        options.add_session_config_entry(key, value)
    source = model if isinstance(model, str) else model.SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def _one_dequantize_matmul(signed: bool, zero_points: bool, rng: np.random.Generator):
    """x @ DequantizeLinear(q, scales[, zero points], axis=0, block_size=32), q int4 or uint4
    [256, 64] written as raw packed bytes; with the float weight the spec gives."""
    k, n, block = 256, 64, 32
    low, high = (-8, 8) if signed else (0, 16)
    q = rng.integers(low, high, (k, n))
    points = rng.integers(low, high, (k // block, n)) * zero_points  # all 0: none written
    scales = rng.uniform(0.01, 0.03, (k // block, n)).astype(np.float32)
    qtype = TensorProto.INT4 if signed else TensorProto.UINT4

    def packed(name: str, values: np.ndarray) -> onnx.TensorProto:
        nibbles = (values.reshape(-1) & 0x0F).astype(np.uint8)
        raw = (nibbles[0::2] | (nibbles[1::2] << 4)).tobytes()  # low nibble first
        assert np.array_equal(_unpack(raw, signed, values.shape), values)
        return helper.make_tensor(name, qtype, values.shape, raw, raw=True)

    initializers = [packed("q", q), numpy_helper.from_array(scales, "scales")]
    if zero_points:
        initializers.append(packed("zp", points))
    inputs = [tensor.name for tensor in initializers]
    dequantize = helper.make_node("DequantizeLinear", inputs, ["w"], axis=0, block_size=block)
    graph = helper.make_graph(
        [dequantize, helper.make_node("MatMul", ["x", "w"], ["y"])],
        "one_dequantize_matmul",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, (4, k))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, (4, n))],
        initializers,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])
    weight = (q - np.repeat(points, block, axis=0)) * np.repeat(scales, block, axis=0)
    return model, weight


@pytest.mark.parametrize(
    ("signed", "zero_points"),
    [(True, False), (False, True), (True, True)],
    ids=["int4", "uint4-zero-points", "int4-zero-points"],
)
def test_onnxruntime_fuses_dequantize_linear_matmul_with_int8_activations(signed, zero_points):
    """The smallest graph that disagrees: one DequantizeLinear + MatMul (our two layouts, and
    signed zero points)."""
    rng = np.random.default_rng(0)
    model, weight = _one_dequantize_matmul(signed, zero_points, rng)
    x = rng.standard_normal((4, weight.shape[0])).astype(np.float32)
    expected = x.astype(np.float64) @ weight
    scale = float(np.abs(expected).max())

    def diff(y: np.ndarray) -> float:
        return float(np.abs(y - expected).max()) / scale

    (reference,) = ReferenceEvaluator(model).run(None, {"x": x})
    exact = _session(model, {FUSED_INT4_ACCURACY_ENTRY: "0"}).run(None, {"x": x})[0]
    assert diff(reference) <= F32_TOLERANCE
    assert diff(exact) <= F32_TOLERANCE
    # onnxruntime's known default (not a bug of ours or of the reference): int8 activations
    fused = _session(model, {}).run(None, {"x": x})[0]
    print(f"\nonnxruntime's defaults vs the spec: {diff(fused):.1e} of the largest output")
    assert diff(fused) > 10 * F32_TOLERANCE
    unfused = ort.SessionOptions()
    unfused.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    plain = ort.InferenceSession(
        model.SerializeToString(), unfused, providers=["CPUExecutionProvider"]
    )
    assert diff(plain.run(None, {"x": x})[0]) <= F32_TOLERANCE


def _onnx_standard_int4(family: str, tmp_path):
    """`family`'s tiny checkpoint, its onnx-standard int4 graph saved (builder, block 16), and
    that graph loaded with its weights."""
    ckpt = write_tiny_checkpoint(tmp_path / "ckpt", family, seed=1)
    caps = get_ep("onnx-standard")
    package = mobius_genai.build(ckpt, caps, "f32", progress=False)
    quantize_int4(package["model"], Int4Options(quality="builder", block_size=16), caps)
    package.save(tmp_path / "q", progress=False)
    path = tmp_path / "q" / "model.onnx"
    return ckpt, path, ir.external_data.load_to_model(ir.load(path))


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma4_text"])
def test_stored_int4_is_the_checkpoint_weight_within_half_a_step(family, tmp_path):
    """Each DequantizeLinear's initializers, unpacked as the spec says, give the checkpoint's
    float weight (transposed to [K, N]) within half a quantization step (a step where
    clipped)."""
    ckpt, _, model = _onnx_standard_int4(family, tmp_path)
    weights = load_file(ckpt / "model.safetensors")
    checked = 0
    for node in model.graph:
        if node.op_type != "DequantizeLinear":
            continue
        data, scales = node.inputs[0], node.inputs[1].const_value.numpy()
        name = data.name.removesuffix("_Q4")
        k, n = (int(d) for d in data.shape)
        block = node.attributes.get_int("block_size")
        q = _unpack(data.const_value.tobytes(), data.dtype == ir.DataType.INT4, (k, n))
        step = np.abs(np.repeat(scales, block, axis=0))
        # onnxruntime's symmetric rounding maps each block's extreme to -8: values of the other
        # sign reach +8 and are clipped to 7 (a whole step); a wrong layout is off by many
        steps = np.where(q == 7, 1.0, 0.5)
        error = np.abs(q * np.repeat(scales, block, axis=0) - weights[name].T)
        assert np.all(error <= steps * step * (1 + 1e-5) + 1e-7), name
        checked += 1
    assert checked == len([node for node in model.graph if node.op_type == "DequantizeLinear"])
    assert checked >= 7  # every projection of a layer at least


@pytest.mark.parametrize("family", ["llama", "qwen2", "gemma4_text"])
def test_onnx_standard_int4_logits_agree_on_both_runtimes(family, tmp_path):
    """The int4 graph's prefill logits equal those of the same graph with numpy-dequantized
    float weights, on the reference evaluator and on onnxruntime with the session entry the
    bundle writes; onnxruntime's defaults do not (its int8 activations)."""
    _, path, model = _onnx_standard_int4(family, tmp_path)
    float_path = dequantized_reference(path, tmp_path / "float")
    float_logits = run_declared(_session(str(float_path), {}), prefill_feeds(model, IDS))["logits"]
    scale = float(np.abs(float_logits).max())
    level = get_ep("onnx-standard").default_int4_accuracy_level
    entries = fused_int4_entries(GraphInfo.from_file(path), level)
    assert entries == {FUSED_INT4_ACCURACY_ENTRY: "0"}

    def diff(entries: dict[str, str]) -> float:
        run = run_declared(_session(str(path), entries), prefill_feeds(model, IDS))
        return float(np.abs(run["logits"] - float_logits).max())

    reference = reference_evaluator_logits(model, IDS)
    assert float(np.abs(reference - float_logits).max()) <= F32_TOLERANCE
    assert diff(entries) <= F32_TOLERANCE
    assert diff({}) > INT8_ACTIVATIONS_MOVE * scale  # onnxruntime's default: level 4


def test_onnx_standard_int4_bundle_runs_the_spec_math_in_og(packaged):
    """og.Generator on the packaged bundle gives the reference evaluator's logits."""
    bundle = packaged("onnx-standard", "int4")
    model = ir.external_data.load_to_model(ir.load(bundle / "model.onnx"))
    reference = reference_evaluator_logits(model, IDS)
    og_model = og.Model(str(bundle))
    params = og.GeneratorParams(og_model)
    params.set_search_options(max_length=IDS.shape[1] + 1)
    generator = og.Generator(og_model, params)
    generator.append_tokens(IDS[0].tolist())
    logits = generator.get_output("logits")
    assert logits.shape == reference.shape
    assert float(np.abs(logits - reference).max()) <= F32_TOLERANCE
    config = json.loads((bundle / "genai_config.json").read_text())
    assert config["model"]["decoder"]["session_options"][FUSED_INT4_ACCURACY_ENTRY] == "0"


def test_asked_accuracy_level_reaches_the_bundle(tiny_int4, tmp_path):
    """`--int4-accuracy-level` sets the fused level of a DequantizeLinear bundle; a MatMulNBits
    bundle carries its level in the graph and no entry."""
    bundle = mobius_genai.package(
        TINY_QWEN2, "onnx-standard", tmp_path / "b", precision="int4", smoke_test=False,
        int4=Int4Options(quality="builder", accuracy_level=4), quiet=True,
    )  # fmt: skip
    for folder, expected in ((bundle, {FUSED_INT4_ACCURACY_ENTRY: "4"}), (tiny_int4, {})):
        config = json.loads((folder / "genai_config.json").read_text())
        session = config["model"]["decoder"]["session_options"]
        assert {k: v for k, v in session.items() if k.startswith("session.")} == expected
