"""CPU decode step: separate q/k/v projections (the cpu EP's choice) against one packed one.

onnxruntime-genai's builder packs q/k/v into one MatMul (MatMulNBits for int4) feeding
GroupQueryAttention; the cpu EP here keeps three projections (`qkv_pack_dtypes` is empty, as in
the spec's registry). This measures which is faster on this machine: both bundles are packaged
from the same checkpoint (the cpu EP, and the cpu EP with `qkv_pack_dtypes={FLOAT}`), then each
of several processes loads both as plain onnxruntime sessions (one thread) and times decode
steps (one new token after a `--past`-token KV cache) in interleaved rounds; the load order
alternates between processes (the session loaded second runs a few percent faster).

    python benchmarks/qkv_packing.py [--precisions fp32,int4] [--processes 4] [--past 256]

Prints the median step time of each layout and the median of the per-round ratios
separate / packed (above 1: separate projections are faster).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from make_qwen25_05b_shape import WORK, make_checkpoint


def package_both(checkpoint: Path, precision: str) -> dict[str, Path]:
    """The cpu bundle and the same with packed q/k/v, under benchmarks/_work."""
    import onnx_ir as ir

    import mobius_genai

    cpu = mobius_genai.get_ep("cpu")
    packed = dataclasses.replace(
        cpu, name="cpu-packed-qkv", qkv_pack_dtypes=frozenset({ir.DataType.FLOAT})
    )
    bundles = {}
    for label, caps in (("separate", cpu), ("packed", packed)):
        out = WORK / f"qkv-{label}-{precision}"
        mobius_genai.package(
            checkpoint, caps, out, precision=precision, force=True, quiet=True, smoke_test=False
        )
        bundles[label] = out
    return bundles


def _feeds(session, past: int) -> dict[str, np.ndarray]:
    feeds = {}
    rng = np.random.default_rng(0)
    for value in session.get_inputs():
        if value.name == "input_ids":
            feeds[value.name] = np.array([[5]], np.int64)
        elif value.name == "attention_mask":
            feeds[value.name] = np.ones((1, past + 1), np.int64)
        elif value.name == "position_ids":
            feeds[value.name] = np.array([[past]], np.int64)
        else:  # past_key_values.*: [batch, kv_heads, past, head_size]
            shape = (1, value.shape[1], past, value.shape[3])
            feeds[value.name] = rng.standard_normal(shape).astype(np.float32)
    return feeds


def time_steps(folders: list[str], past: int, rounds: int, steps: int) -> dict[str, list[float]]:
    """Per round, the mean CPU time (ms) of one decode step of each bundle (run in-process)."""
    import onnxruntime as ort

    sessions = {}
    for folder in folders:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        session = ort.InferenceSession(
            str(Path(folder) / "model.onnx"), options, providers=["CPUExecutionProvider"]
        )
        sessions[folder] = (session, _feeds(session, past))
    times: dict[str, list[float]] = {folder: [] for folder in folders}
    for index in range(rounds):
        for folder in folders if index % 2 == 0 else list(reversed(folders)):
            session, feeds = sessions[folder]
            for _ in range(3):
                session.run(None, feeds)
            started = time.thread_time()
            for _ in range(steps):
                session.run(None, feeds)
            times[folder].append((time.thread_time() - started) / steps * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", default="fp32,int4")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--steps", type=int, default=20, help="decode steps timed per round")
    parser.add_argument("--past", type=int, default=256, help="KV cache length")
    parser.add_argument("--keep", action="store_true", help="keep the bundles in benchmarks/_work")
    parser.add_argument("--child", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(time_steps(args.child, args.past, args.rounds, args.steps)))
        return
    checkpoint = make_checkpoint("0.5b")
    print("| precision | separate (ms/step) | packed (ms/step) | packed / separate time |")
    print("|---|--:|--:|--:|")
    for precision in args.precisions.split(","):
        bundles = package_both(checkpoint, precision)
        order = [str(bundles["separate"]), str(bundles["packed"])]
        pooled: dict[str, list[float]] = {folder: [] for folder in order}
        for index in range(args.processes):
            folders = order if index % 2 == 0 else list(reversed(order))
            command = [sys.executable, __file__, "--child", *folders]
            command += ["--past", str(args.past), "--rounds", str(args.rounds)]
            command += ["--steps", str(args.steps)]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            for folder, values in json.loads(done.stdout.splitlines()[-1]).items():
                pooled[folder].extend(values)
        separate, packed = pooled[order[0]], pooled[order[1]]
        ratio = statistics.median(p / s for s, p in zip(separate, packed, strict=True))
        print(
            f"| {precision} | {statistics.median(separate):.2f} | "
            f"{statistics.median(packed):.2f} | {ratio:.3f} |",
            flush=True,
        )
        if not args.keep:
            for folder in bundles.values():
                shutil.rmtree(folder)


if __name__ == "__main__":
    main()
