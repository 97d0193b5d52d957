"""The speech kind: Whisper's encoder and decoder graphs (`models/whisper.py`) and the
genai_config and audio processor config of onnxruntime-genai 0.18's `whisper` type
(`bundle/whisper_config.py`; docs/whisper.md has og's contract).

og runs the audio processor (`audio_processor_config.json`: decode, resample to 16 kHz, log-mel)
→ encoder once per generator (audio_features → the cross caches) → decoder step by step.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mobius_genai.bundle.whisper_config import (
    AUDIO_PROCESSOR_CONFIG,
    audio_processor_config,
    whisper_genai_config,
)
from mobius_genai.checkpoint.reader import CheckpointReader
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.whisper import WhisperConfig
from mobius_genai.kinds.base import KindGraphs, KindInput, WrittenGraphs
from mobius_genai.models.whisper import WHISPER_ROLES, whisper_graphs

if TYPE_CHECKING:
    from mobius_genai.build import ModelPackage

_DECODER_LAYER = re.compile(r"^model\.decoder\.layers\.(\d+)\.")


class WhisperKind:
    """OpenAI's Whisper (transformers' `model_type` "whisper"): every released size, English-only
    and multilingual."""

    name = "speech"
    keeps_stored_integers = False  # float checkpoints only

    def claims(self, model_type: str) -> bool:
        return model_type == "whisper"

    def build(self, given: KindInput) -> KindGraphs:
        """Both graphs; with `num_layers`, the decoder's first layers (the encoder whole)."""
        config = WhisperConfig.from_dict(given.raw)
        if given.num_layers is not None:
            config = config.first_layers(given.num_layers)
        checkpoint = given.checkpoint  # safetensors: no GGUF file names model_type "whisper"
        left_out = [] if checkpoint is None else _decoder_layers_from(checkpoint, config)
        models = whisper_graphs(config, checkpoint, left_out)
        return KindGraphs(
            graphs={key: (WHISPER_ROLES[key], model) for key, model in models.items()},
            config=decoder_architecture(config),
            context_length=config.max_target_positions,
            family=None,
            kind_config=config,
        )

    def genai_config(self, package: ModelPackage, written: WrittenGraphs) -> dict[str, Any]:
        return whisper_genai_config(
            package.kind_config,
            package.ep,
            generation=written.generation,
            encoder_filename=package.filename("encoder"),
            decoder_filename=package.filename("decoder"),
        )

    def bundle_files(self, checkpoint: Path, package: ModelPackage) -> dict[str, Any]:
        return {AUDIO_PROCESSOR_CONFIG: audio_processor_config(package.kind_config)}

    def twin_layers(self, package: ModelPackage) -> tuple[int, int] | None:
        return None


def decoder_architecture(config: WhisperConfig) -> ArchitectureConfig:
    """The decoder as the packager reads a text decoder (vocabulary, layers, positions)."""
    return ArchitectureConfig(
        model_type="whisper",
        vocab_size=config.vocab_size,
        hidden_size=config.d_model,
        intermediate_size=config.decoder_ffn_dim,
        num_hidden_layers=config.decoder_layers,
        num_attention_heads=config.decoder_attention_heads,
        num_key_value_heads=config.decoder_attention_heads,
        head_dim=config.decoder_head_dim,
        max_position_embeddings=config.max_target_positions,
        hidden_act=config.activation_function,
        norm_eps=config.layer_norm_eps,
        norm_type="layer",
        gated_mlp=False,
        position_embedding="learned",
        tie_word_embeddings=True,
    )


def _decoder_layers_from(checkpoint: CheckpointReader, config: WhisperConfig) -> list[str]:
    """The checkpoint's decoder tensors of the layers a first-layers build leaves out."""
    numbered = ((name, _DECODER_LAYER.match(name)) for name in checkpoint)
    return [name for name, match in numbered if match and int(match[1]) >= config.decoder_layers]
