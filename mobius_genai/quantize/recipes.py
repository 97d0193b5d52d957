"""INT4 quality recipes: how each weight is rounded and which weights keep 8 bits.

A recipe is data: the rounding (onnxruntime's round-to-nearest kernel, or the per-block error
search of `rounding.py`), symmetric or with zero points, and the roles of the weights that stay
in 8 bits (MatMulNBits bits=8 / GatherBlockQuantized bits=8, where those kernels run; see
`quantize_int4`). `builder` is onnxruntime-genai's model builder recipe (symmetric
round-to-nearest, everything in 4 bits); benchmarks/int4_quality.py measures the others
against it and benchmarks/README.md records why `DEFAULT_QUALITY` is the default.
"""

from __future__ import annotations

import dataclasses

__all__ = [
    "DEFAULT_QUALITY",
    "QUALITIES",
    "WIDE_BLOCK_SIZE",
    "Int4Recipe",
    "WeightFormat",
    "wide_block_size",
]


@dataclasses.dataclass(frozen=True)
class WeightFormat:
    """How one weight is stored: bits per value (4 or 8) and values per scale."""

    bits: int
    block_size: int


@dataclasses.dataclass(frozen=True)
class Int4Recipe:
    """One `--int4-quality` choice."""

    symmetric: bool
    """Without zero points (unless the user asks for them)."""
    search: bool
    """Search each block's scale and zero point (`rounding.search_blocks`) instead of min/max."""
    wide_roles: frozenset[str]
    """Roles (`WeightGroup.role`: 'embedding', 'lm_head', 'linear') quantized to 8 bits."""
    summary: str
    """One line for help texts."""


QUALITIES: dict[str, Int4Recipe] = {
    "builder": Int4Recipe(
        symmetric=True,
        search=False,
        wide_roles=frozenset(),
        summary="onnxruntime-genai builder's recipe: symmetric round-to-nearest, all 4-bit",
    ),
    "search": Int4Recipe(
        symmetric=False,
        search=True,
        wide_roles=frozenset(),
        summary="zero points and a per-block scale search, all 4-bit (smallest)",
    ),
    "balanced": Int4Recipe(
        symmetric=False,
        search=True,
        wide_roles=frozenset({"embedding", "lm_head"}),
        summary="as search, with the embedding table and lm_head in 8 bits",
    ),
}

#: The default recipe. `builder` until a recipe meets issue 19's targets (benchmarks/README.md,
#: "INT4 quality"): `balanced` removes a third of the KL (the target is half) at a cost in
#: decode speed and size on small models, and the per-block search adds minutes of
#: quantization time on a 7B model.
DEFAULT_QUALITY = "builder"

#: Block size of 8-bit weights when it divides K (larger blocks: smaller scales overhead).
WIDE_BLOCK_SIZE = 128


def wide_block_size(k: int, block_size: int) -> int:
    """The block size of an 8-bit weight with input dimension `k` (a multiple of `block_size`):
    the largest power of two from `block_size` up to `WIDE_BLOCK_SIZE` that divides `k`."""
    size = block_size
    while size * 2 <= WIDE_BLOCK_SIZE and k % (size * 2) == 0:
        size *= 2
    return size
