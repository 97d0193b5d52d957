"""FP8 checkpoints (transformers' FineGrainedFP8: DeepSeek-V3/R1, Qwen3-*-FP8, ...):
block-wise float8 weights, dequantized as they are read.

config.json says `quantization_config: {"quant_method": "fp8", "fmt": "e4m3",
"activation_scheme": "dynamic", "weight_block_size": [R, C]}`. Each quantized Linear weight
`X.weight` [..., rows, columns] is stored F8_E4M3 beside a float `X.weight_scale_inv`
[..., ceil(rows / R), ceil(columns / C)] (a fused tensor `X` beside `X_scale_inv`), and

    w[i, j] = float(q[i, j]) * scale_inv[i // R, j // C]

the last block of a row or column being ragged where R or C does not divide the size.
Everything else (modules_to_not_convert, embeddings, lm_head, norms, routers) is stored as
float and read as it is. compressed-tensors' float-quantized checkpoints store the same values
as `X.weight_scale` per block, output channel or tensor (`compressed_tensors.py`).

`Fp8Checkpoint` presents each quantized weight as a float32 tensor and dequantizes only the
part a read asks for, so every reader above (row blocks, one expert, a column window) streams
it as it streams a float checkpoint, and every precision (int4 included, whose search then
quantizes the dequantized values) works unchanged.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import onnx_ir as ir

from mobius_genai.checkpoint.prequantized.tensor import PrequantizedTensor
from mobius_genai.checkpoint.reader import CheckpointName, CheckpointReader
from mobius_genai.errors import ConfigError, WeightsError

__all__ = ["Fp8Checkpoint", "Fp8Scheme", "block_sizes", "read_fp8_config"]

METHOD = "fp8"
#: The stored dtype of a quantized weight (config.json's fmt "e4m3").
WEIGHT_DTYPE = "F8_E4M3"
#: The dtypes a scale may be stored as (scale_fmt "float": F32 or a 16-bit float; "ue8m0").
SCALE_DTYPES = ("F32", "BF16", "F16", "F8_E8M0")
#: What a dequantized weight is read as.
READ_DTYPE = "F32"
#: The float32 value of each E4M3 byte: a lookup is exact and about twice as fast as the cast.
_E4M3_VALUES = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
_WHERE = "config.json: quantization_config"


@dataclasses.dataclass(frozen=True)
class Fp8Scheme:
    """What config.json's FP8 `quantization_config` says, checked."""

    block: tuple[int | None, int | None]
    """[rows, columns] of the weights that share one scale; None: the whole axis (one scale
    per output channel: (1, None); per tensor: (None, None))."""
    scale_suffix: str = "_scale_inv"
    """FP8 tensor X's scales are X + this (X.weight_scale_inv; compressed-tensors' "_scale")."""
    words: str = "weight_block_size"
    """Where config.json says the block, for errors."""

    def resolved(self, shape: tuple[int, ...]) -> tuple[int, int]:
        """The block of a weight of `shape` [..., rows, columns]."""
        rows, columns = self.block
        return (rows or shape[-2] or 1, columns or shape[-1] or 1)

    def scale_shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """The scales' shape of a weight of `shape`: a ragged last block has its scale too."""
        rows, columns = self.resolved(shape)
        return (*shape[:-2], math.ceil(shape[-2] / rows), math.ceil(shape[-1] / columns))


def read_fp8_config(raw: Mapping[str, Any]) -> Fp8Scheme | None:
    """The FP8 scheme config.json `raw` names; None unless its quant_method is "fp8".

    Raises ConfigError naming the key for what is not read exactly: another fmt, static
    activation scales, per-tensor scales, FP4 experts.
    """
    qc = raw.get("quantization_config")
    if not isinstance(qc, Mapping) or str(qc.get("quant_method", "")).lower() != METHOD:
        return None
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise ConfigError(f"{_WHERE}.fmt is {fmt!r} (fp8); accepted: 'e4m3'")
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise ConfigError(
            f"{_WHERE}.activation_scheme is {scheme!r} (fp8); accepted: 'dynamic' (static "
            "activation scales are not read)"
        )
    experts = qc.get("expert_dtype", "fp8")
    if experts != "fp8":
        raise ConfigError(f"{_WHERE}.expert_dtype is {experts!r} (fp8); accepted: 'fp8'")
    block = block_sizes(qc.get("weight_block_size"))
    if block is None:
        raise ConfigError(
            f"{_WHERE}.weight_block_size is {qc.get('weight_block_size')!r} (fp8); accepted: "
            "two positive integers such as [128, 128] (per-tensor scales are not read)"
        )
    return Fp8Scheme(block=block)


def block_sizes(value: Any) -> tuple[int, int] | None:
    """`value` as a block's [rows, columns]: two positive integers, else None."""
    if not isinstance(value, list | tuple) or len(value) != 2:
        return None
    if not all(isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in value):
        return None
    return (value[0], value[1])


class Fp8Checkpoint:
    """A `CheckpointReader` over another (the safetensors `Checkpoint`) whose FP8 weights read
    as float32, dequantized block-wise; their scale tensors are part of them and not listed.

    The layout is checked from the headers when it is made: every F8_E4M3 tensor has its
    scales, of the shape its size and the block give, and every scale tensor its weight.
    """

    def __init__(self, inner: CheckpointReader, scheme: Fp8Scheme) -> None:
        self.inner = inner
        self.scheme = scheme
        self.folder: Path = inner.folder
        self.mxfp4_experts = inner.mxfp4_experts
        self._scales = self._check_layout()
        """FP8 weight → its scale tensor."""

    def _check_layout(self) -> dict[str, str]:
        inner = self.inner
        scales = {
            name: self._check_weight(name) for name in inner if inner.dtype(name) == WEIGHT_DTYPE
        }
        suffix = self.scheme.scale_suffix
        for name in inner:
            if name.endswith(suffix) and name not in scales.values():
                raise WeightsError(
                    f"{inner.folder}: tensor {name!r} scales no {WEIGHT_DTYPE} weight; accepted: "
                    f"scales beside the weight they scale, stored as {WEIGHT_DTYPE} (fmt e4m3)"
                )
        return scales

    def _check_weight(self, name: str) -> str:
        """The scale tensor of FP8 tensor `name`, checked from the headers."""
        inner, folder = self.inner, self.inner.folder
        shape = inner.shape(name)
        if len(shape) < 2:
            raise WeightsError(
                f"{folder}: tensor {name!r} of shape {list(shape)} is stored as "
                f"{WEIGHT_DTYPE}; accepted: FP8 matrices (a Linear weight, stacked experts)"
            )
        scale = name + self.scheme.scale_suffix  # X.weight_scale_inv, a fused X's X_scale_inv
        if scale not in inner:
            raise WeightsError(
                f"{folder}: tensor {name!r} is stored as {WEIGHT_DTYPE} without its scales "
                f"{scale!r}; accepted: each FP8 weight beside its scale tensor"
            )
        expected = self.scheme.scale_shape(shape)
        if _squeezed(inner.shape(scale)) != _squeezed(expected):
            raise WeightsError(
                f"{folder}: tensor {scale!r} has shape {list(inner.shape(scale))}; weight "
                f"{name!r} {list(shape)} in blocks of {list(self.scheme.resolved(shape))} "
                f"({self.scheme.words}) needs {list(expected)}"
            )
        if inner.dtype(scale) not in SCALE_DTYPES:
            raise WeightsError(
                f"{folder}: tensor {scale!r} is stored as {inner.dtype(scale)}; accepted: "
                f"{', '.join(SCALE_DTYPES)} (FP8 scales)"
            )
        return scale

    def __contains__(self, name: object) -> bool:
        return name in self.inner and name not in self._scales.values()

    def __iter__(self) -> Iterator[str]:
        hidden = set(self._scales.values())
        return (name for name in self.inner if name not in hidden)

    def __len__(self) -> int:
        return len(self.inner) - len(self._scales)

    def files(self) -> list[Path]:
        return self.inner.files()

    def read(self, name: str, index: tuple[slice, ...] | None = None) -> np.ndarray:
        """Tensor `name` (or the part `index` of it); an FP8 weight as float32, only the
        scale blocks the part touches read."""
        scale = self._scales.get(name)
        if scale is None:
            return self.inner.read(name, index)
        shape = self.inner.shape(name)
        spans = _spans(index, shape)
        block = self.scheme.resolved(shape)
        values = _E4M3_VALUES[self.inner.read(name, index).view(np.uint8)]
        scales = self._scales_of(scale, _scale_index(spans, block), self.scheme.scale_shape(shape))
        return _dequantize(values, spans, block, scales)

    def _scales_of(
        self, scale: str, index: tuple[slice, ...], shape: tuple[int, ...]
    ) -> np.ndarray:
        """The part `index` of the scales of `shape`, as float32: stored in that shape, or with
        axes of one more or fewer (a per-tensor [1], a per-channel [rows]), read whole."""
        if self.inner.shape(scale) == shape:
            return self.inner.read(scale, index).astype(np.float32)
        return self.inner.read(scale).reshape(shape)[index].astype(np.float32)

    def dtype(self, name: str) -> str:
        return READ_DTYPE if name in self._scales else self.inner.dtype(name)

    def kind(self, name: str) -> str:
        return self.inner.kind(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return self.inner.shape(name)

    def describe(self) -> str | None:
        """None: FP8 weights are read as float, nothing is kept as stored integers."""
        return None

    def stored_bits(self) -> frozenset[int]:
        return frozenset()

    def stored_integers(
        self, parameters: Mapping[str, ir.Value], checkpoint_name: CheckpointName
    ) -> tuple[dict[str, PrequantizedTensor], list[str]]:
        return {}, []


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(size for size in shape if size != 1)


def _spans(index: tuple[slice, ...] | None, shape: tuple[int, ...]) -> list[tuple[int, int]]:
    """[start, stop) along each axis of `shape` that `index` (slices, step 1) selects."""
    index = index or ()
    spans = []
    for axis, size in enumerate(shape):
        part = index[axis] if axis < len(index) else slice(None)
        start, stop, step = part.indices(size)
        if step != 1:
            raise ValueError(f"FP8 weights are read in runs of step 1, not {part}")
        spans.append((start, max(start, stop)))
    return spans


def _scale_index(spans: list[tuple[int, int]], block: tuple[int, int]) -> tuple[slice, ...]:
    """The scale blocks the part `spans` of a weight in blocks of `block` touches."""
    (row_start, row_stop), (column_start, column_stop) = spans[-2:]
    rows, columns = block
    return (
        *(slice(*span) for span in spans[:-2]),
        slice(row_start // rows, -(-row_stop // rows)),
        slice(column_start // columns, -(-column_stop // columns)),
    )


def _dequantize(
    values: np.ndarray, spans: list[tuple[int, int]], block: tuple[int, int], scales: np.ndarray
) -> np.ndarray:
    """`values` (float32, the part `spans` of a weight) times `scales` (the blocks
    `_scale_index` names), in place: the scales are repeated over rows, and each column block
    multiplied by its column of them."""
    (row_start, row_stop), (column_start, column_stop) = spans[-2:]
    rows, columns = block
    first_row, first_column = row_start // rows, column_start // columns
    offset = row_start - first_row * rows
    scales = np.repeat(scales, rows, axis=-2)[..., offset : offset + row_stop - row_start, :]
    for j in range(scales.shape[-1]):
        low = max(column_start, (first_column + j) * columns) - column_start
        high = min(column_stop, (first_column + j + 1) * columns) - column_start
        values[..., low:high] *= scales[..., j : j + 1]
    return values
