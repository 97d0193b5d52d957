"""Normalizations as the standard ONNX ops (opset 23+), which compute in float32."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import parameter


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = parameter([size])

    def forward(self, op, x: ir.Value) -> ir.Value:
        return op.RMSNormalization(x, self.weight, axis=-1, epsilon=self.eps)


class LayerNorm(nn.Module):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis."""

    def __init__(self, size: int, eps: float, bias: bool = True) -> None:
        super().__init__()
        self.eps = eps
        self.weight = parameter([size])
        self.bias = parameter([size]) if bias else None

    def forward(self, op, x: ir.Value) -> ir.Value:
        return op.LayerNormalization(x, self.weight, self.bias, axis=-1, epsilon=self.eps)


def make_norm(norm_type: str, size: int, eps: float) -> RMSNorm | LayerNorm:
    """The normalization a config names: "rms" (RMSNorm) or "layer" (LayerNorm with bias)."""
    if norm_type == "rms":
        return RMSNorm(size, eps)
    if norm_type == "layer":
        return LayerNorm(size, eps)
    raise ValueError(f"unsupported norm type {norm_type!r}")
