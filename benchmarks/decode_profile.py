"""Where a decode step's time goes: onnxruntime's profile of bundles, kernel time per op type.

Each bundle runs in a process of its own (two models in one process disturb each other's
speed) as a plain onnxruntime CPU session with one thread: one new token after a `--past`-token
KV cache, `--steps` times after a warm-up, with onnxruntime's profiler on. Prints, per bundle,
the CPU time of a step and the kernel time per op type (after onnxruntime's own fusions, e.g.
a bias Add folded into MatMulNBits, Sigmoid * x into QuickGelu), then the bytes of weights the
matrix products read per step and the rate at which they read them (a decode step reads every
weight once: at one token, speed is bytes over memory bandwidth), next to a reference read
rate measured in the same run: numpy summing 1 GiB of float32 on one thread.

    python benchmarks/decode_profile.py BUNDLE [BUNDLE ...] [--past 256] [--steps 50]
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from _decode import decode_feeds

MATRIX_PRODUCTS = ("MatMul", "FusedMatMul", "Gemm", "MatMulNBits")


def weight_bytes(folder: str) -> int:
    """Bytes of the initializers the bundle's matrix products read (weights, scales, biases)."""
    import onnx

    model = onnx.load(str(Path(folder) / "model.onnx"), load_external_data=False)
    sizes = {
        init.name: int(np.prod(init.dims, dtype=np.int64))
        * onnx.helper.tensor_dtype_to_np_dtype(init.data_type).itemsize
        for init in model.graph.initializer
    }
    read = {
        name
        for node in model.graph.node
        if node.op_type in MATRIX_PRODUCTS
        for name in node.input
        if name in sizes
    }
    return sum(sizes[name] for name in read)


def numpy_read_rate(gib: int = 1, rounds: int = 5) -> float:
    """GB/s of numpy summing `gib` GiB of float32 in this process (best of `rounds`)."""
    values = np.ones(gib * 2**28, np.float32)
    values.sum()
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        values.sum()
        best = min(best, time.perf_counter() - started)
    return values.nbytes / best / 1e9


def profile(folder: str, past: int, steps: int) -> dict:
    """Step CPU time (ms) and kernel ms per step by op type, of one bundle in this process."""
    with tempfile.TemporaryDirectory() as scratch:
        return _profile(folder, past, steps, Path(scratch) / "decode")


def _profile(folder: str, past: int, steps: int, prefix: Path) -> dict:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = str(prefix)
    session = ort.InferenceSession(
        str(Path(folder) / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
    feeds = decode_feeds(session, folder, past)
    warmup = 5
    for _ in range(warmup):
        session.run(None, feeds)
    started = time.thread_time()
    for _ in range(steps):
        session.run(None, feeds)
    step_ms = (time.thread_time() - started) / steps * 1e3
    events = json.loads(Path(session.end_profiling()).read_text())
    kernel_us: collections.Counter[str] = collections.Counter()
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            kernel_us[event["args"]["op_name"]] += event["dur"]
    runs = warmup + steps
    return {"step_ms": step_ms, "kernel_ms": {op: us / runs / 1e3 for op, us in kernel_us.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bundles", nargs="+")
    parser.add_argument("--past", type=int, default=256, help="KV cache length")
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(profile(args.bundles[0], args.past, args.steps)))
        return
    results = {}
    for folder in args.bundles:
        command = [sys.executable, __file__, folder, "--child"]
        command += ["--past", str(args.past), "--steps", str(args.steps)]
        done = subprocess.run(command, capture_output=True, text=True, check=True)
        results[folder] = json.loads(done.stdout.splitlines()[-1])
    ops = sorted(
        {op for result in results.values() for op in result["kernel_ms"]},
        key=lambda op: -max(r["kernel_ms"].get(op, 0.0) for r in results.values()),
    )
    print("| ms per decode step | " + " | ".join(args.bundles) + " |")
    print("|---|" + "--:|" * len(args.bundles))
    print(
        "| step (CPU time) | " + " | ".join(f"{r['step_ms']:.2f}" for r in results.values()) + " |"
    )
    for op in ops:
        cells = [f"{r['kernel_ms'].get(op, 0.0):.3f}" for r in results.values()]
        if max(float(cell) for cell in cells) >= 0.01:
            print(f"| {op} | " + " | ".join(cells) + " |")
    read = {folder: weight_bytes(folder) for folder in args.bundles}
    print(
        "| weights read by matrix products (MiB) | "
        + " | ".join(f"{read[f] / 2**20:,.0f}" for f in args.bundles)
        + " |"
    )
    rates = []
    for folder, result in results.items():
        kernel_ms = sum(result["kernel_ms"].get(op, 0.0) for op in MATRIX_PRODUCTS)
        rates.append(f"{read[folder] / kernel_ms / 1e6:.1f}")
    print("| matrix products' read rate (GB/s) | " + " | ".join(rates) + " |")
    print(
        f"\nReference: numpy sums 1 GiB of float32 on one thread at {numpy_read_rate():.1f} GB/s."
    )


if __name__ == "__main__":
    main()
