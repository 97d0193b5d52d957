"""A Whisper transcript with its timed segments, as transformers'
`WhisperForConditionalGeneration.generate(..., return_timestamps=True)` makes one, on
onnxruntime-genai: for serve's transcription formats (srt, vtt, verbose_json).

The clip's log-mel comes from og's processor (a WAV over the encoder's 30 s window in 30 s
pieces, a FLAC or MP3 in pieces of whole frames up to 30 s (`runtime/flac_pieces.py`,
`runtime/mp3_pieces.py`), their log-mels joined). It is decoded a window at a time from `seek`:
a window whose timestamps end in a pair moves `seek` a whole window on; one cut mid-segment
moves it to that segment's start, which the next window decodes again; without timestamps each
window is one segment. Segments are read from each window's tokens as transformers'
`_retrieve_segment` reads them, offset by the window's start. Each window also gives what
openai/whisper reports of it: its tokens' mean log-probability (`sum / (tokens + 1)`, end of
text counted), its text's zlib compression ratio and the probability of the no-speech token at
the start token. `temperature` above 0 samples each token at that temperature (no fallback
between temperatures); a `prompt` conditions the first window (`<|startofprev|>`, transformers'
`prompt_condition_type="first-segment"`).
"""

from __future__ import annotations

import dataclasses
import math
import sys
import zlib
from collections.abc import Callable, Generator, Sequence
from typing import TYPE_CHECKING

import numpy as np
import onnxruntime_genai as og

from mobius_genai.errors import OptionError
from mobius_genai.kinds.og_types import MULTILINGUAL_VOCAB
from mobius_genai.runtime.audio import (
    Clip,
    audio_inputs,
    end_tokens,
    language_codes,
    max_seconds,
    prompt_text,
    timestamp_rules,
)
from mobius_genai.runtime.audio_length import audio_length, wav_chunks
from mobius_genai.runtime.flac_pieces import flac_pieces
from mobius_genai.runtime.mp3_pieces import mp3_pieces
from mobius_genai.runtime.timestamps import SECONDS_PER_TOKEN, TimestampRules

if TYPE_CHECKING:
    from mobius_genai.runtime.opening import OpenBundle

#: Log-mel frames per second (a 10 ms hop) and per time token (the encoder's stride of 2).
FRAMES_PER_SECOND = 100
FRAMES_PER_TOKEN = 2


@dataclasses.dataclass(frozen=True)
class TranscriptRequest:
    """What a transcript is asked for: the spoken language (None: English, or detected for a
    translation), the task, timestamps, the sampling temperature, a previous-text prompt."""

    language: str | None = None
    task: str = "transcribe"
    timestamps: bool = False
    temperature: float = 0.0
    prompt: str | None = None
    window_tokens: int | None = None
    """New tokens each window may take (`run --audio`'s --max-new-tokens); None: up to the
    decoder's context (transformers' max_length, 448), as serve and `bench --audio` take them."""


@dataclasses.dataclass(frozen=True)
class TimedSegment:
    """One segment as openai/whisper reports it; `seek` is its window's first log-mel frame,
    `tokens` its ids (time tokens included), the last four its window's."""

    id: int
    seek: int
    start: float
    end: float
    text: str
    tokens: tuple[int, ...]
    temperature: float
    avg_logprob: float
    compression_ratio: float
    no_speech_prob: float | None


@dataclasses.dataclass(frozen=True)
class Transcript:
    task: str
    language: str
    duration: float
    text: str
    segments: tuple[TimedSegment, ...]


@dataclasses.dataclass(frozen=True)
class _Window:
    tokens: list[int]
    """The tokens generated, end of text left out."""
    sum_logprob: float
    no_speech_prob: float | None


#: Tokens a transcript takes a step at a time: None per token, the Transcript last.
Steps = Generator[None, None, Transcript]


def transcript_steps(
    bundle: OpenBundle,
    clip: Clip,
    request: TranscriptRequest,
    rng: np.random.Generator | None = None,
    on_segment: Callable[[TimedSegment], None] | None = None,
) -> Steps:
    """The transcript of `clip`: a generator that yields once per token and returns the
    Transcript (`yield from` it, or step it with next() until StopIteration's value); an
    OptionError for a clip og cannot read whole or a language or task the model lacks.
    `on_segment` gets each segment as soon as its window is decoded (a segment is final then:
    one cut at the window's end is left to the next window), so a long clip's text can be shown
    while the rest is decoded."""
    mel, duration = clip_features(bundle, clip)
    tokenizer = og.Tokenizer(bundle.model)
    language = request.language
    width = max_seconds(bundle.folder) * FRAMES_PER_SECOND
    multilingual = bundle.config["model"]["vocab_size"] >= MULTILINGUAL_VOCAB
    if language is None and request.task == "translate" and multilingual:
        language = detect_language(bundle, tokenizer, _window(mel, 0, width))
    forced = prompt_text(bundle.folder, bundle.config, language, request.task, request.timestamps)
    sot = [int(token) for token in tokenizer.encode(forced)]
    rules = timestamp_rules(bundle.config, tokenizer) if request.timestamps else None
    first_time = rules.first_time if rules else sys.maxsize  # without: one segment a window
    decoder = _Decoder(bundle, tokenizer, rules, request, rng)
    previous = _previous(tokenizer, request.prompt, bundle.config["model"]["context_length"])
    total = round(duration * FRAMES_PER_SECOND)
    if total > width:  # long-form: the features end with the audio, a window past it is zeros
        mel = mel[..., :total]
    found: list[TimedSegment] = []
    seek = 0
    while seek < total:
        frames = min(width, total - seek)
        window = yield from decoder.decode(previous + sot, _window(mel, seek, width), sot[0])
        previous = []  # the prompt conditions the first window only
        pieces, advance = window_segments(window.tokens, first_time, seek, frames)
        ratio = compression_ratio(tokenizer.decode(window.tokens))
        for start, end, piece in pieces:
            segment = TimedSegment(
                id=len(found),
                seek=seek,
                start=start,
                end=end,
                text=tokenizer.decode(piece),
                tokens=tuple(piece),
                temperature=request.temperature,
                avg_logprob=window.sum_logprob / (len(window.tokens) + 1),
                compression_ratio=ratio,
                no_speech_prob=window.no_speech_prob,
            )
            found.append(segment)
            if on_segment is not None:
                on_segment(segment)
        seek += advance or frames  # a window that moves nothing on would come back forever
    text = "".join(segment.text for segment in found)
    return Transcript(request.task, language or "en", duration, text, tuple(found))


@dataclasses.dataclass(frozen=True)
class AudioPiece:
    """A piece of a long clip, a file og's processor reads on its own."""

    clip: Clip
    lead: int = 0
    """Log-mel frames its decoding gives before its own audio (an MP3's lead-in), dropped."""
    frames: int | None = None
    """Log-mel frames of its own audio; None: to the end (the last piece, padding included)."""


def clip_features(bundle: OpenBundle, clip: Clip) -> tuple[np.ndarray, float]:
    """The clip's log-mel [1, bins, frames] from og's processor and its length in seconds; a
    clip over the encoder's window in pieces of up to a window (`clip_pieces`), their log-mels
    joined (each cut where its own audio ends, the last one whole, with the processor's padding
    after the audio, as a clip within one window has)."""
    window = max_seconds(bundle.folder)
    seconds = clip.seconds(math.inf)
    if seconds is None:  # not a format whose headers say its length: og's decoder refuses it
        audio_inputs(bundle.model, "<|startoftranscript|>", clip)
        seconds = float(window)
    pieces = [AudioPiece(clip)] if seconds <= window else clip_pieces(clip, window)
    mels = []
    for index, piece in enumerate(pieces):
        mel = audio_inputs(bundle.model, "<|startoftranscript|>", piece.clip)["audio_features"]
        last = index == len(pieces) - 1 or piece.frames is None
        mels.append(mel.as_numpy()[..., piece.lead : None if last else piece.lead + piece.frames])
    return _one_scale(np.concatenate(mels, axis=-1)).astype(np.float32), seconds


def _one_scale(mel: np.ndarray) -> np.ndarray:
    """Whisper's log-mel is log10 raised to 8 below the clip's largest value, then (x + 4) / 4:
    each piece's own largest value, where the whole audio's features (transformers' feature
    extractor, openai/whisper) take the whole audio's. Back to log10 and raised to 8 below the
    largest of all: exact, as a value a piece raised sits below that floor too."""
    logs = mel * 4.0 - 4.0
    return (np.maximum(logs, logs.max() - 8.0) + 4.0) / 4.0


def clip_pieces(clip: Clip, seconds: int) -> list[AudioPiece]:
    """A WAV clip cut into `seconds`-long clips, a FLAC or MP3 one into clips of whole frames up
    to `seconds` long (an MP3's lead-in and tail included: `runtime/mp3_pieces.py`); an
    OptionError for any other format or a FLAC whose frames do not hold the samples its header
    names."""
    found = audio_length(clip.data)
    rate = found.rate
    flac = flac_pieces(clip.data, seconds * rate)
    if flac is not None:
        read, named = sum(piece.samples for piece in flac), round(found.seconds * rate)
        if read != named:  # a frame lost: the audio after it would be left out without a word
            raise OptionError(
                f"{clip.name}: a damaged FLAC file (its frames hold {read} of the {named} "
                "samples its header names); accepted: an undamaged FLAC file"
            )
        starts = np.cumsum([0, *(piece.samples for piece in flac)]) / rate
        return [
            AudioPiece(
                Clip(piece.data, f"{clip.name} from {start:.1f} s"),
                frames=math.floor(piece.samples / rate * FRAMES_PER_SECOND),
            )
            for piece, start in zip(flac, starts, strict=False)
        ]
    mp3 = mp3_pieces(clip.data, seconds, FRAMES_PER_SECOND)
    if mp3 is not None:
        starts = np.cumsum([0, *(piece.frames for piece in mp3)]) / FRAMES_PER_SECOND
        return [
            AudioPiece(
                Clip(piece.data, f"{clip.name} from {start:.1f} s"), piece.lead, piece.frames
            )
            for piece, start in zip(mp3, starts, strict=False)
        ]
    frames = seconds * FRAMES_PER_SECOND
    return [AudioPiece(piece, frames=frames) for piece in wav_pieces(clip, seconds)]


def wav_pieces(clip: Clip, seconds: int) -> list[Clip]:
    """A WAV clip cut into `seconds`-long clips (its `fmt ` chunk copied into each); an
    OptionError for any other format."""
    fmt, samples = wav_chunks(clip.data)
    if fmt is None or samples is None:
        raise OptionError(
            f"{clip.name}: over the encoder's {seconds} s, and only a WAV, FLAC or MP3 file is "
            "cut into windows here (an MP3 whose frames all read, at one sample rate, with "
            f"nothing after them but a tag); accepted: such a file, or any up to {seconds} s"
        )
    rate = int.from_bytes(fmt[12:16], "little")
    block = int.from_bytes(fmt[20:22], "little")
    step = rate * seconds * block
    return [
        Clip(_wav(fmt, samples[start : start + step]), f"{clip.name} from {i * seconds} s")
        for i, start in enumerate(range(0, len(samples), step))
    ]


def _wav(fmt: bytes, samples: bytes) -> bytes:
    body = b"WAVE" + fmt + b"data" + len(samples).to_bytes(4, "little") + samples
    return b"RIFF" + len(body).to_bytes(4, "little") + body


def _window(mel: np.ndarray, seek: int, width: int) -> np.ndarray:
    """The encoder's `width` log-mel frames from `seek`, the audio's end padded with zeros (as
    transformers' `_get_input_segment` pads)."""
    window = np.zeros((*mel.shape[:2], width), np.float32)
    frames = mel[:, :, seek : seek + width]
    window[:, :, : frames.shape[-1]] = frames
    return window


def window_segments(
    tokens: Sequence[int], first_time: int, seek: int, frames: int
) -> tuple[list[tuple[float, float, list[int]]], int]:
    """transformers' `_retrieve_segment` on one window's tokens (end of text left out):
    (start, end, tokens) of each segment, times offset by the window's start, and the log-mel
    frames `seek` moves on by."""
    offset = seek / FRAMES_PER_SECOND
    timed = [token >= first_time for token in tokens]
    pairs = [i + 1 for i in range(len(tokens) - 1) if timed[i] and timed[i + 1]]
    single_ending = timed[-2:] == [False, True]
    if not pairs:
        times = [token for token, is_time in zip(tokens, timed, strict=True) if is_time]
        last = int(frames * (1 / FRAMES_PER_SECOND) / SECONDS_PER_TOKEN)
        if times and times[-1] != first_time:
            last = times[-1] - first_time
        return [(offset, offset + last * SECONDS_PER_TOKEN, list(tokens))], frames
    slices = [*pairs, len(tokens)] if single_ending else [*pairs[:-1], pairs[-1] + 1]
    found, begin = [], 0
    for i, end in enumerate(slices):
        piece = list(tokens[begin:end])
        closing = piece[-1 if i < len(slices) - 1 or single_ending else -2]
        start_time = (piece[0] - first_time) * SECONDS_PER_TOKEN
        found.append(
            (offset + start_time, offset + (closing - first_time) * SECONDS_PER_TOKEN, piece)
        )
        begin = end
    if single_ending:
        return found, frames
    return found, (tokens[begin - 2] - first_time) * FRAMES_PER_TOKEN


def compression_ratio(text: str) -> float:
    """openai/whisper's measure of repetition: the text's bytes over their zlib size."""
    data = text.encode("utf-8")
    return len(data) / len(zlib.compress(data))


def detect_language(bundle: OpenBundle, tokenizer: og.Tokenizer, mel: np.ndarray) -> str:
    """The language whose token the decoder finds likeliest after `<|startoftranscript|>`
    (openai/whisper's detect_language), over the tokenizer's language tokens."""
    codes = sorted(language_codes(bundle.folder))
    ids = [tokenizer.to_token_id(f"<|{code}|>") for code in codes]
    generator = _generator(bundle, [tokenizer.to_token_id("<|startoftranscript|>")], mel, 2)
    logits = np.asarray(generator.get_logits(), np.float32).reshape(-1)
    return codes[int(np.argmax(logits[ids]))]


def _previous(tokenizer: og.Tokenizer, prompt: str | None, context: int) -> list[int]:
    """`<|startofprev|>` and the prompt's last tokens (half the decoder's context, as
    openai/whisper keeps), or nothing."""
    if not prompt or not prompt.strip():
        return []
    text = [int(token) for token in tokenizer.encode(" " + prompt.strip())]
    return [tokenizer.to_token_id("<|startofprev|>"), *text[-(context // 2 - 1) :]]


def _generator(bundle: OpenBundle, ids: list[int], mel: np.ndarray, length: int) -> og.Generator:
    """og.Generator after the prompt `ids` over the encoder's window `mel` (og's processor's
    inputs, given as NamedTensors)."""
    inputs = og.NamedTensors()
    inputs["input_ids"] = np.asarray([ids], np.int32)
    inputs["audio_features"] = mel
    params = og.GeneratorParams(bundle.model)
    params.set_search_options(max_length=length)
    generator = og.Generator(bundle.model, params)
    generator.set_inputs(inputs)
    return generator


class _Decoder:
    """One window's tokens: greedy (or sampled at `temperature`) after the timestamp
    `rules`, with each token's log-probability under the distribution it was drawn from."""

    def __init__(
        self,
        bundle: OpenBundle,
        tokenizer: og.Tokenizer,
        rules: TimestampRules | None,
        request: TranscriptRequest,
        rng: np.random.Generator | None,
    ) -> None:
        self.bundle = bundle
        self.rules = rules
        self.temperature = request.temperature
        self.new_tokens = request.window_tokens or bundle.config["model"]["context_length"]
        self.rng = rng or np.random.default_rng()
        self.ends = end_tokens(bundle.config)
        names = ("<|nospeech|>", "<|nocaptions|>")  # the second in older tokenizers
        self.no_speech = next(filter(None, (_special(tokenizer, name) for name in names)), None)

    def decode(self, ids: list[int], mel: np.ndarray, sot: int) -> Generator[None, None, _Window]:
        context = self.bundle.config["model"]["context_length"]
        generator = _generator(self.bundle, ids, mel, min(len(ids) + self.new_tokens, context))
        no_speech_prob = None
        if self.no_speech is not None:
            first = np.asarray(generator.get_output("logits"), np.float32)[0, ids.index(sot)]
            no_speech_prob = float(np.exp(_log_softmax(first)[self.no_speech]))
        tokens: list[int] = []
        total = 0.0
        while not generator.is_done():
            logits = np.asarray(generator.get_logits(), np.float32).reshape(-1)
            if self.rules is not None:
                logits = self.rules.apply(tokens, logits)
            logprobs = _log_softmax(logits)
            if self.temperature > 0:
                chosen = self._sample(logprobs)
                logits = np.full_like(logits, -np.inf)
                logits[chosen] = 0.0  # og's greedy step takes the sampled token
            if self.temperature > 0 or self.rules is not None:
                generator.set_logits(logits.reshape(1, -1))
            generator.generate_next_token()
            token = int(generator.get_next_tokens()[0])
            total += float(logprobs[token])
            if token in self.ends:
                break
            tokens.append(token)
            yield None
        return _Window(tokens, total, no_speech_prob)

    def _sample(self, logprobs: np.ndarray) -> int:
        """A token drawn from softmax(logits / temperature), as openai/whisper samples."""
        weights = np.exp(_log_softmax(logprobs / self.temperature).astype(np.float64))
        return int(self.rng.choice(weights.size, p=weights / weights.sum()))


def _special(tokenizer: og.Tokenizer, name: str) -> int | None:
    """The id of special token `name`; None when the tokenizer has none (it then encodes the
    name as text)."""
    ids = tokenizer.encode(name)
    return int(ids[0]) if len(ids) == 1 else None


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    top = np.max(logits)
    shifted = logits - top
    return shifted - np.log(np.sum(np.exp(shifted)))
