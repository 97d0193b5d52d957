"""GPTQ and AWQ checkpoints: config.json's `quantization_config` and the int32-packed tensors.

Each quantized Linear `X.weight` is stored as `X.qweight`, `X.qzeros`, `X.scales` (and GPTQ's
`X.g_idx`); both formats dequantize as ``w = (q - zero) * scale`` per group of `group_size`
input features.

- GPTQ (AutoGPTQ / GPTQModel): `qweight` int32 [K * bits / 32, N], input feature 32/bits * r + j
  of column n in bits ``bits * j`` of ``qweight[r, n]``; `qzeros` int32 [G, N * bits / 32] packed
  the same way along N and stored as zero - 1 unless `checkpoint_format` (or `format`) is
  `gptq_v2`; `scales` [G, N]; `g_idx` int32 [K]: the group of each input feature (act-order,
  `desc_act`, makes it a permutation of the groups).
- AWQ GEMM (AutoAWQ): `qweight` int32 [K, N / 8] and `qzeros` int32 [G, N / 8], nibble i of a
  word holding column ``8 * c + [0, 2, 4, 6, 1, 3, 5, 7][i]``; zeros stored as they are.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx_ir as ir

from mobius_genai.checkpoint.prequantized.tensor import (
    PrequantizedTensor,
    StoredBlocks,
    matrices,
)
from mobius_genai.checkpoint.reader import CheckpointName, CheckpointReader, TensorSource
from mobius_genai.errors import ConfigError, WeightsError

__all__ = ["QuantizationScheme", "prequantized_tensors", "read_quantization_config"]

#: Block sizes MatMulNBits takes: a power of two of at least 16.
_MIN_BLOCK = 16
#: AutoAWQ's order of the eight columns packed in one int32 (nibble i holds column _AWQ_ORDER[i]).
_AWQ_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])
#: quant_method → the bit widths we take, and the packed-layout versions accepted.
_METHODS: dict[str, tuple[tuple[int, ...], tuple[str, ...]]] = {
    "gptq": ((4, 8), ("gptq", "gptq_v2")),
    "awq": ((4,), ("gemm",)),
}


@dataclasses.dataclass(frozen=True)
class QuantizationScheme:
    """What config.json's `quantization_config` says, checked."""

    method: str
    """'gptq' or 'awq'."""
    bits: int
    group_size: int
    """-1: one group over all input features."""
    version: str
    """Packed layout: 'gptq' (zero - 1 stored), 'gptq_v2' or 'gemm' (AWQ)."""
    desc_act: bool = False
    symmetric: bool = False

    def describe(self) -> str:
        group = "per column" if self.group_size == -1 else f"group size {self.group_size}"
        words = [f"{self.method.upper()} {self.bits}-bit", group]
        if self.desc_act:
            words.append("act-order")
        if self.method == "gptq":
            words.append("symmetric" if self.symmetric else "asymmetric")
            words.append(f"format {self.version}")
        return ", ".join(words)

    def stored_tensors(
        self,
        parameters: Mapping[str, ir.Value],
        checkpoint: CheckpointReader,
        checkpoint_name: CheckpointName,
    ) -> tuple[dict[str, PrequantizedTensor], list[str]]:
        """The weights stored quantized (`prequantized_tensors`)."""
        return prequantized_tensors(parameters, checkpoint, self, checkpoint_name)


def read_quantization_config(raw: Mapping[str, Any]) -> QuantizationScheme | None:
    """The scheme of config.json's `quantization_config`, None when there is none.

    Raises ConfigError naming the key and the value for anything we do not read exactly.
    """
    qc = raw.get("quantization_config")
    if qc is None:
        return None
    where = "config.json: quantization_config"
    if not isinstance(qc, Mapping):
        raise ConfigError(f"{where} is {qc!r}; accepted: an object")
    method = str(qc.get("quant_method", "")).lower()
    if method not in _METHODS:
        raise ConfigError(
            f"{where}.quant_method is {qc.get('quant_method')!r}; accepted: "
            f"{', '.join(_METHODS)}, mxfp4 (MoE experts), fp8, compressed-tensors (FP8), bitnet (other pre-quantized formats are not "
            "read)"
        )
    bit_widths, versions = _METHODS[method]
    bits = qc.get("bits", qc.get("w_bit"))
    if bits not in bit_widths:
        raise ConfigError(
            f"{where}.bits is {bits!r} ({method}); accepted: {', '.join(map(str, bit_widths))}"
        )
    group = qc.get("group_size", qc.get("q_group_size"))
    if not isinstance(group, int) or isinstance(group, bool) or (group < 1 and group != -1):
        raise ConfigError(f"{where}.group_size is {group!r}; accepted: a positive integer or -1")
    if method == "gptq":
        version = str(qc.get("checkpoint_format") or qc.get("format") or "gptq").lower()
    else:
        version = str(qc.get("version", "gemm")).lower()
        if qc.get("zero_point") is False:
            raise ConfigError(f"{where}.zero_point is false; accepted: AWQ with zero points")
    if version not in versions:
        raise ConfigError(
            f"{where}: packed layout {version!r} ({method}); accepted: {', '.join(versions)}"
        )
    return QuantizationScheme(
        method=method,
        bits=bits,
        group_size=group,
        version=version,
        desc_act=bool(qc.get("desc_act", False)),
        symmetric=bool(qc.get("sym", method == "gptq")),
    )


def prequantized_tensors(
    parameters: Mapping[str, ir.Value],
    checkpoint: CheckpointReader,
    scheme: QuantizationScheme,
    checkpoint_name: CheckpointName,
) -> tuple[dict[str, PrequantizedTensor], list[str]]:
    """A `PrequantizedTensor` for each Linear weight of `parameters` stored quantized.

    A parameter whose checkpoint tensor `X.weight` is absent while `X.qweight` is present is
    quantized; the others are read as float (`parameters.parameter_tensors`). Returns the tensors by parameter
    name and the checkpoint tensors read (qweight, qzeros, scales, g_idx of each).
    """
    tensors: dict[str, PrequantizedTensor] = {}
    used: list[str] = []
    for name, value in matrices(parameters):
        source = checkpoint_name(name)
        names = (source,) if isinstance(source, str) else source.names
        stored = next((n for n in names if n in checkpoint), None)
        bases = (n[: -len("weight")] for n in names if n.endswith(".weight"))
        base = next((b for b in bases if f"{b}qweight" in checkpoint), None)
        if stored is not None or base is None:
            continue
        if isinstance(source, TensorSource) and (source.parts or source.in_out):
            raise WeightsError(
                f"{checkpoint.folder}: {base}qweight is a quantized fused or [in, out] tensor; "
                f"accepted: {scheme.method} checkpoints whose quantized Linear weights map "
                "one-to-one to the graph's"
            )
        k, n = (int(d) for d in value.shape)
        tensors[name], read = _tensor(checkpoint, scheme, base, k, n, value.dtype, name)
        used.extend(read)
    return tensors, used


def _tensor(
    checkpoint: CheckpointReader,
    scheme: QuantizationScheme,
    base: str,
    k: int,
    n: int,
    dtype: ir.DataType,
    name: str,
) -> tuple[PrequantizedTensor, list[str]]:
    names = {part: f"{base}{part}" for part in ("qweight", "qzeros", "scales", "g_idx")}
    for part in ("qzeros", "scales"):
        if names[part] not in checkpoint:
            raise WeightsError(f"{checkpoint.folder}: {names['qweight']} has no {names[part]}")
    group = k if scheme.group_size == -1 else scheme.group_size
    if k % group or group < _MIN_BLOCK or group & (group - 1):
        raise ConfigError(
            f"config.json: quantization_config.group_size {scheme.group_size} gives groups of "
            f"{group} input features for {names['qweight']} (K={k}); accepted: a power of two "
            f"of at least {_MIN_BLOCK} that divides K (MatMulNBits' block sizes)"
        )
    per_word = 32 // scheme.bits
    expected = {
        "qweight": (k // per_word, n) if scheme.method == "gptq" else (k, n // 8),
        "qzeros": (k // group, n // per_word),
        "scales": (k // group, n),
    }
    for part, shape in expected.items():
        if checkpoint.shape(names[part]) != shape:
            raise WeightsError(
                f"{checkpoint.folder}: {names[part]} has shape "
                f"{list(checkpoint.shape(names[part]))}, the architecture in config.json "
                f"({scheme.describe()}) needs {list(shape)}"
            )
    perm = None
    read = [names[p] for p in ("qweight", "qzeros", "scales")]
    if scheme.method == "gptq" and names["g_idx"] in checkpoint:
        read.append(names["g_idx"])
        perm = _act_order(checkpoint.read(names["g_idx"]), group, names["g_idx"], k)

    def read_blocks() -> StoredBlocks:
        return _read_blocks(checkpoint, scheme, names, perm)

    zeros = _unpack_zeros(checkpoint, scheme, names["qzeros"])
    top = 1 << scheme.bits
    if np.all(zeros == top // 2):
        zero_form = "implicit"
    elif zeros.max() < top:
        zero_form = "uint8"
    elif scheme.bits == 4:
        zero_form = "float"  # GPTQ v1's zero 0 stored as -1 reads back as 16
    else:
        raise WeightsError(
            f"{checkpoint.folder}: {names['qzeros']} holds zero point {int(zeros.max())}, "
            f"beyond {scheme.bits}-bit MatMulNBits' uint8 zero points; accepted: 0 .. {top - 1}"
        )
    tensor = PrequantizedTensor(
        read_blocks,
        k=k,
        n=n,
        bits=scheme.bits,
        block_size=group,
        zero_form=zero_form,
        scheme=f"{scheme.method.upper()} {scheme.bits}-bit",
        dtype=dtype,
        name=name,
        perm=perm,
        sources=tuple(read),
    )
    return tensor, read


def _act_order(g_idx: np.ndarray, group: int, name: str, k: int) -> np.ndarray | None:
    """The input order that makes each group a run (None when it is the natural order)."""
    g_idx = np.asarray(g_idx).astype(np.int64).reshape(-1)
    if g_idx.shape != (k,):
        raise WeightsError(f"{name} has {g_idx.size} entries; accepted: one per input ({k})")
    if np.array_equal(g_idx, np.arange(k) // group):
        return None
    counts = np.bincount(g_idx, minlength=k // group) if g_idx.min() >= 0 else None
    if counts is None or counts.size != k // group or np.any(counts != group):
        raise WeightsError(
            f"{name}: groups are not {k // group} groups of {group} input features each; "
            "accepted: act-order g_idx (a permutation of equal groups)"
        )
    return np.argsort(g_idx, kind="stable")


def _unpack(words: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """int32 words → their 32/bits fields (low bits first), spread along `axis`."""
    words = np.asarray(words).view(np.uint32)
    shifts = np.arange(0, 32, bits, dtype=np.uint32)
    fields = np.expand_dims(words, axis + 1) >> np.expand_dims(shifts, 1 - axis)
    fields = fields & np.uint32((1 << bits) - 1)
    shape = list(words.shape)
    shape[axis] *= 32 // bits
    return fields.reshape(shape).astype(np.uint8)


def _unpack_columns(
    checkpoint: CheckpointReader, scheme: QuantizationScheme, name: str
) -> np.ndarray:
    """A tensor packed along its columns (AWQ qweight, any qzeros), unpacked: [rows, N]."""
    fields = _unpack(checkpoint.read(name), scheme.bits, axis=1)
    if scheme.method == "awq":  # field i of each word of 8 holds column _AWQ_ORDER[i]
        rows, n = fields.shape
        ordered = np.empty_like(fields)
        ordered.reshape(rows, n // 8, 8)[:, :, _AWQ_ORDER] = fields.reshape(rows, n // 8, 8)
        fields = ordered
    return fields


def _unpack_zeros(
    checkpoint: CheckpointReader, scheme: QuantizationScheme, name: str
) -> np.ndarray:
    """[G, N] zero points as the format's formula uses them (int16)."""
    zeros = _unpack_columns(checkpoint, scheme, name).astype(np.int16)
    return zeros + 1 if scheme.version == "gptq" else zeros


def _read_blocks(
    checkpoint: CheckpointReader,
    scheme: QuantizationScheme,
    names: Mapping[str, str],
    perm: np.ndarray | None,
) -> StoredBlocks:
    if scheme.method == "gptq":
        values = _unpack(checkpoint.read(names["qweight"]), scheme.bits, axis=0)
    else:
        values = _unpack_columns(checkpoint, scheme, names["qweight"])
    values = values.T  # [N, K]
    if perm is not None:
        values = values[:, perm]
    zeros = _unpack_zeros(checkpoint, scheme, names["qzeros"])
    return StoredBlocks(
        values=np.ascontiguousarray(values),
        scales=np.ascontiguousarray(checkpoint.read(names["scales"]).T),
        zeros=np.ascontiguousarray(zeros.T),
    )
