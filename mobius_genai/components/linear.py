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


class Linear(nn.Module):
    """y = x @ W.T + b, with W kept as the checkpoint's [out, in] read transposed at load."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = parameter([in_features, out_features], transposed=True)
        self.bias = parameter([out_features]) if bias else None

    def forward(self, op, x: ir.Value) -> ir.Value:
        y = op.MatMul(x, self.weight)
        if self.bias is not None:
            y = op.Add(y, self.bias)
        return y
