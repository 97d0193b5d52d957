"""Prefill and decode speed of a bundle with every position's logits (the default) against the
same bundle with `--prune-lm-head` (logits of each sequence's last position only), issue 28.

The pruned LM head saves the [hidden, vocab] matmul over all but one prompt position, which is
what made bundles faster than the builder's at prefill; it costs og.Engine, n-gram speculative
decoding and get_output("logits") (bundle/og_support.py). Both bundles are packaged from
make_qwen25_05b_shape.py's checkpoint (Qwen2.5-0.5B shapes, random bf16 weights, vocabulary
151936: the LM head is a large part of a small model's prefill) and timed as compare_builder.py
times bundles: onnxruntime-genai on CPU, one thread, each bundle in processes of its own that
take turns; the ratio is the median of per-round ratios pruned / full.

    python benchmarks/prune_lm_head.py                       # fp32, ~5 minutes
    python benchmarks/prune_lm_head.py --precision int4 --processes 2
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess

import make_qwen25_05b_shape
from compare_builder import LABELS, MOBIUS, WORK, _fmt, speed

METRICS = (
    ("prefill_tps", "prefill"),
    ("prefill_tps", "prefill_cpu"),
    ("decode_tps", "decode"),
    ("decode_tps", "decode_cpu"),
)


def package(checkpoint, precision: str, prune: bool):
    out = WORK / f"logits-{precision}-{'pruned' if prune else 'full'}"
    command = [MOBIUS, "package", str(checkpoint), "--ep", "cpu", "--precision", precision]
    command += ["-o", str(out), "--force", "--quiet", "--no-smoke-test"]
    command += ["--prune-lm-head"] if prune else []
    subprocess.run(command, check=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", default="fp32", choices=("fp32", "int4"))
    parser.add_argument("--rounds", type=int, default=3, help="speed rounds per process")
    parser.add_argument("--processes", type=int, default=4, help="speed processes per bundle")
    parser.add_argument("--prompt", type=int, default=256, help="prompt tokens (prefill)")
    parser.add_argument("--new", type=int, default=16, help="new tokens (decode)")
    parser.add_argument("--keep", action="store_true", help="keep the bundles in benchmarks/_work")
    args = parser.parse_args()
    checkpoint = make_qwen25_05b_shape.make_checkpoint("0.5b")
    full = package(checkpoint, args.precision, prune=False)
    pruned = package(checkpoint, args.precision, prune=True)
    results = speed([pruned, full], args)
    print(
        f"\nQwen2.5-0.5B shapes, {args.precision}, CPU EP, 1 thread, prompt {args.prompt} "
        f"tokens, {args.new} new tokens, {args.processes} x {args.rounds} rounds, medians\n"
    )
    print("| metric | --prune-lm-head | default (every position) | ratio pruned / default |")
    print("|---|--:|--:|--:|")
    for metric, key in METRICS:
        ours, reference = results[str(pruned)][key], results[str(full)][key]
        ratio = statistics.median(a / b for a, b in zip(ours, reference, strict=False))
        label = LABELS.get(metric, metric) + (" (CPU time)" if key.endswith("_cpu") else "")
        print(
            f"| {label} | {_fmt(statistics.median(ours))} | "
            f"{_fmt(statistics.median(reference))} | {ratio:.2f} |"
        )
    if not args.keep:
        shutil.rmtree(full)
        shutil.rmtree(pruned)


if __name__ == "__main__":
    main()
