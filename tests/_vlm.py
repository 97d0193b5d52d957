"""Tiny random Gemma 3 vision-language checkpoints written by transformers (no download)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoTokenizer, Gemma3Config, Gemma3ForConditionalGeneration

from tests._hf import generated_tokens, randomize_weights
from tests.conftest import TINY_QWEN2

IMAGE_TOKEN, BOI_TOKEN, EOI_TOKEN = 100, 101, 102
TEXT_HIDDEN = 64

_TEXT = {
    "hidden_size": TEXT_HIDDEN,
    "intermediate_size": 96,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 128,
    "max_position_embeddings": 512,
    "query_pre_attn_scalar": 24,
    "sliding_window": 5,
    "sliding_window_pattern": 2,
}
# 8 x 8 patches pooled 2 x 2 into 16 image tokens; SigLIP's head is off, as in Gemma 3.
_VISION = {
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "image_size": 32,
    "patch_size": 4,
    "vision_use_head": False,
}


def tiny_gemma3(
    image_tokens: int = 16, text: dict | None = None, **settings: Any
) -> Gemma3ForConditionalGeneration:
    """A seeded random Gemma3ForConditionalGeneration (float32, eval mode).

    `text` overrides text_config keys; `settings` are vision_config keys (image_size, ...)
    or top-level token ids (image_token_index, boi_token_index, eoi_token_index).
    """
    tokens = {
        "image_token_index": IMAGE_TOKEN,
        "boi_token_index": BOI_TOKEN,
        "eoi_token_index": EOI_TOKEN,
    }
    for key in tokens:
        tokens[key] = settings.pop(key, tokens[key])
    config = Gemma3Config(
        text_config={**_TEXT, **(text or {})},
        vision_config={**_VISION, **settings},
        mm_tokens_per_image=image_tokens,
        **tokens,
    )
    model = Gemma3ForConditionalGeneration(config).eval()
    randomize_weights(model, 0)
    return model


def write_tiny_gemma3(dest: Path, **kwargs: Any) -> Path:
    tiny_gemma3(**kwargs).save_pretrained(dest)
    return dest


IMAGE_SPECIALS = ["<start_of_image>", "<image_soft_token>", "<end_of_image>"]
SIZE = 64  # 16 x 16 patches of 4: og's Gemma 3 processor assumes 256 image tokens


def write_gemma3_checkpoint(folder: Path) -> Gemma3ForConditionalGeneration:
    """Write a packageable tiny Gemma 3 checkpoint into `folder`: the model (SIZE x SIZE images,
    256 image tokens), tiny-qwen2's tokenizer with the image special tokens, and the image
    processor's settings. Returns the model (float32, eval mode)."""
    tokenizer = AutoTokenizer.from_pretrained(TINY_QWEN2)
    tokenizer.add_special_tokens({"additional_special_tokens": IMAGE_SPECIALS})
    boi, image, eoi = tokenizer.convert_tokens_to_ids(IMAGE_SPECIALS)
    model = tiny_gemma3(
        image_tokens=256,
        image_size=SIZE,
        text={"vocab_size": len(tokenizer) + 4},
        image_token_index=image,
        boi_token_index=boi,
        eoi_token_index=eoi,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # Gemma3ImageProcessor's settings (saving it needs PIL, which tests do not install)
    preprocessor = {
        "image_processor_type": "Gemma3ImageProcessor",
        "size": {"height": SIZE, "width": SIZE},
        "rescale_factor": 1 / 255,
        "image_mean": [0.5, 0.5, 0.5],
        "image_std": [0.5, 0.5, 0.5],
    }
    (folder / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    return model


def image_prompt(image_tokens: int = 16) -> torch.Tensor:
    """bos, text, an image (boi, image tokens, eoi), text: [1, seq] int64."""
    return torch.tensor([[2, 5, BOI_TOKEN] + [IMAGE_TOKEN] * image_tokens + [EOI_TOKEN, 7, 8, 9]])


def transformers_tokens(
    model: torch.nn.Module, input_ids: torch.Tensor, pixels: np.ndarray, new_tokens: int
) -> list[int]:
    """transformers' greedy tokens for `input_ids` and an image of uint8 `pixels` [h, w, 3]
    already at the processor's size (its processor: rescale, normalize, channels first)."""
    hf_pixels = ((pixels / 255 - 0.5) / 0.5).astype(np.float32).transpose(2, 0, 1)[None]
    return generated_tokens(
        model,
        input_ids,
        new_tokens,
        pixel_values=torch.from_numpy(hf_pixels),
        token_type_ids=(input_ids == model.config.image_token_index).long(),
    )
