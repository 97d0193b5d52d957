"""Each built-in EP turns the same tiny 3-layer decoder into exactly the ops it should run.

The decoder ties its embeddings, so the LM head is ``MatMul(h, Transpose(embed_table))``.
Counts are exact: 3 layers give 3 attention nodes, 6 residual Add + RMSNorm pairs (two per layer
minus layer 0's input norm, plus the final norm) and one RMSNormalization left over.
Entries are grouped per EP.
"""

from __future__ import annotations

import collections

import onnx_ir as ir

from mobius_genai.components.tier1 import MS_DOMAIN, is_standard_domain
from mobius_genai.optimize import optimize_model
from tests.optimize._graphs import DTYPES, tiny_config, tiny_decoder

LAYERS = 3
SKIP_OPS = ("SkipSimplifiedLayerNormalization", "SkipLayerNormalization")


def _optimized(ep: str, dtype: str) -> tuple[ir.Model, collections.Counter[str]]:
    config = tiny_config(num_hidden_layers=LAYERS, tie_word_embeddings=True)
    model, _ = tiny_decoder(config, dtype=dtype, weights="none")
    optimize_model(model, ep, DTYPES[dtype])
    counts = collections.Counter(node.op_type for node in model.graph.all_nodes())
    return model, counts


def _input_names(model: ir.Model) -> list[str]:
    return [value.name for value in model.graph.inputs]


# ------------------------------------------------------------------ default


def test_ep_produces_expected_ops_default():
    model, counts = _optimized("default", "f32")
    assert counts["Attention"] == LAYERS  # standard attention: no GQA for the portable EP
    assert counts["GroupQueryAttention"] == 0
    assert counts["RotaryEmbedding"] == 2 * LAYERS
    assert counts["SkipSimplifiedLayerNormalization"] == 2 * LAYERS
    assert counts["RMSNormalization"] == 1
    assert counts["FusedMatMul"] == 1
    assert (
        counts["Transpose"] == 2 * LAYERS
    )  # key and value placement (kv_slots.py), none at the head
    # Custom ops keep their function bodies: a runtime without the kernels expands them.
    assert set(model.functions) == {
        (MS_DOMAIN, "SkipSimplifiedLayerNormalization", ""),
        (MS_DOMAIN, "FusedMatMul", "transB"),
    }
    assert "position_ids" in _input_names(model)


# ------------------------------------------------------------------ onnx-standard


def test_ep_produces_expected_ops_onnx_standard():
    model, counts = _optimized("onnx-standard", "f32")
    assert [n.op_type for n in model.graph.all_nodes() if not is_standard_domain(n.domain)] == []
    assert not model.functions
    assert set(model.opset_imports) == {""}
    assert counts["Attention"] == LAYERS
    assert counts["RMSNormalization"] == 2 * LAYERS + 1
    assert counts["Transpose"] == 1 + 2 * LAYERS  # the tied head's, and kv_slots.py's
    assert not any(op in counts for op in SKIP_OPS)


# ------------------------------------------------------------------ trt-rtx


def test_ep_produces_expected_ops_trt_rtx():
    model, counts = _optimized("trt-rtx", "f16")
    # TensorRT-RTX runs the norm primitives itself: no Skip*LayerNorm, no bodies for them.
    assert not any(op in counts for op in SKIP_OPS)
    assert not any(key[1] in SKIP_OPS for key in model.functions)
    assert counts["RMSNormalization"] == 2 * LAYERS + 1
    assert counts["FusedMatMul"] == 1


# ------------------------------------------------------------------ cpu


def test_ep_produces_expected_ops_cpu_f32():
    _, counts = _optimized("cpu", "f32")
    assert counts["SkipSimplifiedLayerNormalization"] == 2 * LAYERS
    assert counts["RMSNormalization"] == 1
    assert counts["FusedMatMul"] == 1


# ================================================================== attention (GQA) block
# GroupQueryAttention fusion, QKV packing and the attention lowerings (SeparateRoPE,
# UnpackQKV, EliminateShape), per EP. Written with the attention rules
# (mobius_genai/optimize/rules/{gqa,pack_qkv,separate_rope,unpack_qkv,eliminate_shape}.py).

GQA = "GroupQueryAttention"
QUERY, KEY, VALUE, PAST_KEY, PAST_VALUE, SEQLENS_K, TOTAL_SEQ_LEN, COS_CACHE, SIN_CACHE = range(9)


def _gqa_nodes(model: ir.Model) -> list[ir.Node]:
    return [node for node in model.graph if node.op_type == GQA]


def _assert_gqa_layers(model: ir.Model, counts: collections.Counter[str], rotary: int) -> None:
    """3 GQA nodes in com.microsoft, no Attention left, lengths derived once from the mask."""
    assert counts[GQA] == LAYERS and counts["Attention"] == 0
    gqas = _gqa_nodes(model)
    assert all(node.domain == MS_DOMAIN for node in gqas)
    assert all(node.attributes.get_int("do_rotary", 0) == rotary for node in gqas)
    assert all(node.attributes.get_int("num_heads") == 4 for node in gqas)
    assert all(node.attributes.get_int("kv_num_heads") == 2 for node in gqas)
    assert len({id(node.inputs[SEQLENS_K]) for node in gqas}) == 1
    assert len({id(node.inputs[TOTAL_SEQ_LEN]) for node in gqas}) == 1
    assert counts["Where"] == 0  # the additive mask is gone


def _projection(value: ir.Value) -> ir.Node:
    node = value.producer()
    assert node is not None and node.op_type == "MatMul", node
    return node


def test_ep_produces_expected_ops_cpu_f32_gqa():
    model, counts = _optimized("cpu", "f32")
    _assert_gqa_layers(model, counts, rotary=1)
    assert counts["RotaryEmbedding"] == 0
    # q/k/v packed into one projection (qkv_pack_dtypes): GQA's key and value inputs are empty.
    assert all(
        node.inputs[KEY] is None and node.inputs[VALUE] is None for node in _gqa_nodes(model)
    )
    assert "position_ids" not in _input_names(model)  # GQA derives positions


def test_ep_produces_expected_ops_cpu_f16_no_gqa():
    _, counts = _optimized("cpu", "f16")  # gqa_dtypes = {FLOAT}
    assert counts[GQA] == 0 and counts["Attention"] == LAYERS


def test_ep_produces_expected_ops_cuda_f16_gqa():
    model, counts = _optimized("cuda", "f16")
    _assert_gqa_layers(model, counts, rotary=1)
    assert counts["SkipSimplifiedLayerNormalization"] == 2 * LAYERS
    assert counts["RotaryEmbedding"] == 0
    for layer, node in enumerate(_gqa_nodes(model)):
        assert node.inputs[KEY] is None and node.inputs[VALUE] is None  # packed QKV
        weight = _projection(node.inputs[QUERY]).inputs[1]
        assert weight.name == f"model.layers.{layer}.self_attn.qkv_proj.weight"
        assert list(weight.shape) == [64, 64 + 2 * 32]
        assert weight.const_value is None  # built without weights: no value to make up
    assert "position_ids" not in _input_names(model)


def test_ep_produces_expected_ops_cuda_f32_no_gqa():
    model, counts = _optimized("cuda", "f32")  # gqa_dtypes = {FLOAT16, BFLOAT16}
    assert counts[GQA] == 0 and counts["Attention"] == LAYERS
    assert counts["RotaryEmbedding"] == 2 * LAYERS
    assert "position_ids" in _input_names(model)


def test_ep_produces_expected_ops_trt_rtx_f16_gqa():
    model, counts = _optimized("trt-rtx", "f16")
    _assert_gqa_layers(model, counts, rotary=1)
    assert all(node.inputs[KEY] is not None for node in _gqa_nodes(model))  # not packed


def test_ep_produces_expected_ops_dml_f16_gqa():
    model, counts = _optimized("dml", "f16")
    _assert_gqa_layers(model, counts, rotary=0)
    assert counts["RotaryEmbedding"] == 2 * LAYERS  # separate: onnxruntime's, which DML runs
    # no opset-23 ops, which DirectML has no kernels for: the un-fused norm is onnxruntime's
    assert counts["RMSNormalization"] == 0 and counts["SimplifiedLayerNormalization"] >= 1
    simplified = [n for n in model.graph if n.op_type == "SimplifiedLayerNormalization"]
    assert all(node.domain == "" for node in simplified)  # where onnxruntime registers it
    position_ids = next(v for v in model.graph.inputs if v.name == "position_ids")
    for node in _gqa_nodes(model):
        assert len(node.inputs) == TOTAL_SEQ_LEN + 1  # no cos/sin caches
        for index, heads in ((QUERY, 4), (KEY, 2)):
            rope = node.inputs[index].producer()
            assert rope.op_type == "RotaryEmbedding" and rope.domain == "com.microsoft"
            assert rope.attributes.get_int("num_heads") == heads
            assert rope.inputs[1] is position_ids
            _projection(rope.inputs[0])  # unpacked q / k projections
        _projection(node.inputs[VALUE])


def test_ep_produces_expected_ops_webgpu_f16_gqa():
    model, counts = _optimized("webgpu", "f16")
    _assert_gqa_layers(model, counts, rotary=1)
    assert counts["Shape"] == 0


def test_ep_produces_expected_ops_webgpu_f32_gqa():
    model, counts = _optimized("webgpu", "f32")
    _assert_gqa_layers(model, counts, rotary=1)
    assert counts["Shape"] == 0


def test_ep_produces_expected_ops_mlx_f16_gqa():
    model, counts = _optimized("mlx", "f16")
    _assert_gqa_layers(model, counts, rotary=1)
    for node in _gqa_nodes(model):  # unpacked Q/K/V
        for index in (QUERY, KEY, VALUE):
            _projection(node.inputs[index])
