"""What onnxruntime-genai 0.18 does with each model.type a bundle names, one row per type.

A kind's row names its og type (`VisionLanguageFamily.genai_type`, `FamilyAdapter.genai_type`);
the facts about that type live here, on its row, for every reader: the packager (through the
kind), validate (any bundle, ours or another tool's), `run --image` and the smoke test (the
prompt's image placeholder). Pure data: imported by processes that load no graph-building stack.
"""

from __future__ import annotations

import dataclasses

#: The audio pipeline og's WhisperProcessor reads (onnxruntime-extensions' feature extraction).
AUDIO_PROCESSOR_FILE = "audio_processor_config.json"


@dataclasses.dataclass(frozen=True)
class OgType:
    """One onnxruntime-genai model.type."""

    name: str
    # og feeds position_ids [3, batch, seq] (its ModelType::IsQwenVLFamily), else [batch, seq].
    three_d_positions: bool = False
    # The text og's multimodal processor expands to one image's tokens (None: takes no images).
    image_placeholder: str | None = None
    # The token og's processor expands each placeholder to, one per image feature: in a prompt
    # outside a placeholder it is a feature og has none for (runtime/placeholders.py).
    image_token: str | None = None
    # og's processor takes audio (og.Audios); the encoder runs once before the decoder.
    audio: bool = False
    # The text og's processor expands to one audio clip's tokens in a prompt, for a bundle
    # with a speech graph (model.speech.filename); None: no audio beside a prompt.
    audio_placeholder: str | None = None
    # Files og reads by their default name, which no genai_config key names.
    required_files: tuple[str, ...] = ()


OG_TYPES: dict[str, OgType] = {
    row.name: row
    for row in (
        # og expands each `<start_of_image>` to it, the image's `<image_soft_token>`s and
        # `<end_of_image>` (its GemmaImageProcessor)
        OgType("gemma3", image_placeholder="<start_of_image>", image_token="<image_soft_token>"),
        # og expands each `[IMG]` to the image's rows of `[IMG]`, `[IMG_BREAK]` after each row
        # and `[IMG_END]` after the last (its Mistral3ImageProcessor)
        OgType("mistral3", image_placeholder="[IMG]"),
        OgType("whisper", audio=True, required_files=(AUDIO_PROCESSOR_FILE,)),
        OgType(
            "qwen2_5_vl",
            three_d_positions=True,
            image_placeholder="<|vision_start|><|image_pad|><|vision_end|>",
            image_token="<|image_pad|>",
        ),
        OgType(
            "qwen3_vl",
            three_d_positions=True,
            image_placeholder="<|vision_start|><|image_pad|><|vision_end|>",
            image_token="<|image_pad|>",
        ),
        OgType("lfm2_vl", image_placeholder="<image>"),
        # og expands each `<|image>` to a blank line, `<|image>`, one `<|image|>` per token,
        # `<image|>` and a blank line (its Gemma4MultiModalProcessor)
        # and one `<|audio|>` to a blank line, `<|audio>`, a `<|audio|>` per audio token,
        # `<audio|>` and a blank line (one clip a prompt; E2B/E4B's speech graph)
        OgType(
            "gemma4",
            image_placeholder="<|image>",
            image_token="<|image|>",
            audio_placeholder="<|audio|>",
        ),
        # types og positions in 3-D that mobius-genai does not write (other tools' bundles)
        OgType("fara", three_d_positions=True),
        OgType("qwen3_5", three_d_positions=True),
        OgType("qwen3_5_moe", three_d_positions=True),
    )
}

#: og's defaults for the graphs beside a decoder: section → (input names, output names).
OG_SECTIONS: dict[str, tuple[dict[str, str], dict[str, str]]] = {
    "vision": ({"pixel_values": "pixel_values"}, {"image_features": "image_features"}),
    "embedding": (
        {"input_ids": "input_ids", "image_features": "image_features"},
        {"inputs_embeds": "inputs_embeds"},
    ),
    # Gemma 4's audio tower: og's processor feeds the log-mel frames and their mask (and the
    # clip's token count as audio_sizes, to a graph with that input)
    "speech": (
        {"audio_embeds": "audio_embeds", "attention_mask": "audio_attention_mask"},
        {"audio_features": "audio_features"},
    ),
    # "%d" names one tensor per decoder layer (the cross caches the decoder reads)
    "encoder": (
        {"audio_features": "audio_features"},
        {
            "encoder_hidden_states": "encoder_hidden_states",
            "cross_present_key_names": "present_key_cross_%d",
            "cross_present_value_names": "present_value_cross_%d",
        },
    ),
    # a multi-token-prediction head (og.MtpGenerator's draft model; bundle/mtp_config.py);
    # position_ids, fed where the graph has it (not once GroupQueryAttention computes them)
    "mtp": (
        {
            "input_ids": "input_ids",
            "hidden_states": "hidden_states",
            "attention_mask": "attention_mask",
            "past_key_names": "past_key_values.%d.key",
            "past_value_names": "past_key_values.%d.value",
        },
        {
            "logits": "logits",
            "hidden_states": "hidden_states_out",
            "present_key_names": "present.%d.key",
            "present_value_names": "present.%d.value",
        },
    ),
}

#: Sections og runs only where they name a graph file (gemma4's speech section without one,
#: its processor file named "", turns audio off).
OG_OPTIONAL_SECTIONS = frozenset({"speech"})

#: Sections whose "%d" names count layers of their own (the section's num_hidden_layers, og's
#: default 1), not the decoder's.
OG_OWN_LAYERS = frozenset({"mtp"})

#: Sections whose processor reads a config file: section → og's default config_filename.
OG_PROCESSOR_FILES: dict[str, str] = {"vision": "processor_config.json"}


#: Whisper vocabularies this large have language tokens (English-only ones are one smaller).
MULTILINGUAL_VOCAB = 51_865


def whisper_prompt(
    vocab_size: int, language: str = "en", task: str = "transcribe", timestamps: bool = False
) -> str:
    """The decoder prompt og's processor turns into Whisper's forced ids: start, language,
    task, and no timestamps unless asked; an English-only vocabulary has no language or task
    token."""
    last = "" if timestamps else "<|notimestamps|>"
    if vocab_size < MULTILINGUAL_VOCAB:
        return f"<|startoftranscript|>{last}"
    return f"<|startoftranscript|><|{language}|><|{task}|>{last}"


def og_type(name: str) -> OgType:
    """The row of model.type `name`; a type without one is a plain decoder to og."""
    return OG_TYPES.get(name) or OgType(name)


def audio_types() -> list[str]:
    """The model.type values that take audio, sorted (for error messages)."""
    return sorted(name for name, row in OG_TYPES.items() if row.audio)


def image_types() -> list[str]:
    """The model.type values that take images, sorted (for error messages)."""
    return sorted(name for name, row in OG_TYPES.items() if row.image_placeholder is not None)
