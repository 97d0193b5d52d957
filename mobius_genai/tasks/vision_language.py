"""The vision and embedding graphs of a vision-language package (onnxruntime-genai's contract).

    vision     pixel_values [images, channels, size, size] → image_features [tokens, hidden]
               (Qwen2.5-VL: pixel_values [patches, patch values] and image_grid_thw [1, 3];
               Mistral 3: pixel_values [1, channels, height, width], one image at its size)
    embedding  input_ids [batch, seq], image_features [tokens, hidden] → inputs_embeds
               [batch, seq, hidden]; on decode steps image_features is empty [0, hidden]

    speech     (Gemma 4) log-mel input_features [clips, frames, mel] and their mask →
               audio_features [tokens, hidden], which the embedding graph places as it
               places image_features

image_features are 2-D (every image's tokens, in order), the layout onnxruntime-genai hands
from the vision graph to the embedding graph and empties after the prompt.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx_ir as ir
from onnxscript import GraphBuilder

from mobius_genai.ep.context import get_build_dtype
from mobius_genai.tasks.causal_lm import BATCH, INPUTS_EMBEDS, OPSET, SEQ, finish_model

if TYPE_CHECKING:
    from onnxscript import nn

PIXEL_VALUES = "pixel_values"
IMAGE_GRID_THW = "image_grid_thw"
IMAGE_FEATURES = "image_features"
AUDIO_FEATURES = "audio_features"
AUDIO_TOKENS = "num_audio_tokens"
IMAGES, IMAGE_TOKENS, PATCHES = "num_images", "num_image_tokens", "num_patches"
IMAGE_HEIGHT, IMAGE_WIDTH = "image_height", "image_width"


def _graph() -> tuple[ir.Graph, GraphBuilder]:
    graph = ir.Graph([], [], nodes=[], opset_imports={"": OPSET}, name="main_graph")
    return graph, GraphBuilder(graph)


class VisionTask:
    """The module's `graph_inputs` (name, element type or None for the build dtype, shape)
    → image_features, from ``module(op, *inputs)``."""

    output, tokens = IMAGE_FEATURES, IMAGE_TOKENS

    def build(self, module: nn.Module, hidden: int) -> ir.Model:
        graph, builder = _graph()
        inputs = [
            builder.input(name, dtype or get_build_dtype(), shape)
            for name, dtype, shape in module.graph_inputs
        ]
        features = module(builder.op, *inputs)
        builder.add_output(features, self.output)
        features.shape = ir.Shape([self.tokens, hidden])
        features.dtype = get_build_dtype()
        return finish_model(graph, builder)


class SpeechTask(VisionTask):
    """The module's `graph_inputs` → audio_features [audio tokens, hidden] (og's speech
    graph, Gemma 4's)."""

    output, tokens = AUDIO_FEATURES, AUDIO_TOKENS


class EmbeddingTask:
    """input_ids + image_features (+ audio_features where the module's `feature_inputs` name
    them) → inputs_embeds, from ``module(op, input_ids, *features)``."""

    def build(self, module: nn.Module, hidden: int) -> ir.Model:
        graph, builder = _graph()
        input_ids = builder.input("input_ids", ir.DataType.INT64, [BATCH, SEQ])
        features = [
            builder.input(name, get_build_dtype(), [tokens, hidden])
            for name, tokens in module.feature_inputs
        ]
        embeds = module(builder.op, input_ids, *features)
        builder.add_output(embeds, INPUTS_EMBEDS)
        embeds.shape = ir.Shape([BATCH, SEQ, hidden])
        embeds.dtype = get_build_dtype()
        return finish_model(graph, builder)
