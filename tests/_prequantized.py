"""Test-only writers of GPTQ and AWQ checkpoints, from the formats' definitions.

`write_quantized_pair` quantizes every decoder Linear weight of a float checkpoint itself (min/max
per group), packs the integers as the format stores them, and writes two checkpoints: the packed
one (with config.json's quantization_config) and a float one whose weights are the format's
dequantization ``(q - zero) * scale`` of the same integers, for transformers to run.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclasses.dataclass(frozen=True)
class Format:
    method: str  # "gptq" or "awq"
    bits: int = 4
    group_size: int = 32
    symmetric: bool = False
    act_order: bool = False
    version: str = "gptq"  # gptq (zero - 1 stored), gptq_v2, or gemm (AWQ)

    def config(self) -> dict:
        if self.method == "awq":
            return {
                "quant_method": "awq",
                "bits": self.bits,
                "group_size": self.group_size,
                "zero_point": True,
                "version": self.version,
            }
        return {
            "quant_method": "gptq",
            "bits": self.bits,
            "group_size": self.group_size,
            "desc_act": self.act_order,
            "sym": self.symmetric,
            "checkpoint_format": self.version,
        }


@dataclasses.dataclass(frozen=True)
class Quantized:
    """One weight's integers as the format's formula reads them, [N, K] natural order."""

    q: np.ndarray  # [N, K] uint8
    zeros: np.ndarray  # [G, N] as read back (GPTQ v1: stored + 1)
    scales: np.ndarray  # [G, N] float16
    g_idx: np.ndarray  # [K] group of each input feature

    def dequantized(self) -> np.ndarray:
        """[N, K] float32: (q - zero[g_idx[k]]) * scale[g_idx[k]]."""
        zeros = self.zeros[self.g_idx].T.astype(np.float32)
        scales = self.scales[self.g_idx].T.astype(np.float32)
        return (self.q.astype(np.float32) - zeros) * scales


def _pack_along(values: np.ndarray, bits: int, axis: int, order=None) -> np.ndarray:
    """uint values → int32 words of 32/bits fields along `axis`, field j in bits bits*j."""
    per = 32 // bits
    values = np.moveaxis(values.astype(np.uint32), axis, -1)
    groups = values.reshape(*values.shape[:-1], -1, per)
    if order is not None:
        groups = groups[..., list(order)]  # field i holds column order[i]
    shifts = np.arange(per, dtype=np.uint32) * bits
    words = np.bitwise_or.reduce(groups << shifts, axis=-1).astype(np.uint32)
    return np.ascontiguousarray(np.moveaxis(words, -1, axis)).view(np.int32)


def quantize(weight: np.ndarray, fmt: Format, rng: np.random.Generator) -> Quantized:
    """Min/max quantization of an [N, K] weight per the format's groups."""
    n, k = weight.shape
    top = (1 << fmt.bits) - 1
    groups = k // fmt.group_size
    g_idx = np.arange(k) // fmt.group_size
    if fmt.act_order:
        g_idx = np.empty(k, np.int64)
        g_idx[rng.permutation(k)] = np.arange(k) // fmt.group_size
    q = np.zeros((n, k), np.uint8)
    zeros = np.zeros((groups, n), np.int64)
    scales = np.zeros((groups, n), np.float16)
    for g in range(groups):
        cols = g_idx == g
        block = weight[:, cols]
        if fmt.symmetric:
            xmax = np.abs(block).max(axis=1)
            scale = (2 * xmax / top).astype(np.float16)
            zero = np.full(n, (top + 1) // 2)
        else:
            lo, hi = np.minimum(block.min(axis=1), 0), np.maximum(block.max(axis=1), 0)
            scale = ((hi - lo) / top).astype(np.float16)
            zero = np.clip(np.round(-lo / scale.astype(np.float32)), 0, top).astype(np.int64)
        s = scale.astype(np.float32)[:, None]
        q[:, cols] = np.clip(np.round(block / s) + zero[:, None], 0, top)
        zeros[g], scales[g] = zero, scale
    if fmt.method == "gptq" and fmt.version == "gptq":  # stored zero - 1 reads back + 1
        zeros = ((zeros - 1) & top) + 1
    return Quantized(q, zeros, scales, g_idx)


def packed_tensors(prefix: str, quantized: Quantized, fmt: Format) -> dict[str, np.ndarray]:
    """The tensors the format stores for one Linear `prefix` (without the trailing 'weight')."""
    zeros = quantized.zeros - (1 if fmt.method == "gptq" and fmt.version == "gptq" else 0)
    zeros = zeros & ((1 << fmt.bits) - 1)
    if fmt.method == "awq":
        return {
            f"{prefix}qweight": _pack_along(quantized.q.T, 4, axis=1, order=AWQ_ORDER),
            f"{prefix}qzeros": _pack_along(zeros, 4, axis=1, order=AWQ_ORDER),
            f"{prefix}scales": quantized.scales,
        }
    return {
        f"{prefix}qweight": _pack_along(quantized.q.T, fmt.bits, axis=0),
        f"{prefix}qzeros": _pack_along(zeros, fmt.bits, axis=1),
        f"{prefix}scales": quantized.scales,
        f"{prefix}g_idx": quantized.g_idx.astype(np.int32),
    }


def write_quantized_pair(
    float_ckpt: Path, quantized_dir: Path, reference_dir: Path, fmt: Format, seed: int = 0
) -> dict[str, Quantized]:
    """Write the packed checkpoint and its dequantized float twin; returns the integers."""
    rng = np.random.default_rng(seed)
    tensors = load_file(str(float_ckpt / "model.safetensors"))
    packed, reference, integers = {}, {}, {}
    for name, array in tensors.items():
        prefix = name[: -len("weight")]
        if name.endswith(".weight") and any(f".{linear}." in name for linear in LINEARS):
            weight = array.astype(np.float32)
            if not integers:  # one block with no negative weight: zero point 0
                weight[0, : fmt.group_size] = np.abs(weight[0, : fmt.group_size])
            quantized = quantize(weight, fmt, rng)
            integers[name] = quantized
            packed.update(packed_tensors(prefix, quantized, fmt))
            reference[name] = quantized.dequantized()
        else:
            packed[name] = reference[name] = array
    for folder, content in ((quantized_dir, packed), (reference_dir, reference)):
        shutil.copytree(float_ckpt, folder, ignore=shutil.ignore_patterns("*.safetensors"))
        save_file(content, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((quantized_dir / "config.json").read_text())
    config["quantization_config"] = fmt.config()
    (quantized_dir / "config.json").write_text(json.dumps(config, indent=2))
    return integers
