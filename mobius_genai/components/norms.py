"""Normalizations as the standard ONNX ops (opset 23+), which compute in float32."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import parameter
from mobius_genai.ep.context import get_build_dtype


def _unit_scale(size: int) -> nn.Parameter:
    """A constant scale of ones: the op's required weight input for a norm that learns none."""
    dtype = get_build_dtype()
    ones = ir.Tensor(np.ones([size], dtype=dtype.numpy()), name="ones")
    return nn.Parameter([size], dtype=dtype, data=ones)


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis (weight 1 when not `affine`)."""

    def __init__(self, size: int, eps: float, affine: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = parameter([size]) if affine else _unit_scale(size)

    def forward(self, op, x: ir.Value) -> ir.Value:
        return op.RMSNormalization(x, self.weight, axis=-1, epsilon=self.eps)


class LayerNorm(nn.Module):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis.

    Without `affine` the norm learns nothing (olmo's LayerNorm): weight is a constant 1 and
    there is no bias.
    """

    def __init__(self, size: int, eps: float, bias: bool = True, affine: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = parameter([size]) if affine else _unit_scale(size)
        self.bias = parameter([size]) if bias and affine else None

    def forward(self, op, x: ir.Value) -> ir.Value:
        return op.LayerNormalization(x, self.weight, self.bias, axis=-1, epsilon=self.eps)


class _HeadWeight(nn.Module):
    """The norm weight of one head (a module so the name is `norms.{head}.weight`)."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.weight = parameter([size])

    def forward(self, op) -> ir.Value:
        """The weight as one row [1, size]."""
        return op.Unsqueeze(self.weight, op.Constant(value_ints=[0]))


class HeadwiseNorm(nn.Module):
    """Each head normalized over its channels and scaled by its own weight, without bias.

        y[..., h, :] = norm(x[..., h, :]) * norms[h].weight      x: [..., num_heads, head_dim]

    stablelm's per-head q/k LayerNorms (one weight tensor per head, `norms.{h}.weight`) and
    cohere's (`stacked`: one [num_heads, head_dim] tensor `weight`). The graph normalizes all
    heads with one op of unit scale and multiplies by the weights stacked [num_heads, head_dim].
    """

    def __init__(
        self, norm_type: str, num_heads: int, head_dim: int, eps: float, stacked: bool = False
    ) -> None:
        super().__init__()
        self.normalize = make_norm(norm_type, head_dim, eps, affine=False)
        if stacked:
            self.weight = parameter([num_heads, head_dim])
            self.norms = None
        else:
            self.weight = None
            self.norms = nn.ModuleList([_HeadWeight(head_dim) for _ in range(num_heads)])

    def forward(self, op, x: ir.Value) -> ir.Value:
        weights = self.weight
        if weights is None:
            weights = op.Concat(*(head(op) for head in self.norms), axis=0)
        return op.Mul(self.normalize(op, x), weights)


def make_norm(norm_type: str, size: int, eps: float, *, affine: bool = True) -> nn.Module:
    """The normalization a config names: "rms" (RMSNorm), "layer" (LayerNorm with bias),
    "layer_no_bias" (LayerNorm with a weight only), "layer_no_affine" (LayerNorm without
    weight or bias) or "rms_no_affine" (RMSNorm without weight); `affine=False` drops the
    weight and bias of any of them."""
    if norm_type == "rms":
        return RMSNorm(size, eps, affine=affine)
    if norm_type == "rms_no_affine":
        return RMSNorm(size, eps, affine=False)
    if norm_type == "layer":
        return LayerNorm(size, eps, affine=affine)
    if norm_type == "layer_no_bias":
        return LayerNorm(size, eps, bias=False, affine=affine)
    if norm_type == "layer_no_affine":
        return LayerNorm(size, eps, affine=False)
    raise ValueError(f"unsupported norm type {norm_type!r}")
