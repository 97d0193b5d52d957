"""One configuration of `mobius-genai bench`, in a process of its own: reads the request (JSON)
on stdin, prints the measurements (JSON) on stdout.

The process loads the bundle, runs one warm-up generation, then the timed rounds; its peak
resident memory (the kernel's, so nothing between samples is missed) covers exactly this
configuration: the model, its sessions and the KV cache of this batch and length.
"""

from __future__ import annotations

import json
import sys
import time

from mobius_genai.bench.speed import open_for_bench, random_prompt, time_generation
from mobius_genai.errors import MobiusError


def peak_rss_mib() -> float | None:
    """This process's peak resident set size in MiB; None where the system does not say."""
    try:
        import resource
    except ImportError:  # Windows
        return None
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, else KiB


def measure(request: dict) -> dict:
    """Load time, the timed rounds and the peak RSS of one configuration."""
    started = time.perf_counter()
    bundle = open_for_bench(
        request["folder"],
        cpu=request["cpu"],
        threads=request["threads"],
        adapter=request.get("adapter"),
        mtp=request.get("mtp", True),
    )
    load_s = time.perf_counter() - started
    prompt = random_prompt(request["batch_size"], request["prompt_length"], request["vocab_size"])
    new_tokens = request["new_tokens"]
    try:
        time_generation(bundle.model, prompt, min(new_tokens, 4), bundle.adapter, bundle.mtp)
        rounds = [
            time_generation(bundle.model, prompt, new_tokens, bundle.adapter, bundle.mtp)
            for _ in range(request["rounds"])
        ]
    except RuntimeError as error:  # onnxruntime-genai's error type for a failing run
        raise bundle.failure("generate", error) from error
    return {"load_s": load_s, "rounds": rounds, "peak_rss_mib": peak_rss_mib()}


def main() -> None:
    request = json.loads(sys.stdin.read())
    try:
        answer = measure(request)
    except MobiusError as error:
        answer = {"error": str(error)}
    print(json.dumps(answer))


if __name__ == "__main__":
    main()
