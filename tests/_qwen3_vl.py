"""Tiny random Qwen3-VL checkpoints written by transformers (no download); the rest of
transformers' side (patches, prompts, greedy tokens) is Qwen2.5-VL's (tests/_qwen_vl.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import Qwen3VLConfig, Qwen3VLForConditionalGeneration

from tests._hf import randomize_weights
from tests._qwen_vl import (
    IMAGE_TOKEN,
    MERGE,
    PATCH,
    TEMPORAL,
    TEXT_HIDDEN,
    VIDEO_TOKEN,
    VISION_END,
    VISION_START,
    write_qwen2_5_vl_checkpoint,
)

#: Blocks whose tokens the decoder adds after its layers 0 and 1 (of 3).
DEEPSTACK = [0, 2]

_TEXT = {
    "hidden_size": TEXT_HIDDEN,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 160,
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "rope_parameters": {
        "rope_type": "default",
        "mrope_section": [2, 3, 3],
        "mrope_interleaved": True,
        "rope_theta": 1e4,
    },
}
# a 4 x 4 learned position grid resampled to every image size; blocks 0 and 2 feed DeepStack
_VISION = {
    "depth": 3,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_heads": 2,
    "patch_size": PATCH,
    "spatial_merge_size": MERGE,
    "temporal_patch_size": TEMPORAL,
    "out_hidden_size": TEXT_HIDDEN,
    "num_position_embeddings": 16,
    "deepstack_visual_indexes": DEEPSTACK,
}


def tiny_qwen3_vl(text: dict | None = None, **tokens: Any) -> Qwen3VLForConditionalGeneration:
    """A seeded random Qwen3VLForConditionalGeneration (float32, eval mode).

    `text` overrides text_config keys; `tokens` the top-level token ids."""
    ids = {
        "image_token_id": IMAGE_TOKEN,
        "video_token_id": VIDEO_TOKEN,
        "vision_start_token_id": VISION_START,
        "vision_end_token_id": VISION_END,
        **tokens,
    }
    config = Qwen3VLConfig(text_config={**_TEXT, **(text or {})}, vision_config=_VISION, **ids)
    model = Qwen3VLForConditionalGeneration(config).eval()
    randomize_weights(model, 0)
    return model


def write_qwen3_vl_checkpoint(folder: Path) -> torch.nn.Module:
    """A packageable tiny Qwen3-VL checkpoint in `folder` (tokenizer and processor settings as
    Qwen2.5-VL's); returns the model."""
    return write_qwen2_5_vl_checkpoint(folder, tiny_qwen3_vl)
