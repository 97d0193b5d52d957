"""One picked expert's projection at one token (a decode step's product), four ways, on CPU.

Gemma-4-26B-A4B's up projection ([1408, 2816]; 16 experts stacked, random weights) picked by a
run-time index: "float" gathers the float expert and multiplies (the float MoE body);
"gather-block-quantized" dequantizes its 4-bit blocks with com.microsoft::GatherBlockQuantized,
then multiplies (the int4 QMoE body); "nbits-input" gathers its codes and feeds them to
com.microsoft::MatMulNBits as a run-time input; "nbits-constant" is MatMulNBits on the expert's
own constant codes, which onnxruntime prepacks at load, and "nbits-constant-if" the same inside
an If (as a per-expert branch would hold it). Blocks of 32 with zero points; one onnxruntime
thread; CPU time of the calling thread per run, best of `--repeats` means of `--runs` runs.
The outputs of the 4-bit variants are compared (they read the same codes).

    python benchmarks/expert_matmul.py [--runs 50] [--repeats 3]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import onnxruntime as ort
from _expert_nbits import matmul_nbits
from onnx import ModelProto, NodeProto, TensorProto, helper, numpy_helper

EXPERTS, N, K, BLOCK = 16, 1408, 2816, 32


def _model(nodes: list, arrays: dict[str, np.ndarray]) -> ModelProto:
    graph = helper.make_graph(
        nodes,
        "expert",
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, K]),
            helper.make_tensor_value_info("e", TensorProto.INT64, [1]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(array, name) for name, array in arrays.items()],
    )
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=10)


def _nbits(inputs: list[str], output: str) -> NodeProto:
    return matmul_nbits(inputs, output, K, N, BLOCK)


def _models(rng: np.random.Generator) -> dict[str, ModelProto]:
    packed = rng.integers(0, 256, (EXPERTS, N, K // 2), dtype=np.uint8)
    scales = rng.random((EXPERTS, N, K // BLOCK), dtype=np.float32) * 0.01
    zero_points = rng.integers(0, 256, (EXPERTS, N, K // BLOCK // 2), dtype=np.uint8)
    node = helper.make_node
    multiply = [
        node("Squeeze", ["w", "axis0"], ["w2"]),
        node("Transpose", ["w2"], ["wt"]),
        node("MatMul", ["x", "wt"], ["y"]),
    ]
    stacked = {"packed": packed, "scales": scales, "zero_points": zero_points}
    blocked = np.array([N, K // BLOCK, BLOCK // 2])
    one = {
        "b": packed[0].reshape(N, K // BLOCK, BLOCK // 2),
        "s": scales[0].reshape(-1),
        "z": zero_points[0].reshape(-1),
    }
    branch = helper.make_graph(
        [_nbits(["x", "b", "s", "z"], "t")],
        "then",
        [],
        [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)],
    )
    otherwise = helper.make_graph(
        [node("Identity", ["x"], ["u"])],
        "else",
        [],
        [helper.make_tensor_value_info("u", TensorProto.FLOAT, None)],
    )
    return {
        "float": _model(
            [node("Gather", ["weights", "e"], ["w"]), *multiply],
            {
                "weights": rng.standard_normal((EXPERTS, N, K), dtype=np.float32),
                "axis0": np.array([0]),
            },
        ),
        "gather-block-quantized": _model(
            [
                node(
                    "GatherBlockQuantized",
                    ["packed", "e", "scales", "zero_points"],
                    ["w"],
                    domain="com.microsoft",
                    gather_axis=0,
                    quantize_axis=2,
                    bits=4,
                    block_size=BLOCK,
                ),
                *multiply,
            ],
            {**stacked, "axis0": np.array([0])},
        ),
        "nbits-input": _model(
            [
                node("Gather", ["packed", "e"], ["p"]),
                node("Reshape", ["p", "blocked"], ["b"]),
                node("Gather", ["scales", "e"], ["s0"]),
                node("Reshape", ["s0", "flat"], ["s"]),
                node("Gather", ["zero_points", "e"], ["z0"]),
                node("Reshape", ["z0", "flat"], ["z"]),
                _nbits(["x", "b", "s", "z"], "y"),
            ],
            {**stacked, "blocked": blocked, "flat": np.array([-1])},
        ),
        "nbits-constant": _model(
            [
                _nbits(["x", "b", "s", "z"], "y0"),
                node("Identity", ["y0"], ["y"]),
                node("Identity", ["e"], ["unused"]),
            ],
            one,
        ),
        "nbits-constant-if": _model(
            [
                node("ReduceSum", ["e"], ["sum"], keepdims=0),
                node("Equal", ["sum", "zero"], ["first"]),
                node("If", ["first"], ["y"], then_branch=branch, else_branch=otherwise),
            ],
            {**one, "zero": np.array(0)},
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((1, K), dtype=np.float32), "e": np.array([0])}
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    outputs = {}
    for name, model in _models(rng).items():
        session = ort.InferenceSession(
            model.SerializeToString(), options, providers=["CPUExecutionProvider"]
        )
        outputs[name] = session.run(None, feeds)[0]
        best = float("inf")
        for _ in range(args.repeats):
            started = time.thread_time()
            for _ in range(args.runs):
                session.run(None, feeds)
            best = min(best, (time.thread_time() - started) / args.runs)
        print(f"{name:24} {best * 1e3:7.2f} ms")
    reference = outputs["gather-block-quantized"]
    for name in ("nbits-input", "nbits-constant", "nbits-constant-if"):
        error = np.abs(outputs[name] - reference).max() / np.abs(reference).max()
        print(f"{name} against gather-block-quantized: {error:.1e} of the largest value")


if __name__ == "__main__":
    main()
