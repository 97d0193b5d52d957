"""CPU decode step: q/k/v packed into one projection against three separate ones.

The cpu EP packs q/k/v for float32 (`qkv_pack_dtypes={FLOAT}`), as onnxruntime-genai's
builder does: one MatMul (MatMulNBits for int4) per layer feeding GroupQueryAttention instead
of three. This measures what that changes: both bundles are packaged from the same checkpoint
(the cpu EP, and the cpu EP with `qkv_pack_dtypes` empty), then processes that each load one
bundle as a plain onnxruntime session (one thread; two models in one process disturb each
other's speed) take turns timing decode steps (one new token after a `--past`-token KV cache).

    python benchmarks/qkv_packing.py [--precisions fp32,int4] [--processes 6] [--past 256]

Prints the median step time of each layout and the median of the per-round ratios
packed / separate (below 1: packing is faster).
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

from _decode import decode_feeds
from make_qwen25_05b_shape import WORK, make_checkpoint


def package_both(checkpoint: Path, precision: str) -> dict[str, Path]:
    """The cpu bundle (packed q/k/v) and the same with three projections, in benchmarks/_work."""
    import mobius_genai

    packed = mobius_genai.get_ep("cpu")
    separate = dataclasses.replace(packed, name="cpu-separate-qkv", qkv_pack_dtypes=frozenset())
    bundles = {}
    for label, caps in (("separate", separate), ("packed", packed)):
        out = WORK / f"qkv-{label}-{precision}"
        mobius_genai.package(
            checkpoint, caps, out, precision=precision, force=True, quiet=True, smoke_test=False
        )
        bundles[label] = out
    return bundles


def time_steps(folder: str, past: int, rounds: int, steps: int) -> list[float]:
    """Per round, the mean CPU time (ms) of one decode step of the bundle in `folder`."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(
        str(Path(folder) / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )
    feeds = decode_feeds(session, folder, past)
    for _ in range(3):
        session.run(None, feeds)
    times = []
    for _ in range(rounds):
        started = time.thread_time()
        for _ in range(steps):
            session.run(None, feeds)
        times.append((time.thread_time() - started) / steps * 1e3)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precisions", default="fp32,int4")
    parser.add_argument("--processes", type=int, default=6, help="processes per bundle")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per process")
    parser.add_argument("--steps", type=int, default=20, help="decode steps timed per round")
    parser.add_argument("--past", type=int, default=256, help="KV cache length")
    parser.add_argument("--keep", action="store_true", help="keep the bundles in benchmarks/_work")
    parser.add_argument("--child", help=argparse.SUPPRESS)
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
            for folder in order if index % 2 == 0 else list(reversed(order)):
                command = [sys.executable, __file__, "--child", folder]
                command += ["--past", str(args.past), "--rounds", str(args.rounds)]
                command += ["--steps", str(args.steps)]
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                pooled[folder].extend(json.loads(done.stdout.splitlines()[-1]))
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
