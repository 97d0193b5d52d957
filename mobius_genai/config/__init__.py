"""The architecture description: config.json in, one validated ArchitectureConfig out.

`architecture` holds ArchitectureConfig, `checks` the checks of its sizes and block kinds,
`rope` the rotary embedding, `layers` the per-layer kinds, `recurrent` the recurrent blocks and
the states each declares, `fields` the readers every config.json field goes through. A new kind
of block (MoE, recurrent layers, a vision tower) gets a module of its own here with its config,
parsing and checks.
"""

from mobius_genai.config.architecture import ArchitectureConfig, read_config_json
from mobius_genai.config.checks import (
    HIDDEN_ACTS,
    NORM_PLACEMENTS,
    NORM_TYPES,
    POSITION_EMBEDDINGS,
)
from mobius_genai.config.layers import LAYER_TYPES
from mobius_genai.config.rope import ROPE_TYPES, RopeConfig, rotated_channels

__all__ = [
    "HIDDEN_ACTS",
    "LAYER_TYPES",
    "NORM_PLACEMENTS",
    "NORM_TYPES",
    "POSITION_EMBEDDINGS",
    "ROPE_TYPES",
    "ArchitectureConfig",
    "RopeConfig",
    "read_config_json",
    "rotated_channels",
]
