"""The vision and embedding graphs of a vision-language package (onnxruntime-genai's contract).

    vision     pixel_values [images, channels, size, size] → image_features [tokens, hidden]
               (Qwen2.5-VL: pixel_values [patches, patch values] and image_grid_thw [1, 3];
               Mistral 3: pixel_values [1, channels, height, width], one image at its size)
    embedding  input_ids [batch, seq], image_features [tokens, hidden] → inputs_embeds
               [batch, seq, hidden]; on decode steps image_features is empty [0, hidden]

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
IMAGES, IMAGE_TOKENS, PATCHES = "num_images", "num_image_tokens", "num_patches"
IMAGE_HEIGHT, IMAGE_WIDTH = "image_height", "image_width"


def _graph() -> tuple[ir.Graph, GraphBuilder]:
    graph = ir.Graph([], [], nodes=[], opset_imports={"": OPSET}, name="main_graph")
    return graph, GraphBuilder(graph)


class VisionTask:
    """The module's `graph_inputs` (name, element type or None for the build dtype, shape)
    → image_features, from ``module(op, *inputs)``."""

    def build(self, module: nn.Module, hidden: int) -> ir.Model:
        graph, builder = _graph()
        inputs = [
            builder.input(name, dtype or get_build_dtype(), shape)
            for name, dtype, shape in module.graph_inputs
        ]
        features = module(builder.op, *inputs)
        builder.add_output(features, IMAGE_FEATURES)
        features.shape = ir.Shape([IMAGE_TOKENS, hidden])
        features.dtype = get_build_dtype()
        return finish_model(graph, builder)


class EmbeddingTask:
    """input_ids + image_features → inputs_embeds, from ``module(op, input_ids, features)``."""

    def build(self, module: nn.Module, hidden: int) -> ir.Model:
        graph, builder = _graph()
        input_ids = builder.input("input_ids", ir.DataType.INT64, [BATCH, SEQ])
        features = builder.input(IMAGE_FEATURES, get_build_dtype(), [IMAGE_TOKENS, hidden])
        embeds = module(builder.op, input_ids, features)
        builder.add_output(embeds, INPUTS_EMBEDS)
        embeds.shape = ir.Shape([BATCH, SEQ, hidden])
        embeds.dtype = get_build_dtype()
        return finish_model(graph, builder)
