"""Prefill and decode speed of bundles with onnxruntime-genai, interleaved; prints JSON.

Run by compare_builder.py in a process of its own. Every bundle is loaded once with the same
overlay (CPU, `intra_op_num_threads` threads); then each round runs every bundle once, the order
alternating between rounds, after one warm-up run each. A run is timed as `mobius-genai bench`
times it (mobius_genai/bench/speed.py: prefill, decode and time to first token, by wall clock
and by CPU time of the calling thread, which other processes on the machine disturb much
less). The JSON also says how much of the process's anonymous memory sits in transparent huge
pages at the end (`anon_huge_mib`, Linux; see hugepages.py).

    python benchmarks/_og_speed.py --prompt 256 --new 64 --rounds 3 BUNDLE [BUNDLE ...]
"""

from __future__ import annotations

import argparse
import json
import time

from mobius_genai.bench.speed import load, random_prompt, time_generation


def anon_huge_mib() -> float | None:
    """MiB of this process's anonymous memory in transparent huge pages (Linux), else None."""
    try:
        with open("/proc/self/smaps_rollup") as stream:
            for line in stream:
                if line.startswith("AnonHugePages:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundles", nargs="+")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=384, help="prompt ids are drawn below this")
    args = parser.parse_args()
    prompt = random_prompt(1, args.prompt, args.vocab)
    models = {}
    load_s = {}
    for folder in args.bundles:
        started = time.perf_counter()
        models[folder] = load(folder, cpu=True, threads=args.threads)
        load_s[folder] = time.perf_counter() - started
    for model in models.values():
        time_generation(model, prompt, min(args.new, 4))  # warm-up
    results: dict[str, dict[str, list[float]]] = {folder: {} for folder in models}
    for round_index in range(args.rounds):
        order = list(models) if round_index % 2 == 0 else list(reversed(models))
        for folder in order:
            for key, value in time_generation(models[folder], prompt, args.new).items():
                results[folder].setdefault(key, []).append(value)
    print(json.dumps({"load_s": load_s, "anon_huge_mib": anon_huge_mib(), "results": results}))


if __name__ == "__main__":
    main()
