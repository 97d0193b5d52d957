"""Tiny random Mistral 3 checkpoints written by transformers (no download), and transformers'
side of the comparisons: pixel values, image features, greedy tokens."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import AutoTokenizer, Mistral3Config, Mistral3ForConditionalGeneration

from tests._hf import _FAMILY_CONFIG, MINISTRAL3_ROPE, generated_tokens, randomize_weights
from tests.conftest import TINY_QWEN2

IMAGE_TOKEN, BREAK_TOKEN, END_TOKEN = 10, 12, 13  # Mistral's [IMG], [IMG_BREAK], [IMG_END]
TEXT_HIDDEN = 64
PATCH, MERGE = 4, 2
TOKEN_PIXELS = PATCH * MERGE
MEAN = (0.48145466, 0.4578275, 0.40821073)
STD = (0.26862954, 0.26130258, 0.27577711)
SPECIALS = ["[IMG]", "[IMG_BREAK]", "[IMG_END]", "[INST]"]
LONGEST_EDGE = 128

_TEXT = {
    "model_type": "mistral",
    "hidden_size": TEXT_HIDDEN,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 128,
    "max_position_embeddings": 512,
    "rope_theta": 1e4,
    "sliding_window": None,
    "tie_word_embeddings": False,
}
#: A Ministral 3 text_config (Ministral-3-3B/8B/14B's): yarn rope and the query scale over an
#: original length of 4 positions, so it steps up within an image prompt and while decoding.
MINISTRAL3_TEXT = {
    "model_type": "ministral3",
    "max_position_embeddings": 64,
    "rope_parameters": {**MINISTRAL3_ROPE, "factor": 16.0},
}
#: Mistral Large 3's text_config: DeepSeek-V3's latent attention and group-routed experts
#: (tests/_hf.py's tiny row; its rotary head of 8 is head_dim, as DeepseekV3Config sets it).
MISTRAL_LARGE3_TEXT = {
    "model_type": "deepseek_v3",
    **_FAMILY_CONFIG["deepseek_v3"],
    "head_dim": 8,
    "max_position_embeddings": 64,
}
_VISION = {
    "model_type": "pixtral",
    "hidden_size": 32,
    "intermediate_size": 48,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "head_dim": 16,
    "patch_size": PATCH,
    "image_size": LONGEST_EDGE,
    "hidden_act": "silu",
}


def tiny_mistral3(text: dict | None = None, **settings: Any) -> Mistral3ForConditionalGeneration:
    """A seeded random Mistral3ForConditionalGeneration (float32, eval mode), its projector with
    biases. `text` overrides text_config keys; `settings` top-level keys."""
    config = Mistral3Config(
        text_config={**_TEXT, **(text or {})},
        vision_config=_VISION,
        image_token_index=settings.pop("image_token_index", IMAGE_TOKEN),
        spatial_merge_size=MERGE,
        multimodal_projector_bias=True,
        tie_word_embeddings=False,
        **settings,
    )
    model = Mistral3ForConditionalGeneration(config).eval()
    randomize_weights(model, 0)
    return model


def special_ids(folder: Path) -> tuple[int, int, int]:
    """The ids of [IMG], [IMG_BREAK] and [IMG_END] in the tokenizer at `folder`."""
    return tuple(AutoTokenizer.from_pretrained(folder).convert_tokens_to_ids(SPECIALS[:3]))


def write_mistral3_checkpoint(
    folder: Path, text: dict | None = None
) -> Mistral3ForConditionalGeneration:
    """Write a packageable tiny Mistral 3 checkpoint into `folder`: the model (`text`
    overriding text_config keys), tiny-qwen2's tokenizer with Mistral's image tokens, and the
    image processor's settings. Returns the model (float32, eval mode)."""
    tokenizer = AutoTokenizer.from_pretrained(TINY_QWEN2)
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS})
    model = tiny_mistral3(
        text={
            "vocab_size": len(tokenizer) + 4,
            "eos_token_id": tokenizer.eos_token_id,
            **(text or {}),
        },
        image_token_index=tokenizer.convert_tokens_to_ids("[IMG]"),
    )
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    # PixtralImageProcessor's settings (saving it needs PIL, which tests do not install)
    preprocessor = {
        "image_processor_type": "PixtralImageProcessor",
        "size": {"longest_edge": LONGEST_EDGE},
        "patch_size": PATCH,
        "rescale_factor": 1 / 255,
        "image_mean": list(MEAN),
        "image_std": list(STD),
    }
    (Path(folder) / "preprocessor_config.json").write_text(json.dumps(preprocessor))
    return model


def pixel_values(pixels: np.ndarray) -> np.ndarray:
    """transformers' PixtralImageProcessor on uint8 RGB `pixels` [h, w, 3] already at its size:
    rescale, normalize, channels first → [1, 3, h, w] float32."""
    image = (pixels / 255 - np.array(MEAN)) / np.array(STD)
    return np.ascontiguousarray(image.transpose(2, 0, 1)[None].astype(np.float32))


def image_tokens(height: int, width: int, ids: tuple[int, int, int] | None = None) -> list[int]:
    """One image's tokens: a row of [IMG] per row of image tokens, [IMG_BREAK] after each row
    but the last, [IMG_END] after it."""
    image, brk, end = ids or (IMAGE_TOKEN, BREAK_TOKEN, END_TOKEN)
    rows, cols = height // TOKEN_PIXELS, width // TOKEN_PIXELS
    tokens = []
    for row in range(rows):
        tokens += [image] * cols + [brk if row < rows - 1 else end]
    return tokens


def image_prompt(height: int, width: int) -> torch.Tensor:
    """text, one image's tokens, text: [1, seq] int64."""
    return torch.tensor([[1, 5, *image_tokens(height, width), 7, 8, 9]])


def reference_features(model, pixels: np.ndarray) -> np.ndarray:
    """transformers' image features [tokens, text hidden] of one image."""
    values = torch.from_numpy(pixel_values(pixels))
    sizes = torch.tensor([list(pixels.shape[:2])])
    with torch.no_grad():
        output = model.model.get_image_features(values, sizes)
    return torch.cat(output.pooler_output).numpy()


def transformers_tokens(
    model: torch.nn.Module, input_ids: torch.Tensor, pixels: np.ndarray, new_tokens: int
) -> list[int]:
    """transformers' greedy tokens for `input_ids` and an image of uint8 `pixels` [h, w, 3]
    already at the processor's size."""
    return generated_tokens(
        model,
        input_ids,
        new_tokens,
        pixel_values=torch.from_numpy(pixel_values(pixels)),
        image_sizes=torch.tensor([list(pixels.shape[:2])]),
    )
