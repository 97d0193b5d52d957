"""Prefill and decode speed of bundles with onnxruntime-genai, interleaved; prints JSON.

Run by compare_builder.py in a process of its own. Every bundle is loaded once with the same
overlay (CPU, `intra_op_num_threads` threads); then each round runs every bundle once, the order
alternating between rounds, after one warm-up run each:

- prefill: the time of `append_tokens(prompt)` (one forward pass over the prompt);
- decode: the time of the generate_next_token() calls after the first (the first only picks a
  token from the prefill's logits; each later one runs one forward pass and picks a token).

Each is measured in wall-clock time and in CPU time of the calling thread (with one intra-op
thread, onnxruntime computes on the caller's thread), which other processes on the machine
disturb much less. The JSON also says how much of the process's anonymous memory sits in
transparent huge pages at the end (`anon_huge_mib`, Linux; see hugepages.py).

    python benchmarks/_og_speed.py --prompt 256 --new 64 --rounds 3 BUNDLE [BUNDLE ...]
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np
import onnxruntime_genai as og


def load(folder: str, threads: int) -> og.Model:
    config = og.Config(folder)
    config.clear_providers()
    options = {"intra_op_num_threads": threads, "inter_op_num_threads": 1}
    config.overlay(json.dumps({"model": {"decoder": {"session_options": options}}}))
    return og.Model(config)


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


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.thread_time()


def run_once(model: og.Model, prompt: np.ndarray, new_tokens: int) -> dict[str, float]:
    """Prefill and decode tokens/s of one generation, by wall clock and by thread CPU time."""
    params = og.GeneratorParams(model)
    total = len(prompt) + new_tokens
    params.set_search_options(max_length=total, min_length=total, do_sample=False)
    generator = og.Generator(model, params)
    started = _clocks()
    generator.append_tokens(prompt)
    prefilled = _clocks()
    generator.generate_next_token()
    steps = 0
    decode_started = _clocks()
    while not generator.is_done():
        generator.generate_next_token()
        steps += 1
    decoded = _clocks()
    if steps != new_tokens - 1:
        raise RuntimeError(f"generated {steps + 1} tokens, expected {new_tokens}")
    return {
        "prefill": len(prompt) / (prefilled[0] - started[0]),
        "decode": steps / (decoded[0] - decode_started[0]),
        "prefill_cpu": len(prompt) / (prefilled[1] - started[1]),
        "decode_cpu": steps / (decoded[1] - decode_started[1]),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundles", nargs="+")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--vocab", type=int, default=384, help="prompt ids are drawn below this")
    args = parser.parse_args()
    prompt = np.random.default_rng(0).integers(0, args.vocab, args.prompt).astype(np.int32)
    models = {}
    load_s = {}
    for folder in args.bundles:
        started = time.perf_counter()
        models[folder] = load(folder, args.threads)
        load_s[folder] = time.perf_counter() - started
    for model in models.values():
        run_once(model, prompt, min(args.new, 4))  # warm-up
    results: dict[str, dict[str, list[float]]] = {folder: {} for folder in models}
    for round_index in range(args.rounds):
        order = list(models) if round_index % 2 == 0 else list(reversed(models))
        for folder in order:
            for key, value in run_once(models[folder], prompt, args.new).items():
                results[folder].setdefault(key, []).append(value)
    print(json.dumps({"load_s": load_s, "anon_huge_mib": anon_huge_mib(), "results": results}))


if __name__ == "__main__":
    main()
