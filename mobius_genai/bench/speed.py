"""Prefill and decode speed of one onnxruntime-genai generation.

- prefill: the time of `append_tokens(prompt)` (one forward pass over the prompt);
- time to first token: prefill plus the first generate_next_token() (which only picks a token
  from the prefill's logits);
- decode: the time of the generate_next_token() calls after the first (each runs one forward
  pass and picks a token).

Rates count the tokens of the whole batch. Each is measured in wall-clock time and in CPU time
of the calling thread (with one intra-op thread, onnxruntime computes on the caller's thread),
which other processes on the machine disturb much less.
"""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import onnxruntime_genai as og

from mobius_genai.runtime.adapters import ActiveAdapter
from mobius_genai.runtime.mtp import MtpStats, mtp_generator
from mobius_genai.runtime.opening import ON_CPU, OpenBundle, open_bundle


def load(folder: str | Path, *, cpu: bool = False, threads: int | None = None) -> og.Model:
    """og.Model of a bundle; `cpu` runs it on the CPU provider, `threads` sets onnxruntime's
    intra-op threads (one inter-op thread), the bundle itself unchanged."""
    return open_for_bench(folder, cpu=cpu, threads=threads).model


def open_for_bench(
    folder: str | Path,
    *,
    cpu: bool,
    threads: int | None,
    adapter: str | None = None,
    mtp: bool = True,
) -> OpenBundle:
    """The bundle opened as `run` and `chat` open it (their errors and advice), for bench;
    `adapter` names the LoRA adapter its generations run with; `mtp=False` leaves its MTP
    head out."""
    return open_bundle(
        folder,
        command="bench",
        provider=ON_CPU if cpu else None,
        threads=threads,
        adapter=adapter,
        mtp=mtp,
    )


def random_prompt(batch_size: int, length: int, vocab_size: int, seed: int = 0) -> np.ndarray:
    """int32 token ids [batch_size, length] drawn below `vocab_size`."""
    rng = np.random.default_rng(seed)
    return rng.integers(0, vocab_size, (batch_size, length)).astype(np.int32)


def _time_mtp(
    model: og.Model, head: og.Model, prompt: np.ndarray, new_tokens: int
) -> dict[str, float]:
    """`time_generation` with og.MtpGenerator: prefill is `append_tokens` (the main model's),
    decode the tokens after the first; `acceptance` the drafts accepted per draft evaluated."""
    length = len(prompt)
    generator = mtp_generator(model, head, length + new_tokens)
    started = _clocks()
    generator.append_tokens(prompt)
    prefilled = _clocks()
    generator.generate_next_token()
    first = _clocks()
    while not generator.is_done() and len(generator.get_sequence()) < length + new_tokens:
        generator.generate_next_token()
    decoded = _clocks()
    steps = len(generator.get_sequence()) - length - 1
    if steps != new_tokens - 1:
        raise RuntimeError(f"generated {steps + 1} tokens, expected {new_tokens}")
    stats = MtpStats()
    stats.read(generator.get_stats())
    return {
        "prefill": length / (prefilled[0] - started[0]),
        "decode": steps / (decoded[0] - first[0]),
        "prefill_cpu": length / (prefilled[1] - started[1]),
        "decode_cpu": steps / (decoded[1] - first[1]),
        "ttft_s": first[0] - started[0],
        "acceptance": stats.acceptance or 0.0,
    }


def _clocks() -> tuple[float, float]:
    return time.perf_counter(), time.thread_time()


def time_generation(
    model: og.Model,
    prompt: np.ndarray,
    new_tokens: int,
    adapter: ActiveAdapter | None = None,
    head: og.Model | None = None,
) -> dict[str, float]:
    """Prefill and decode tokens/s (by wall clock and by thread CPU time) and the time to first
    token in seconds of generating exactly `new_tokens` (>= 2) after `prompt`, a sequence of
    token ids or a [batch, length] array of them; with `adapter` active. With an MTP `head`
    (batch 1), og.MtpGenerator generates them, and the head's acceptance is measured too."""
    if new_tokens < 2:
        raise ValueError(f"new_tokens {new_tokens}: decode needs 2 or more")
    prompt = np.atleast_2d(np.asarray(prompt, np.int32))
    batch_size, length = prompt.shape
    if head is not None and batch_size == 1:
        return _time_mtp(model, head, prompt[0], new_tokens)
    params = og.GeneratorParams(model)
    total = length + new_tokens
    params.set_search_options(
        max_length=total, min_length=total, do_sample=False, batch_size=batch_size
    )
    generator = og.Generator(model, params)
    if adapter is not None:
        adapter.activate(generator)
    started = _clocks()
    generator.append_tokens(prompt if batch_size > 1 else prompt[0])
    prefilled = _clocks()
    generator.generate_next_token()
    first = _clocks()
    steps = 0
    while not generator.is_done():
        generator.generate_next_token()
        steps += 1
    decoded = _clocks()
    if steps != new_tokens - 1:
        raise RuntimeError(f"generated {steps + 1} tokens, expected {new_tokens}")
    return {
        "prefill": batch_size * length / (prefilled[0] - started[0]),
        "decode": batch_size * steps / (decoded[0] - first[0]),
        "prefill_cpu": batch_size * length / (prefilled[1] - started[1]),
        "decode_cpu": batch_size * steps / (decoded[1] - first[1]),
        "ttft_s": first[0] - started[0],
    }


def time_processed(
    bundle: OpenBundle, inputs: Callable[[], og.NamedTensors], new_tokens: int
) -> tuple[float, float, int, int]:
    """(seconds to the first token, tokens/s after it, prompt tokens, tokens generated) of a
    greedy generation from a multimodal processor's `inputs()` (an image's or a clip's, `bench
    --image` and `--audio`), which the first token's time includes."""
    start = time.perf_counter()
    prompt = inputs()
    length = prompt["input_ids"].as_numpy().shape[-1]
    params = og.GeneratorParams(bundle.model)
    limit = min(length + new_tokens, bundle.context_length)
    params.set_search_options(do_sample=False, max_length=limit)
    generator = og.Generator(bundle.model, params)
    generator.set_inputs(prompt)
    generator.generate_next_token()
    first = time.perf_counter()
    tokens = 1
    while not generator.is_done():
        generator.generate_next_token()
        tokens += 1
    decoded = time.perf_counter() - first
    return first - start, (tokens - 1) / decoded if tokens > 1 else 0.0, length, tokens


@dataclasses.dataclass(frozen=True)
class FirstTokenBench:
    """The first token after an image or a clip beside a prompt (`bench --image`, `--audio`),
    against the same prompt without it: medians of the timed rounds."""

    ttft_ms: float  # the processor (decoding the media), the graphs, the first token
    text_ttft_ms: float  # the first token of the same prompt without the media
    decode_tps: float  # tokens/s after the first, with the media
    prompt_tokens: int  # the prompt with the media's tokens
    tokens: int

    @property
    def cost(self) -> float:
        """How many times the text prompt's first token the media's first token takes."""
        return self.ttft_ms / self.text_ttft_ms

    def line(self, shown: str, what: str, rounds: int) -> str:
        """The result in words: `shown` names the media, `what` its kind ("image", "clip")."""
        return (
            f"{shown}: first token after the {what} in {self.ttft_ms:,.1f} ms "
            f"({self.cost:.1f}x the {self.text_ttft_ms:,.1f} ms of the prompt without "
            f"it; {self.prompt_tokens} prompt tokens), then {self.decode_tps:,.1f} tokens/s "
            f"(median of {rounds})"
        )


def first_token_medians(
    bundle: OpenBundle,
    inputs: Callable[[], og.NamedTensors],
    text: str,
    rounds: int,
    new_tokens: int,
) -> dict[str, float | int]:
    """FirstTokenBench's fields: `rounds` generations of `new_tokens` after the processor's
    `inputs()` and as many first tokens after the prompt `text` alone, each after a warm-up."""
    processor = bundle.model.create_multimodal_processor()
    with_media, without = [], []
    for _ in range(rounds + 1):
        with_media.append(time_processed(bundle, inputs, new_tokens))
        without.append(time_processed(bundle, lambda: processor(text), 1))
    timed = with_media[1:]
    return {
        "ttft_ms": statistics.median(run[0] for run in timed) * 1e3,
        "text_ttft_ms": statistics.median(run[0] for run in without[1:]) * 1e3,
        "decode_tps": statistics.median(run[1] for run in timed),
        "prompt_tokens": timed[0][2],
        "tokens": timed[0][3],
    }
