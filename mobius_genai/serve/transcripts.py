"""A transcript in OpenAI's response formats: json and text (the text), srt and vtt (a cue per
segment), verbose_json (task, language, duration, text and the segments with what
openai/whisper reports of them; a value that could not be computed is left out, not made up).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mobius_genai.runtime.transcription import TimedSegment, Transcript
from mobius_genai.runtime.whisper_languages import LANGUAGE_NAMES

#: Each format's media type.
MEDIA_TYPES = {
    "json": "application/json",
    "verbose_json": "application/json",
    "text": "text/plain; charset=utf-8",
    "srt": "application/x-subrip; charset=utf-8",
    "vtt": "text/vtt; charset=utf-8",
}


def transcript_body(transcript: Transcript, response_format: str) -> str | dict[str, Any]:
    """The response body of `transcript` in `response_format`: a JSON object or text."""
    if response_format == "json":
        return {"text": transcript.text}
    if response_format == "verbose_json":
        return verbose_json(transcript)
    if response_format == "srt":
        return srt(transcript.segments)
    if response_format == "vtt":
        return vtt(transcript.segments)
    return transcript.text


def verbose_json(transcript: Transcript) -> dict[str, Any]:
    """OpenAI's verbose_json: the transcript and its segments."""
    segments = [
        {key: value for key, value in dataclasses.asdict(segment).items() if value is not None}
        for segment in transcript.segments
    ]
    for segment in segments:
        segment["tokens"] = list(segment["tokens"])
    return {
        "task": transcript.task,
        "language": LANGUAGE_NAMES.get(transcript.language, transcript.language),
        "duration": transcript.duration,
        "text": transcript.text,
        "segments": segments,
    }


def srt(segments: tuple[TimedSegment, ...]) -> str:
    """SubRip: numbered cues from 1, `HH:MM:SS,mmm --> HH:MM:SS,mmm`, a blank line after each."""
    return "".join(
        f"{i}\n{_clock(s.start, ',')} --> {_clock(s.end, ',')}\n{s.text.strip()}\n\n"
        for i, s in enumerate(segments, start=1)
    )


def vtt(segments: tuple[TimedSegment, ...]) -> str:
    """WebVTT: the WEBVTT header, then cues `HH:MM:SS.mmm --> HH:MM:SS.mmm`."""
    cues = "".join(
        f"{_clock(s.start, '.')} --> {_clock(s.end, '.')}\n{s.text.strip()}\n\n" for s in segments
    )
    return f"WEBVTT\n\n{cues}"


def _clock(seconds: float, separator: str) -> str:
    milliseconds = round(seconds * 1000)
    hours, milliseconds = divmod(milliseconds, 3_600_000)
    minutes, milliseconds = divmod(milliseconds, 60_000)
    seconds, milliseconds = divmod(milliseconds, 1000)
    return f"{hours:02d}:{minutes:02d}:{seconds:02d}{separator}{milliseconds:03d}"
