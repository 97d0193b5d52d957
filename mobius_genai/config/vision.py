"""Vision-language checkpoints: the vision tower's sizes and how images enter the text.

A vision-language config.json (Gemma 3's `model_type` "gemma3") nests a `text_config` (read
by the text family's adapter into an ArchitectureConfig) and a `vision_config` (a SigLIP
tower, read here; Qwen2.5-VL's tower in qwen_vision.py), plus the image token ids and the
number of tokens one image becomes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.architecture import ArchitectureConfig, activation
from mobius_genai.config.layers import UniformTower
from mobius_genai.config.pixtral import PixtralVisionConfig
from mobius_genai.config.qwen3_vision import Qwen3VisionConfig
from mobius_genai.config.qwen_vision import QwenVisionConfig
from mobius_genai.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class VisionConfig(UniformTower):
    """A ViT-style tower (SigLIP): square patches of a square image, pre-norm encoder layers
    with bidirectional attention, LayerNorms with bias, an FC MLP, a final LayerNorm."""

    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    image_size: int
    patch_size: int
    num_channels: int = 3
    layer_norm_eps: float = 1e-6
    hidden_act: str = "gelu_pytorch_tanh"

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @property
    def patches_per_side(self) -> int:
        return self.image_size // self.patch_size

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> VisionConfig:
        """Parse `vision_config` (transformers' SiglipVisionConfig defaults where absent)."""
        where = "vision_config."
        sizes = {
            key: fields.integer(raw.get(key), where + key, default)
            for key, default in (
                ("hidden_size", 768),
                ("intermediate_size", 3072),
                ("num_hidden_layers", 12),
                ("num_attention_heads", 12),
                ("image_size", 224),
                ("patch_size", 16),
                ("num_channels", 3),
            )
        }
        act = activation(raw.get("hidden_act", "gelu_pytorch_tanh"), where + "hidden_act")
        config = cls(
            **sizes,
            layer_norm_eps=fields.number(
                raw.get("layer_norm_eps"), where + "layer_norm_eps", 1e-6, positive=True
            ),
            hidden_act=act,
        )
        for numerator, denominator in (
            ("hidden_size", "num_attention_heads"),
            ("image_size", "patch_size"),
        ):
            if sizes[numerator] % sizes[denominator]:
                raise ConfigError(
                    f"config.json: vision_config.{numerator} {sizes[numerator]} is not a "
                    f"multiple of vision_config.{denominator} {sizes[denominator]}"
                )
        return config


@dataclasses.dataclass(frozen=True)
class VisionLanguageConfig:
    """The text decoder's config, the vision tower's, and how image features enter the text.

    `image_token_id` marks the positions of `image_tokens` features per image in the prompt;
    the projector average-pools the tower's patches down to that many tokens. Without
    `image_tokens` (Qwen2.5-VL) an image's grid sets its number of tokens, and
    `vision_start_token_id` / `video_token_id` let onnxruntime-genai find each image.
    """

    model_type: str
    text: ArchitectureConfig
    vision: VisionConfig | QwenVisionConfig | Qwen3VisionConfig | PixtralVisionConfig
    image_token_id: int
    image_tokens: int | None = None
    boi_token_id: int | None = None
    eoi_token_id: int | None = None
    video_token_id: int | None = None
    vision_start_token_id: int | None = None
    # The tokens of one image attend to each other both ways, as the config says (Gemma 4's
    # `use_bidirectional_attention`); a family that always does sets its row's flag instead.
    bidirectional_images: bool = False
    # An audio tower beside the vision one (Gemma 4 E2B/E4B: config/gemma4_audio.py), whose
    # tokens replace the prompt's `audio_token_id` tokens; None: the model takes no audio.
    audio: Any = None
    audio_token_id: int | None = None
    # (stand-in, tokens): the tokens whose text embedding, where no features replace them, is
    # the stand-in's (Gemma 4's image, video and audio tokens: its pad token's); None: each
    # placeholder's own (models/vision_embedding.py).
    placeholder_text: tuple[int, tuple[int, ...]] | None = None

    def first_layers(self, count: int) -> VisionLanguageConfig:
        """The decoder's first `count` layers and the vision (and audio) tower's first layers
        of every kind (the smoke test's twin); token ids and image sizes stay."""
        vision = self.vision.first_layers(self.vision.layers_of_every_kind())
        audio = self.audio and self.audio.first_layers(self.audio.layers_of_every_kind())
        return dataclasses.replace(
            self, text=self.text.first_layers(count), vision=vision, audio=audio
        )

    @property
    def deepstack_layers(self) -> int:
        """The decoder layers after which DeepStack features are added (Qwen3-VL), else 0."""
        return len(getattr(self.vision, "deepstack_visual_indexes", ()))

    @property
    def embedding_width(self) -> int:
        """Width of image_features and inputs_embeds: the text hidden size, once for the
        embeddings and once per DeepStack layer (components/deepstack.py)."""
        return self.text.hidden_size * (1 + self.deepstack_layers)

    @property
    def tokens_per_side(self) -> int:
        return round(self.image_tokens**0.5)

    @property
    def pool_kernel(self) -> int:
        """Side of the average-pooling window: patches per side over tokens per side."""
        return self.vision.patches_per_side // self.tokens_per_side


def parse_qwen_vision_language(
    raw: Mapping[str, Any],
    text: ArchitectureConfig,
    tower: type[QwenVisionConfig | Qwen3VisionConfig] = QwenVisionConfig,
    interleaved: bool = False,
    tie_by_top_level: bool = False,
) -> VisionLanguageConfig:
    """The VisionLanguageConfig of a Qwen2.5-VL (or, with Qwen3-VL's `tower`, Qwen3-VL)
    config.json whose text keys gave `text` (transformers' token-id defaults where absent);
    `interleaved`: the decoder's mrope sections interleave (Qwen3-VL's always do);
    `tie_by_top_level`: the top level's tie_word_embeddings ties the LM head, false when absent,
    whatever text_config says (Qwen3-VL's models)."""
    if text.rope.mrope_section is None:
        raise ConfigError(
            "config.json: rope_scaling (rope_parameters) has no 'mrope_section'; Qwen2.5-VL's "
            "decoder rotates by temporal, height and width positions"
        )
    ids = {
        key: fields.integer(raw.get(key), key, default, positive=False)
        for key, default in (
            ("image_token_id", 151_655),
            ("video_token_id", 151_656),
            ("vision_start_token_id", 151_652),
        )
    }
    return VisionLanguageConfig(
        model_type=fields.model_type(raw.get("model_type")),
        text=dataclasses.replace(
            text,
            rope=dataclasses.replace(text.rope, mrope_interleaved=interleaved),
            tie_word_embeddings=fields.flag(
                raw.get("tie_word_embeddings"), "tie_word_embeddings", False
            )
            if tie_by_top_level
            else text.tie_word_embeddings,
        ),
        vision=tower.from_dict(fields.mapping(raw.get("vision_config"), "vision_config")),
        **ids,
    )


def parse_mistral3(raw: Mapping[str, Any], text: ArchitectureConfig) -> VisionLanguageConfig:
    """The VisionLanguageConfig of a Mistral 3 config.json whose `text_config` (a decoder of
    the row's text families) gave `text`; images keep their size, so no fixed token count.
    Mistral3ForConditionalGeneration ties its LM head by the top level's tie_word_embeddings
    (true where absent), whatever `text_config` says."""
    tied = fields.flag(raw.get("tie_word_embeddings"), "tie_word_embeddings", True)
    text = dataclasses.replace(text, tie_word_embeddings=tied)
    return VisionLanguageConfig(
        model_type=fields.model_type(raw.get("model_type")),
        text=text,
        vision=PixtralVisionConfig.from_dict(raw, text),
        image_token_id=fields.integer(
            raw.get("image_token_index", raw.get("image_token_id")),
            "image_token_index",
            10,
            positive=False,
        ),
    )


def parse_vision_language(
    raw: Mapping[str, Any], text: ArchitectureConfig, *, image_tokens_default: int
) -> VisionLanguageConfig:
    """The VisionLanguageConfig of a (Gemma 3) config.json whose `text_config` gave `text`."""
    vision = VisionConfig.from_dict(fields.mapping(raw.get("vision_config"), "vision_config"))
    image_tokens = fields.integer(
        raw.get("mm_tokens_per_image"), "mm_tokens_per_image", image_tokens_default
    )
    config = VisionLanguageConfig(
        model_type=fields.model_type(raw.get("model_type")),
        text=text,
        vision=vision,
        image_token_id=fields.integer(
            raw.get("image_token_index", raw.get("image_token_id")),
            "image_token_index",
            positive=False,
        ),
        image_tokens=image_tokens,
        boi_token_id=fields.integer(raw.get("boi_token_index"), "boi_token_index", positive=False),
        eoi_token_id=fields.integer(raw.get("eoi_token_index"), "eoi_token_index", positive=False),
    )
    if config.image_token_id is None:
        raise ConfigError("config.json: field 'image_token_index' is required and missing")
    side = config.tokens_per_side
    patches = vision.patches_per_side
    if side * side != image_tokens or patches % side:
        raise ConfigError(
            f"config.json: mm_tokens_per_image {image_tokens} is not the square of a divisor of "
            f"the {patches} patches per side (vision_config.image_size / patch_size)"
        )
    return config
