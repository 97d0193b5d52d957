"""INT4 graph rewrites per EP, without running them: ops, attributes, shared tables, report."""

from __future__ import annotations

import collections
import json

import onnx_ir as ir
import pytest

import mobius_genai
from mobius_genai.ep import get_ep
from mobius_genai.quantize import DEFAULT_QUALITY, QUALITIES, Int4Options, quantize_int4
from tests.conftest import TINY_QWEN2

LAYERS = 3  # tests._hf tiny configs
#: (MatMulNBits accuracy_level, GatherBlockQuantized for the EP's default dtype).
EXPECTED = {"cpu": (4, True), "cuda": (0, True), "webgpu": (4, True), "dml": (0, False)}


def _quantized(ckpt, ep: str, dtype=None, **options):
    caps = get_ep(ep)
    package = mobius_genai.build(ckpt, caps, dtype)
    options.setdefault("quality", "builder")  # all 4-bit; recipes are tested in test_int4_numerics
    report = quantize_int4(package["model"], Int4Options(**options), caps)
    return package, report


def _nodes(model: ir.Model, op_type: str) -> list[ir.Node]:
    return [node for node in model.graph if node.op_type == op_type]


def _float_weight_matmuls(model: ir.Model) -> list[str]:
    """MatMul-like nodes still reading a float initializer (directly or via Transpose)."""
    found = []
    for node in model.graph:
        if node.op_type not in ("MatMul", "FusedMatMul", "Gemm"):
            continue
        for value in node.inputs[1:2]:
            producer = value.producer()
            if value.is_initializer() or (
                producer is not None
                and producer.op_type == "Transpose"
                and producer.inputs[0].is_initializer()
            ):
                found.append(node.name)
    return found


@pytest.mark.parametrize("ep", sorted(EXPECTED))
def test_every_projection_and_the_lm_head_become_matmul_nbits(ep, untied_ckpt):
    package, report = _quantized(untied_ckpt, ep)
    model = package["model"]
    level, gather = EXPECTED[ep]
    packed = package.dtype in get_ep(ep).qkv_pack_dtypes  # cuda f16: one q/k/v projection
    projections = LAYERS * ((1 if packed else 3) + 1 + 3) + 1  # qkv, o, gate/up/down, lm_head
    matmuls = _nodes(model, "MatMulNBits")
    assert len(matmuls) == projections
    assert report.op_counts["MatMulNBits"] == projections
    assert _float_weight_matmuls(model) == []
    for node in matmuls:
        assert node.domain == "com.microsoft"
        assert node.attributes.get_int("accuracy_level", 0) == level
        assert node.attributes.get_int("bits") == 4
        assert node.attributes.get_int("block_size") == 32
        k, n = node.attributes.get_int("K"), node.attributes.get_int("N")
        assert tuple(node.inputs[1].shape) == (n, k // 32, 16)
        assert node.inputs[1].dtype == ir.DataType.UINT8
        assert tuple(node.inputs[2].shape) == (n, k // 32)
        assert node.inputs[2].dtype == package.dtype
        assert len(node.inputs) == 3  # symmetric: no zero points
    gathers = _nodes(model, "GatherBlockQuantized")
    assert len(gathers) == int(gather)
    assert len(_nodes(model, "Gather")) == int(not gather)
    assert report.embedding == ("int4" if gather else "float")
    assert model.opset_imports["com.microsoft"] == 1


@pytest.mark.parametrize(("ep", "level"), [("cuda", 2), ("cpu", 0), ("dml", 4)])
def test_accuracy_level_override(ep, level, untied_ckpt):
    package, report = _quantized(untied_ckpt, ep, accuracy_level=level)
    assert report.options.accuracy_level == level
    levels = {
        n.attributes.get_int("accuracy_level", 0) for n in _nodes(package["model"], "MatMulNBits")
    }
    assert levels == {level}


@pytest.mark.parametrize("symmetric", [True, False])
def test_tied_table_is_one_int4_copy_for_lookup_and_lm_head(symmetric):
    package, report = _quantized(TINY_QWEN2, "cpu", symmetric=symmetric)
    model = package["model"]
    (gather,) = _nodes(model, "GatherBlockQuantized")
    lm_head = next(n for n in _nodes(model, "MatMulNBits") if n.attributes.get_int("N") == 384)
    reshape = gather.inputs[0].producer()
    assert reshape is not None and reshape.op_type == "Reshape"
    assert reshape.inputs[0] is lm_head.inputs[1]  # the same int4 initializer
    assert tuple(reshape.inputs[1].const_value.numpy()) == (384, 32)
    assert gather.inputs[2] is lm_head.inputs[2]  # the same scales
    if not symmetric:
        assert gather.inputs[3] is lm_head.inputs[3]  # the same zero points
    assert gather.attributes.get_int("quantize_axis") == 1
    assert gather.attributes.get_int("gather_axis") == 0
    assert gather.attributes.get_int("block_size") == 32
    # one table-sized tensor in the whole model (>= 384 * 64 / 2 elements): the int4 copy
    tables = [v for v in model.graph.initializers.values() if v.const_value.size >= 384 * 32]
    assert [(tuple(v.shape), v.dtype) for v in tables] == [((384, 2, 16), ir.DataType.UINT8)]
    assert "model.embed_tokens.weight" not in model.graph.initializers
    assert not [key for key in model.functions if key[1] == "FusedMatMul"]
    assert report.embedding == "int4-shared"
    assert report.weights[0].ops == ("MatMulNBits", "GatherBlockQuantized")


def test_tied_table_without_a_gather_kernel_stays_float_and_lm_head_gets_a_copy():
    package, report = _quantized(TINY_QWEN2, "dml")
    model = package["model"]
    (gather,) = _nodes(model, "Gather")
    assert gather.inputs[0].name == "model.embed_tokens.weight"
    assert gather.inputs[0].dtype == ir.DataType.FLOAT16
    lm_head = [n for n in _nodes(model, "MatMulNBits") if n.attributes.get_int("N") == 384]
    assert len(lm_head) == 1
    assert report.embedding == "float"
    assert report.float_weights == ("model.embed_tokens.weight",)


def test_untied_embedding_is_its_own_int4_table(untied_ckpt):
    package, report = _quantized(untied_ckpt, "cpu")
    model = package["model"]
    (gather,) = _nodes(model, "GatherBlockQuantized")
    table = gather.inputs[0]
    assert table.is_initializer() and tuple(table.shape) == (128, 32)  # [vocab, hidden / 2]
    names = {w.name: w for w in report.weights}
    assert names["model.embed_tokens.weight"].ops == ("GatherBlockQuantized",)
    assert names["model.embed_tokens.weight"].role == "embedding"
    assert names["lm_head.weight"].ops == ("MatMulNBits",)
    assert names["lm_head.weight"].role == "lm_head"


@pytest.mark.parametrize("symmetric", [True, False])
def test_onnx_standard_uses_dequantize_linear_and_no_custom_ops(symmetric, untied_ckpt):
    package, report = _quantized(untied_ckpt, "onnx-standard", symmetric=symmetric)
    model = package["model"]
    assert report.format == "DequantizeLinear"
    assert {node.domain for node in model.graph} == {""}
    assert not model.functions
    assert model.opset_imports[""] >= 21
    dequantize = _nodes(model, "DequantizeLinear")
    assert len(dequantize) == LAYERS * 7 + 1
    qtype = ir.DataType.INT4 if symmetric else ir.DataType.UINT4
    for node in dequantize:
        data = node.inputs[0]
        assert data.dtype == qtype and data.is_initializer()
        assert node.attributes.get_int("axis") == 0
        assert node.attributes.get_int("block_size") == 32
        k, n = data.shape
        assert tuple(node.inputs[1].shape) == (k // 32, n)
        assert len(node.inputs) == (2 if symmetric else 3)
        (matmul,) = node.outputs[0].consumers()
        assert matmul.op_type == "MatMul" and matmul.inputs[1] is node.outputs[0]
    assert _float_weight_matmuls(model) == []
    assert report.embedding == "float"  # a standard Gather of int4 data has no ORT kernel
    assert report.to_dict()["accuracy_level"] is None


def test_default_ep_int4_is_portable_dequantize_linear(untied_ckpt, tmp_path):
    """Portable ONNX keeps only custom ops with function bodies, so no MatMulNBits; onnxruntime
    still runs the kernel: it fuses blocked DequantizeLinear + MatMul into MatMulNBits."""
    package, report = _quantized(untied_ckpt, "default")
    model = package["model"]
    assert report.format == "DequantizeLinear"
    assert len(_nodes(model, "DequantizeLinear")) == LAYERS * 7 + 1
    assert not _nodes(model, "MatMulNBits") and not _nodes(model, "GatherBlockQuantized")
    bodies = {(function.domain, function.name) for function in model.functions.values()}
    custom = {
        (node.domain, node.op_type) for node in model.graph if node.domain not in ("", "ai.onnx")
    }
    assert custom and custom <= bodies  # a runtime without the custom ops expands the bodies
    package.save(tmp_path / "graph", progress=False)

    import onnx
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.optimized_model_filepath = str(tmp_path / "optimized.onnx")
    ort.InferenceSession(str(tmp_path / "graph" / "model.onnx"), options)
    optimized = onnx.load(options.optimized_model_filepath, load_external_data=False)
    ops = collections.Counter(node.op_type for node in optimized.graph.node)
    assert ops["MatMulNBits"] == LAYERS * 7 + 1 and ops["DequantizeLinear"] == 0


def test_graph_built_without_weights_is_rewritten_without_values():
    caps = get_ep("cuda")
    package = mobius_genai.build(TINY_QWEN2, caps, "f16", load_weights=False)
    report = quantize_int4(package["model"], Int4Options(symmetric=False, quality="builder"), caps)
    assert report.op_counts == {"MatMulNBits": 11, "GatherBlockQuantized": 1}
    graph = package["model"].graph
    new = [
        v for v in graph.initializers.values() if "_Q4" in v.name and v.dtype != ir.DataType.INT64
    ]
    assert len(new) == 11 * 3  # 10 projections + the shared table: data, scales, zero points
    assert all(v.const_value is None for v in new)


def test_report_is_json_ready_and_complete(untied_ckpt):
    _, report = _quantized(untied_ckpt, "cpu", block_size=16, symmetric=False)
    data = json.loads(json.dumps(report.to_dict()))
    assert data["block_size"] == 16 and data["symmetric"] is False
    assert data["accuracy_level"] == 4 and data["format"] == "MatMulNBits"
    projections = LAYERS * 5  # per layer: packed q/k/v (the cpu EP packs them), o, gate, up, down
    assert data["op_counts"] == {"MatMulNBits": projections + 1, "GatherBlockQuantized": 1}
    assert data["quantized_weights"] == projections + 2
    roles = collections.Counter(w["role"] for w in data["weights"])
    assert roles == {"linear": projections, "lm_head": 1, "embedding": 1}
    assert data["embedding"] == "int4"


def test_a_second_run_finds_nothing_to_do(untied_ckpt):
    caps = get_ep("cpu")
    package = mobius_genai.build(untied_ckpt, caps, "f32")
    quantize_int4(package["model"], Int4Options(), caps)
    before = collections.Counter(n.op_type for n in package["model"].graph)
    again = quantize_int4(package["model"], Int4Options(), caps)
    assert again.weights == () and again.op_counts == {}
    assert collections.Counter(n.op_type for n in package["model"].graph) == before


@pytest.mark.parametrize("ep", ["cpu", "default"])
def test_the_default_recipe_calibrates_matmul_nbits_and_dequantize_linear(ep, untied_ckpt):
    _, report = _quantized(untied_ckpt, ep, "f32", quality=DEFAULT_QUALITY)
    assert QUALITIES[DEFAULT_QUALITY].calibrate and report.calibration is not None
    assert "calibration_skipped" not in report.summary()


@pytest.mark.parametrize(("ep", "dtype"), [("trt-rtx", "f16"), ("default", "f32")])
def test_eps_without_matmul_nbits_get_dequantize_linear(ep, dtype, untied_ckpt):
    """TensorRT-RTX takes int4 as DequantizeLinear + MatMul (as onnxruntime-genai's builder
    emits it there); portable ONNX has no body-less MatMulNBits."""
    package, report = _quantized(untied_ckpt, ep, dtype)
    assert not get_ep(ep).supports_matmul_nbits
    assert report.format == "DequantizeLinear" and report.to_dict()["accuracy_level"] is None
    assert not _nodes(package["model"], "MatMulNBits")
    assert len(_nodes(package["model"], "DequantizeLinear")) == LAYERS * 7 + 1
