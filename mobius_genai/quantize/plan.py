"""The user's int4 choices (`Int4Options`) and what one build makes of them: `int4_plan`.

Which ops int4 weights become on an EP (com.microsoft::MatMulNBits, or standard
DequantizeLinear + MatMul; a quantized embedding lookup, GatherBlockQuantized; QMoE experts),
at which accuracy level, and with which block size, symmetry and recipe. This is the one
place that reads those answers off the EP's capabilities: `resolve_target` calls `int4_plan`
and carries the answer in `Target.int4_plan`, which the int4 passes and the packager follow;
`mobius-genai eps` prints each EP's.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir

from mobius_genai.ep.capabilities import MAX_INT4_ACCURACY_LEVEL, EpCapabilities
from mobius_genai.errors import ConfigError
from mobius_genai.quantize.recipes import DEFAULT_QUALITY, QUALITIES, Int4Recipe

__all__ = [
    "BLOCK_SIZES",
    "DEQUANTIZE_LINEAR",
    "MATMUL_NBITS",
    "Int4Options",
    "Int4Plan",
    "int4_plan",
]

#: Accepted `block_size` values: powers of two that both MatMulNBits and GatherBlockQuantized take.
BLOCK_SIZES = (16, 32, 64, 128, 256)


@dataclasses.dataclass(frozen=True)
class Int4Options:
    """The user's INT4 choices. None means the default: for `block_size` and `symmetric` the
    quality recipe's, for `accuracy_level` the EP's."""

    block_size: int | None = None
    symmetric: bool | None = None
    accuracy_level: int | None = None
    quality: str = DEFAULT_QUALITY

    def __post_init__(self) -> None:
        size = self.block_size
        if size is not None and (
            isinstance(size, bool) or not isinstance(size, int) or size not in BLOCK_SIZES
        ):
            raise ConfigError(
                f"int4 block size {size!r} is not accepted; accepted: "
                f"{', '.join(map(str, BLOCK_SIZES))} (powers of two from 16 to 256)"
            )
        if self.symmetric is not None and not isinstance(self.symmetric, bool):
            raise ConfigError(f"int4 symmetric must be true or false, got {self.symmetric!r}")
        if self.quality not in QUALITIES:
            raise ConfigError(
                f"int4 quality {self.quality!r} is not accepted; accepted: "
                f"{', '.join(QUALITIES)} (default {DEFAULT_QUALITY})"
            )
        level = self.accuracy_level
        if level is not None and (
            isinstance(level, bool)
            or not isinstance(level, int)
            or not 0 <= level <= MAX_INT4_ACCURACY_LEVEL
        ):
            raise ConfigError(
                f"int4 accuracy level {level!r} is not accepted; accepted: 0 (most accurate) to "
                f"{MAX_INT4_ACCURACY_LEVEL} (int8 compute, fastest), or unset for the EP default"
            )

    @classmethod
    def from_choices(
        cls,
        block_size: int | None = None,
        asymmetric: bool = False,
        accuracy_level: int | None = None,
        quality: str | None = None,
    ) -> Int4Options | None:
        """The options a user chose (CLI flags, Olive params); None when they chose none."""
        if block_size is None and not asymmetric and accuracy_level is None and quality is None:
            return None
        return cls(
            block_size=block_size,
            symmetric=False if asymmetric else None,
            accuracy_level=accuracy_level,
            quality=DEFAULT_QUALITY if quality is None else quality,
        )

    @property
    def recipe(self) -> Int4Recipe:
        """The quality recipe (rounding, 8-bit roles)."""
        return QUALITIES[self.quality]

    def resolved(self, caps: EpCapabilities) -> Int4Options:
        """These options with the block size and symmetry (from the recipe) and accuracy level
        (from the EP) filled in."""
        return dataclasses.replace(
            self,
            block_size=self.recipe.block_size if self.block_size is None else self.block_size,
            symmetric=self.recipe.symmetric if self.symmetric is None else self.symmetric,
            accuracy_level=(
                caps.default_int4_accuracy_level
                if self.accuracy_level is None
                else self.accuracy_level
            ),
        )


#: The two forms of an int4 matrix: onnxruntime's custom op, or standard ONNX.
MATMUL_NBITS = "MatMulNBits"
DEQUANTIZE_LINEAR = "DequantizeLinear"


@dataclasses.dataclass(frozen=True)
class Int4Plan:
    """How one build writes int4 weights (asked for, or stored by a pre-quantized source)."""

    matmul: str
    """MATMUL_NBITS, or DEQUANTIZE_LINEAR for an EP without the custom op (where a source's
    stored integers are dequantized: only MatMulNBits holds them as stored)."""
    gather: bool
    """Token embedding lookups as GatherBlockQuantized (the EP has it for the model dtype),
    sharing one quantized table with a tied lm_head; else they stay float. GeGLU experts'
    picked experts are dequantized by it too; else by standard ops."""
    qmoe: bool
    """MoE experts as QMoE; else they stay float (GeGLU experts are 4-bit either way: a QMoE
    body every EP expands)."""
    per_expert: bool
    """GeGLU experts as a MatMulNBits per expert (the EP's "MatMulNBits.experts" kernel row);
    else in QMoE's body."""
    accuracy_level: int
    """Of every MatMulNBits and QMoE written, stored integers included: the one asked for,
    else the EP's default."""
    options: Int4Options | None = None
    """The int4 asked for, every choice filled in (block size and symmetry from the recipe
    unless chosen, the accuracy level above); None when none is asked."""

    @property
    def matmul_nbits(self) -> bool:
        """Whether int4 matrices are MatMulNBits (and a source's integers are kept)."""
        return self.matmul == MATMUL_NBITS


def int4_plan(
    caps: EpCapabilities, dtype: ir.DataType, options: Int4Options | None = None
) -> Int4Plan:
    """The one answer to "which int4 ops does this EP take for a `dtype` model?", read from
    its capabilities, with `options` (the int4 asked for, if any) resolved for it."""
    custom = caps.supports_custom_ops
    resolved = (options or Int4Options()).resolved(caps)
    return Int4Plan(
        matmul=MATMUL_NBITS if caps.runs_matmul_nbits else DEQUANTIZE_LINEAR,
        gather=custom and dtype in caps.int4_gather_dtypes,
        qmoe=custom and caps.supports_qmoe,
        per_expert=caps.runs_matmul_nbits and dtype in caps.kernel_dtypes("MatMulNBits.experts"),
        accuracy_level=resolved.accuracy_level,
        options=None if options is None else resolved,
    )
