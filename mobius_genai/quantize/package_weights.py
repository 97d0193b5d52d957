"""The weights of one bundle, as its target's int4 plan says: `quantize_package`.

The one entry the packager calls between building a graph and saving it: int4 asked for
(`quantize_planned`), a pre-quantized source's integers kept in MatMulNBits or dequantized
(`apply_prequantized`), and the floats such a source leaves re-quantized when int4 is asked
(`requantize_floats`). Nothing here asks the EP what it runs: `Target.int4_plan` says.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from mobius_genai.quantize.int4 import Int4Report, quantize_planned
from mobius_genai.quantize.plan import Int4Plan
from mobius_genai.quantize.requantize import requantize_floats
from mobius_genai.quantize.stored_weights import PrequantizedReport, apply_prequantized
from mobius_genai.target import Target, precision_of

if TYPE_CHECKING:
    from mobius_genai.build import ModelPackage

__all__ = ["INT4_ROLES", "PackageWeights", "quantize_package", "why_float"]

#: The graph roles (`optimize.gates.ROLES`) whose weights int4 quantizes: a text decoder's, a
#: speech model's encoder and decoder (onnxruntime-genai's builder quantizes Whisper's both),
#: and a vision-language embedding graph's token table (a lookup by token ids, as a text
#: decoder's). A vision tower stays in the model's dtype.
INT4_ROLES = frozenset({"decoder", "encoder", "cross_decoder", "embedding"})


@dataclasses.dataclass(frozen=True)
class PackageWeights:
    """What `quantize_package` did to a package's weights, for the manifest and the card."""

    precision: str
    """The precision the bundle holds, the one its folder's name, manifest and card say: the
    target's, resolved with what the source stores."""
    int4: Int4Report | None = None
    """The int4 asked for (None: none asked, or nothing a pre-quantized source left to it)."""
    prequantized: PrequantizedReport | None = None
    """A pre-quantized source's integers, kept or dequantized (None: a float source)."""


def quantize_package(built: ModelPackage, target: Target) -> PackageWeights:
    """Int4 as the target asks; a pre-quantized source keeps its own integers instead.

    With `Target.dequantize_stored` (a float precision asked, or an EP without MatMulNBits)
    its integers are dequantized to the model's dtype too. What such a source leaves in float
    is dequantized to the model's dtype, unless the target asks for int4 explicitly (the
    plan's options): then its matrices are quantized with them (`requantize_floats`; a table
    the source kept in float stays float). One accuracy level for all: the plan's.
    """
    model, plan = built[built.decoder_key], target.int4_plan
    if built.prequantized is None:
        int4 = None if plan.options is None else _quantize_graphs(built, plan)
        return PackageWeights(target.precision, int4)
    precision = precision_of(target.dtype)
    stored = apply_prequantized(
        model,
        built.prequantized,
        plan,
        keep=not target.dequantize_stored,
        float_kinds=built.float_kinds,
        precision=precision,
        why_float=why_float(target),
    )
    if plan.options is None:
        return PackageWeights(target.precision, prequantized=stored)
    int4, moved = requantize_floats(model, plan)
    return PackageWeights(target.precision, int4, stored.with_requantized(moved, precision))


def _quantize_graphs(built: ModelPackage, plan: Int4Plan) -> Int4Report:
    """Every graph whose role takes int4 (`INT4_ROLES`), the decoder first: one report, the
    decoder's choices (embedding, calibration) with every graph's weights."""
    keys = [built.decoder_key] + [
        key for key, role in built.roles.items() if role in INT4_ROLES and key != built.decoder_key
    ]
    first, *others = (quantize_planned(built[key], plan) for key in keys)
    tables = {report.embedding for report in (first, *others)} - {"none"}
    return dataclasses.replace(
        first,
        embedding=tables.pop() if len(tables) == 1 else ("mixed" if tables else "none"),
        weights=first.weights + tuple(w for report in others for w in report.weights),
        float_weights=first.float_weights + tuple(w for r in others for w in r.float_weights),
        declined=first.declined + tuple(d for report in others for d in report.declined),
        kept_float32=first.kept_float32 + tuple(w for r in others for w in r.kept_float32),
    )


def why_float(target: Target) -> str:
    """Why a pre-quantized source's integers become float weights (`dequantize_stored`)."""
    if not target.int4_plan.matmul_nbits:
        return f"{target.ep.name} has no MatMulNBits"
    return f"precision {target.precision} asked"
