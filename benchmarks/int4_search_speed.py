"""The int4 scale search's CPU time, alone and against one candidate's fit as an onnxruntime graph.

Thread CPU time (other processes on a shared machine disturb it less than the wall clock), best
of `--repeat` runs, in this process:

- `search_blocks` on 1.92M Student-t(5) weights (60,000 blocks of 32) with lognormal importance,
  asymmetric 4-bit, and its weighted error;
- `quantize_matmul_nbits(search=True)` of a [896, 4864] weight (a Qwen2.5-0.5B MLP projection)
  with a per-feature importance, the worker pool off (`PARALLEL_ELEMENTS` raised);
- one candidate's fit (round, refit, round again, weighted error) on one [32, 2048] slice:
  `rounding._Scratch.fit` against the same arithmetic as an onnxruntime graph on one thread
  (the lever "the search as an onnxruntime graph", issue 29).

    python benchmarks/int4_search_speed.py [--repeat 3]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper

from mobius_genai.quantize import layout, rounding


def best_cpu(function: Callable[[], object], repeat: int, calls: int = 1) -> float:
    """Least thread CPU seconds per call over `repeat` runs of `calls` calls."""
    function()
    times = []
    for _ in range(repeat):
        start = time.thread_time()
        for _ in range(calls):
            function()
        times.append((time.thread_time() - start) / calls)
    return min(times)


def fit_graph(blocks: int) -> ort.InferenceSession:
    """`_Scratch.fit` as ONNX ops on x, w [32, blocks], scale, zero [blocks] (4-bit)."""
    node = helper.make_node
    nodes = [
        node("Reciprocal", ["scale"], ["inverse"]),
        node("Neg", ["zero"], ["low"]),
        node("Sub", ["top", "zero"], ["high"]),
    ]
    for step in ("1", "2"):
        if step == "2":
            nodes.append(node("Reciprocal", ["refit"], ["inverse2"]))
        inverse = "inverse" if step == "1" else "inverse2"
        nodes += [
            node("Mul", ["x", inverse], [f"t{step}"]),
            node("Round", [f"t{step}"], [f"r{step}"]),
            node("Max", [f"r{step}", "low"], [f"m{step}"]),
            node("Min", [f"m{step}", "high"], [f"q{step}"]),
        ]
        if step == "1":
            nodes += [
                node("Mul", ["w", "q1"], ["wq"]),
                node("Mul", ["wq", "q1"], ["wqq"]),
                node("ReduceSum", ["wqq", "axis"], ["square"], keepdims=0),
                node("Mul", ["wq", "x"], ["wqx"]),
                node("ReduceSum", ["wqx", "axis"], ["cross"], keepdims=0),
                node("Div", ["cross", "square"], ["refit"]),
            ]
    nodes += [
        node("Mul", ["q2", "refit"], ["values"]),
        node("Sub", ["values", "x"], ["residual"]),
        node("Mul", ["w", "residual"], ["weighted"]),
        node("Mul", ["weighted", "residual"], ["squares"]),
        node("ReduceSum", ["squares", "axis"], ["error"], keepdims=0),
    ]
    f32 = TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "fit",
        [helper.make_tensor_value_info(name, f32, [32, blocks]) for name in ("x", "w")]
        + [helper.make_tensor_value_info(name, f32, [blocks]) for name in ("scale", "zero")],
        [helper.make_tensor_value_info(name, f32, [blocks]) for name in ("error", "refit")],
        [
            helper.make_tensor("top", f32, [], [15.0]),
            helper.make_tensor("axis", TensorProto.INT64, [1], [0]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, ["CPUExecutionProvider"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    blocks = (rng.standard_t(5, size=(60_000, 32)) * 0.02).astype(np.float32)
    importance = rng.lognormal(0, 1, size=blocks.shape).astype(np.float32)
    rounded = rounding.search_blocks(blocks, 4, False, importance)
    values = (rounded.q.astype(np.float32) - rounded.zero[:, None]) * rounded.scales[:, None]
    weights = (np.abs(blocks) + np.sqrt((blocks**2).mean(1))[:, None]) * importance
    seconds = best_cpu(lambda: rounding.search_blocks(blocks, 4, False, importance), args.repeat)
    error = float((weights * (values - blocks) ** 2).sum())
    print(f"search_blocks, 1.92M weights: {seconds:.4f} s of CPU, weighted error {error:.6f}")

    layout.PARALLEL_ELEMENTS = 1 << 62  # the worker pool off: this process's CPU time only
    weight = (rng.standard_normal((896, 4864)) * 0.02).astype(np.float32)
    per_feature = rng.lognormal(0, 1, size=896).astype(np.float32)
    seconds = best_cpu(
        lambda: layout.quantize_matmul_nbits(
            weight, 32, False, search=True, importance=per_feature
        ),
        args.repeat,
    )
    print(f"quantize_matmul_nbits(search=True), [896, 4864]: {seconds:.4f} s of CPU")

    columns = np.ascontiguousarray(blocks[:2048].T)
    column_weights = np.abs(columns) + 0.01
    low = np.minimum(columns.min(0), 0)
    scale = ((np.maximum(columns.max(0), 0) - low) / 15).astype(np.float32)
    zero = np.clip(np.round(-low / scale), 0, 15).astype(np.float32)
    session = fit_graph(columns.shape[1])
    feeds = {"x": columns, "w": column_weights, "scale": scale, "zero": zero}
    work = rounding._Scratch(columns, column_weights, 15)
    graph_error = session.run(["error"], feeds)[0]
    np.testing.assert_allclose(graph_error, work.fit(scale, zero)[0], rtol=1e-3, atol=1e-9)
    ours = best_cpu(lambda: work.fit(scale, zero), args.repeat, calls=300)
    graph = best_cpu(lambda: session.run(None, feeds), args.repeat, calls=300)
    print(
        f"one candidate's fit, [32, 2048]: numpy {ours * 1e6:.0f} us, onnxruntime graph "
        f"{graph * 1e6:.0f} us ({graph / ours:.2f}x), one thread"
    )


if __name__ == "__main__":
    main()
