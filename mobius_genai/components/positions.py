"""Absolute position embeddings added to the token embeddings: a learned table (gpt2, opt) or
sinusoids computed from the positions (xglm, ctrl), each read `offset` rows on (OPT's and
XGLM's 2).

The positions are the graph's position_ids, which onnxruntime-genai derives from the attention
mask (a left-padded row's first real token is position 0), as OPT derives them from the mask's
cumsum; so a left-padded row embeds the positions transformers gives it.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.embedding import Embedding
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.embedding_layout import SINUSOID_SHIFTS
from mobius_genai.ep.context import get_build_dtype
from mobius_genai.errors import ConfigError


class LearnedPositions(Embedding):
    """Rows position + offset of a learned [max_positions + offset, hidden] table (`weight`,
    the checkpoint's `embed_positions.weight`)."""

    def __init__(self, rows: int, hidden: int, offset: int) -> None:
        super().__init__(rows + offset, hidden)
        self.offset = offset

    def forward(self, op, position_ids: ir.Value) -> ir.Value:
        return super().forward(op, _offset(op, position_ids, self.offset))


class SinusoidalPositions(nn.Module):
    """Sinusoids of position + offset: [sin(p * f) | cos(p * f)] with
    f_i = exp(-i * ln(10000) / (half - shift)) over half = hidden // 2 frequencies, a zero
    channel last when hidden is odd: fairseq's with shift 1 (transformers'
    XGLMSinusoidalPositionalEmbedding.get_embedding), CTRL's positional_encoding with shift 0.
    Computed in the graph from the positions, so no table bounds the context."""

    def __init__(self, hidden: int, offset: int, shift: int = 1) -> None:
        super().__init__()
        half = hidden // 2
        step = math.log(10000) / (half - shift)
        self.frequencies = np.exp(np.arange(half, dtype=np.float32) * np.float32(-step))
        self.odd = hidden % 2 == 1
        self.offset = offset

    def forward(self, op, position_ids: ir.Value) -> ir.Value:
        positions = op.Cast(_offset(op, position_ids, self.offset), to=ir.DataType.FLOAT)
        frequencies = op.Constant(value=ir.tensor(self.frequencies))
        angles = op.Mul(op.Unsqueeze(positions, op.Constant(value_ints=[-1])), frequencies)
        parts = [op.Sin(angles), op.Cos(angles)]
        if self.odd:
            parts.append(
                op.Mul(op.Slice(angles, *_first_channel(op)), op.Constant(value_float=0.0))
            )
        return op.Cast(op.Concat(*parts, axis=-1), to=get_build_dtype())


def _first_channel(op) -> tuple[ir.Value, ...]:
    """Slice arguments of the first channel of the last axis."""
    return (op.Constant(value_ints=[0]), op.Constant(value_ints=[1]), op.Constant(value_ints=[-1]))


def _offset(op, position_ids: ir.Value, offset: int) -> ir.Value:
    return position_ids if not offset else op.Add(position_ids, op.Constant(value_int=offset))


def make_positions(config: ArchitectureConfig, context_length: int) -> nn.Module | None:
    """The absolute position embedding `config` names (None for rotary positions); a learned
    table must hold the whole context."""
    layout = config.embedding_layout
    offset = layout.position_offset
    if config.position_embedding == "sinusoidal":
        return SinusoidalPositions(config.hidden_size, offset, SINUSOID_SHIFTS[layout.sinusoids])
    if config.position_embedding != "learned":
        return None
    if context_length > config.max_position_embeddings:
        raise ConfigError(
            f"context length {context_length} exceeds the {config.max_position_embeddings}"
            " learned positions of this model; accepted: at most max_position_embeddings"
        )
    return LearnedPositions(config.max_position_embeddings, config.hidden_size, offset)
