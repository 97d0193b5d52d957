"""The vision-language kind: vision, embedding and decoder graphs from a VISION_LANGUAGE row,
and the sections and processor config of onnxruntime-genai 0.18's multimodal pipeline.

og runs vision (pixel_values → image_features) → embedding (input_ids + image_features →
inputs_embeds) → decoder (Gemma 4 E2B/E4B: speech, log-mel frames → audio_features, beside
vision, the embedding placing both), with the image processor of onnxruntime-extensions configured by
`processor_config.json` (the row's `image_transforms`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from mobius_genai._json import read_json_object
from mobius_genai.components.gemma4_audio import INPUT_FEATURES, INPUT_FEATURES_MASK
from mobius_genai.config.vision import VisionLanguageConfig
from mobius_genai.errors import ConfigError, UnsupportedModelError
from mobius_genai.kinds.base import KindGraphs, KindInput, WrittenGraphs
from mobius_genai.kinds.og_types import AUDIO_PROCESSOR_FILE, OG_PROCESSOR_FILES
from mobius_genai.kinds.text import decoder_genai_config
from mobius_genai.models.audio_processors import feature_extractor_settings
from mobius_genai.models.vision_language import VISION_LANGUAGE, vision_language_family
from mobius_genai.models.vision_language_graphs import vision_language_graphs
from mobius_genai.tasks.causal_lm import INPUTS_EMBEDS
from mobius_genai.tasks.vision_language import AUDIO_FEATURES, IMAGE_FEATURES

if TYPE_CHECKING:
    from mobius_genai.build import ModelPackage

PROCESSOR_FILENAME = OG_PROCESSOR_FILES["vision"]
#: Package key → role; each graph is saved as `<key>.onnx`.
#: The speech graph is a tower like the vision one: kept float under int4, never given GQA.
_ROLES = {"vision": "vision", "embedding": "embedding", "decoder": "decoder", "speech": "vision"}
SPEECH = "speech"


class VisionLanguageKind:
    """A vision tower and projector beside a text decoder of the family table."""

    name = "vision-language"

    def claims(self, model_type: str) -> bool:
        return model_type in VISION_LANGUAGE

    def build(self, given: KindInput) -> KindGraphs:
        """The three graphs; with `num_layers`, the decoder's first layers and the vision
        tower's first layers of every kind (`VisionLanguageConfig.first_layers`)."""
        if given.lora_targets:
            raise UnsupportedModelError(
                f"LoRA adapters on {given.raw.get('model_type')!r}: accepted for text decoders only"
            )
        family = vision_language_family(given.raw.get("model_type", ""), given.raw)
        config = family.parse_config(given.raw)  # type: ignore[union-attr]
        if given.num_layers is not None:
            config = config.first_layers(given.num_layers)
        checkpoint = given.checkpoint
        dropped = (
            family.dropped_layers(checkpoint, config)  # type: ignore[union-attr]
            if checkpoint is not None and given.num_layers is not None
            else []
        )
        length = given.target.context_length or config.text.max_position_embeddings
        models, float_kinds = vision_language_graphs(config, family, length, checkpoint, dropped)  # type: ignore[arg-type]
        return KindGraphs(
            graphs={key: (_ROLES[key], model) for key, model in models.items()},
            config=config.text,
            context_length=length,
            family=family,
            kind_config=config,
            prequantized=None if checkpoint is None else checkpoint.describe(),
            float_kinds=float_kinds,
        )

    def genai_config(self, package: ModelPackage, written: WrittenGraphs) -> dict[str, Any]:
        """The decoder's genai_config (fed inputs_embeds) with the vision and embedding
        sections of og's multimodal pipeline beside it."""
        genai_config = decoder_genai_config(package, written)
        config: VisionLanguageConfig = package.kind_config
        model = genai_config["model"]
        decoder = model["decoder"]
        decoder["inputs"] = {INPUTS_EMBEDS: INPUTS_EMBEDS, **decoder["inputs"]}
        # og sizes image_features and inputs_embeds by it: DeepStack's wider rows (Qwen3-VL)
        decoder["hidden_size"] = config.embedding_width
        session = {"session_options": dict(decoder["session_options"])}
        keys = package.family.vision_input_keys
        vision_inputs = {
            keys.get(value.name, value.name): value.name for value in package["vision"].graph.inputs
        }
        model["vision"] = {
            "filename": package.filename("vision"),
            "config_filename": PROCESSOR_FILENAME,
            **package.family.vision_keys(config.vision),
            "inputs": vision_inputs,
            "outputs": {"image_features": IMAGE_FEATURES},
            **session,
        }
        model.update(_position_token_ids(config))
        model.update(package.family.model_sections)
        features = {"image_features": IMAGE_FEATURES}
        if SPEECH in package.models:
            model[SPEECH] = _speech_section(package, session)
            features["audio_features"] = AUDIO_FEATURES
        model["embedding"] = {
            "filename": package.filename("embedding"),
            "inputs": {"input_ids": "input_ids", **features},
            "outputs": {"inputs_embeds": INPUTS_EMBEDS},
            **session,
        }
        return genai_config

    def bundle_files(self, checkpoint: Path, package: ModelPackage) -> dict[str, Any]:
        """processor_config.json: onnxruntime-extensions' image pipeline equal to the
        checkpoint's image processor."""
        path = checkpoint / "preprocessor_config.json"
        settings = read_json_object(path, ConfigError) if path.is_file() else {}
        operations = package.family.image_transforms(settings, package.kind_config.vision, path)
        transforms = [
            {"operation": {"name": name, "type": kind, "attrs": attrs}}
            for name, kind, attrs in operations
        ]
        files = {
            PROCESSOR_FILENAME: {
                "processor": {"name": "image_processing", "transforms": transforms}
            }
        }
        if SPEECH in package.models:
            settings, where = feature_extractor_settings(checkpoint)
            files[AUDIO_PROCESSOR_FILE] = package.family.audio_processor(settings, where)
        return files

    def twin_layers(self, package: ModelPackage) -> tuple[int, int] | None:
        vision = package.kind_config.vision
        return vision.layers_of_every_kind(), vision.num_layers


def _speech_section(package: ModelPackage, session: dict[str, Any]) -> dict[str, Any]:
    """og's speech section: the graph, the audio processor file, and the graph's inputs under
    og's keys (the log-mel frames as `audio_embeds`, their mask as `attention_mask`)."""
    return {
        "filename": package.filename(SPEECH),
        "config_filename": AUDIO_PROCESSOR_FILE,
        "inputs": {"audio_embeds": INPUT_FEATURES, "attention_mask": INPUT_FEATURES_MASK},
        "outputs": {"audio_features": AUDIO_FEATURES},
        **session,
    }


def _position_token_ids(config: VisionLanguageConfig) -> dict[str, int]:
    """The model-level token ids og's 3-D mrope positions read (Qwen2.5-VL), else none."""
    if config.vision_start_token_id is None:
        return {}
    return {
        "image_token_id": config.image_token_id,
        "video_token_id": config.video_token_id,
        "vision_start_token_id": config.vision_start_token_id,
    }
