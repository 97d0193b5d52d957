"""MXFP4 expert weights (gpt_oss checkpoints): read, checked and dequantized one expert at a time.

config.json says `quantization_config.quant_method: "mxfp4"`; each quantized expert tensor `W`
([experts, rows, columns] as the MoE op holds it: gate_up_proj [E, 2I, hidden], down_proj
[E, hidden, I]) is stored as two tensors (OCP Microscaling, transformers' integrations/mxfp4.py):

- `W_blocks` uint8 [E, rows, columns / 32, 16]: 32 FP4 (e2m1) codes per block, two per byte,
  the low nibble the even column, the high nibble the odd one;
- `W_scales` uint8 [E, rows, columns / 32]: one E8M0 exponent per block, bias 127.

``value = FP4_VALUES[code] * 2 ** (scale - 127)``. Nothing else is quantized (attention, router,
embeddings and head stay float), so the experts are dequantized to the bundle's dtype as they
stream into it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from mobius_genai.checkpoint.reader import CheckpointReader
from mobius_genai.errors import ConfigError, WeightsError

__all__ = ["FP4_VALUES", "dequantize", "is_mxfp4", "read_expert", "stored_as_mxfp4"]

METHOD = "mxfp4"
#: The value of each FP4 e2m1 code: sign bit 3, exponent bits 2-1, mantissa bit 0.
FP4_VALUES = np.array(
    [0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0],
    dtype=np.float32,
)
_BLOCK = 32  # values per scale
_SCALE_BIAS = 127


def is_mxfp4(raw: Mapping[str, Any]) -> bool:
    """Whether config.json `raw` says its experts are stored in MXFP4."""
    qc = raw.get("quantization_config")
    if not isinstance(qc, Mapping) or str(qc.get("quant_method", "")).lower() != METHOD:
        return False
    if qc.get("dequantize") is True:
        raise ConfigError(
            "config.json: quantization_config.dequantize is true (mxfp4); accepted: a checkpoint "
            "as stored (its blocks are dequantized while building)"
        )
    return True


def dequantize(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """float32 [..., groups * 32] of `blocks` uint8 [..., groups, 16] and `scales` [..., groups]."""
    codes = np.empty((*blocks.shape[:-1], 2 * blocks.shape[-1]), dtype=np.uint8)
    codes[..., 0::2] = blocks & 0x0F
    codes[..., 1::2] = blocks >> 4
    exponents = scales.astype(np.int32)[..., None] - _SCALE_BIAS
    values = np.ldexp(FP4_VALUES[codes], exponents)
    return values.reshape(*blocks.shape[:-2], -1)


def stored_as_mxfp4(checkpoint: CheckpointReader, name: str) -> bool:
    """Whether `name` is absent and its `_blocks` / `_scales` pair is there."""
    return name not in checkpoint and f"{name}_blocks" in checkpoint


def check_stored(checkpoint: CheckpointReader, name: str, expected: tuple[int, ...]) -> list[str]:
    """The `_blocks` / `_scales` tensors of `name` (graph shape `expected` [E, rows, columns]),
    checked for their dtype and shape; returns their names."""
    experts, rows, columns = expected
    if columns % _BLOCK:
        raise WeightsError(
            f"{checkpoint.folder}: tensor {name!r} is stored in MXFP4 but has {columns} columns; "
            f"accepted: a multiple of {_BLOCK}"
        )
    shapes = {
        f"{name}_blocks": (experts, rows, columns // _BLOCK, _BLOCK // 2),
        f"{name}_scales": (experts, rows, columns // _BLOCK),
    }
    for stored, shape in shapes.items():
        if stored not in checkpoint:
            raise WeightsError(f"{checkpoint.folder}: checkpoint lacks tensor {stored!r} (MXFP4)")
        if checkpoint.dtype(stored) != "U8":
            raise WeightsError(
                f"{checkpoint.folder}: tensor {stored!r} is stored as {checkpoint.dtype(stored)}; "
                "accepted: U8 (MXFP4)"
            )
        if checkpoint.shape(stored) != shape:
            raise WeightsError(
                f"{checkpoint.folder}: tensor {stored!r} has shape "
                f"{list(checkpoint.shape(stored))}, the MoE sizes in config.json need {list(shape)}"
            )
    return list(shapes)


def read_expert(checkpoint: CheckpointReader, name: str, expert: int) -> np.ndarray:
    """Expert `expert`'s [rows, columns] float32 matrix of the MXFP4 tensor `name`."""
    index = (slice(expert, expert + 1),)
    blocks = checkpoint.read(f"{name}_blocks", index)[0]
    with np.errstate(over="ignore"):
        values = dequantize(blocks, checkpoint.read(f"{name}_scales", index)[0])
    if not np.isfinite(values).all():
        raise WeightsError(
            f"{checkpoint.folder}: tensor {name + '_scales'!r} (expert {expert}) scales blocks "
            "beyond the float32 range (an exponent byte of 255 is NaN); accepted: finite weights"
        )
    return values
