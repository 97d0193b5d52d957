"""EmbeddingLayout: how tokens enter and leave the decoder stack where it differs from llama's.

OPT and XGLM (fairseq's layout) index their absolute position table from `position_offset`
(2: the rows before it belonged to fairseq's padding index); OPT-350m keeps its token table
narrower than the stack (`width`: project_in after the lookup, project_out before the head)
and, being post-LN, has no final norm (`final_norm`). The defaults are llama's layout.
"""

from __future__ import annotations

import dataclasses

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class EmbeddingLayout:
    """`position_offset`: the table row of position 0 (absolute positions only);
    `width`: the token table's width when it is not hidden_size (None: hidden_size);
    `final_norm`: the stack's output passes through a final norm."""

    position_offset: int = 0
    width: int | None = None
    final_norm: bool = True


def validate_embedding_layout(layout: EmbeddingLayout, position_embedding: str) -> None:
    """A non-negative offset of absolute positions only, and a positive width."""
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
    width = layout.width
    if width is not None and (not fields.is_int(width) or width <= 0):
        raise ConfigError(
            f"config.json: field 'word_embed_proj_dim' must be a positive integer, found {width!r}"
        )
