"""xIELU (arXiv 2411.13010), Apertus's MLP activation, in standard ONNX ops.

    xielu(x) = alpha_p * x^2 + beta * x                          for x > 0
               alpha_n * (expm1(min(x, eps)) - x) + beta * x     otherwise
    alpha_p = softplus(a_p),  alpha_n = beta + softplus(a_n)

a_p and a_n are learned per layer; beta and eps are buffers the checkpoint stores (in its dtype:
bfloat16's -1e-6 is not float32's), so all four are read from it. ONNX has no expm1; exp(m) - 1
differs from it by float32 rounding of 1 (6e-8), which alpha_n keeps that small.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import parameter


class XIELU(nn.Module):
    """The activation with its parameters named as transformers' XIELUActivation."""

    def __init__(self) -> None:
        super().__init__()
        self.alpha_p = parameter([1])
        self.alpha_n = parameter([1])
        self.beta = parameter([])
        self.eps = parameter([])

    def forward(self, op, x: ir.Value) -> ir.Value:
        alpha_p = op.Softplus(self.alpha_p)
        alpha_n = op.Add(self.beta, op.Softplus(self.alpha_n))
        linear = op.Mul(self.beta, x)
        positive = op.Add(op.Mul(alpha_p, op.Mul(x, x)), linear)
        one = op.CastLike(op.Constant(value_float=1.0), x)
        expm1 = op.Sub(op.Exp(op.Min(x, self.eps)), one)
        negative = op.Add(op.Mul(op.Sub(expm1, x), alpha_n), linear)
        zero = op.CastLike(op.Constant(value_float=0.0), x)
        return op.Where(op.Greater(x, zero), positive, negative)
