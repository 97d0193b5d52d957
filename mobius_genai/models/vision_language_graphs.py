"""The three graphs of a vision-language package, with the checkpoint's weights attached."""

from __future__ import annotations

from collections.abc import Collection

import onnx_ir as ir

from mobius_genai.checkpoint.parameters import attach_weights, parameter_tensors
from mobius_genai.checkpoint.reader import CheckpointReader
from mobius_genai.config.vision import VisionLanguageConfig
from mobius_genai.models.causal_lm import CausalLMModel
from mobius_genai.models.vision_embedding import EmbeddingModel
from mobius_genai.models.vision_language import VisionLanguageFamily
from mobius_genai.tasks.causal_lm import CausalLMTask
from mobius_genai.tasks.vision_language import EmbeddingTask, SpeechTask, VisionTask


def vision_language_graphs(
    config: VisionLanguageConfig,
    family: VisionLanguageFamily,
    context_length: int,
    checkpoint: CheckpointReader | None,
    dropped: Collection[str] = (),
) -> tuple[dict[str, ir.Model], dict[str, int]]:
    """{"vision", "embedding", "decoder"} graphs (and "speech" where the config has an audio
    tower and the row a module for it), and the stored kinds of the checkpoint
    tensors read as float (`parameter_tensors`: the read path of every model kind); call
    inside the build context. `dropped` names the checkpoint tensors of layers `config` leaves
    out (a twin's), which none reads."""
    text = config.text
    both_ways = family.bidirectional_images or config.bidirectional_images
    blocks = config.image_token_id if both_ways else None
    deepstack, width = config.deepstack_layers, config.embedding_width
    decoder = CausalLMModel(text, context_length, image_token_id=blocks, deepstack_layers=deepstack)
    models = {
        "vision": VisionTask().build(family.vision_model(config), width),
        "embedding": EmbeddingTask().build(EmbeddingModel(config), width),
        "decoder": CausalLMTask(inputs_embeds=True, embeds_width=width).build(decoder, text),
    }
    if config.audio is not None and family.audio_model is not None:
        models["speech"] = SpeechTask().build(family.audio_model(config), width)
    if checkpoint is None:
        return models, {}
    parameters = {  # one check over the three graphs: every tensor read once
        name: value for model in models.values() for name, value in model.graph.initializers.items()
    }
    tensors, float_kinds = parameter_tensors(
        parameters, checkpoint, family, text, tied=decoder.tied_weights(), dropped=dropped
    )
    for model in models.values():
        initializers = model.graph.initializers
        attach_weights(model, {k: v for k, v in tensors.items() if k in initializers})
    return models, float_kinds
