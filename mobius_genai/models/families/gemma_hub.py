"""The hub's multimodal Gemma checkpoints (Gemma 3n, Gemma 4: Gemma*ForConditionalGeneration)
built as bundles of their text decoder: the decoder's keys in `text_config`, its weights under
`model.language_model.`, the towers' tensors beside them unread."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config.text_config import TextOnly
from mobius_genai.models.families.adapter import FamilyAdapter

_TOWERS = r"^model\.(vision_tower|audio_tower|embed_vision|embed_audio)\."


def gemma_hub_row(
    text_row: FamilyAdapter, model_type: str, text_defaults: Mapping[str, Any]
) -> FamilyAdapter:
    """`text_row` (the decoder's own model_type) read from a `model_type` checkpoint, whose
    text_config transformers fills with `text_defaults` (its text config class's)."""
    return dataclasses.replace(
        text_row,
        model_type=model_type,
        weight_renames=((r"^model\.", "model.language_model."),),
        unused_weights=(*text_row.unused_weights, _TOWERS),
        text_only=TextOnly(
            not_built=(
                "the vision and audio towers and their soft-token embedders (model.vision_tower, "
                "model.audio_tower, model.embed_vision, model.embed_audio): a text-only bundle, "
                "whose image and audio token ids read the text embedding table"
            ),
            text_defaults=text_defaults,
            top_level_keys={"tie_word_embeddings": True},
        ),
    )
