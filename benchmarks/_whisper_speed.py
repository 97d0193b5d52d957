"""One Whisper bundle's transcription time on onnxruntime-genai's CPU EP; prints JSON.

Run by whisper_cpu.py in a process of its own (its peak memory is the process's, load included). The bundle is
opened as `mobius-genai bench` opens it (CPU provider, `--threads` intra-op threads, the bundle
unchanged); a round is og's processor on the audio file (decode, log-mel), then og.Generator:
the encoder once and exactly `--new` decoder steps after the forced prompt (min_length keeps a
random model's early end-of-text from shortening a round), timed by wall clock.

    python benchmarks/_whisper_speed.py BUNDLE AUDIO --new 64 --rounds 3 --threads 1
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import onnxruntime_genai as og

from mobius_genai.bench.speed import load

PROMPT = "<|startoftranscript|><|en|><|transcribe|><|notimestamps|>"


def transcribe(model: og.Model, audio: str, new: int) -> float:
    """Seconds from the audio file to the `new`-th token."""
    started = time.perf_counter()
    inputs = model.create_multimodal_processor()(PROMPT, audios=og.Audios.open(audio))
    length = inputs["input_ids"].as_numpy().shape[-1] + new
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=length, min_length=length)
    generator = og.Generator(model, params)
    generator.set_inputs(inputs)
    while not generator.is_done():
        generator.generate_next_token()
    return time.perf_counter() - started


def peak_mib() -> float:
    """This process's peak RSS since its exec (Linux VmHWM; ru_maxrss would carry the peak of
    the parent it was forked from)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("no VmHWM in /proc/self/status (Linux only)")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("audio")
    parser.add_argument("--new", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    model = load(args.bundle, cpu=True, threads=args.threads)
    transcribe(model, args.audio, 4)  # warm-up
    seconds = [transcribe(model, args.audio, args.new) for _ in range(args.rounds)]
    print(json.dumps({"seconds": seconds, "peak_mib": peak_mib()}))


if __name__ == "__main__":
    main()
