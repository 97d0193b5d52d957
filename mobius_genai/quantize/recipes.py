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
import re

__all__ = [
    "DEFAULT_QUALITY",
    "QUALITIES",
    "WIDE_BLOCK_SIZE",
    "FormatRule",
    "Int4Recipe",
    "WeightFormat",
    "layer_index",
    "more_bits_layer",
    "wide_block_size",
]

#: Block size of 8-bit weights when it divides K (larger blocks: smaller scales overhead).
WIDE_BLOCK_SIZE = 128

#: The decoder layer of a weight name (`model.layers.11.mlp.down_proj.weight` -> 11).
_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


@dataclasses.dataclass(frozen=True)
class WeightFormat:
    """How one weight is stored: bits per value (4 or 8) and values per scale."""

    bits: int
    block_size: int


def layer_index(name: str) -> int | None:
    """The decoder layer a weight belongs to, from its name; None outside the layers."""
    found = _LAYER.search(name)
    return int(found.group(1)) if found else None


def more_bits_layer(index: int, count: int) -> bool:
    """llama.cpp's `use_more_bits` (its k-quant "medium" mixes): the first and last eighth of
    the layers and every third layer between them."""
    return index < count // 8 or index >= 7 * count // 8 or (index - count // 8) % 3 == 2


#: `FormatRule.layers` choices: which decoder layers (index, layer count) a rule covers.
_LAYER_SETS = {
    "all": lambda index, count: True,
    "more_bits": more_bits_layer,
}


@dataclasses.dataclass(frozen=True)
class FormatRule:
    """Weights a recipe stores other than in 4 bits at the chosen block size: those of `role`,
    and (when `suffix` is set) only those whose name ends with `suffix` in the decoder layers
    `layers` selects ('all' or 'more_bits'). They get `bits` and the largest block size up to
    `max_block` that divides their K (`wide_block_size`)."""

    role: str
    suffix: str = ""
    layers: str = "all"
    bits: int = 8
    max_block: int = WIDE_BLOCK_SIZE

    def covers(self, name: str, role: str, layer_count: int) -> bool:
        """Whether the weight `name` of `role` (in a model of `layer_count` layers) is covered."""
        if role != self.role or not name.endswith(self.suffix):
            return False
        if self.layers == "all":
            return True
        index = layer_index(name)
        return index is not None and _LAYER_SETS[self.layers](index, layer_count)


@dataclasses.dataclass(frozen=True)
class Int4Recipe:
    """One `--int4-quality` choice."""

    symmetric: bool
    """Without zero points (unless the user asks for them)."""
    search: bool
    """Search each block's scale and zero point (`rounding.search_blocks`) instead of min/max."""
    rules: tuple[FormatRule, ...]
    """The weights stored otherwise than in 4 bits at the chosen block size (first rule wins)."""
    summary: str
    """One line for help texts."""
    block_size: int = 32
    """Block size of the 4-bit weights, unless the user picks one (`--int4-block-size`)."""
    calibrate: bool = False
    """Weight the search by each MatMul input feature's mean square over random token ids
    pushed through the float graph (`calibrate.py`)."""

    @property
    def wide_roles(self) -> frozenset[str]:
        """Roles (`WeightGroup.role`: 'embedding', 'lm_head', 'linear') with 8-bit weights."""
        return frozenset(rule.role for rule in self.rules if rule.bits == 8)

    def weight_format(
        self, name: str, role: str, k: int, block_size: int, layer_count: int
    ) -> WeightFormat:
        """The format of the weight `name` of `role` with input dimension `k`."""
        for rule in self.rules:
            if rule.covers(name, role, layer_count):
                return WeightFormat(rule.bits, wide_block_size(k, block_size, rule.max_block))
        return WeightFormat(4, block_size)


#: `mixed`'s 8-bit weights: attention k/v (a packed q/k/v whole) and "more bits" down_proj.
_MIXED_RULES = (
    FormatRule("linear", "self_attn.qkv_proj.weight"),
    FormatRule("linear", "self_attn.v_proj.weight"),
    FormatRule("linear", "self_attn.k_proj.weight"),
    FormatRule("linear", "mlp.down_proj.weight", "more_bits"),
)

QUALITIES: dict[str, Int4Recipe] = {
    "builder": Int4Recipe(
        symmetric=True,
        search=False,
        rules=(),
        summary="onnxruntime-genai builder's recipe: symmetric round-to-nearest, all 4-bit",
    ),
    "search": Int4Recipe(
        symmetric=False,
        search=True,
        rules=(),
        summary="zero points and a per-block scale search, all 4-bit (smallest)",
    ),
    "balanced": Int4Recipe(
        symmetric=False,
        search=True,
        rules=(FormatRule("embedding"), FormatRule("lm_head")),
        summary="as search, with the embedding table and lm_head in 8 bits",
    ),
    "mixed": Int4Recipe(
        symmetric=False,
        search=True,
        rules=_MIXED_RULES,
        summary="as search, with the attention k/v projections (a checkpoint's own packed "
        "q/k/v whole) and the down_proj of llama.cpp's 'more bits' layers in 8 bits",
    ),
    "calibrated": Int4Recipe(
        symmetric=False,
        search=True,
        rules=(FormatRule("linear", "self_attn.v_proj.weight"),),
        summary="as search, weighted by the activations each weight meets over 256 random "
        "token ids (no data needed), with the attention v projections in 8 bits",
        calibrate=True,
    ),
    "calibrated-mixed": Int4Recipe(
        symmetric=False,
        search=True,
        rules=_MIXED_RULES,
        summary="as mixed, with the search weighted by the activations as in calibrated "
        "(most accurate)",
        calibrate=True,
    ),
}

#: The default recipe: the one that meets issue 19's targets (half the builder's KL at most,
#: at most 1.15x its size, at least 0.95x its decode speed; benchmarks/README.md, "INT4
#: quality"). Its calibration runs on every float type (in float32) and within a 7B's 3 GB.
DEFAULT_QUALITY = "calibrated"


def wide_block_size(k: int, block_size: int, limit: int = WIDE_BLOCK_SIZE) -> int:
    """The block size of a weight with input dimension `k` (a multiple of `block_size`) that
    a `FormatRule` covers: the largest power of two from `block_size` up to `limit` that
    divides `k`."""
    size = block_size
    while size * 2 <= limit and k % (size * 2) == 0:
        size *= 2
    return size
