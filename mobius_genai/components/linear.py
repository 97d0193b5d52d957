"""Linear projection stored as [in, out] so the graph runs a plain MatMul."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.checkpoint.reader import TRANSPOSED_FROM_CHECKPOINT
from mobius_genai.ep.context import get_build_dtype


def parameter(shape: list[int], *, transposed: bool = False) -> nn.Parameter:
    """A parameter in the build dtype; `transposed` marks [in, out] copies of [out, in] weights."""
    param = nn.Parameter(shape, dtype=get_build_dtype())
    if transposed:
        param.meta[TRANSPOSED_FROM_CHECKPOINT] = True
    return param


def in_float32(op, x: ir.Value, dtype: ir.DataType | None = None) -> ir.Value:
    """`x` in float32 (itself when float32 already): what recurrent blocks compute their decays
    and states in, whatever the model dtype. `dtype` is `x`'s, by default the build's (a
    parameter its family keeps in float32 is float32 in any build)."""
    dtype = get_build_dtype() if dtype is None else dtype
    return x if dtype == ir.DataType.FLOAT else op.Cast(x, to=ir.DataType.FLOAT)


class Linear(nn.Module):
    """y = x @ W.T + b (+ a LoRA branch), with W kept as the checkpoint's [out, in] read transposed at load."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = parameter([in_features, out_features], transposed=True)
        self.bias = parameter([out_features]) if bias else None
        self.lora: nn.Module | None = None
        """A LoRA branch (components/lora.py) whose output is added, when the build asks."""
        self.pre: nn.Module | None = None
        """A module the input goes through first (BitNet's: components/bitlinear.py)."""

    def forward(self, op, x: ir.Value) -> ir.Value:
        if self.pre is not None:
            x = self.pre(op, x)
        y = op.MatMul(x, self.weight)
        if self.bias is not None:
            y = op.Add(y, self.bias)
        if self.lora is not None:
            y = op.Add(y, self.lora(op, x))
        return y
