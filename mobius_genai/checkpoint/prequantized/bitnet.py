"""BitNet b1.58 checkpoints: config.json's `quantization_config` (quant_method "bitnet") and
the ternary weights of its BitLinear projections, as transformers' integrations/bitnet.py reads
them.

Every projection of the decoder layers holds weights in {-1, 0, 1} times one scale per tensor:

- `linear_class` "bitlinear": `X.weight` packed 2-bit in uint8 [N / 4, K] and `X.weight_scale`
  [1]; y = (x_q @ w.T) / (x_scale * weight_scale), so the scale of w is 1 / weight_scale.
- "autobitlinear", `quantization_mode` "offline": the same packed `X.weight` (or the ternary
  values unpacked, as floats) and y = (x @ w.T) * weight_scale.
- "autobitlinear", "online" (the -bf16 master weights): `X.weight` float; transformers
  ternarizes it at each call, s = 1 / mean(|W|) (at least 1e-5), w = clamp(round(W * s), -1, 1) / s.

Packed layout (`unpack_weights`): output row ``i * N / 4 + r`` is bits ``2 i`` of row r of the
packed tensor, stored as the value + 1. Each weight becomes a `PrequantizedTensor` of 4-bit
integers (value + 8, MatMulNBits' implicit zero point) whose blocks all carry the tensor's
scale: exact, and read one weight at a time.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx_ir as ir

from mobius_genai.checkpoint.bitnet_config import bitnet_quantization
from mobius_genai.checkpoint.prequantized.tensor import (
    PrequantizedTensor,
    StoredBlocks,
    matrices,
)
from mobius_genai.checkpoint.reader import CheckpointName, CheckpointReader
from mobius_genai.errors import WeightsError

__all__ = ["BitNetScheme", "read_bitnet_config"]

#: Ternary values per packed byte (transformers' VALUES_PER_ITEM).
_PER_BYTE = 4
#: MatMulNBits' implicit zero point of 4-bit integers: value v is stored as v + 8.
_ZERO = 8
#: The largest block written: every block of a weight carries the same scale, so a larger one
#: only saves scales; MatMulNBits' CPU kernels take blocks of 16 .. 256.
_MAX_BLOCK = 256
_MIN_BLOCK = 16
#: The checkpoint weights of BitLinear projections: those of the decoder layers.
_PROJECTION = re.compile(r"\.layers\.\d+\..*_proj\.weight$")
#: transformers' clamp of the mean |W| (WeightQuant) before its inverse is taken.
_MIN_MEAN = np.float32(1e-5)


@dataclasses.dataclass(frozen=True)
class BitNetScheme:
    """What config.json's bitnet `quantization_config` says, checked."""

    linear_class: str
    mode: str
    bits: int = 4
    """The integers the bundle holds (MatMulNBits 4-bit; the values are ternary)."""

    @property
    def online(self) -> bool:
        """Whether the weights are float master weights ternarized as they are read."""
        return self.linear_class == "autobitlinear" and self.mode == "online"

    def describe(self) -> str:
        return f"BitNet b1.58 ternary ({self.linear_class}, {self.mode})"

    def stored_tensors(
        self,
        parameters: Mapping[str, ir.Value],
        checkpoint: CheckpointReader,
        checkpoint_name: CheckpointName,
    ) -> tuple[dict[str, PrequantizedTensor], list[str]]:
        """A `PrequantizedTensor` for each projection weight of the decoder layers, and the
        checkpoint tensors read (each weight and its weight_scale)."""
        tensors: dict[str, PrequantizedTensor] = {}
        used: list[str] = []
        for name, value in matrices(parameters):
            source = checkpoint_name(name)
            if not isinstance(source, str) or not _PROJECTION.search(source):
                continue
            k, n = (int(d) for d in value.shape)
            tensors[name], read = self._tensor(checkpoint, source, k, n, value.dtype, name)
            used.extend(read)
        return tensors, used

    def _tensor(
        self,
        checkpoint: CheckpointReader,
        stored: str,
        k: int,
        n: int,
        dtype: ir.DataType,
        name: str,
    ) -> tuple[PrequantizedTensor, list[str]]:
        scale_name = f"{stored}_scale"
        read = [stored] if self.online else [stored, scale_name]
        if not self.online and scale_name not in checkpoint:
            raise WeightsError(f"{checkpoint.folder}: {stored} has no {scale_name}")
        shape = checkpoint.shape(stored)
        packed = checkpoint.dtype(stored) == "U8"
        expected = (n // _PER_BYTE, k) if packed else (n, k)
        if shape != expected or (packed and n % _PER_BYTE):
            raise WeightsError(
                f"{checkpoint.folder}: {stored} has shape {list(shape)} ({checkpoint.dtype(stored)}); "
                f"the architecture in config.json needs {list(expected)}"
            )
        if packed and self.online:
            raise WeightsError(
                f"{checkpoint.folder}: {stored} is packed uint8; accepted with quantization_mode "
                "'online': float master weights"
            )
        block = _block_size(k, stored)

        def read_blocks() -> StoredBlocks:
            values, scale = self._ternary(checkpoint, stored, packed)
            return StoredBlocks(
                values=(values + _ZERO).astype(np.uint8),
                scales=np.full((n, k // block), scale, dtype=np.float32),
                zeros=np.full((n, k // block), _ZERO, dtype=np.uint8),
            )

        tensor = PrequantizedTensor(
            read_blocks,
            k=k,
            n=n,
            bits=self.bits,
            block_size=block,
            zero_form="implicit",
            scheme="BitNet ternary",
            dtype=dtype,
            name=name,
            sources=tuple(read),
        )
        return tensor, read

    def _ternary(
        self, checkpoint: CheckpointReader, stored: str, packed: bool
    ) -> tuple[np.ndarray, np.float32]:
        """[N, K] int8 values in {-1, 0, 1} and the scale of the weight's values."""
        if self.online:
            return ternarized(checkpoint.read(stored).astype(np.float32))
        raw = checkpoint.read(stored)
        values = unpack_ternary(raw) if packed else raw.astype(np.float32)
        if not packed and not np.isin(values, (-1.0, 0.0, 1.0)).all():
            raise WeightsError(
                f"{checkpoint.folder}: {stored} holds values other than -1, 0 and 1; accepted "
                "with quantization_mode 'offline': packed uint8 or ternary weights"
            )
        stored_scale = checkpoint.read(f"{stored}_scale").astype(np.float32).reshape(-1)
        if stored_scale.size != 1 or not np.isfinite(stored_scale[0]) or stored_scale[0] == 0:
            raise WeightsError(
                f"{checkpoint.folder}: {stored}_scale is {stored_scale.tolist()}; accepted: one "
                "finite, non-zero scale per weight"
            )
        weight_scale = np.float32(stored_scale[0])
        scale = np.float32(1) / weight_scale if self.linear_class == "bitlinear" else weight_scale
        return values.astype(np.int8), scale


def unpack_ternary(packed: np.ndarray) -> np.ndarray:
    """transformers' `unpack_weights`: uint8 [R, K] → int8 [4 R, K] in {-1, 0, 1}, output row
    ``i * R + r`` from bits ``2 i`` of packed row r."""
    packed = np.asarray(packed, dtype=np.uint8)
    shifts = np.arange(_PER_BYTE, dtype=np.uint8)[:, None, None] * 2
    fields = (packed[None] >> shifts) & np.uint8(3)
    return fields.reshape(-1, packed.shape[-1]).astype(np.int8) - 1


def ternarized(weight: np.ndarray) -> tuple[np.ndarray, np.float32]:
    """transformers' WeightQuant in float32: the values clamp(round(W * s), -1, 1) and their
    scale 1 / s, with s = 1 / max(mean(|W|), 1e-5)."""
    mean = np.float32(np.abs(weight).mean(dtype=np.float32))
    inverse = np.float32(1) / max(mean, _MIN_MEAN)
    values = np.clip(np.round(weight * inverse), -1, 1).astype(np.int8)
    return values, np.float32(1) / inverse


def read_bitnet_config(raw: Mapping[str, Any]) -> BitNetScheme | None:
    """The scheme of a bitnet `quantization_config`; None when config.json has another or
    none. Raises ConfigError for values transformers would not build."""
    found = bitnet_quantization(raw)
    return None if found is None else BitNetScheme(*found)


def _block_size(k: int, name: str) -> int:
    """The largest power of two of 16 .. _MAX_BLOCK that divides K."""
    block = _MAX_BLOCK
    while block >= _MIN_BLOCK and k % block:
        block //= 2
    if block < _MIN_BLOCK:
        raise WeightsError(
            f"{name}: {k} input features; accepted: a multiple of {_MIN_BLOCK} "
            "(MatMulNBits' blocks)"
        )
    return block
