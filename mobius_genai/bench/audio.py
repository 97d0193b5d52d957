"""`bench --audio [FILE]`: a speech bundle's transcription time against the clip's length (the
real-time factor: below 1 is faster than the audio plays), or, for a bundle that takes a clip
beside its prompt (Gemma 4 E2B/E4B), the time to the first token with the clip, against the same
prompt without it. Without FILE, a generated tone is the clip."""

from __future__ import annotations

import dataclasses
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import onnxruntime_genai as og

from mobius_genai.bundle.validate import read_genai_config
from mobius_genai.ep import HOST_EP
from mobius_genai.errors import OptionError
from mobius_genai.runtime.audio import (
    PROMPT_CLIP_SECONDS,
    Clip,
    audio_inputs,
    audio_prompt,
    has_audio,
    max_seconds,
    require_audio_bundle,
    tone_bytes,
)
from mobius_genai.runtime.opening import OpenBundle, open_bundle
from mobius_genai.runtime.placement import provider_of
from mobius_genai.runtime.transcription import TranscriptRequest, transcript_steps

#: The clip `bench --audio` times without a file: a tone as long as the smoke test's.
GENERATED_SECONDS = 2.0
#: The prompt the clip is placed in front of (og's processor expands the placeholder).
BENCH_PROMPT = "Describe the audio."


@dataclasses.dataclass(frozen=True)
class AudioBench:
    audio_seconds: float
    seconds: float  # median transcription time, processor to last token
    tokens: int

    @property
    def real_time_factor(self) -> float:
        return self.seconds / self.audio_seconds


@dataclasses.dataclass(frozen=True)
class ClipBench:
    audio_seconds: float | None  # None where the clip's headers do not say
    ttft_ms: float  # median: the processor (decoding, features), the graphs, the first token
    text_ttft_ms: float  # median first token of the same prompt without the clip
    decode_tps: float  # median tokens/s after the first, with the clip
    prompt_tokens: int  # the prompt with the clip's tokens
    tokens: int

    @property
    def clip_cost(self) -> float:
        """How many times the text prompt's first token the clip's first token takes."""
        return self.ttft_ms / self.text_ttft_ms


def generated_clip() -> Clip:
    """The clip `bench --audio` times when no file is given."""
    return Clip(tone_bytes(GENERATED_SECONDS), f"a generated {GENERATED_SECONDS:g} s tone")


def bench_audio(
    folder: str | Path,
    clip: Clip,
    *,
    rounds: int,
    cpu: bool,
    threads: int | None,
    new_tokens: int = 32,
) -> AudioBench | ClipBench:
    """The medians of `rounds` timed runs with `clip` after a warm-up: a speech bundle's
    transcriptions, or a prompt-audio bundle's generations of `new_tokens` after BENCH_PROMPT."""
    config = read_genai_config(Path(folder))
    require_audio_bundle(folder, config, True)
    speech = has_audio(config)
    seconds = clip.seconds(max_seconds(folder) if speech else PROMPT_CLIP_SECONDS)
    if speech and seconds is None:
        raise OptionError(
            f"{clip.name}: bench needs the audio's length, which it reads from WAV, FLAC and MP3 "
            "headers; accepted: a WAV, FLAC or MP3 file"
        )
    bundle = open_bundle(
        folder, command="bench", provider=provider_of(HOST_EP) if cpu else None, threads=threads
    )
    if not speech:
        return _bench_prompt_clip(bundle, clip, seconds, rounds, new_tokens)
    times, tokens = [], 0
    for _ in range(rounds + 1):
        start = time.perf_counter()
        tokens = sum(1 for _ in transcript_steps(bundle, clip, TranscriptRequest()))
        times.append(time.perf_counter() - start)
    return AudioBench(seconds, statistics.median(times[1:]), tokens)


def _bench_prompt_clip(
    bundle: OpenBundle, clip: Clip, seconds: float | None, rounds: int, new_tokens: int
) -> ClipBench:
    text, _ = audio_prompt(bundle.folder, bundle.config, BENCH_PROMPT, clip)
    processor = bundle.model.create_multimodal_processor()
    with_clip, without = [], []
    try:
        for _ in range(rounds + 1):
            with_clip.append(
                _timed(bundle, lambda: audio_inputs(bundle.model, text, clip), new_tokens)
            )
            without.append(_timed(bundle, lambda: processor(BENCH_PROMPT), 1))
    except RuntimeError as error:
        raise bundle.failure("generate after the clip", error) from error
    timed = with_clip[1:]
    return ClipBench(
        audio_seconds=seconds,
        ttft_ms=statistics.median(run[0] for run in timed) * 1e3,
        text_ttft_ms=statistics.median(run[0] for run in without[1:]) * 1e3,
        decode_tps=statistics.median(run[1] for run in timed),
        prompt_tokens=timed[0][2],
        tokens=timed[0][3],
    )


def _timed(
    bundle: OpenBundle, inputs: Callable[[], og.NamedTensors], new_tokens: int
) -> tuple[float, float, int, int]:
    """(seconds to the first token, tokens/s after it, prompt tokens, tokens generated) of a
    greedy generation from the processor's `inputs()`, which the first token's time includes."""
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
