"""Vision-language checkpoints as three graphs: vision, embedding and the text decoder.

A row of VISION_LANGUAGE says how one model_type differs: the text family its `text_config`
belongs to, onnxruntime-genai's model.type (its facts: `kinds/og_types.py`), transformers' text
defaults hub configs leave out, how the vision keys are read, the vision graph's module, where
the checkpoint keeps each graph's tensors, and the tower's image processor and vision-section
keys (`image_processors`); `kinds/vision_language.py` builds and writes them. The decoder is
the text family's CausalLMModel fed `inputs_embeds` (the embedding graph:
`vision_embedding.py`); the vision graph is a SigLIP tower and Gemma 3's projector, or
Qwen2.5-VL's windowed tower and merger (Qwen2-VL's: the same tower without windows).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.checkpoint.grouped import GroupedWeight
from mobius_genai.checkpoint.reader import TensorSource
from mobius_genai.checkpoint.weights import no_preprocess
from mobius_genai.components.gemma4_audio import Gemma4AudioModel
from mobius_genai.components.gemma4_vision import Gemma4VisionModel
from mobius_genai.components.pixtral_vision import Mistral3VisionModel
from mobius_genai.components.qwen3_vision import Qwen3VisionTower
from mobius_genai.components.qwen_vision import QwenVisionTower
from mobius_genai.components.siglip2 import PIXEL_ATTENTION_MASK, SPATIAL_SHAPES, Lfm2VlVisionModel
from mobius_genai.components.vision import Gemma3Projector, SiglipVisionTower
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.gemma4_vision import parse_gemma4_vision_language
from mobius_genai.config.qwen3_vision import Qwen3VisionConfig
from mobius_genai.config.qwen_vision import Qwen2VisionConfig
from mobius_genai.config.siglip2 import parse_lfm2_vision_language
from mobius_genai.config.text_config import nested_text_keys
from mobius_genai.config.vision import (
    VisionLanguageConfig,
    parse_mistral3,
    parse_qwen_vision_language,
    parse_vision_language,
)
from mobius_genai.errors import UnsupportedModelError
from mobius_genai.models.audio_processors import gemma4_log_mel
from mobius_genai.models.families import FamilyAdapter, get_family
from mobius_genai.models.image_processors import (
    Transform,
    gemma4_transforms,
    lfm2_vl_transforms,
    lfm2_vl_vision_keys,
    no_vision_keys,
    pixtral_transforms,
    pixtral_vision_keys,
    qwen3_vision_keys,
    qwen_patch_transforms,
    qwen_vision_keys,
    square_transforms,
)
from mobius_genai.models.text_class_defaults import LFM2_DEFAULTS, MISTRAL3_TEXT_CLASSES
from mobius_genai.tasks.vision_language import (
    IMAGE_GRID_THW,
    IMAGES,
    PATCHES,
    PIXEL_VALUES,
)


@dataclasses.dataclass(frozen=True)
class VisionLanguageFamily:
    """How one vision-language model_type is read and named."""

    model_type: str
    # The family of a text_config without a model_type (transformers' sub-config default).
    text_family: str
    genai_type: str
    # transformers' text-config defaults for keys hub configs omit.
    text_defaults: Mapping[str, Any]
    # ArchitectureConfig fields the multimodal model fixes over its text family's.
    text_overrides: Mapping[str, Any]
    # The whole config.json and the text decoder's config → the VisionLanguageConfig.
    parse_vision: Callable[[Mapping[str, Any], ArchitectureConfig], VisionLanguageConfig]
    # The vision graph's module (pixel inputs → image_features).
    vision_model: Callable[[VisionLanguageConfig], nn.Module]
    # (graph prefix, checkpoint prefixes tried in order) for each graph's parameters.
    checkpoint_prefixes: tuple[tuple[str, tuple[str, ...]], ...]
    # The vision graph's numbered layers (`<vision_layers>.<index>.` parameter names).
    vision_layers: str
    # The speech graph's module (log-mel frames → audio_features), for a config with an audio
    # tower (VisionLanguageConfig.audio; Gemma 4 E2B/E4B); None: the row takes no audio.
    audio_model: Callable[[VisionLanguageConfig], nn.Module] | None = None
    # The feature extractor's settings and their file → og's audio_processor_config.json
    # (`audio_processors`), for the rows with an `audio_model`.
    audio_processor: Callable[[Mapping[str, Any], Path], dict[str, Any]] | None = None
    # The speech graph's numbered layers (`<audio_layers>.<index>.`), which a twin cuts.
    audio_layers: str | None = None
    # The vision graph's numbered DeepStack mergers, one per DeepStack block (Qwen3-VL).
    deepstack_mergers: str | None = None
    # Where the checkpoint keeps the decoder's experts, when not as its text family's do.
    experts_layout: ExpertLayout | None = None
    # Regex over vision graph parameters whose norm scales by 1 + weight (None: no such norm).
    offset_norms: str | None = None
    # Regex over checkpoint tensors no graph reads (a tower head the model never calls).
    unused_weights: tuple[str, ...] = ()
    # Top-level config.json keys that are the text decoder's when `text_config` lacks them.
    top_level_text_keys: tuple[str, ...] = ()
    # The tokens of one image attend to each other in both directions (Gemma 3; Gemma 4's
    # config says: VisionLanguageConfig.bidirectional_images).
    bidirectional_images: bool = False
    # preprocessor_config.json's settings, the tower's config and the file's path → the
    # transforms of og's image processor (processor_config.json).
    image_transforms: Callable[[dict[str, Any], Any, Path], list[Transform]] = square_transforms
    # The tower's config → the size keys og reads in genai_config's vision section.
    vision_keys: Callable[[Any], dict[str, Any]] = no_vision_keys
    # Vision graph input → the key og feeds it by in the vision section's inputs (where og's
    # key is not the input's name).
    vision_input_keys: Mapping[str, str] = dataclasses.field(default_factory=dict)
    # More sections of genai_config's model, as written (og's defaults a bundle must override).
    model_sections: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    # Where transformers builds text_config by its model_type (AutoConfig), the ones besides
    # `text_family` the row builds, each by its own family row; others are refused. None: the
    # multimodal class fixes its text config's class, whatever text_config.model_type says.
    text_families: tuple[str, ...] | None = None
    # For a given text_config of a row with `text_families`: transformers' defaults of the
    # config class its model_type names (`text_defaults` are the multimodal class's, for a
    # text_config left out), for the keys that text family's row requires.
    text_class_defaults: Mapping[str, Mapping[str, Any]] = dataclasses.field(default_factory=dict)

    @property
    def text(self) -> FamilyAdapter:
        return get_family(self.text_family)

    @property
    def experts(self) -> ExpertLayout | None:
        """The text decoder's MoE experts (named through `checkpoint_name`, as its weights)."""
        return self.experts_layout or self.text.experts

    @property
    def grouped_weights(self) -> tuple[GroupedWeight, ...]:
        return self.text.grouped_weights

    def for_text(self, raw: Mapping[str, Any]) -> VisionLanguageFamily:
        """This row for `raw`'s text decoder (`text_families`): a given text_config filled by its
        class's defaults (`text_class_defaults`), as AutoConfig fills it; `text_defaults` stand
        in for an absent one only."""
        text = raw.get("text_config")
        if self.text_families is None or not isinstance(text, Mapping):
            return self
        given = text.get("model_type") or self.text_family
        if given != self.text_family and given not in self.text_families:
            raise UnsupportedModelError(
                f"config.json: field 'text_config.model_type' is {given!r}; accepted for "
                f"{self.model_type}: {[self.text_family, *self.text_families]}"
            )
        defaults = self.text_class_defaults.get(given, {})
        return dataclasses.replace(self, text_family=given, text_defaults=defaults)

    def parse_config(self, raw: Mapping[str, Any]) -> VisionLanguageConfig:
        """Text keys from `text_config`, or from the top level of a flat hub config.json."""
        row = self.for_text(raw)
        text_raw = nested_text_keys(
            raw, row.text_defaults, row.top_level_text_keys, row.text.config_aliases
        )
        text_raw["model_type"] = row.text_family
        text = dataclasses.replace(row.text.parse_config(text_raw), **row.text_overrides)
        return row.parse_vision(raw, text)

    def checkpoint_name(self, graph_name: str) -> str | TensorSource:
        """The checkpoint tensor of a parameter of any of the three graphs."""
        for graph_prefix, prefixes in self.checkpoint_prefixes:
            if graph_name.startswith(graph_prefix):
                named = self.text.checkpoint_name(graph_name) if graph_prefix == "model." else None
                rest = (named if isinstance(named, str) else graph_name)[len(graph_prefix) :]
                names = tuple(prefix + rest for prefix in prefixes)
                return names[0] if len(names) == 1 else TensorSource(names=names)
        return graph_name

    def dropped_layers(self, names: Iterable[str], config: VisionLanguageConfig) -> list[str]:
        """Of the checkpoint tensor `names`, those of the decoder's and the vision tower's layers
        beyond `config`'s (cut to its first layers: the smoke test's twin), which no graph
        reads."""
        numbered = [
            ("model.layers.", config.text.num_hidden_layers),
            (f"{self.vision_layers}.", config.vision.num_layers),
        ]
        if self.deepstack_mergers is not None:
            numbered.append((f"{self.deepstack_mergers}.", config.vision.deepstack_mergers))
        if self.audio_layers is not None and config.audio is not None:
            numbered.append((f"{self.audio_layers}.", config.audio.num_layers))
        kept = {
            prefix: count
            for graph_layers, count in numbered
            for prefix in _names(self.checkpoint_name(graph_layers))
        }
        dropped = []
        for name in names:
            for prefix, count in kept.items():
                match = re.match(rf"{re.escape(prefix)}(\d+)\.", name)
                if match and int(match.group(1)) >= count:
                    dropped.append(name)
        return dropped

    def preprocess_weight(
        self, name: str, array: np.ndarray, config: ArchitectureConfig
    ) -> np.ndarray:
        """The text family's value changes for decoder names, norm offsets for the rest."""
        if name.startswith("model."):
            return self.text.preprocess_weight(name, array, config)
        if self.preprocessed(name):
            return array.astype(np.float32) + 1.0
        return no_preprocess(name, array, config)

    def preprocessed(self, name: str) -> bool:
        if name.startswith("model."):
            return self.text.preprocessed(name)
        return self.offset_norms is not None and re.search(self.offset_norms, name) is not None


def _names(source: str | TensorSource) -> tuple[str, ...]:
    return (source,) if isinstance(source, str) else source.names


class VisionModel(nn.Module):
    """pixel_values → image_features [images * image_tokens, text hidden] (Gemma 3)."""

    def __init__(self, config: VisionLanguageConfig) -> None:
        super().__init__()
        self.text_hidden = config.text.hidden_size
        vision = config.vision
        self.graph_inputs = [
            (
                PIXEL_VALUES,
                None,
                [IMAGES, vision.num_channels, vision.image_size, vision.image_size],
            )
        ]
        self.vision_tower = SiglipVisionTower(vision)
        self.multi_modal_projector = Gemma3Projector(config)

    def forward(self, op, pixel_values: ir.Value) -> ir.Value:
        tokens = self.multi_modal_projector(op, self.vision_tower(op, pixel_values))
        return op.Reshape(tokens, op.Constant(value_ints=[-1, self.text_hidden]))


class QwenVisionModel(nn.Module):
    """pixel_values [patches, C·T·p²] of one image and its image_grid_thw [1, 3] →
    image_features [patches / merge², text hidden] (Qwen2.5-VL; onnxruntime-genai runs the
    graph once per image when the input says one image)."""

    def __init__(self, config: VisionLanguageConfig) -> None:
        super().__init__()
        self.graph_inputs = [
            (PIXEL_VALUES, None, [PATCHES, config.vision.patch_dim]),
            (IMAGE_GRID_THW, ir.DataType.INT64, [1, 3]),
        ]
        self.visual = QwenVisionTower(config.vision)

    def forward(self, op, pixel_values: ir.Value, image_grid_thw: ir.Value) -> ir.Value:
        return self.visual(op, pixel_values, image_grid_thw)


class Qwen3VisionModel(QwenVisionModel):
    """QwenVisionModel's inputs → image_features [patches / merge², text hidden · (1 +
    DeepStack layers)]: each token's features, then its DeepStack features (Qwen3-VL)."""

    def __init__(self, config: VisionLanguageConfig) -> None:
        nn.Module.__init__(self)
        vision: Qwen3VisionConfig = config.vision  # type: ignore[assignment]
        self.graph_inputs = [
            (PIXEL_VALUES, None, [PATCHES, vision.patch_dim]),
            (IMAGE_GRID_THW, ir.DataType.INT64, [1, 3]),
        ]
        self.visual = Qwen3VisionTower(vision)


VISION_LANGUAGE: dict[str, VisionLanguageFamily] = {
    family.model_type: family
    for family in (
        VisionLanguageFamily(
            model_type="gemma3",
            text_family="gemma3_text",
            genai_type="gemma3",
            text_defaults={
                "vocab_size": 262_208,
                "hidden_size": 2304,
                "intermediate_size": 9216,
                "num_hidden_layers": 26,
                "num_attention_heads": 8,
                "num_key_value_heads": 4,
                "head_dim": 256,
                "query_pre_attn_scalar": 256,
                "max_position_embeddings": 131_072,
                "rms_norm_eps": 1e-6,
                "sliding_window": 4096,
                "hidden_activation": "gelu_pytorch_tanh",
                "rope_theta": 1_000_000.0,
                "rope_local_base_freq": 10_000.0,
                "bos_token_id": 2,
                "eos_token_id": 1,
                "pad_token_id": 0,
            },
            # Gemma3ForConditionalGeneration never applies the text config's logit softcap.
            text_overrides={"final_logit_softcapping": None},
            parse_vision=functools.partial(parse_vision_language, image_tokens_default=256),
            vision_model=VisionModel,
            checkpoint_prefixes=(
                ("model.", ("language_model.model.",)),
                ("vision_tower.", ("vision_tower.vision_model.", "vision_tower.")),
                ("multi_modal_projector.", ("multi_modal_projector.",)),
            ),
            offset_norms=r"^multi_modal_projector\.mm_soft_emb_norm\.weight$",
            vision_layers="vision_tower.encoder.layers",
            unused_weights=(r"^vision_tower\.(vision_model\.)?head\.",),
            bidirectional_images=True,
        ),
        VisionLanguageFamily(
            model_type="qwen2_5_vl",
            text_family="qwen2",
            genai_type="qwen2_5_vl",
            # Qwen2_5_VLTextConfig's defaults that differ from Qwen2Config's
            text_defaults={
                "vocab_size": 152_064,
                "hidden_size": 8192,
                "intermediate_size": 29_568,
                "num_hidden_layers": 80,
                "num_attention_heads": 64,
                "num_key_value_heads": 8,
                "max_position_embeddings": 32_768,
                "rope_theta": 1_000_000.0,
                "rms_norm_eps": 1e-5,
            },
            text_overrides={},
            parse_vision=parse_qwen_vision_language,
            vision_model=QwenVisionModel,
            # transformers 5 names (model.language_model., model.visual.) and the hub's
            checkpoint_prefixes=(
                ("model.", ("model.language_model.", "model.")),
                ("visual.", ("model.visual.", "visual.")),
            ),
            vision_layers="visual.blocks",
            top_level_text_keys=("tie_word_embeddings",),
            image_transforms=qwen_patch_transforms,
            vision_keys=qwen_vision_keys,
        ),
        VisionLanguageFamily(
            model_type="mistral3",
            text_family="mistral",
            genai_type="mistral3",
            # Mistral3Config's text_config defaults (Mistral-Small-3.1)
            text_defaults={
                "vocab_size": 131_072,
                "hidden_size": 5120,
                "intermediate_size": 32_768,
                "num_hidden_layers": 40,
                "num_attention_heads": 32,
                "num_key_value_heads": 8,
                "head_dim": 128,
                "max_position_embeddings": 131_072,
                "rms_norm_eps": 1e-5,
                "rope_theta": 1_000_000_000.0,
                "sliding_window": None,
            },
            text_overrides={},
            parse_vision=parse_mistral3,
            vision_model=Mistral3VisionModel,
            # transformers 5 names (model.language_model., model.vision_tower.) and the hub's
            checkpoint_prefixes=(
                ("model.", ("model.language_model.", "language_model.model.")),
                ("lm_head.", ("lm_head.", "language_model.lm_head.")),
                ("vision_tower.", ("model.vision_tower.", "vision_tower.")),
                (
                    "multi_modal_projector.",
                    ("model.multi_modal_projector.", "multi_modal_projector."),
                ),
            ),
            vision_layers="vision_tower.transformer.layers",
            image_transforms=pixtral_transforms,
            vision_keys=pixtral_vision_keys,
            text_families=("ministral3", "deepseek_v3"),  # Ministral 3, Mistral Large 3
            text_class_defaults=MISTRAL3_TEXT_CLASSES,
        ),
        VisionLanguageFamily(
            model_type="qwen3_vl",
            text_family="qwen3",
            genai_type="qwen3_vl",
            # Qwen3VLTextConfig's defaults that differ from Qwen3Config's
            text_defaults={
                "vocab_size": 151_936,
                "hidden_size": 4096,
                "intermediate_size": 22_016,
                "num_hidden_layers": 32,
                "num_attention_heads": 32,
                "num_key_value_heads": 32,
                "head_dim": 128,
                "max_position_embeddings": 128_000,
                "rope_theta": 500_000.0,
                "rms_norm_eps": 1e-6,
            },
            text_overrides={},
            parse_vision=functools.partial(
                parse_qwen_vision_language,
                tower=Qwen3VisionConfig,
                interleaved=True,
                tie_by_top_level=True,
            ),
            vision_model=Qwen3VisionModel,
            checkpoint_prefixes=(
                ("model.", ("model.language_model.", "model.")),
                ("visual.", ("model.visual.", "visual.")),
            ),
            vision_layers="visual.blocks",
            deepstack_mergers="visual.deepstack_merger_list",
            image_transforms=qwen_patch_transforms,
            vision_keys=qwen3_vision_keys,
        ),
        # LFM2-VL: a SigLIP2 NaFlex tower (images at their own size, padded patches masked)
        # and the pixel-unshuffle projector (config/siglip2.py) beside LFM2's hybrid decoder;
        # og 0.18's lfm2_vl type patchifies the image and feeds the mask and the patch grid
        # under its own keys
        VisionLanguageFamily(
            model_type="lfm2_vl",
            text_family="lfm2",
            genai_type="lfm2_vl",
            text_defaults=LFM2_DEFAULTS,
            text_overrides={},
            parse_vision=parse_lfm2_vision_language,
            vision_model=Lfm2VlVisionModel,
            # transformers 5 names, and the hub's (the tower's vision_model. level)
            checkpoint_prefixes=(
                ("model.", ("model.language_model.",)),
                ("vision_tower.", ("model.vision_tower.", "model.vision_tower.vision_model.")),
                ("multi_modal_projector.", ("model.multi_modal_projector.",)),
            ),
            vision_layers="vision_tower.encoder.layers",
            unused_weights=(r"^model\.vision_tower\.(vision_model\.)?head\.",),
            top_level_text_keys=("tie_word_embeddings",),
            image_transforms=lfm2_vl_transforms,
            vision_keys=lfm2_vl_vision_keys,
            vision_input_keys={
                PIXEL_ATTENTION_MASK: "attention_mask",
                SPATIAL_SHAPES: "image_sizes",
            },
            text_families=(),  # Lfm2VlConfig builds text_config by its model_type: lfm2 only
            text_class_defaults={"lfm2": LFM2_DEFAULTS},
        ),
        # Gemma 4: images cut into patches by og's Gemma4ImageTransform (aspect ratio kept
        # within max_soft_tokens), a tower with learned and rotary 2-D positions, 3 x 3
        # pooling and the embedder into the text (config/gemma4_vision.py)
        VisionLanguageFamily(
            model_type="gemma4",
            text_family="gemma4_text",
            genai_type="gemma4",
            text_defaults={  # Gemma4TextConfig's
                "vocab_size": 262_144,
                "hidden_size": 2304,
                "intermediate_size": 9216,
                "num_hidden_layers": 30,
                "num_attention_heads": 8,
                "num_key_value_heads": 4,
                "head_dim": 256,
                "hidden_activation": "gelu_pytorch_tanh",
                "max_position_embeddings": 131_072,
                "rms_norm_eps": 1e-6,
                "sliding_window": 512,
                "bos_token_id": 2,
                "eos_token_id": 1,
                "pad_token_id": 0,
            },
            text_overrides={},
            parse_vision=parse_gemma4_vision_language,
            vision_model=Gemma4VisionModel,
            checkpoint_prefixes=(
                ("model.", ("model.language_model.",)),
                ("vision_tower.", ("model.vision_tower.",)),
                ("embed_vision.", ("model.embed_vision.",)),
                ("audio_tower.", ("model.audio_tower.",)),
                ("embed_audio.", ("model.embed_audio.",)),
            ),
            vision_layers="vision_tower.encoder.layers",
            # E2B and E4B: a conformer audio tower (components/gemma4_audio.py), the speech
            # graph og's gemma4 type runs on its Gemma4LogMel features
            audio_model=Gemma4AudioModel,
            audio_processor=gemma4_log_mel,
            audio_layers="audio_tower.layers",
            image_transforms=gemma4_transforms,
            # og's gemma4 type names an audio processor file by default and refuses a bundle
            # whose speech section has that file but no speech graph (the kind writes the
            # whole section where the checkpoint has an audio tower)
            model_sections={"speech": {"config_filename": ""}},
        ),
    )
}


#: Qwen3-VL-MoE (Qwen3-VL-30B-A3B, -235B-A22B): Qwen3-VL's tower and og type, a qwen3_moe decoder
#: whose router always renormalizes its top-k, experts fused as the hub stores them
#: (transformers' Qwen3VLMoeTextExperts transposed: gate_up_proj [E, H, 2I], down_proj [E, I, H]).
VISION_LANGUAGE["qwen3_vl_moe"] = dataclasses.replace(
    VISION_LANGUAGE["qwen3_vl"],
    model_type="qwen3_vl_moe",
    text_family="qwen3_moe",
    # Qwen3VLMoeTextConfig's defaults that differ from Qwen3MoeConfig's
    text_defaults={
        "vocab_size": 151_936,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": 128,
        "max_position_embeddings": 128_000,
        "rope_theta": 500_000.0,
        "rms_norm_eps": 1e-6,
        "moe_intermediate_size": 1408,
        "num_experts_per_tok": 4,
        "num_experts": 60,  # or num_local_experts, as transformers 5 writes it
        "norm_topk_prob": True,
    },
    experts_layout=ExpertLayout(
        gate="gate_up_proj", up=None, down="down_proj", in_out=True, either_way=True
    ),
)

#: Qwen2-VL (Qwen2-VL-2B/7B/72B-Instruct): Qwen2.5-VL's decoder, checkpoint names and og type
#: (og 0.18 has no qwen2_vl type; its qwen2_5_vl processor and 3-D positions are Qwen2-VL's
#: for images), and the tower without windows, with LayerNorms and an fc1 → quick_gelu → fc2
#: MLP (config/qwen_vision.Qwen2VisionConfig).
VISION_LANGUAGE["qwen2_vl"] = dataclasses.replace(
    VISION_LANGUAGE["qwen2_5_vl"],
    model_type="qwen2_vl",
    parse_vision=functools.partial(parse_qwen_vision_language, tower=Qwen2VisionConfig),
)


def vision_language_family(
    model_type: str, raw: Mapping[str, Any] | None = None
) -> VisionLanguageFamily | None:
    """The row for a vision-language model_type, None for any other; with config.json `raw`,
    the row for its text decoder (`VisionLanguageFamily.for_text`)."""
    row = VISION_LANGUAGE.get(model_type)
    return row if row is None or raw is None else row.for_text(raw)
