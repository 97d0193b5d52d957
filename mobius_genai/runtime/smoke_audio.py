"""The smoke test's audio run for a speech bundle (an og type whose row takes audio: Whisper).

onnxruntime-genai's processor turns a generated tone (a WAV file) and the forced English
transcription prompt into audio_features and input_ids; the generator runs the encoder once
and the decoder step by step. The reference is a plain onnxruntime loop: the encoder graph once
on the processor's audio_features, then the decoder fed its cross caches at every step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime_genai as og

from mobius_genai.kinds.og_types import OG_SECTIONS
from mobius_genai.runtime.audio import Clip, audio_inputs, prompt_text, tone_bytes
from mobius_genai.runtime.generate import greedy_tokens, load_tokenizer
from mobius_genai.runtime.ort_session import ort_session

SMOKE_SECONDS = 2.0


@dataclasses.dataclass(frozen=True)
class AudioPrompt:
    """What og's processor made of the smoke test's prompt and tone."""

    input_ids: list[int]
    audio_features: np.ndarray


def audio_greedy(
    model: og.Model, folder: Path, config: Mapping[str, Any], max_new_tokens: int
) -> tuple[AudioPrompt, list[int], str]:
    """(prompt, generated ids, generated text) of a greedy transcription of a tone."""
    tone = Clip(tone_bytes(SMOKE_SECONDS), "the smoke test's tone")
    inputs = audio_inputs(model, prompt_text(folder, config, None, "transcribe"), tone)
    prompt = AudioPrompt(
        [int(token) for token in inputs["input_ids"].as_numpy().reshape(-1)],
        inputs["audio_features"].as_numpy().copy(),  # set_inputs takes the tensors
    )
    max_length = min(len(prompt.input_ids) + max_new_tokens, config["model"]["context_length"])
    tokens = greedy_tokens(model, inputs, max_length)
    return prompt, tokens, load_tokenizer(model, folder).decode(tokens)


def audio_note(prompt: AudioPrompt) -> str:
    return f" from {SMOKE_SECONDS:g} s of generated audio"


def cross_caches(
    folder: Path,
    config: Mapping[str, Any],
    prompt: AudioPrompt,
    options: Mapping[str, str],
    cpu_provider: str,
) -> Callable[[Sequence[int]], Mapping[str, np.ndarray]]:
    """The reference loop's extra decoder inputs at every step: the encoder graph's cross
    caches of the prompt's audio_features, under the names the decoder reads them."""
    model = config["model"]
    section = model["encoder"]
    defaults_in, defaults_out = OG_SECTIONS["encoder"]
    names_in = {**defaults_in, **section.get("inputs", {})}
    names_out = {**defaults_out, **section.get("outputs", {})}
    session = ort_session(folder / section["filename"], options, cpu_provider)
    outputs = dict(
        zip(
            [value.name for value in session.get_outputs()],
            session.run(None, {names_in["audio_features"]: prompt.audio_features}),
            strict=True,
        )
    )
    decoder_inputs = model["decoder"].get("inputs", {})
    feeds = {}
    for layer in range(model["decoder"]["num_hidden_layers"]):
        for kind in ("key", "value"):
            made = names_out[f"cross_present_{kind}_names"] % layer
            read = decoder_inputs.get(f"cross_past_{kind}_names", f"past_{kind}_cross_%d") % layer
            feeds[read] = outputs[made]
    return lambda new: feeds
