"""Whisper's timestamp mode on onnxruntime-genai: the rules that make the decoder emit time
tokens (`TimestampRules`, applied to og.Generator's logits before each greedy step) and a
segment's line `[start -> end] text` (`run --audio --timestamps`).

onnxruntime-genai 0.18 has no timestamp logic of its own (its whisper code only forces the
prompt): without `<|notimestamps|>` in the prompt the model may emit time tokens, and the rules
here are the ones openai/whisper and transformers' `WhisperTimeStampLogitsProcessor` apply, so
og's greedy tokens equal transformers' `generate(..., return_timestamps=True)`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

#: Seconds per time token: the encoder's 1500 positions over 30 s.
SECONDS_PER_TOKEN = 0.02
#: The latest time the first token may name (openai/whisper's `max_initial_timestamp`, 1 s).
MAX_INITIAL_SECONDS = 1.0


@dataclasses.dataclass(frozen=True)
class TimestampRules:
    """Which tokens may come next in timestamp mode. Time tokens follow `<|notimestamps|>`
    (`no_timestamps`): `<|0.00|>` is `no_timestamps + 1`, one more each 20 ms."""

    no_timestamps: int
    eos: int

    @property
    def first_time(self) -> int:
        return self.no_timestamps + 1

    def apply(self, generated: Sequence[int], logits: np.ndarray) -> np.ndarray:
        """`logits` (one row) with the tokens the rules forbid after `generated` (the tokens
        after the prompt) set to -inf: times come in pairs, never decrease, the first token is
        a time up to 1 s, and a time is forced when all times together outweigh every text
        token."""
        out = np.array(logits, np.float32).reshape(-1)
        first = self.first_time
        out[self.no_timestamps] = -np.inf
        last_was_time = len(generated) >= 1 and generated[-1] >= first
        before_was_time = len(generated) < 2 or generated[-2] >= first
        if last_was_time:
            if before_was_time:
                out[first:] = -np.inf
            else:
                out[: self.eos] = -np.inf
        times = [token for token in generated if token >= first]
        if times:
            # a closing time may repeat the opening one; a new segment starts later than both
            out[first : times[-1] + (0 if last_was_time and not before_was_time else 1)] = -np.inf
        if not generated:
            out[:first] = -np.inf
            out[first + round(MAX_INITIAL_SECONDS / SECONDS_PER_TOKEN) + 1 :] = -np.inf
        # log-probabilities share one normalizer: compare the logits' log-sum-exp and max
        if np.logaddexp.reduce(out[first:]) > out[:first].max():
            out[:first] = -np.inf
        return out


@dataclasses.dataclass(frozen=True)
class Segment:
    start: float
    end: float
    text: str

    def __str__(self) -> str:
        return f"[{self.start:.2f} -> {self.end:.2f}] {self.text.strip()}"
