"""Int4 for the matrices a pre-quantized source leaves in float, when the user asks for int4.

`apply_prequantized` keeps the stored integers MatMulNBits holds exactly and reads the rest as
float (a GGUF's Q2_K / Q3_K / IQ4 / F16 / BF16 / F32 matrices, a GPTQ or AWQ checkpoint's float
layers). With an explicit int4 request (`Int4Plan.options`), `requantize_floats` hands these
to `quantize_planned` with the user's options (block size, symmetry, quality recipe) at the
bundle's one accuracy level:

- linear projections: always;
- the lm_head and embedding tables: when the source stored them quantized (it meant them to be
  small), or when the recipe keeps their role in 8 bits (`balanced`); a table the source kept
  in float (a GPTQ / AWQ lm_head, a GGUF's F16 output) otherwise stays float: the int4 recipes
  would round it to 4 bits, a change to the model the source chose not to make.

MoE experts are left as they are. The weights kept exactly are MatMulNBits already, so
`quantize_int4` never sees them.
"""

from __future__ import annotations

import onnx_ir as ir

from mobius_genai.checkpoint.prequantized.tensor import PrequantizedTensor
from mobius_genai.checkpoint.weights import CheckpointTensor, ConcatTensor
from mobius_genai.quantize.int4 import Int4Report, quantize_planned
from mobius_genai.quantize.plan import Int4Plan
from mobius_genai.quantize.stored_weights import FLOAT_KINDS
from mobius_genai.quantize.weight_uses import WeightGroup, find_weights

__all__ = ["requantize_floats"]


def requantize_floats(
    model: ir.Model, plan: Int4Plan
) -> tuple[Int4Report | None, list[tuple[str, str]]]:
    """Quantize (in place) the float weights of `model` an int4 request covers (see the module
    docstring) as `plan` says. Returns the int4 report (None when there was nothing to
    quantize) and, once per source tensor quantized, its stored kind and what it became
    (for `PrequantizedReport.with_requantized`)."""
    options = plan.options
    assert options is not None, "requantize_floats is for an int4 request"
    groups, _ = find_weights(model.graph)
    stored = {group.source.name: _stored(group) for group in groups}
    wide = options.recipe.wide_roles

    def select(group: WeightGroup) -> bool:
        if not stored[group.source.name]:
            return False  # not a checkpoint's tensor (the block mins of float zero points)
        quantized = {kind for _, kind in stored[group.source.name]} - FLOAT_KINDS
        return group.role == "linear" or group.role in wide or bool(quantized)

    report = quantize_planned(model, plan, select=select)
    moved: dict[str, tuple[str, str]] = {}
    for weight in report.weights:
        outcome = (
            f"re-quantized to int{weight.bits} (block {weight.block_size}, "
            f"recipe {options.quality})"
        )
        for source, kind in stored[weight.name]:
            moved.setdefault(source, (kind, outcome))
    return (report if report.weights else None), list(moved.values())


def _stored(group: WeightGroup) -> list[tuple[str, str]]:
    """(source tensor, stored kind) of each checkpoint tensor the weight reads."""
    return [pair for value in group.source.values for pair in _sources(value.const_value)]


def _sources(tensor: object) -> list[tuple[str, str]]:
    if isinstance(tensor, PrequantizedTensor):
        return [(source, tensor.scheme) for source in tensor.sources or (tensor.name or "",)]
    if isinstance(tensor, ConcatTensor):
        return [pair for part in tensor.parts for pair in _sources(part)]
    if isinstance(tensor, CheckpointTensor):
        return [(tensor.source, tensor.checkpoint.kind(tensor.source))]
    return []
