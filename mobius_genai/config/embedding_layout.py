"""EmbeddingLayout: how tokens enter and leave the decoder stack where it differs from llama's.

OPT and XGLM (fairseq's layout) index their absolute position table from `position_offset`
(2: the rows before it belonged to fairseq's padding index); OPT-350m keeps its token table
narrower than the stack (`width`: project_in after the lookup, project_out before the head)
and, being post-LN, has no final norm (`final_norm`). Sinusoidal positions come in two
layouts (`sinusoids`), both [sin | cos] halves over half = hidden // 2 frequencies
f_i = 10000^(-i / (half - shift)): fairseq's (XGLM, shift 1: the last frequency is 1/10000)
and the one of "Attention Is All You Need" (CTRL, shift 0: f_i = 10000^(-2i / hidden)). The
defaults are llama's layout.
"""

from __future__ import annotations

import dataclasses

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError

#: Each sinusoid layout's shift: its frequencies are 10000^(-i / (half - shift)).
SINUSOID_SHIFTS = {"fairseq": 1, "vaswani": 0}


@dataclasses.dataclass(frozen=True)
class EmbeddingLayout:
    """`position_offset`: the table row of position 0 (absolute positions only);
    `width`: the token table's width when it is not hidden_size (None: hidden_size);
    `final_norm`: the stack's output passes through a final norm;
    `sinusoids`: the sinusoid layout (a SINUSOID_SHIFTS name) of sinusoidal positions."""

    position_offset: int = 0
    width: int | None = None
    final_norm: bool = True
    sinusoids: str = "fairseq"


def validate_embedding_layout(layout: EmbeddingLayout, position_embedding: str) -> None:
    """A non-negative offset of absolute positions only, a known sinusoid layout and a positive
    width."""
    offset = layout.position_offset
    if not fields.is_int(offset) or offset < 0:
        raise ConfigError(
            f"config.json: the position offset must be a non-negative integer, found {offset!r}"
        )
    if offset and position_embedding == "rope":
        raise ConfigError(
            "config.json: a position offset needs absolute positions (learned or sinusoidal), "
            "found rotary positions"
        )
    if layout.sinusoids not in SINUSOID_SHIFTS:
        raise ConfigError(
            f"sinusoid layout {layout.sinusoids!r} is unknown; accepted: {sorted(SINUSOID_SHIFTS)}"
        )
    width = layout.width
    if width is not None and (not fields.is_int(width) or width <= 0):
        raise ConfigError(
            f"config.json: field 'word_embed_proj_dim' must be a positive integer, found {width!r}"
        )
