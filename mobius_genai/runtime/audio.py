"""Audio into a speech bundle (og type with `audio` on its row: Whisper): a file checked and
opened for onnxruntime-genai's processor, and the decoder prompt it forces (start, language,
task, no timestamps). A clip beside a prompt, for a bundle with a speech graph whose og type
places audio in prompts (`audio_placeholder`: Gemma 4 E2B/E4B).

og's processor reads the file through onnxruntime-extensions' AudioDecoder, which resamples
down only, and pads or cuts the log-mel to the encoder's window (`chunk_size` seconds of
audio_processor_config.json): longer audio would be cut without a word, so a clip beside a
prompt is refused here, and a transcript (runtime/transcription.py) cuts a longer WAV or FLAC
into windows.
"""

from __future__ import annotations

import dataclasses
import io
import wave
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og

from mobius_genai._json import read_json_object
from mobius_genai.errors import BundleError, OptionError
from mobius_genai.kinds.og_types import (
    AUDIO_PROCESSOR_FILE,
    MULTILINGUAL_VOCAB,
    audio_types,
    og_type,
    whisper_prompt,
)
from mobius_genai.runtime.audio_length import audio_length
from mobius_genai.runtime.timestamps import TimestampRules

#: The rate the encoder's log-mel is computed at; og resamples down to it, never up.
SAMPLE_RATE = 16_000
TASKS = ("transcribe", "translate")
#: The clip a prompt takes: transformers' Gemma4AudioFeatureExtractor cuts at 480,000 samples
#: (30 s), og cuts nothing, so a longer clip is refused rather than read differently.
PROMPT_CLIP_SECONDS = 30
#: onnxruntime-extensions' AudioDecoder messages → what was wrong, what is accepted.
_DECODER_ERRORS = {
    "Cannot detect audio stream format": (
        "not an audio file onnxruntime-genai can decode; accepted: WAV, FLAC or MP3"
    ),
    "only down-sampling supported": (
        f"sampled below {SAMPLE_RATE} Hz, which onnxruntime-genai cannot resample up; "
        f"accepted: {SAMPLE_RATE} Hz or higher"
    ),
}


def has_audio(config: Mapping[str, Any]) -> bool:
    """Whether genai_config's model type takes audio (its og_types row)."""
    return og_type(config["model"]["type"]).audio


def prompt_audio(config: Mapping[str, Any]) -> str | None:
    """The placeholder of a clip in a prompt, for a bundle whose og type places audio in
    prompts and which has a speech graph (Gemma 4 E2B/E4B); None for any other."""
    placeholder = og_type(config["model"]["type"]).audio_placeholder
    return placeholder if config["model"].get("speech", {}).get("filename") else None


@dataclasses.dataclass(frozen=True)
class Clip:
    """An audio file's bytes and the words that name it in errors (`--audio a.wav`, a request's
    `file`), opened for og's processor from memory (og.Audios.open_bytes reads what
    og.Audios.open reads from a file)."""

    data: bytes
    name: str

    @classmethod
    def read(cls, path: str | Path) -> Clip:
        """The file at `path`, named `--audio PATH`; an OptionError when it cannot be read."""
        path = Path(path)
        if not path.is_file():
            raise OptionError(f"--audio {path}: not a file; accepted: a WAV, FLAC or MP3 file")
        try:
            return cls(path.read_bytes(), f"--audio {path}")
        except OSError as error:
            raise OptionError(f"--audio {path}: cannot be read ({error.strerror})") from error

    def seconds(self, limit: int) -> float | None:
        """The length in seconds of a WAV, FLAC or MP3 clip (None where its headers do not say:
        another format, which og's decoder then refuses), checked against og's rate and the
        encoder's `limit`: an OptionError naming what was wrong."""
        found = audio_length(self.data)
        if found is None:
            return None
        if found.rate < SAMPLE_RATE:
            raise OptionError(
                f"{self.name}: {found.rate} Hz is {_DECODER_ERRORS['only down-sampling supported']}"
            )
        if found.seconds - found.slack > limit:
            raise OptionError(
                f"{self.name}: {found.seconds:.1f} s of audio, over the {limit} s the encoder "
                f"takes at once; accepted: up to {limit} s (cut longer audio into pieces)"
            )
        return found.seconds

    def audios(self) -> og.Audios:
        return og.Audios.open_bytes(self.data)


def decoder_refusal(message: str) -> str | None:
    """What was wrong with a clip, in words, when og's processor failed with `message` because
    its audio decoder refused the clip; None for any other failure."""
    return next((said for key, said in _DECODER_ERRORS.items() if key in message), None)


def audio_prompt(
    folder: str | Path, config: Mapping[str, Any], text: str, clip: Clip
) -> tuple[str, og.Audios]:
    """`text` with the clip's placeholder in front unless it places it itself, and the clip
    opened for og's processor; an OptionError for a bundle that takes no clip beside a prompt
    or a clip og would not read whole."""
    placeholder = prompt_audio(config)
    if placeholder is None:
        raise OptionError(
            f"{folder}: model.type {config['model']['type']!r} without a speech graph takes no "
            "audio beside a prompt; accepted: a Gemma 4 E2B/E4B bundle"
        )
    clip.seconds(PROMPT_CLIP_SECONDS)
    if placeholder not in text:
        text = f"{placeholder} {text}"
    return text, clip.audios()


def require_audio_bundle(folder: str | Path, config: Mapping[str, Any], audio: bool) -> None:
    """An audio file for a speech bundle, none for any other but one that takes a clip beside
    its prompt: else an OptionError."""
    model_type = config["model"]["type"]
    if audio and not has_audio(config) and prompt_audio(config) is None:
        raise OptionError(
            f"{folder}: model.type {model_type!r} takes no audio; accepted: --audio with a "
            f"speech bundle (model.type {', '.join(audio_types())}) or a bundle with a speech "
            "graph (Gemma 4 E2B/E4B)"
        )
    if not audio and has_audio(config):
        raise OptionError(
            f"{folder}: a speech bundle (model.type {model_type!r}) transcribes audio; "
            "accepted: --audio FILE"
        )


def max_seconds(folder: str | Path) -> int:
    """The audio the encoder takes at once: audio_processor_config.json's log-mel chunk_size."""
    path = Path(folder) / AUDIO_PROCESSOR_FILE
    document = read_json_object(path, BundleError)
    for step in document.get("feature_extraction", {}).get("sequence", []):
        attrs = step.get("operation", {}).get("attrs", {})
        if "chunk_size" in attrs:
            return int(attrs["chunk_size"])
    raise BundleError(f"{path}: no log-mel chunk_size; accepted: the file `package` writes")


def prompt_text(
    folder: str | Path,
    config: Mapping[str, Any],
    language: str | None,
    task: str,
    timestamps: bool = False,
) -> str:
    """The decoder prompt og's processor turns into the forced ids: multilingual vocabularies
    name the language and task; English-only ones transcribe English and nothing else."""
    vocab_size = config["model"]["vocab_size"]
    if vocab_size < MULTILINGUAL_VOCAB:
        if language not in (None, "en") or task != "transcribe":
            raise OptionError(
                f"{folder}: an English-only model (vocab_size {config['model']['vocab_size']}) "
                f"cannot --language {language} --task {task}; accepted: --language en "
                "--task transcribe"
            )
        return whisper_prompt(vocab_size, timestamps=timestamps)
    language = language or "en"
    languages = _language_tokens(folder)
    if f"<|{language}|>" not in languages:
        raise OptionError(
            f"--language {language}: not a language of this tokenizer; accepted: "
            + ", ".join(language_codes(folder))
        )
    return whisper_prompt(vocab_size, language, task, timestamps)


def language_codes(folder: str | Path) -> list[str]:
    """The languages the bundle's tokenizer names ("en", "fr", ...), sorted."""
    return sorted(token[2:-2] for token in _language_tokens(folder))


def _language_tokens(folder: str | Path) -> set[str]:
    """The tokenizer's special tokens that name a language ("<|en|>", ...)."""
    document = read_json_object(Path(folder) / "tokenizer.json", BundleError)
    others = {"<|endoftext|>", "<|nospeech|>", "<|nocaptions|>", "<|notimestamps|>"}
    return {
        content
        for content in (token.get("content", "") for token in document.get("added_tokens", []))
        if content.startswith("<|")
        and content.endswith("|>")
        and content not in others
        and content[2:-2].replace("_", "").isalpha()
        and content[2:-2] not in {*TASKS, "startoftranscript", "startoflm", "startofprev"}
    }


def audio_inputs(model: og.Model, text: str, clip: Clip) -> og.NamedTensors:
    """og's processor's inputs (input_ids, the clip's features) for `text` and `clip`; an
    OptionError naming the clip when og cannot process it."""
    try:
        return model.create_multimodal_processor()(text, audios=clip.audios())
    except RuntimeError as error:
        message = str(error)
        what = decoder_refusal(message) or f"onnxruntime-genai cannot process it: {message}"
        raise OptionError(f"{clip.name}: {what}") from error


def tone_bytes(seconds: float = 2.0, frequency: float = 440.0) -> bytes:
    """A generated test signal (a 16 kHz 16-bit mono tone) as a WAV file's bytes."""
    time = np.arange(round(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    samples = (0.5 * np.sin(2 * np.pi * frequency * time) * 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as file:
        file.setnchannels(1)
        file.setsampwidth(2)
        file.setframerate(SAMPLE_RATE)
        file.writeframes(samples.tobytes())
    return buffer.getvalue()


def end_tokens(config: Mapping[str, Any]) -> set[int]:
    """genai_config's end-of-text ids."""
    eos = config["model"].get("eos_token_id", [])
    return set(eos if isinstance(eos, list) else [eos])


def timestamp_rules(config: Mapping[str, Any], tokenizer: og.Tokenizer) -> TimestampRules:
    """The rules over a bundle's ids: `<|notimestamps|>` from its tokenizer, end of text from
    its genai_config."""
    return TimestampRules(
        no_timestamps=tokenizer.to_token_id("<|notimestamps|>"), eos=min(end_tokens(config))
    )
