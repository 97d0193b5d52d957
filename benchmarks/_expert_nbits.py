"""A prototype measured by moe_body.py, not what a bundle holds: GeGLU experts in 4 bits as two
com.microsoft::MatMulNBits per expert, each with the expert's own constant codes (which
onnxruntime prepacks at load, as for a dense layer), behind an `If` that runs only when some
token picked the expert, on the tokens that picked it.

Routing as the QMoE bodies' (softmax, top k, renormalized); each picked expert's rows
(NonZero of its routing weights) through fc1, GeGLU, fc2, times their weight; the pieces and
their token indices concatenated and added into the rows' total by one ScatterND (add). No
expert is ever float, and a prefill computes each expert on its own tokens only.
"""

from __future__ import annotations

import numpy as np
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

#: (packed codes [E, N, K/2], scales [E, N, K/bs], zero points [E, N, ceil(K/bs/2)])
Quantized = tuple[np.ndarray, np.ndarray, np.ndarray]


def matmul_nbits(inputs: list[str], output: str, k: int, n: int, block: int) -> NodeProto:
    """com.microsoft::MatMulNBits of 4-bit codes in blocks of `block`: [.., k] → [.., n]."""
    return helper.make_node(
        "MatMulNBits",
        inputs,
        [output],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=4,
        block_size=block,
    )


def _expert_branch(e: int, fc1: Quantized, fc2: Quantized, block: int) -> list:
    """The then-branch nodes of expert `e`: its rows' weighted GeGLU output and their rows."""
    p = f"e{e}_"
    inter2, hidden = fc1[0].shape[1], fc2[0].shape[1]

    def nbits(inputs: list[str], output: str, k: int, n: int) -> NodeProto:
        return matmul_nbits(inputs, output, k, n, block)

    return [
        helper.make_node("Gather", ["weights", p + "column"], [p + "w"], axis=1),
        helper.make_node("Squeeze", [p + "w", "axis1"], [p + "weight"]),
        helper.make_node("Greater", [p + "weight", "zero"], [p + "mine"]),
        helper.make_node("NonZero", [p + "mine"], [p + "nonzero"]),
        helper.make_node("Squeeze", [p + "nonzero", "axis0"], [p + "tokens"]),
        helper.make_node("Gather", ["rows", p + "tokens"], [p + "rows"]),
        nbits([p + "rows", p + "fc1", p + "fc1_s", p + "fc1_z"], p + "fused", hidden, inter2),
        helper.make_node("Reshape", [p + "fused", "pairs_shape"], [p + "pairs"]),
        helper.make_node("Split", [p + "pairs"], [p + "g", p + "u"], axis=-1, num_outputs=2),
        helper.make_node("Gelu", [p + "g"], [p + "gelu"], approximate="tanh"),
        helper.make_node("Mul", [p + "gelu", p + "u"], [p + "act3"]),
        helper.make_node("Reshape", [p + "act3", "act_shape"], [p + "act"]),
        nbits([p + "act", p + "fc2", p + "fc2_s", p + "fc2_z"], p + "out", inter2 // 2, hidden),
        helper.make_node("Gather", [p + "weight", p + "tokens"], [p + "tw"]),
        helper.make_node("Unsqueeze", [p + "tw", "last"], [p + "tw2"]),
        helper.make_node("Mul", [p + "out", p + "tw2"], [p + "part"]),
    ]


def nbits_model(fc1: Quantized, fc2: Quantized, top_k: int, block: int) -> ModelProto:
    """x [1, T, H], router [T, E] → y [1, T, H] (float32), the experts' arrays as initializers."""
    experts, inter2, hidden = fc1[0].shape[0], fc1[0].shape[1], fc2[0].shape[1]
    constants = {
        "k": np.array([top_k]),
        "axis0": np.array([0]),
        "axis1": np.array([1]),
        "last": np.array([-1]),
        "rows_shape": np.array([-1, hidden]),
        "pairs_shape": np.array([0, inter2 // 2, 2]),
        "act_shape": np.array([0, inter2 // 2]),
        "zero": np.array(0.0, np.float32),
        "no_tokens": np.zeros((0,), np.int64),
    }
    for e in range(experts):
        constants[f"e{e}_column"] = np.array([e])
        for name, (packed, scales, zero_points) in (("fc1", fc1), ("fc2", fc2)):
            n, half = packed.shape[1:]
            constants[f"e{e}_{name}"] = packed[e].reshape(n, 2 * half // block, block // 2)
            constants[f"e{e}_{name}_s"] = scales[e].reshape(-1)
            constants[f"e{e}_{name}_z"] = zero_points[e].reshape(-1)
    node = helper.make_node
    nodes = [
        node("Reshape", ["x", "rows_shape"], ["rows"]),
        node("Softmax", ["router"], ["probs"], axis=-1),
        node("TopK", ["probs", "k"], ["top", "index"], axis=-1),
        node("ReduceSum", ["top", "axis1"], ["top_sum"], keepdims=1),
        node("Div", ["top", "top_sum"], ["normalized"]),
        node("Sub", ["probs", "probs"], ["zeros"]),
        node("ScatterElements", ["zeros", "index", "normalized"], ["weights"], axis=1),
        node("ReduceMax", ["weights", "axis0"], ["most"], keepdims=0),
        node("Greater", ["most", "zero"], ["used"]),
        node("Split", ["used"], [f"e{e}_used" for e in range(experts)], num_outputs=experts),
        node("Slice", ["rows", "axis0", "axis0"], ["no_rows"]),
    ]
    for e in range(experts):
        p = f"e{e}_"
        outputs = [
            helper.make_tensor_value_info(p + "part", TensorProto.FLOAT, None),
            helper.make_tensor_value_info(p + "tokens", TensorProto.INT64, None),
        ]
        then = helper.make_graph(_expert_branch(e, fc1, fc2, block), p + "then", [], outputs)
        empty = [
            node("Identity", ["no_rows"], [p + "no_part"]),
            node("Identity", ["no_tokens"], [p + "no_tokens"]),
        ]
        nothing = [
            helper.make_tensor_value_info(p + "no_part", TensorProto.FLOAT, None),
            helper.make_tensor_value_info(p + "no_tokens", TensorProto.INT64, None),
        ]
        otherwise = helper.make_graph(empty, p + "else", [], nothing)
        nodes.append(node("Squeeze", [p + "used", "axis0"], [p + "run"]))
        nodes.append(
            node(
                "If",
                [p + "run"],
                [p + "piece", p + "rows_of"],
                then_branch=then,
                else_branch=otherwise,
            )
        )
    nodes += [
        node("Concat", [f"e{e}_piece" for e in range(experts)], ["pieces"], axis=0),
        node("Concat", [f"e{e}_rows_of" for e in range(experts)], ["indices"], axis=0),
        node("Unsqueeze", ["indices", "last"], ["scatter_at"]),
        node("Mul", ["rows", "zero"], ["no_sum"]),  # x is finite here
        node("ScatterND", ["no_sum", "scatter_at", "pieces"], ["summed"], reduction="add"),
        node("Shape", ["x"], ["x_shape"]),
        node("Reshape", ["summed", "x_shape"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "expert_nbits",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "tokens", hidden]),
            helper.make_tensor_value_info("router", TensorProto.FLOAT, ["tokens", experts]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(np.asarray(array), name) for name, array in constants.items()],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)
