"""Tiny random Qwen2.5-VL (and Qwen2-VL) checkpoints written by transformers (no download), and
transformers' side of the comparisons: image features, merged embeddings, 3-D mrope positions,
greedy tokens."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import (
    AutoTokenizer,
    Qwen2_5_VLConfig,
    Qwen2_5_VLForConditionalGeneration,
    Qwen2VLConfig,
    Qwen2VLForConditionalGeneration,
)

from tests._hf import generated_tokens, randomize_weights
from tests.conftest import TINY_QWEN2

IMAGE_TOKEN, VIDEO_TOKEN, VISION_START, VISION_END = 150, 151, 152, 153
TEXT_HIDDEN = 64
PATCH, MERGE, TEMPORAL = 4, 2, 2
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)
QWEN_SPECIALS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
MIN_PIXELS = 32 * 32  # the smoke test's image: the smallest square smart_resize keeps

_TEXT = {
    "hidden_size": TEXT_HIDDEN,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "vocab_size": 160,
    "max_position_embeddings": 512,
    "bos_token_id": 1,
    "eos_token_id": 2,
    "rope_parameters": {"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 1e4},
}
#: The vision tower Qwen2.5-VL and Qwen3-VL share here: 3 blocks, 2 x 2 merges of 4-pixel patches.
VISION_TOWER = {
    "depth": 3,
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_heads": 2,
    "patch_size": PATCH,
    "spatial_merge_size": MERGE,
    "temporal_patch_size": TEMPORAL,
    "out_hidden_size": TEXT_HIDDEN,
}
# window_size 16 = 2 merged tokens of 2 x 2 patches of 4 pixels: a 40 x 56 image is a 5 x 7
# grid of merged tokens in 3 x 4 windows, some of them partial; block 1 attends to everything.
_VISION = {**VISION_TOWER, "window_size": 16, "fullatt_block_indexes": [1]}
#: Qwen2-VL's names for the same sizes: the tower's width is embed_dim, the merger's output
#: hidden_size, the MLP's width mlp_ratio times the tower's (quick_gelu, transformers' default).
QWEN2_VISION = {
    "depth": 3,
    "embed_dim": 32,
    "mlp_ratio": 2,
    "num_heads": 2,
    "hidden_size": TEXT_HIDDEN,
    "patch_size": PATCH,
    "spatial_merge_size": MERGE,
    "temporal_patch_size": TEMPORAL,
}


def tiny_qwen2_5_vl(text: dict | None = None, **tokens: Any) -> Qwen2_5_VLForConditionalGeneration:
    """A seeded random Qwen2_5_VLForConditionalGeneration (float32, eval mode).

    `text` overrides text_config keys; `tokens` the top-level token ids."""
    return _tiny(Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, _VISION, text, tokens)


def tiny_qwen2_vl(text: dict | None = None, **tokens: Any) -> Qwen2VLForConditionalGeneration:
    """A seeded random Qwen2VLForConditionalGeneration (float32, eval mode), arguments as
    `tiny_qwen2_5_vl`'s. Its greedy tokens after the tests' image prompts start with the image
    token, which a decode step embeds as text (models/vision_embedding.py)."""
    return _tiny(Qwen2VLConfig, Qwen2VLForConditionalGeneration, QWEN2_VISION, text, tokens)


def _tiny(config_class, model_class, vision: dict, text: dict | None, tokens: dict, seed: int = 0):
    ids = {
        "image_token_id": IMAGE_TOKEN,
        "video_token_id": VIDEO_TOKEN,
        "vision_start_token_id": VISION_START,
        "vision_end_token_id": VISION_END,
        **tokens,
    }
    config = config_class(text_config={**_TEXT, **(text or {})}, vision_config=vision, **ids)
    model = model_class(config).eval()
    randomize_weights(model, seed)
    return model


def write_qwen2_5_vl_checkpoint(
    folder: Path, tiny: Callable[..., torch.nn.Module] = tiny_qwen2_5_vl
) -> Qwen2_5_VLForConditionalGeneration:
    """Write a packageable tiny Qwen2.5-VL checkpoint (or `tiny`'s: Qwen3-VL) into `folder`:
    the model, tiny-qwen2's tokenizer with the vision special tokens, and the image
    processor's settings. Returns the model (float32, eval mode)."""
    tokenizer = AutoTokenizer.from_pretrained(TINY_QWEN2)
    tokenizer.add_special_tokens({"additional_special_tokens": QWEN_SPECIALS})
    start, end, image, video = tokenizer.convert_tokens_to_ids(QWEN_SPECIALS)
    model = tiny(
        text={"vocab_size": len(tokenizer) + 4, "eos_token_id": tokenizer.eos_token_id},
        image_token_id=image,
        video_token_id=video,
        vision_start_token_id=start,
        vision_end_token_id=end,
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # Qwen2VLImageProcessor's settings (saving it needs PIL, which tests do not install)
    preprocessor = {
        "image_processor_type": "Qwen2VLImageProcessor",
        "min_pixels": MIN_PIXELS,
        "max_pixels": 256 * 256,
        "patch_size": PATCH,
        "temporal_patch_size": TEMPORAL,
        "merge_size": MERGE,
        "rescale_factor": 1 / 255,
        "image_mean": list(MEAN),
        "image_std": list(STD),
    }
    (Path(folder) / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    return model


def patches(pixels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """transformers' Qwen2VLImageProcessor on uint8 `pixels` [h, w, 3] already at its size:
    rescale, normalize, the frame repeated to `TEMPORAL`, cut into merge-ordered patches.
    Returns (pixel_values [patches, 3 * TEMPORAL * PATCH²] float32, image_grid_thw [1, 3])."""
    return temporal_patches(np.repeat(pixels[None], TEMPORAL, axis=0))


def temporal_patches(frames: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """`patches` of uint8 video `frames` [f, h, w, 3] (f a multiple of `TEMPORAL`), as the
    video processor cuts them: consecutive frames form one temporal patch. Returns
    (pixel_values, grid [[f / TEMPORAL, h / PATCH, w / PATCH]])."""
    count, height, width, _ = frames.shape
    video = ((frames / 255 - np.array(MEAN)) / np.array(STD)).astype(np.float32)
    video = video.transpose(0, 3, 1, 2)  # [f, C, H, W]
    grid_t, grid_h, grid_w = count // TEMPORAL, height // PATCH, width // PATCH
    blocks = video.reshape(
        grid_t, TEMPORAL, 3, grid_h // MERGE, MERGE, PATCH, grid_w // MERGE, MERGE, PATCH
    )
    ordered = blocks.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    flat = ordered.reshape(grid_t * grid_h * grid_w, 3 * TEMPORAL * PATCH * PATCH)
    return np.ascontiguousarray(flat), np.array([[grid_t, grid_h, grid_w]], np.int64)


def image_prompt(grid: np.ndarray, before: tuple[int, ...] = (5, 6)) -> torch.Tensor:
    """text, vision_start, one image's pad tokens, vision_end, text: [1, seq] int64."""
    count = int(np.prod(grid[0])) // MERGE**2
    image = [VISION_START, *[IMAGE_TOKEN] * count, VISION_END]
    return torch.tensor([[*before, *image, 7, 8, 9]])


def token_types(input_ids: torch.Tensor, image_token_id: int = IMAGE_TOKEN) -> torch.Tensor:
    """mm_token_type_ids: 1 for image tokens, 0 for text."""
    return (input_ids == image_token_id).int()


def transformers_prefill(
    model: torch.nn.Module, input_ids: torch.Tensor, pixel_values: np.ndarray, grid: np.ndarray
) -> tuple[torch.Tensor, Any]:
    """transformers' mrope position ids for `input_ids` with one image's patches, and its
    prefill output (logits and cache) over them."""
    grid_thw = torch.from_numpy(grid)
    with torch.no_grad():
        positions, _ = model.model.get_rope_index(
            input_ids, token_types(input_ids), image_grid_thw=grid_thw
        )
        reference = model(
            input_ids=input_ids,
            pixel_values=torch.from_numpy(pixel_values),
            image_grid_thw=grid_thw,
            mm_token_type_ids=token_types(input_ids),
            use_cache=True,
        )
    return positions, reference


def transformers_tokens(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    pixels: np.ndarray | list[np.ndarray],
    new_tokens: int,
) -> list[int]:
    """transformers' greedy tokens for `input_ids` and an image (or a list of images, in the
    prompt's order) of uint8 `pixels` [h, w, 3] already at the processor's size."""
    values, grids = zip(*(patches(image) for image in _listed(pixels)), strict=True)
    return generated_tokens(
        model,
        input_ids,
        new_tokens,
        pixel_values=torch.from_numpy(np.concatenate(values)),
        image_grid_thw=torch.from_numpy(np.concatenate(grids)),
        mm_token_type_ids=token_types(input_ids, model.config.image_token_id),
    )


def _listed(pixels: np.ndarray | list[np.ndarray]) -> list[np.ndarray]:
    return pixels if isinstance(pixels, list) else [pixels]
