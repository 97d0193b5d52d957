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

    Without features (a decode step, a prompt without an image or audio) a placeholder keeps
    its text embedding, as transformers embeds it without pixel values: a token generated or
    written as text. Its text embedding is its own row, token 0's when it lies outside the
    vocabulary (Gemma 3), or the stand-in the config names (Gemma 4: the pad token). With
    features, placeholders and rows must match in number, as transformers requires: a
    placeholder past the last row fails the Gather, as transformers raises. A zero row in front
    of the features keeps the Gather valid when they are empty. With DeepStack the rows are
    `embedding_width` wide and text tokens get zeros beside their embedding
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
        self.stand_ins = _stand_ins(config, self.placeholders)

    def forward(self, op, input_ids: ir.Value, *features: ir.Value) -> ir.Value:
        marks = [op.Equal(input_ids, op.Constant(value_int=token)) for token in self.placeholders]
        text_ids = input_ids
        for token, stand_in in self.stand_ins.items():
            mark = op.Equal(input_ids, op.Constant(value_int=token))
            text_ids = op.Where(mark, op.Constant(value_int=stand_in), text_ids)
        embeds = widen_embeddings(
            op, self.model(op, text_ids), self.text_hidden, self.deepstack_layers
        )
        for mark, rows in zip(marks, features, strict=True):
            embeds = self._place(op, input_ids, mark, rows, embeds)
        return embeds

    def _place(self, op, input_ids, mark: ir.Value, features: ir.Value, embeds: ir.Value):
        """embeds with the k-th `mark`ed token's row replaced by the k-th row of `features`;
        unchanged when `features` has no rows."""
        flat = op.Reshape(op.Cast(mark, to=ir.DataType.INT64), op.Constant(value_ints=[-1]))
        order = op.Mul(op.CumSum(flat, op.Constant(value_int=0)), flat)
        filled = op.Greater(op.Shape(features, start=0, end=1), op.Constant(value_ints=[0]))
        rows = op.Reshape(op.Mul(order, op.Cast(filled, to=ir.DataType.INT64)), op.Shape(input_ids))
        zero = np.zeros([1, self.hidden], dtype=get_build_dtype().numpy())
        padded = op.Concat(op.Constant(value=ir.tensor(zero)), features, axis=0)
        placed = op.Gather(padded, rows, axis=0)
        taken = op.And(mark, filled)
        return op.Where(op.Unsqueeze(taken, op.Constant(value_ints=[-1])), placed, embeds)


def _stand_ins(config: VisionLanguageConfig, placeholders: list[int]) -> dict[int, int]:
    """{token: the token whose text embedding it gets} for the tokens not embedded as
    themselves: the config's `placeholder_text` stand-in, else (Gemma 3's rule) token 0 for a
    placeholder outside the vocabulary."""
    if config.placeholder_text is not None:
        stand_in, tokens = config.placeholder_text
        return {token: stand_in for token in tokens if token != stand_in}
    return {token: 0 for token in placeholders if token >= config.text.vocab_size}
