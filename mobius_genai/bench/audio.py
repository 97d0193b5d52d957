"""`bench --audio FILE`: how long a speech bundle takes to transcribe a file, against the
file's length (the real-time factor: below 1 is faster than the audio plays)."""

from __future__ import annotations

import dataclasses
import statistics
import time
from pathlib import Path

from mobius_genai.ep import HOST_EP
from mobius_genai.errors import OptionError
from mobius_genai.runtime.audio import audio_seconds, max_seconds, transcribe
from mobius_genai.runtime.opening import open_bundle
from mobius_genai.runtime.placement import provider_of


@dataclasses.dataclass(frozen=True)
class AudioBench:
    audio_seconds: float
    seconds: float  # median transcription time, processor to last token
    tokens: int

    @property
    def real_time_factor(self) -> float:
        return self.seconds / self.audio_seconds


def bench_audio(
    folder: str | Path, path: str | Path, *, rounds: int, cpu: bool, threads: int | None
) -> AudioBench:
    """The median of `rounds` timed transcriptions of the audio file `path` (WAV, FLAC or
    MP3), after a warm-up."""
    seconds = audio_seconds(path, max_seconds(folder))
    if seconds is None:
        raise OptionError(
            f"--audio {path}: bench needs the audio's length, which it reads from WAV, FLAC "
            "and MP3 headers; accepted: a WAV, FLAC or MP3 file"
        )
    bundle = open_bundle(
        folder, command="bench", provider=provider_of(HOST_EP) if cpu else None, threads=threads
    )
    times, tokens = [], 0
    for _ in range(rounds + 1):
        start = time.perf_counter()
        tokens = len(list(transcribe(bundle, path)))
        times.append(time.perf_counter() - start)
    return AudioBench(seconds, statistics.median(times[1:]), tokens)
