"""Float zero points as integer zero points plus block mins: the arrays, and the nodes adding
the mins back to a MatMulNBits product or a GatherBlockQuantized lookup.

Math preserved exactly: a block ``(q - z) * s`` with float zero point z (GGUF's Q4_1, Q4_K,
Q5_1, Q5_K offsets, GPTQ v1) equals ``(q - round(z)) * s + m`` with the block min
``m = (round(z) - z) * s``. onnxruntime's kernels take the integer part (MatMulNBits' fast
kernels, and GatherBlockQuantized at all, need integer zero points); the mins come back as
``BlockSums(A) @ mins`` [K/bs, N] after a MatMulNBits (`plus_block_mins`), and as the
looked-up rows' mins, each repeated over its block, after a GatherBlockQuantized
(`plus_row_mins`).
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir

from mobius_genai.checkpoint.prequantized.tensor import StoredBlocks
from mobius_genai.quantize.graph_writer import GraphWriter

__all__ = ["block_sums", "integer_zeros_and_mins", "plus_block_mins", "plus_row_mins"]


def integer_zeros_and_mins(
    stored: list[StoredBlocks], bits: int
) -> tuple[StoredBlocks, np.ndarray]:
    """The blocks of `stored` (concatenated along N) with their float zero points z rounded to
    the nearest code, and the block mins ``(round(z) - z) * scale`` [N, K/bs] (float32)."""
    zeros = np.concatenate([s.zeros for s in stored], axis=0).astype(np.float32)
    whole = np.clip(np.rint(zeros), 0, (1 << bits) - 1)
    joined = StoredBlocks(
        values=np.concatenate([s.values for s in stored], axis=0),
        scales=np.concatenate([s.scales for s in stored], axis=0),
        zeros=whole.astype(np.uint8),
    )
    return joined, (whole - zeros) * joined.scales.astype(np.float32)


def plus_block_mins(
    writer: GraphWriter,
    a: ir.Value,
    nbits: ir.Node,
    mins: ir.Value,
    block_sums_of: dict[tuple[int, int], ir.Value],
) -> list[ir.Node]:
    """``nbits + BlockSums(a) @ mins``: the float zero points' term of ``A @ W``, with
    BlockSums(a) [..., K/bs] the sums of a's features block by block, computed once per input
    and block size (`block_sums_of`) for the weights that share them (gate and up)."""
    name = nbits.name
    blocks = int(mins.shape[0])
    block_size = int(nbits.attributes["block_size"].as_int())
    new_nodes = []
    if (id(a), block_size) not in block_sums_of:
        new_nodes = block_sums(writer, a, blocks, block_size, name)
        block_sums_of[id(a), block_size] = new_nodes[-1].outputs[0]
    sums = block_sums_of[id(a), block_size]
    term = ir.node("MatMul", [sums, mins], name=f"{name}_mins")
    total = ir.node("Add", [nbits.outputs[0], term.outputs[0]], name=f"{name}_plus_mins")
    return [*new_nodes, term, total]


def block_sums(
    writer: GraphWriter, a: ir.Value, blocks: int, block_size: int, name: str
) -> list[ir.Node]:
    """Nodes summing `a`'s last axis block by block, [..., K] → [..., K/bs]: a Reshape to
    [..., K/bs, bs] (its shape a constant where `a`'s rank is known: a Shape and a Concat
    fewer per step) and a ReduceSum."""
    last = writer.constant(f"{name}_last_axis", np.array([-1], np.int64))
    nodes = []
    if a.shape is not None:  # 0: the input's dimension, kept
        grouping = np.array([0] * (a.shape.rank() - 1) + [blocks, block_size], np.int64)
        shape = writer.constant(f"{name}_blocks", grouping)
    else:
        split = writer.constant(f"{name}_blocks", np.array([blocks, block_size], np.int64))
        lead = ir.node("Shape", [a], {"end": -1}, name=f"{name}_lead")
        joined = ir.node("Concat", [lead.outputs[0], split], {"axis": 0}, name=f"{name}_shape")
        nodes += [lead, joined]
        shape = joined.outputs[0]
    grouped = ir.node("Reshape", [a, shape], name=f"{name}_grouped")
    sums = ir.node("ReduceSum", [grouped.outputs[0], last], {"keepdims": 0}, name=f"{name}_sums")
    return [*nodes, grouped, sums]


def plus_row_mins(
    writer: GraphWriter,
    lookup: ir.Node,
    ids: ir.Value,
    mins: ir.Value,
    block_size: int,
    shared: bool,
) -> list[ir.Node]:
    """``lookup + mins[ids]`` repeated over each block: the float zero points' term of a
    GatherBlockQuantized lookup [..., K]. `mins` is [N, K/bs], or with `shared` the [K/bs, N]
    a tied lm_head's `plus_block_mins` reads (gathered along axis 1, then transposed: no
    second copy); the sum is taken on a [tokens, K/bs, bs] view, so any rank of `ids` works."""
    name = lookup.name
    blocks = int(mins.shape[0] if shared else mins.shape[1])
    flat = writer.constant(f"{name}_flat", np.array([-1], np.int64))
    view = writer.constant(f"{name}_blocks", np.array([-1, blocks, block_size], np.int64))
    column = writer.constant(f"{name}_block_column", np.array([-1, blocks, 1], np.int64))
    tokens = ir.node("Reshape", [ids, flat], name=f"{name}_tokens")
    picked = ir.node(
        "Gather", [mins, tokens.outputs[0]], {"axis": int(shared)}, name=f"{name}_row_mins"
    )
    nodes = [tokens, picked]
    if shared:  # [K/bs, tokens] → [tokens, K/bs]
        nodes.append(ir.node("Transpose", [picked.outputs[0]], {"perm": [1, 0]}, name=f"{name}_t"))
    rows = lookup.outputs[0]
    each = ir.node("Reshape", [nodes[-1].outputs[0], column], name=f"{name}_mins_view")
    grouped = ir.node("Reshape", [rows, view], name=f"{name}_grouped")
    total = ir.node("Add", [grouped.outputs[0], each.outputs[0]], name=f"{name}_plus_mins")
    shape = ir.node("Shape", [rows], name=f"{name}_shape")
    back = ir.node("Reshape", [total.outputs[0], shape.outputs[0]], name=f"{name}_rows")
    return [*nodes, each, grouped, total, shape, back]
