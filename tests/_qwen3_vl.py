"""Tiny random Qwen3-VL checkpoints written by transformers (no download); the rest of
transformers' side (patches, prompts, greedy tokens) is Qwen2.5-VL's (tests/_qwen_vl.py)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.numpy import load_file, save_file
from transformers import (
    Qwen3VLConfig,
    Qwen3VLForConditionalGeneration,
    Qwen3VLMoeConfig,
    Qwen3VLMoeForConditionalGeneration,
)

from tests._hf import randomize_weights
from tests._qwen_vl import (
    IMAGE_TOKEN,
    TEXT_HIDDEN,
    VIDEO_TOKEN,
    VISION_END,
    VISION_START,
    VISION_TOWER,
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
_VISION = {**VISION_TOWER, "num_position_embeddings": 16, "deepstack_visual_indexes": DEEPSTACK}


#: A tiny MoE decoder: 4 experts of 64 (whole int4 blocks of 32, so int4 writes QMoE); the
#: fused gate_up_proj [4, 128, 64] differs from its transpose, down_proj's layout shows in values.
_MOE = {"moe_intermediate_size": 64, "num_experts": 4, "num_experts_per_tok": 2}


def tiny_qwen3_vl(text: dict | None = None, *, moe: bool = False, **tokens: Any) -> torch.nn.Module:
    """A seeded random Qwen3VLForConditionalGeneration (with `moe`, Qwen3VLMoe...; float32,
    eval mode). `text` overrides text_config keys; `tokens` the top-level token ids."""
    ids = {
        "image_token_id": IMAGE_TOKEN,
        "video_token_id": VIDEO_TOKEN,
        "vision_start_token_id": VISION_START,
        "vision_end_token_id": VISION_END,
        **tokens,
    }
    config_class, model_class = (
        (Qwen3VLMoeConfig, Qwen3VLMoeForConditionalGeneration)
        if moe
        else (Qwen3VLConfig, Qwen3VLForConditionalGeneration)
    )
    text_config = {**_TEXT, **(_MOE if moe else {}), **(text or {})}
    config = config_class(text_config=text_config, vision_config=_VISION, **ids)
    model = model_class(config).eval()
    randomize_weights(model, 0)
    return model


def write_qwen3_vl_checkpoint(folder: Path, moe: bool = False) -> torch.nn.Module:
    """A packageable tiny Qwen3-VL (or Qwen3-VL-MoE, its experts as the hub stores them)
    checkpoint in `folder` (tokenizer and processor settings as Qwen2.5-VL's); returns the
    model."""
    model = write_qwen2_5_vl_checkpoint(folder, functools.partial(tiny_qwen3_vl, moe=moe))
    if moe:
        hub_experts(folder)
    return model


def hub_experts(folder: Path) -> None:
    """Rewrite a saved Qwen3-VL-MoE's experts as the hub's checkpoints store them:
    gate_up_proj [E, H, 2I] and down_proj [E, I, H] (transformers transposes them on load, and
    saves its own [E, 2I, H] and [E, H, I])."""
    path = Path(folder) / "model.safetensors"
    tensors = load_file(path)
    for name in tensors:
        if name.endswith(("experts.gate_up_proj", "experts.down_proj")):
            tensors[name] = np.ascontiguousarray(tensors[name].transpose(0, 2, 1))
    save_file(tensors, path, metadata={"format": "pt"})
