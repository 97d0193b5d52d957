"""INT4 layouts: onnxruntime's kernels, our numpy dequantization and the ops agree exactly."""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
import onnx_ir as ir
import onnxruntime as ort
import pytest

from mobius_genai.quantize.layout import (
    dequantize_blocked_int4,
    dequantize_matmul_nbits,
    quantize_blocked_int4,
    quantize_matmul_nbits,
)
from tests.quantize._reference import grid_weights

FLOAT_DTYPES = {np.float32: ir.DataType.FLOAT, np.float16: ir.DataType.FLOAT16}


def _run(nodes, inputs, initializers, feeds, opsets=None):
    """Run a one-output graph on the CPU EP (no graph optimizations: the nodes as written)."""
    output = nodes[-1].outputs[0]
    output.name = "y"
    graph = ir.Graph(
        inputs,
        [output],
        nodes=nodes,
        initializers=initializers,
        opset_imports=opsets or {"": 24, "com.microsoft": 1},
    )
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(
        ir.to_proto(ir.Model(graph, ir_version=10)).SerializeToString(),
        options,
        providers=["CPUExecutionProvider"],
    )
    return session.run(None, feeds)[0]


def _const(name: str, tensor: ir.TensorProtocol) -> ir.Value:
    return ir.Value(
        name=name,
        type=ir.TensorType(tensor.dtype),
        shape=ir.Shape(tensor.shape),
        const_value=tensor,
    )


@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("block_size", [16, 32, 64])
def test_grid_weights_round_trip_exactly(symmetric, block_size):
    """Values on the int4 grid survive quantize → dequantize up to float32 rounding of the
    scale (both layouts); any layout or rounding mistake is off by a whole grid step."""
    w = grid_weights(48, 128, np.random.default_rng(0)).T  # [K=128, N=48], a transposed view
    nbits = quantize_matmul_nbits(w, block_size, symmetric)
    np.testing.assert_allclose(dequantize_matmul_nbits(nbits, 128), w, rtol=1e-6, atol=0)
    blocked = quantize_blocked_int4(w, block_size, symmetric)
    np.testing.assert_allclose(dequantize_blocked_int4(blocked, 128, 48), w, rtol=1e-6, atol=0)


@pytest.mark.parametrize("symmetric", [True, False])
def test_layout_shapes_and_dtypes(symmetric):
    w = np.random.default_rng(1).standard_normal((64, 24)).astype(np.float16)
    nbits = quantize_matmul_nbits(w, 16, symmetric)
    assert nbits.packed.shape == (24, 4, 8) and nbits.packed.dtype == np.uint8
    assert nbits.scales.shape == (24, 4) and nbits.scales.dtype == np.float16
    assert (nbits.zero_points is None) == symmetric
    if not symmetric:
        assert nbits.zero_points.shape == (24, 2)
    blocked = quantize_blocked_int4(w, 16, symmetric)
    assert blocked.data.shape == (64 * 24 // 2,)
    assert blocked.scales.shape == (4, 24)


@pytest.mark.parametrize("symmetric", [True, False])
def test_slicing_does_not_change_the_result(symmetric):
    """Quantizing in small slices (along N, or K for the blocked layout) = one kernel call."""
    w = np.random.default_rng(2).standard_normal((96, 37)).astype(np.float32)
    whole, sliced = (
        quantize_matmul_nbits(w, 32, symmetric),
        quantize_matmul_nbits(w, 32, symmetric, chunk_elements=100),
    )
    np.testing.assert_array_equal(whole.packed, sliced.packed)
    np.testing.assert_array_equal(whole.scales, sliced.scales)
    if not symmetric:
        np.testing.assert_array_equal(whole.zero_points, sliced.zero_points)
    whole_b = quantize_blocked_int4(w, 16, symmetric)
    sliced_b = quantize_blocked_int4(w, 16, symmetric, chunk_elements=10)
    np.testing.assert_array_equal(whole_b.data, sliced_b.data)
    np.testing.assert_array_equal(whole_b.scales, sliced_b.scales)
    if not symmetric:
        np.testing.assert_array_equal(whole_b.zero_points, sliced_b.zero_points)


def test_bfloat16_is_quantized_in_float32_with_bfloat16_scales():
    w = np.random.default_rng(3).standard_normal((32, 8)).astype(ml_dtypes.bfloat16)
    nbits = quantize_matmul_nbits(w, 16, True)
    assert nbits.scales.dtype == ml_dtypes.bfloat16
    error = np.abs(dequantize_matmul_nbits(nbits, 32) - w.astype(np.float32)).max()
    assert error < 0.5  # 4-bit rounding of N(0, 1) values: at most one step (~absmax / 8)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize("symmetric", [True, False])
def test_matmul_nbits_kernel_reads_our_layout(dtype, symmetric):
    """onnxruntime's MatMulNBits computes A @ (our numpy dequantization of its inputs)."""
    rng = np.random.default_rng(4)
    k, n = 64, 40
    w = rng.standard_normal((k, n)).astype(dtype)
    nbits = quantize_matmul_nbits(w, 32, symmetric)
    a = ir.val("a", FLOAT_DTYPES[dtype], ir.Shape([3, k]))
    consts = [_const("b", ir.Tensor(nbits.packed)), _const("s", ir.Tensor(nbits.scales))]
    if not symmetric:
        consts.append(_const("z", ir.Tensor(nbits.zero_points)))
    node = ir.node(
        "MatMulNBits",
        [a, *consts],
        {"K": k, "N": n, "bits": 4, "block_size": 32},
        domain="com.microsoft",
    )
    x = rng.standard_normal((3, k)).astype(dtype)
    y = _run([node], [a], consts, {"a": x})
    expected = x.astype(np.float32) @ dequantize_matmul_nbits(nbits, k)
    tolerance = 1e-4 if dtype == np.float32 else 2e-2  # f16: the kernel's f16 accumulation
    np.testing.assert_allclose(y.astype(np.float32), expected, atol=tolerance, rtol=tolerance)


@pytest.mark.parametrize("symmetric", [True, False])
def test_gather_block_quantized_reads_the_matmul_nbits_data_as_rows(symmetric):
    """The MatMulNBits copy of an [N, K] table, viewed as [N, K/2], is a GatherBlockQuantized
    table with the same scales and zero points: this is what lets a tied table be shared."""
    rng = np.random.default_rng(5)
    table = rng.standard_normal((50, 64)).astype(np.float32)  # [vocab, hidden]
    nbits = quantize_matmul_nbits(table.T, 16, symmetric)
    ids = ir.val("ids", ir.DataType.INT64, ir.Shape([2, 3]))
    b = _const("b", ir.Tensor(nbits.packed))
    shape = _const("shape", ir.tensor(np.array([50, 32], np.int64)))
    consts = [_const("s", ir.Tensor(nbits.scales))]
    if not symmetric:
        consts.append(_const("z", ir.Tensor(nbits.zero_points)))
    reshape = ir.node("Reshape", [b, shape])
    gather = ir.node(
        "GatherBlockQuantized",
        [reshape.outputs[0], ids, *consts],
        {"bits": 4, "block_size": 16, "gather_axis": 0, "quantize_axis": 1},
        domain="com.microsoft",
    )
    index = np.array([[0, 7, 49], [3, 3, 12]], np.int64)
    y = _run([reshape, gather], [ids], [b, shape, *consts], {"ids": index})
    rows = dequantize_matmul_nbits(nbits, 64).T
    np.testing.assert_array_equal(y, rows[index])


@pytest.mark.parametrize("symmetric", [True, False])
def test_dequantize_linear_reads_our_blocked_layout(symmetric):
    rng = np.random.default_rng(6)
    k, n = 64, 21  # odd N: packing runs across rows
    w = rng.standard_normal((k, n)).astype(np.float32)
    blocked = quantize_blocked_int4(w, 32, symmetric)
    qtype = ir.DataType.INT4 if symmetric else ir.DataType.UINT4
    consts = [
        _const("q", ir.PackedTensor(blocked.data, qtype, shape=(k, n))),
        _const("s", ir.Tensor(blocked.scales)),
    ]
    if not symmetric:
        consts.append(_const("z", ir.PackedTensor(blocked.zero_points, qtype, shape=(2, n))))
    node = ir.node("DequantizeLinear", consts, {"axis": 0, "block_size": 32})
    y = _run([node], [], consts, {}, opsets={"": 21})
    np.testing.assert_array_equal(y, dequantize_blocked_int4(blocked, k, n))


@pytest.mark.parametrize("dtype", [np.float32, np.float16, ml_dtypes.bfloat16])
@pytest.mark.parametrize("symmetric", [True, False])
@pytest.mark.parametrize("search", [False, True])
def test_all_zero_blocks_quantize_to_exact_zeros_without_warnings(dtype, symmetric, search):
    """A checkpoint's zero rows (or zero experts) give all-zero blocks: scale 0 or any finite
    scale, never NaN/inf or a numpy warning, and the block dequantizes (numpy and onnxruntime's
    MatMulNBits) to exactly 0 while the other blocks keep their grid values."""
    k, n = 128, 48
    w = grid_weights(n, k, np.random.default_rng(5)).T.astype(dtype)  # [K, N]
    w[32:96, :7] = 0  # two whole blocks of 32 in columns 0..6
    w[:, 40:] = 0  # whole columns
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        nbits = quantize_matmul_nbits(w, 32, symmetric, search=search)
        blocked = quantize_blocked_int4(w, 32, symmetric, search=search)
        nbits8 = quantize_matmul_nbits(w, 32, symmetric, bits=8, search=search)
    for scales in (nbits.scales, blocked.scales, nbits8.scales):
        assert np.isfinite(np.asarray(scales, np.float32)).all()
    expected = w.astype(np.float32)  # grid values and zeros: exact up to the scale's rounding
    tolerance = {"rtol": 1e-6 if dtype == np.float32 else 1e-2, "atol": 0}
    for dequantized in (
        dequantize_matmul_nbits(nbits, k),
        dequantize_blocked_int4(blocked, k, n),
        dequantize_matmul_nbits(nbits8, k),
    ):
        np.testing.assert_array_equal(dequantized[expected == 0], 0)
        np.testing.assert_allclose(dequantized, expected, **tolerance)
    kernel_dtype = np.float32 if dtype == ml_dtypes.bfloat16 else dtype
    a = ir.val("a", FLOAT_DTYPES[kernel_dtype], ir.Shape([2, k]))
    scales = np.asarray(nbits.scales).astype(kernel_dtype)
    consts = [_const("b", ir.Tensor(nbits.packed)), _const("s", ir.Tensor(scales))]
    if not symmetric:
        consts.append(_const("z", ir.Tensor(nbits.zero_points)))
    attributes = {"K": k, "N": n, "bits": 4, "block_size": 32}
    node = ir.node("MatMulNBits", [a, *consts], attributes, domain="com.microsoft")
    x = np.random.default_rng(6).standard_normal((2, k)).astype(kernel_dtype)
    y = _run([node], [a], consts, {"a": x}).astype(np.float32)
    assert np.isfinite(y).all()
    np.testing.assert_array_equal(y[:, 40:], 0)
