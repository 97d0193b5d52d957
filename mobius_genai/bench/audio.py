"""`bench --audio [FILE]`: a speech bundle's transcription time against the clip's length (the
real-time factor: below 1 is faster than the audio plays), or, for a bundle that takes a clip
beside its prompt (Gemma 4 E2B/E4B), the time to the first token with the clip, against the same
prompt without it. Without FILE, a generated tone is the clip."""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

from mobius_genai.bench.speed import FirstTokenBench, first_token_medians
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
class ClipBench(FirstTokenBench):
    audio_seconds: float | None  # None where the clip's headers do not say

    @property
    def clip_cost(self) -> float:
        return self.cost


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
    try:
        medians = first_token_medians(
            bundle, lambda: audio_inputs(bundle.model, text, clip), BENCH_PROMPT, rounds, new_tokens
        )
    except RuntimeError as error:
        raise bundle.failure("generate after the clip", error) from error
    return ClipBench(audio_seconds=seconds, **medians)
