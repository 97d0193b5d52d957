"""INT4 weight quantization of a built (and optimized) decoder graph: `quantize_int4`.

Every linear projection and the lm_head become `com.microsoft::MatMulNBits` (or, for an EP
without that kernel, e.g. portable ONNX, standard DequantizeLinear + MatMul); embedding tables become
`com.microsoft::GatherBlockQuantized` where the EP has that kernel for the model dtype, sharing
one quantized copy with a tied lm_head; MoE experts become `com.microsoft::QMoE` where the EP
has it (qmoe.py), else they stay float, except GeGLU experts (Gemma 4's): 4-bit on every EP,
in a QMoE body expanded here (components/moe_bodies.py). Which of these an EP takes is the int4
plan's answer (`plan.py`), made once for the target. Only the graph changes here: the quantized tensors are
lazy and computed one weight at a time while the model is saved.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from typing import Any

import numpy as np
import onnx_ir as ir
import onnx_ir.passes.common as common

from mobius_genai.components.tier1 import expand_after_int4, register_functions
from mobius_genai.ep.capabilities import EpCapabilities
from mobius_genai.errors import ConfigError
from mobius_genai.quantize.calibrate import (
    Calibration,
    activation_importance,
    calibration_refusal,
    within_context,
)
from mobius_genai.quantize.dequantize_linear import DequantizeLinearPass
from mobius_genai.quantize.format_split import packed_format, split_mixed_formats
from mobius_genai.quantize.matmul_nbits import MatMulNBitsPass
from mobius_genai.quantize.plan import (
    BLOCK_SIZES,
    MATMUL_NBITS,
    Int4Options,
    Int4Plan,
    int4_plan,
)
from mobius_genai.quantize.qmoe import QMoEPass
from mobius_genai.quantize.recipes import (
    DEFAULT_QUALITY,
    QUALITIES,
    WeightFormat,
    layer_index,
)
from mobius_genai.quantize.streaming import OneWeightCache
from mobius_genai.quantize.weight_uses import WeightGroup, find_weights

__all__ = [
    "DEFAULT_QUALITY",
    "QUALITIES",
    "Int4Report",
    "QuantizedWeight",
    "quantize_int4",
    "quantize_planned",
]

_SUMMARY_KEYS = (
    "bits",
    "format",
    "quality",
    "rounding",
    "block_size",
    "symmetric",
    "accuracy_level",
    "embedding",
    "op_counts",
    "quantized_weights",
    "weights_8bit",
    "weights_float32",
    "calibration",
    "calibration_skipped",
)


@dataclasses.dataclass(frozen=True)
class QuantizedWeight:
    """One float weight and what it became."""

    name: str
    role: str
    """'linear', 'lm_head', 'embedding' or 'experts' (a MoE layer's stacked experts: QMoE, or
    for GeGLU experts the op of their expanded body that reads the codes, GatherBlockQuantized
    or Gather; k and n are each expert's)."""
    k: int
    n: int
    ops: tuple[str, ...]
    """The ops that now read its quantized copy (one copy, shared by all of them)."""
    bits: int = 4
    """4, or 8 for a weight the quality recipe keeps wide."""
    block_size: int = 32


@dataclasses.dataclass(frozen=True)
class Int4Report:
    """What `quantize_int4` did, for the manifest and the model card (see `to_dict`)."""

    options: Int4Options
    """The options applied (accuracy level resolved)."""
    format: str
    """'MatMulNBits' (com.microsoft ops) or 'DequantizeLinear' (standard ONNX)."""
    weights: tuple[QuantizedWeight, ...]
    float_weights: tuple[str, ...]
    """Weights left in float (e.g. an embedding the EP cannot look up in int4)."""
    embedding: str
    """'int4-shared' (one int4 table for lookup and lm_head), 'int4' (own int4 table), the same
    with int8 for a table kept in 8 bits, 'float' (lookup stays float), 'none' (no lookup of a
    weight) or 'mixed' (several tables)."""
    declined: tuple[tuple[str, str], ...] = ()
    """(node, reason) for weight-like uses left alone."""
    calibration: Calibration | None = None
    """The random token ids whose activations weighted the search (None: unweighted)."""
    calibration_skipped: str | None = None
    """Why a recipe that calibrates searched unweighted here (None when it did not)."""
    kept_float32: tuple[str, ...] = ()
    """Matrices left float because their family keeps them in float32 (a MoE router's:
    models/families/float32.py), whose choice 4-bit rounding would change."""

    @property
    def op_counts(self) -> dict[str, int]:
        """Op type → number of nodes reading int4 weights."""
        return dict(Counter(op for weight in self.weights for op in weight.ops))

    def summary(self) -> dict[str, Any]:
        """The choices and counts, without the per-tensor list (for the manifest and card)."""
        full = self.to_dict()
        return {key: full[key] for key in _SUMMARY_KEYS if key in full}

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary: the choices, the counts and every quantized tensor."""
        calibration: dict[str, Any] = (
            {}
            if self.calibration is None
            else {"calibration": dataclasses.asdict(self.calibration)}
        )
        if self.calibration_skipped is not None:
            calibration["calibration_skipped"] = self.calibration_skipped
        return calibration | {
            "bits": 4,
            "format": self.format,
            "quality": self.options.quality,
            "rounding": "search" if self.options.recipe.search else "nearest",
            "block_size": self.options.block_size,
            "symmetric": self.options.symmetric,
            # DequantizeLinear + MatMul has no accuracy level in the graph: a bundle's
            # genai_config gives onnxruntime's fusion of it the plan's (bundle/genai_config.py)
            "accuracy_level": self.options.accuracy_level if self.format == MATMUL_NBITS else None,
            "embedding": self.embedding,
            "op_counts": self.op_counts,
            "quantized_weights": len(self.weights),
            "weights_8bit": {
                weight.name: weight.block_size for weight in self.weights if weight.bits == 8
            },
            "weights_float32": list(self.kept_float32),
            "weights": [
                dataclasses.asdict(weight) | {"ops": list(weight.ops)} for weight in self.weights
            ],
            "float_weights": list(self.float_weights),
            "declined": [{"node": node, "reason": reason} for node, reason in self.declined],
        }


def quantize_int4(
    model: ir.Model,
    options: Int4Options,
    caps: EpCapabilities,
    *,
    select: Callable[[WeightGroup], bool] | None = None,
    calibration: Calibration | None = None,
) -> Int4Report:
    """Quantize the weights of `model` (in place) to INT4 for `caps`' EP, with `options`
    resolved for it and the weights' dtype (`int4_plan`); a package follows its target's plan
    instead (`quantize_planned`)."""
    groups, _ = find_weights(model.graph)
    plan = int4_plan(caps, _model_dtype(groups), options)
    return quantize_planned(model, plan, select=select, calibration=calibration)


def quantize_planned(
    model: ir.Model,
    plan: Int4Plan,
    *,
    select: Callable[[WeightGroup], bool] | None = None,
    calibration: Calibration | None = None,
) -> Int4Report:
    """Quantize the weights of `model` (in place) to INT4 as `plan` says (`plan.options`: the
    int4 asked for, resolved).

    Run it after the optimization pipeline. Nothing is read from the checkpoint here: the int4
    tensors are lazy and computed, one weight at a time, when the model is saved (the saving
    progress bar shows that work). Raises ConfigError, before changing anything, when the
    block size does not divide a weight's K. `select`: only the weights it accepts, no experts.
    A recipe that calibrates runs the float graph over `calibration`'s random token ids first
    (`calibrate.py`; default `Calibration()`, at most the graph's context length) and weights
    the search of the 4-bit weights by the activations measured; where the graph cannot be
    calibrated (a vision-language decoder, MoE experts: `calibration_refusal`), the search is
    unweighted and the report says why. Weights their family keeps in float32 stay float
    (`WeightGroup.kept_float32`; the report's `kept_float32`).
    """
    options = plan.options
    if options is None:
        raise ConfigError("no int4 was asked; accepted: a plan made with int4 options")
    groups, declined = find_weights(model.graph)
    groups = [group for group in groups if select is None or select(group)]
    kept = tuple(group.source.name for group in groups if group.kept_float32)
    groups = [group for group in groups if not group.kept_float32]
    _check_block_size(
        [g for g in groups if g.matmuls or (plan.gather and g.gathers)], options.block_size
    )
    cache = OneWeightCache()
    symmetric, search = bool(options.symmetric), options.recipe.search
    refusal = calibration_refusal(model.graph) if options.recipe.calibrate else None
    if options.recipe.calibrate and refusal is None:
        calibration = within_context(model, calibration or Calibration())
    else:
        calibration = None
    if plan.matmul_nbits:
        groups, formats = _nbits_formats(model.graph, groups, options, split=select is None)
        quantizer: MatMulNBitsPass | DequantizeLinearPass = MatMulNBitsPass(
            groups,
            formats=formats,
            symmetric=symmetric,
            search=search,
            importance=_importance(model, groups, calibration),
            accuracy_level=plan.accuracy_level,
            gather=plan.gather,
            cache=cache,
        )
    else:
        formats = [WeightFormat(4, options.block_size)] * len(groups)
        quantizer = DequantizeLinearPass(
            groups,
            block_size=options.block_size,
            symmetric=symmetric,
            search=search,
            cache=cache,
            importance=_importance(model, groups, calibration),
        )
    experts, qmoe = _quantize_experts(model, plan, quantize=select is None)
    if quantizer(model).modified or qmoe:
        # A replaced FusedMatMul or MoE may leave its function overload unused.
        common.RemoveUnusedFunctionsPass()(model)
    weights, float_weights = _outcomes(groups, formats, quantizer.results)
    weights += [
        QuantizedWeight(name, "experts", k=k, n=n, ops=(op,), block_size=options.block_size)
        for name, _, n, k, op in experts.quantized
    ]
    return Int4Report(
        options=options,
        format=plan.matmul,
        weights=tuple(weights),
        float_weights=tuple(float_weights),
        embedding=_embedding_state(groups, formats, quantizer.results),
        declined=tuple((item.node, item.reason) for item in declined) + tuple(experts.declined),
        calibration=calibration,
        calibration_skipped=refusal,
        kept_float32=kept,
    )


def _quantize_experts(model: ir.Model, plan: Int4Plan, quantize: bool) -> tuple[QMoEPass, bool]:
    """The MoE experts as QMoE (`quantize`), then the MoE nodes the pipeline left for int4 and
    the QMoE bodies made of them expanded (components/tier1.py's `expanded_after_int4`); the
    pass and whether it changed the graph."""
    options = plan.options
    assert options is not None and options.block_size is not None  # resolved by the plan
    experts = QMoEPass(
        options.block_size,
        bool(options.symmetric),
        options.recipe.search,
        plan.accuracy_level,
        kernel=plan.qmoe,
        gather=plan.gather,
        per_expert=plan.per_expert,
    )
    modified = quantize and experts(model).modified
    register_functions(model)
    expand_after_int4(model)
    return experts, modified


def _outcomes(
    groups: list[WeightGroup], formats: list[WeightFormat], results: list[tuple[str, ...]]
) -> tuple[list[QuantizedWeight], list[str]]:
    """The weights quantized (and their formats) and those whose lookup stays float."""
    weights = []
    float_weights = []
    for group, weight_format, ops in zip(groups, formats, results, strict=True):
        if ops:
            weights.append(
                QuantizedWeight(
                    name=group.source.name,
                    role=group.role,
                    k=group.source.k,
                    n=group.source.n,
                    ops=ops,
                    bits=weight_format.bits,
                    block_size=weight_format.block_size,
                )
            )
        if group.gathers and "GatherBlockQuantized" not in ops:
            float_weights.append(group.source.name)
    return weights, float_weights


def _nbits_formats(
    graph: ir.Graph, groups: list[WeightGroup], options: Int4Options, split: bool
) -> tuple[list[WeightGroup], list[WeightFormat]]:
    """The groups (with `split`, packed weights whose parts the recipe stores differently
    split: `format_split`; not for a re-quantization, whose report names its weights as
    found) and each one's format from the recipe's rules; the layer count (for
    rules on some layers) comes from the weights' names."""
    indices = [layer_index(group.source.name) for group in groups]
    layer_count = max((index + 1 for index in indices if index is not None), default=0)

    def format_of(name: str, group: WeightGroup) -> WeightFormat:
        return options.recipe.weight_format(
            name, group.role, group.source.k, options.block_size, layer_count
        )

    if split:
        groups = split_mixed_formats(graph, groups, format_of)
    return groups, [packed_format(group, format_of) for group in groups]


def _importance(
    model: ir.Model, groups: list[WeightGroup], calibration: Calibration | None
) -> list[np.ndarray | None] | None:
    """Each group's activation importance ([K], from its MatMuls' A inputs) when calibrating."""
    if calibration is None:
        return None
    inputs = [[use.node.inputs[0] for use in group.matmuls] for group in groups]
    return activation_importance(model, inputs, calibration)  # type: ignore[arg-type]


def _model_dtype(groups: list[WeightGroup]) -> ir.DataType | None:
    """The float dtype of the weights (None when there are none)."""
    return groups[0].source.dtype if groups else None


def _embedding_state(
    groups: list[WeightGroup], formats: list[WeightFormat], results: list[tuple[str, ...]]
) -> str:
    states = []
    for group, weight_format, ops in zip(groups, formats, results, strict=True):
        if not group.gathers:
            continue
        width = f"int{weight_format.bits}"
        if "GatherBlockQuantized" not in ops:
            states.append("float")
        elif "MatMulNBits" in ops:
            states.append(f"{width}-shared")
        else:
            states.append(width)
    return states[0] if len(set(states)) == 1 else ("none" if not states else "mixed")


def _check_block_size(groups: list[WeightGroup], block_size: int) -> None:
    """Every quantized weight's K must be a multiple of the block size."""
    for group in groups:
        k = group.source.k
        if k % block_size:
            ks = {g.source.k for g in groups}
            fitting = [size for size in BLOCK_SIZES if all(dim % size == 0 for dim in ks)]
            accepted = (
                ", ".join(map(str, fitting))
                if fitting
                else "none of " + ", ".join(map(str, BLOCK_SIZES))
            )
            raise ConfigError(
                f"int4 block size {block_size} does not divide the input dimension K={k} of "
                f"weight {group.source.name!r} ({group.role}, [K, N] = [{k}, {group.source.n}]); "
                f"block sizes that divide every weight of this model: {accepted}"
            )
