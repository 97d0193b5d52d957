"""BitNet b1.58's BitLinear inputs: the sub-norm before o_proj and down_proj, and the int8
per-token quantize-dequantize of every projection's input (transformers' ActQuant).

Math preserved (float32, as ActQuant computes whatever the model dtype):
    s = 127 / max(max(|x|, last axis), 1e-5);  x' = clamp(round(x * s), -128, 127) / s
Round is ONNX's half-to-even, as torch.round; the weight side is the stored ternary integers
and their scale (checkpoint/prequantized/bitnet.py), so the projection of x' equals
transformers' to float rounding.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import Linear, in_float32
from mobius_genai.components.norms import make_norm
from mobius_genai.config import ArchitectureConfig
from mobius_genai.ep.context import get_build_dtype

#: The projections whose input is normalized first (attn_sub_norm, ffn_sub_norm).
SUB_NORMED = ("o_proj", "down_proj")
#: The int8 range and transformers' floor of the absmax.
_QMIN, _QMAX, _MIN_ABSMAX = -128.0, 127.0, 1e-5


def int8_quant_dequant(op, x: ir.Value) -> ir.Value:
    """x rounded to int8 per token (absmax over the last axis) and scaled back."""
    dtype = get_build_dtype()
    x32 = in_float32(op, x)
    absmax = op.ReduceMax(op.Abs(x32), op.Constant(value_ints=[-1]), keepdims=1)
    floor = op.Constant(value_float=_MIN_ABSMAX)
    scale = op.Div(op.Constant(value_float=_QMAX), op.Max(absmax, floor))
    rounded = op.Round(op.Mul(x32, scale))
    q = op.Clip(rounded, op.Constant(value_float=_QMIN), op.Constant(value_float=_QMAX))
    out = op.Div(q, scale)
    return out if dtype == ir.DataType.FLOAT else op.Cast(out, to=dtype)


class BitLinearInput(nn.Module):
    """What a BitLinear does to its input before the matmul: its sub-norm, if any, then the
    int8 quantize-dequantize, if the checkpoint's quantization_config asks for it."""

    def __init__(self, sub_norm: nn.Module | None, int8: bool) -> None:
        super().__init__()
        self.sub_norm = sub_norm
        self.int8 = int8

    def forward(self, op, x: ir.Value) -> ir.Value:
        if self.sub_norm is not None:
            x = self.sub_norm(op, x)
        return int8_quant_dequant(op, x) if self.int8 else x


def add_bitlinear_inputs(layer: nn.Module, config: ArchitectureConfig) -> None:
    """Give each projection of a decoder layer its BitLinear input (config.bitlinear)."""
    settings = config.bitlinear
    if settings is None:
        return
    projections = [(n, s) for n, s in layer.named_modules() if isinstance(s, Linear)]
    for name, sub in projections:
        norm = None
        if name.rsplit(".", 1)[-1] in SUB_NORMED:
            norm = make_norm(config.norm_type, sub.in_features, config.norm_eps)
        if norm is not None or settings.int8_activations:
            sub.pre = BitLinearInput(norm, settings.int8_activations)
