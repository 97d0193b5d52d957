"""Test-only helpers for INT4: EP capabilities with the int4 gather field, reference graphs.

`write_grid_checkpoint` writes a tiny checkpoint whose 2-D weights lie exactly on an int4 grid
for every block size, so the int4 graph must reproduce the float graph (to float rounding): a
wrong layout, transposition or sharing shows up as a large error. `dequantized_reference` turns a saved int4 graph into the same graph with every int4 weight
replaced by float values dequantized in numpy (from the operator specs, not onnxruntime), so
running both in onnxruntime isolates the int4 kernels from the quantization error.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx_ir as ir
from safetensors.numpy import load_file, save_file

from mobius_genai.quantize.layout import (
    BlockedInt4,
    NBitsWeight,
    dequantize_blocked_int4,
    dequantize_matmul_nbits,
)

F32, F16, BF16 = ir.DataType.FLOAT, ir.DataType.FLOAT16, ir.DataType.BFLOAT16


def grid_weights(rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, cols] float32 = scale[row] * q, q integers in [-8, 7], -8 and 7 in every 16 columns.

    Blocks of 16..256 along the columns then hold their own min and max, so ORT's symmetric
    (scale = -absmax/8) and asymmetric (scale = (max-min)/15, zero point 8) rounding both
    recover the values exactly.
    """
    if cols % 16:
        raise ValueError(f"cols={cols} must be a multiple of 16")
    q = rng.integers(-8, 8, size=(rows, cols // 16, 16))
    q[:, :, 0] = -8
    q[:, :, 1] = 7
    q = rng.permuted(q, axis=2).reshape(rows, cols)
    scale = rng.uniform(0.005, 0.03, size=(rows, 1))
    return (q * scale).astype(np.float32)


def write_grid_checkpoint(dest: Path, family: str, seed: int = 0, **overrides) -> Path:
    """A tiny checkpoint (tests._hf) whose 2-D weights are rewritten by `grid_weights`."""
    from tests._hf import write_tiny_checkpoint

    write_tiny_checkpoint(dest, family, seed, **overrides)
    path = dest / "model.safetensors"
    tensors = load_file(path)
    rng = np.random.default_rng(seed)
    for name, array in tensors.items():
        if array.ndim == 2:
            tensors[name] = grid_weights(*array.shape, rng)  # checkpoint layout [out, in]
    save_file(tensors, path, metadata={"format": "pt"})
    return dest


def _array(value: ir.Value | None) -> np.ndarray | None:
    if value is None:
        return None
    return value.const_value.numpy()  # type: ignore[union-attr]


def _packed_bytes(value: ir.Value | None) -> np.ndarray | None:
    """Raw packed bytes of an initializer (int4/uint4 data as stored)."""
    if value is None:
        return None
    return np.frombuffer(value.const_value.tobytes(), np.uint8)  # type: ignore[union-attr]


def _initializer(graph: ir.Graph, name: str, array: np.ndarray) -> ir.Value:
    value = ir.Value(
        name=name,
        type=ir.TensorType(ir.DataType.from_numpy(array.dtype)),
        shape=ir.Shape(array.shape),
        const_value=ir.tensor(array, name=name),
    )
    graph.register_initializer(value)
    return value


def _input(node: ir.Node, index: int) -> ir.Value | None:
    return node.inputs[index] if len(node.inputs) > index else None


def dequantized_reference(model_path: Path, out_dir: Path) -> Path:
    """Save to `out_dir`/model.onnx the graph at `model_path` with int4 weights dequantized."""
    model = ir.load(model_path)
    graph = model.graph
    replaced = 0
    for node in list(graph):
        new: ir.Node | None = None
        if node.op_type == "MatMulNBits":
            k = node.attributes.get_int("K")
            weight = NBitsWeight(
                _array(node.inputs[1]),
                _array(node.inputs[2]),
                _array(_input(node, 3)),
                bits=node.attributes.get_int("bits"),
            )
            scales_dtype = weight.scales.dtype
            dense = dequantize_matmul_nbits(weight, k).astype(scales_dtype)
            b = _initializer(graph, f"{node.inputs[1].name}_reference", dense)
            new = ir.node("MatMul", [node.inputs[0], b])
        elif node.op_type == "GatherBlockQuantized":
            data = _array(node.inputs[0]) if node.inputs[0].const_value is not None else None
            if data is None:  # Reshape(B) of a shared MatMulNBits weight
                data = _array(node.inputs[0].producer().inputs[0])
            scales = _array(node.inputs[2])
            n, blocks = scales.shape
            block_size = node.attributes.get_int("block_size")
            bits = node.attributes.get_int("bits")
            weight = NBitsWeight(
                data.reshape(n, blocks, block_size * bits // 8),
                scales,
                _array(_input(node, 3)),
                bits=bits,
            )
            table = dequantize_matmul_nbits(weight, blocks * block_size).T.astype(scales.dtype)
            t = _initializer(graph, f"{node.name}_reference_table", np.ascontiguousarray(table))
            new = ir.node("Gather", [t, node.inputs[1]], {"axis": 0})
        elif node.op_type == "DequantizeLinear" and node.inputs[0].const_value is not None:
            k, n = (int(d) for d in node.inputs[0].shape)
            weight = BlockedInt4(
                _packed_bytes(node.inputs[0]),
                _array(node.inputs[1]),
                _packed_bytes(_input(node, 2)),
            )
            dense = dequantize_blocked_int4(weight, k, n).astype(weight.scales.dtype)
            node.outputs[0].const_value = None
            value = _initializer(graph, f"{node.inputs[0].name}_reference", dense)
            ir.convenience.replace_all_uses_with(node.outputs[0], value)
            graph.remove(node, safe=True)
            replaced += 1
            continue
        if new is not None:
            ir.convenience.replace_nodes_and_values(
                graph, node, [node], [new], [node.outputs[0]], [new.outputs[0]]
            )
            replaced += 1
    assert replaced, "no int4 node found"
    for node in [n for n in graph if n.op_type == "Reshape" and not n.outputs[0].uses()]:
        graph.remove(node, safe=True)
    for name in [n for n, v in graph.initializers.items() if not v.uses()]:
        graph.initializers.pop(name)
    out_dir.mkdir(parents=True, exist_ok=True)
    ir.save(model, out_dir / "model.onnx", external_data="model.onnx.data")
    return out_dir / "model.onnx"
