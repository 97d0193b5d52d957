"""Time of one com.microsoft::MatMulNBits node per weight format, on onnxruntime's CPU EP.

A graph of one MatMulNBits (random codes, scales and zero points) with a [1, K] input, one
thread, best of 5 x `--calls` calls after a warm-up, for each bits x block size x zero points x
accuracy level: which formats have a fast kernel (at accuracy level 4 onnxruntime runs MLAS's
int8-compute kernels; below it, 8-bit weights have none and are dequantized on every call) and
what each costs against the bytes it reads.

    python benchmarks/matmul_nbits_kernels.py --n 49152 --k 576   # SmolLM2's tied lm_head
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper


def node_model(n: int, k: int, bits: int, block: int, zero_points: bool, level: int) -> bytes:
    """One MatMulNBits [1, K] x [K, N] with random quantized weights."""
    blocks = k // block
    rng = np.random.default_rng(0)
    data = rng.integers(0, 256, (n, blocks, block * bits // 8), dtype=np.uint8)
    scales = (rng.random((n, blocks), dtype=np.float32) * 0.01).astype(np.float32)
    initializers = [numpy_helper.from_array(data, "B"), numpy_helper.from_array(scales, "S")]
    inputs = ["A", "B", "S"]
    if zero_points:
        packed = rng.integers(0, 256, (n, (blocks * bits + 7) // 8), dtype=np.uint8)
        initializers.append(numpy_helper.from_array(packed, "Z"))
        inputs.append("Z")
    node = helper.make_node(
        "MatMulNBits",
        inputs,
        ["Y"],
        domain="com.microsoft",
        K=k,
        N=n,
        bits=bits,
        block_size=block,
        accuracy_level=level,
    )
    graph = helper.make_graph(
        [node],
        "matmul_nbits",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, k])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, n])],
        initializers,
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


def ms_per_call(model: bytes, k: int, calls: int) -> float:
    """Best of 5 rounds of `calls` calls, thread CPU time, one thread."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    feeds = {"A": np.random.default_rng(1).standard_normal((1, k)).astype(np.float32)}
    for _ in range(3):
        session.run(None, feeds)
    rounds = []
    for _ in range(5):
        started = time.thread_time()
        for _ in range(calls):
            session.run(None, feeds)
        rounds.append((time.thread_time() - started) / calls * 1e3)
    return min(rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=49152)
    parser.add_argument("--k", type=int, default=576)
    parser.add_argument("--bits", default="4,8")
    parser.add_argument("--blocks", default="16,32,64,128")
    parser.add_argument("--levels", default="4", help="accuracy levels, e.g. 0,4")
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    print(f"MatMulNBits [1, {args.k}] x [{args.k}, {args.n}], one thread, ms per call")
    print("| bits | block | zero points | accuracy level | ms per call | MiB | GiB/s |")
    print("|--:|--:|:-:|--:|--:|--:|--:|")
    choices = itertools.product(
        map(int, args.bits.split(",")),
        map(int, args.blocks.split(",")),
        (False, True),
        map(int, args.levels.split(",")),
    )
    for bits, block, zero_points, level in choices:
        if args.k % block:
            continue
        model = node_model(args.n, args.k, bits, block, zero_points, level)
        calls = args.calls if level == 4 or bits == 4 else 2  # the 8-bit fallback is slow
        ms = ms_per_call(model, args.k, calls)
        mib = args.n * args.k * (bits / 8 + 4 / block) / 2**20
        print(
            f"| {bits} | {block} | {'yes' if zero_points else 'no'} | {level} | {ms:.3f} "
            f"| {mib:.1f} | {mib / 1024 / ms * 1e3:.1f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
