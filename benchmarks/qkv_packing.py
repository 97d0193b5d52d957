"""CPU decode step: q/k/v packed into one projection against three separate ones.

The cpu EP packs q/k/v for float32 (`qkv_pack_dtypes={FLOAT}`), as onnxruntime-genai's
builder does: one MatMul (MatMulNBits for int4) per layer feeding GroupQueryAttention instead
of three. This measures what that changes: both bundles are packaged from the same checkpoint
(the cpu EP, and the cpu EP with `qkv_pack_dtypes` empty), then processes that each load one
bundle as a plain onnxruntime session (one thread; two models in one process disturb each
other's speed) take turns timing decode steps (one new token after a `--past`-token KV cache).

    python benchmarks/qkv_packing.py [--shape qwen2.5-0.5b] [--precisions fp32,int4]
        [--processes 6] [--past 256]

`--shape gemma3-270m` (make_gemma3_270m_shape.py) measures layers whose q/k norms sit between
the projections and attention: packed there means one projection and a Split before the norms
(PackQKVSplit).

Prints the median step time of each layout and the median of the per-round ratios
packed / separate (below 1: packing is faster), then the kernel time of the q/k/v projections
alone (from onnxruntime's profile of each process's steps; median over processes), which the
LM head and the MLPs do not drown out.
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

import make_gemma3_270m_shape
import make_qwen25_05b_shape
from _decode import decode_feeds
from make_qwen25_05b_shape import WORK

#: Name parts of the q/k/v projection nodes (separate, and packed with its Split).
PROJECTION_NODES = ("q_proj/", "k_proj/", "v_proj/", "qkv_proj/", "qkv_split")

#: --shape → the function making (or finding) its random-weight checkpoint.
SHAPES = {
    "qwen2.5-0.5b": lambda: make_qwen25_05b_shape.make_checkpoint("0.5b"),
    "gemma3-270m": make_gemma3_270m_shape.make_checkpoint,
}


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


def _session(folder: str, profile: bool):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.enable_profiling = profile
    if profile:
        options.profile_file_prefix = str(Path(folder) / "profile")
    return ort.InferenceSession(
        str(Path(folder) / "model.onnx"), options, providers=["CPUExecutionProvider"]
    )


def time_steps(folder: str, past: int, rounds: int, steps: int) -> list[float]:
    """Per round, the mean CPU time (ms) of one decode step of the bundle in `folder`."""
    session = _session(folder, profile=False)
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


def projection_time(folder: str, past: int, steps: int) -> float:
    """The kernel time (ms per decode step) of the q/k/v projection nodes (and the packed
    layout's Split), from onnxruntime's profile of `steps` steps."""
    session = _session(folder, profile=True)
    feeds = decode_feeds(session, folder, past)
    for _ in range(steps):
        session.run(None, feeds)
    profile = Path(session.end_profiling())
    events = json.loads(profile.read_text())
    profile.unlink()
    total = sum(
        event["dur"]
        for event in events
        if event.get("cat") == "Node"
        and event["name"].endswith("_kernel_time")
        and any(f"/{part}" in event["name"] for part in PROJECTION_NODES)
    )
    return total / steps / 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-0.5b")
    parser.add_argument("--precisions", default="fp32,int4")
    parser.add_argument("--processes", type=int, default=6, help="processes per bundle")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per process")
    parser.add_argument("--steps", type=int, default=20, help="decode steps timed per round")
    parser.add_argument("--past", type=int, default=256, help="KV cache length")
    parser.add_argument("--keep", action="store_true", help="keep the bundles in benchmarks/_work")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        steps = time_steps(args.child, args.past, args.rounds, args.steps)
        projections = projection_time(args.child, args.past, args.rounds * args.steps)
        print(json.dumps({"steps": steps, "projections": projections}))
        return
    checkpoint = SHAPES[args.shape]()
    print(
        "| precision | separate (ms/step) | packed (ms/step) | packed / separate time | "
        "q/k/v projections separate (ms/step) | packed | packed / separate |"
    )
    print("|---|--:|--:|--:|--:|--:|--:|")
    for precision in args.precisions.split(","):
        bundles = package_both(checkpoint, precision)
        order = [str(bundles["separate"]), str(bundles["packed"])]
        pooled: dict[str, list[float]] = {folder: [] for folder in order}
        projections: dict[str, list[float]] = {folder: [] for folder in order}
        for index in range(args.processes):
            for folder in order if index % 2 == 0 else list(reversed(order)):
                command = [sys.executable, __file__, "--child", folder]
                command += ["--past", str(args.past), "--rounds", str(args.rounds)]
                command += ["--steps", str(args.steps)]
                done = subprocess.run(command, capture_output=True, text=True, check=True)
                result = json.loads(done.stdout.splitlines()[-1])
                pooled[folder].extend(result["steps"])
                projections[folder].append(result["projections"])
        separate, packed = pooled[order[0]], pooled[order[1]]
        ratio = statistics.median(p / s for s, p in zip(separate, packed, strict=True))
        qkv = [statistics.median(projections[folder]) for folder in order]
        print(
            f"| {precision} | {statistics.median(separate):.2f} | "
            f"{statistics.median(packed):.2f} | {ratio:.3f} | {qkv[0]:.3f} | {qkv[1]:.3f} | "
            f"{qkv[1] / qkv[0]:.3f} |",
            flush=True,
        )
        if not args.keep:
            for folder in bundles.values():
                shutil.rmtree(folder)


if __name__ == "__main__":
    main()
