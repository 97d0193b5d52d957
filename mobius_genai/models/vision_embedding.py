"""The embedding graph of a vision-language package: token embeddings with each image (and
audio) token's row replaced by the tower's features, as onnxruntime-genai's multimodal
pipeline feeds the decoder's inputs_embeds."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.deepstack import widen_embeddings
from mobius_genai.components.embedding import Embedding
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.vision import VisionLanguageConfig
from mobius_genai.ep.context import get_build_dtype
from mobius_genai.tasks.vision_language import (
    AUDIO_FEATURES,
    AUDIO_TOKENS,
    IMAGE_FEATURES,
    IMAGE_TOKENS,
)


class _Tokens(nn.Module):
    """Holds `embed_tokens` under the decoder's module name, so both share the weight name."""

    def __init__(self, config: ArchitectureConfig) -> None:
        super().__init__()
        self.embed_tokens = Embedding(
            config.vocab_size, config.hidden_size, config.embedding_multiplier
        )

    def forward(self, op, input_ids: ir.Value) -> ir.Value:
        return self.embed_tokens(op, input_ids)


class EmbeddingModel(nn.Module):
    """inputs_embeds: the scaled token embeddings, with the k-th image token of the batch
    (row-major) replaced by the k-th row of image_features (transformers' masked_scatter), and
    where the model takes audio, the k-th audio token by the k-th row of audio_features.

    Image and audio tokens are looked up as token 0 (their rows are replaced), so a token id
    outside the vocabulary is harmless; a zero row in front of the features keeps the gather
    valid when they are empty (decode steps, a prompt without audio). With DeepStack the rows
    are `embedding_width` wide and text tokens get zeros beside their embedding
    (components/deepstack.py).
    """

    def __init__(self, config: VisionLanguageConfig) -> None:
        super().__init__()
        self.text_hidden = config.text.hidden_size
        self.deepstack_layers = config.deepstack_layers
        self.hidden = config.embedding_width
        self.model = _Tokens(config.text)
        # (graph input, its token axis, the prompt token its rows replace)
        self.feature_inputs = [(IMAGE_FEATURES, IMAGE_TOKENS)]
        self.placeholders = [config.image_token_id]
        if config.audio is not None:
            self.feature_inputs.append((AUDIO_FEATURES, AUDIO_TOKENS))
            self.placeholders.append(config.audio_token_id)

    def forward(self, op, input_ids: ir.Value, *features: ir.Value) -> ir.Value:
        marks = [op.Equal(input_ids, op.Constant(value_int=token)) for token in self.placeholders]
        soft = marks[0] if len(marks) == 1 else op.Or(*marks)
        text_ids = op.Where(soft, op.Constant(value_int=0), input_ids)
        embeds = widen_embeddings(
            op, self.model(op, text_ids), self.text_hidden, self.deepstack_layers
        )
        for mark, rows in zip(marks, features, strict=True):
            embeds = self._place(op, input_ids, mark, rows, embeds)
        return embeds

    def _place(self, op, input_ids, mark: ir.Value, features: ir.Value, embeds: ir.Value):
        """embeds with the k-th `mark`ed token's row replaced by the k-th row of `features`."""
        flags = op.Cast(mark, to=ir.DataType.INT64)
        order = op.CumSum(op.Reshape(flags, op.Constant(value_ints=[-1])), op.Constant(value_int=0))
        rows = op.Reshape(
            op.Mul(order, op.Reshape(flags, op.Constant(value_ints=[-1]))), op.Shape(input_ids)
        )
        zero = np.zeros([1, self.hidden], dtype=get_build_dtype().numpy())
        padded = op.Concat(op.Constant(value=ir.tensor(zero)), features, axis=0)
        placed = op.Gather(padded, rows, axis=0)
        return op.Where(op.Unsqueeze(mark, op.Constant(value_ints=[-1])), placed, embeds)
