"""A decode step's MLPs: separate projections against onnxruntime's fused SwiGLU kernels (CPU).

The question behind it (issue 8, decode): would one fused gate/up + SwiGLU + down kernel make a
CPU decode step faster than the graph both mobius-genai and onnxruntime-genai's builder emit?
onnxruntime 1.32 has such kernels only as mixture-of-experts ops; with one expert and k=1
(routing weight softmax([x]) = 1 exactly) they compute a dense SwiGLU MLP:

- fp32: MatMul gate, MatMul up, x * sigmoid(x), Mul, MatMul down (the cpu graph) against
  `com.microsoft::MoE` (gate/up interleaved in one fc1, `swiglu_fusion=1`);
- int4: the same with MatMulNBits (block 32, symmetric, accuracy level 4) against
  `com.microsoft::QMoE` with the same 4-bit blocks.

Each variant chains 24 layers of Qwen2.5-0.5B MLP shapes (hidden 896, intermediate 4864, with
a residual Add) so the weights come from memory as in a real decode step, and runs one token
(M = 1) with one thread. Both variants are first checked to give the same output; then each runs
in processes of its own, taking turns (two models in one process disturb each other's speed).

    python benchmarks/fused_mlp.py [--layers 24] [--processes 3] [--steps 60]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

HIDDEN, INTERMEDIATE, BLOCK = 896, 4864, 32
VARIANTS = {"fp32": ("separate", "MoE"), "int4": ("separate", "QMoE")}


def _random_int4(rng: np.random.Generator, n: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """MatMulNBits B [n, k/BLOCK, BLOCK/2] (two 4-bit values per byte) and scales [n, k/BLOCK]."""
    data = rng.integers(0, 256, (n, k // BLOCK, BLOCK // 2), dtype=np.uint8)
    scales = rng.uniform(0.5e-3, 1.5e-3, (n, k // BLOCK)).astype(np.float32)
    return data, scales


def _dequantize(data: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """[n, k] float32 of MatMulNBits blocks (symmetric: zero point 8)."""
    low, high = (data & 0x0F).astype(np.float32), (data >> 4).astype(np.float32)
    values = np.stack([low, high], axis=-1).reshape(data.shape[0], data.shape[1], BLOCK)
    return ((values - 8) * scales[..., None]).reshape(data.shape[0], -1)


def _layers(precision: str, count: int) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(0)
    shapes = {"gate": (INTERMEDIATE, HIDDEN), "up": (INTERMEDIATE, HIDDEN)}
    shapes["down"] = (HIDDEN, INTERMEDIATE)
    layers = []
    for _ in range(count):
        layer = {}
        for name, (n, k) in shapes.items():
            data, scales = _random_int4(rng, n, k)
            if precision == "int4":
                layer[name], layer[name + "_scales"] = data, scales
            else:  # the same values as float32 [n, k]
                layer[name] = _dequantize(data, scales)
        layers.append(layer)
    return layers


def _interleave(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """Rows g0, u0, g1, u1, ... (`swiglu_fusion=1`)."""
    return np.stack([gate, up], axis=1).reshape(2 * gate.shape[0], *gate.shape[1:])


def _separate(precision: str, x: str, p: str, layer: dict, inits: list) -> tuple[list, str]:
    def project(source: str, name: str) -> helper.NodeProto:
        weight = layer[name]
        if precision == "fp32":
            inits.append(numpy_helper.from_array(np.ascontiguousarray(weight.T), p + name))
            return helper.make_node("MatMul", [source, p + name], [p + name + "_y"])
        inits.append(numpy_helper.from_array(weight, p + name))
        inits.append(numpy_helper.from_array(layer[name + "_scales"].reshape(-1), p + name + "_s"))
        n, k = weight.shape[0], weight.shape[1] * BLOCK
        return helper.make_node(
            "MatMulNBits",
            [source, p + name, p + name + "_s"],
            [p + name + "_y"],
            domain="com.microsoft",
            K=k,
            N=n,
            bits=4,
            block_size=BLOCK,
            accuracy_level=4,
        )

    nodes = [
        project(x, "gate"),
        project(x, "up"),
        helper.make_node("Sigmoid", [p + "gate_y"], [p + "sigmoid"]),
        helper.make_node("Mul", [p + "gate_y", p + "sigmoid"], [p + "silu"]),
        helper.make_node("Mul", [p + "silu", p + "up_y"], [p + "hidden"]),
        project(p + "hidden", "down"),
    ]
    return nodes, p + "down_y"


def _fused(precision: str, x: str, p: str, layer: dict, inits: list) -> tuple[list, str]:
    fc1 = _interleave(layer["gate"], layer["up"])
    fc1 = fc1.reshape(1, fc1.shape[0], -1)  # int4: [1, 2I, H/2] bytes, blocks one after another
    inputs = [x, "router_probs", p + "fc1"]
    inits.append(numpy_helper.from_array(fc1, p + "fc1"))
    attributes = {"k": 1, "activation_type": "swiglu", "swiglu_fusion": 1}
    attributes |= {"activation_alpha": 1.0, "activation_beta": 0.0}
    if precision == "fp32":
        inits.append(numpy_helper.from_array(layer["down"][None], p + "fc2"))
        inputs += ["", p + "fc2"]
        op = "MoE"
    else:
        scales = _interleave(layer["gate_scales"], layer["up_scales"])[None]
        inits.append(numpy_helper.from_array(scales, p + "fc1_s"))
        inits.append(numpy_helper.from_array(layer["down"].reshape(1, HIDDEN, -1), p + "fc2"))
        inits.append(numpy_helper.from_array(layer["down_scales"][None], p + "fc2_s"))
        inputs += [p + "fc1_s", "", p + "fc2", p + "fc2_s"]
        attributes |= {"block_size": BLOCK, "expert_weight_bits": 4, "accuracy_level": 4}
        op = "QMoE"
    node = helper.make_node(op, inputs, [p + "mlp_y"], domain="com.microsoft", **attributes)
    return [node], p + "mlp_y"


def session(precision: str, variant: str, layers: int) -> ort.InferenceSession:
    """24 (or `layers`) residual MLP blocks in one graph, one intra-op thread."""
    emit = _separate if variant == "separate" else _fused
    nodes, inits, x = [], [], "x"
    for index, layer in enumerate(_layers(precision, layers)):
        block, y = emit(precision, x, f"l{index}_", layer, inits)
        nodes += [*block, helper.make_node("Add", [x, y], [f"l{index}_out"])]
        x = f"l{index}_out"
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, HIDDEN])]
    if variant != "separate":
        inputs.append(helper.make_tensor_value_info("router_probs", TensorProto.FLOAT, [1, 1]))
    output = helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, HIDDEN])
    graph = helper.make_graph(nodes, "mlps", inputs, [output], inits)
    opsets = [helper.make_opsetid("", 21), helper.make_opsetid("com.microsoft", 1)]
    model = helper.make_model(graph, opset_imports=opsets)
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    return ort.InferenceSession(
        model.SerializeToString(), options, providers=["CPUExecutionProvider"]
    )


def _feeds(variant: str) -> dict[str, np.ndarray]:
    x = np.random.default_rng(1).uniform(-1, 1, (1, HIDDEN)).astype(np.float32)
    return (
        {"x": x}
        if variant == "separate"
        else {"x": x, "router_probs": np.zeros((1, 1), np.float32)}
    )


def step_ms(precision: str, variant: str, layers: int, steps: int) -> float:
    """CPU time of one M = 1 pass through all layers, in this process."""
    sess, feeds = session(precision, variant, layers), _feeds(variant)
    for _ in range(5):
        sess.run(None, feeds)
    started = time.thread_time()
    for _ in range(steps):
        sess.run(None, feeds)
    return (time.thread_time() - started) / steps * 1e3


def check_same(precision: str, layers: int) -> float:
    """Largest difference between the variants' outputs, relative to the output's scale."""
    separate, fused = VARIANTS[precision]
    y_sep = session(precision, separate, layers).run(None, _feeds(separate))[0]
    y_fused = session(precision, fused, layers).run(None, _feeds(fused))[0]
    return float(np.abs(y_sep - y_fused).max() / np.abs(y_sep).max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--processes", type=int, default=3, help="per variant")
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(step_ms(*args.child, args.layers, args.steps))
        return
    print("| precision | variant | ms per step (median) | ratio to separate |")
    print("|---|---|--:|--:|")
    for precision, variants in VARIANTS.items():
        difference = check_same(precision, args.layers)
        if difference > 1e-2:
            raise SystemExit(f"{precision}: variants differ by {difference:.2e} (relative)")
        times: dict[str, list[float]] = {variant: [] for variant in variants}
        for round_ in range(args.processes):
            for variant in variants[:: 1 if round_ % 2 == 0 else -1]:
                command = [sys.executable, __file__, "--child", precision, variant]
                command += ["--layers", str(args.layers), "--steps", str(args.steps)]
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                times[variant].append(float(done.stdout.split()[-1]))
        base = statistics.median(times[variants[0]])
        for variant in variants:
            median = statistics.median(times[variant])
            print(f"| {precision} | {variant} | {median:.2f} | {median / base:.2f} |")
        print(json.dumps({"precision": precision, "max_relative_difference": difference}))


if __name__ == "__main__":
    main()
