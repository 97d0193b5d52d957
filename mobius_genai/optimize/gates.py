"""Which rule groups run for which target: the FUSIONS and LOWERINGS tables and their gates.

Every decision reads the EP's kernels (ep/kernels.py: `missing`) and `EpCapabilities` (and the
model dtype and role), never an EP name; each gate sits in its table next to the rule group it
admits, and says why it keeps a group out (the trace prints the reason).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import onnx_ir as ir
from onnxscript.rewriter import pattern

from mobius_genai.components.tier1 import TIER1_OPS
from mobius_genai.ep.capabilities import EpCapabilities
from mobius_genai.ep.kernels import KERNELS, missing
from mobius_genai.optimize.rules import (
    bias_gelu,
    eliminate_shape,
    fused_matmul,
    fused_moe,
    gelu,
    gqa,
    gqa_image_blocks,
    gqa_sinks,
    pack_qkv,
    pack_qkv_split,
    packed_mha,
    prune_lm_head,
    separate_rope,
    simplified_norm,
    skip_layer_norm,
    skip_norm,
    unpack_qkv,
)

__all__ = ["FUSIONS", "LOWERINGS", "ROLES", "Gate", "GateInput", "RuleGroup", "gqa_gate"]

#: "cross_decoder": a decoder that attends to an encoder's output (Whisper's), which
#: onnxruntime-genai feeds no attention_mask: no GroupQueryAttention, no pruned logits.
ROLES = ("decoder", "vision", "embedding", "encoder", "cross_decoder")


@dataclasses.dataclass(frozen=True)
class GateInput:
    """What a model is optimized for, as the gates read it: the EP's capabilities, the model
    dtype and its role."""

    caps: EpCapabilities
    dtype: ir.DataType
    role: str
    prune_lm_head: bool = False
    """Compute logits for the last position only (bundles for onnxruntime-genai)."""


Gate = Callable[[GateInput], "str | None"]
"""None when a rule group runs for the target, else the reason it does not."""


@dataclasses.dataclass(frozen=True)
class RuleGroup:
    """One row of a stage table: a rule module and the capability gate that admits it."""

    name: str
    make: Callable[[], pattern.RewriteRuleSet | ir.passes.InPlacePass]
    """The rule module's `rules` (a RewriteRuleSet factory) or its InPlacePass class."""
    gate: Gate
    keeps: str | None = None
    """The com.microsoft op this group keeps for the EP's kernel (components emit it); where the
    gate declines, InlinePass expands its nodes."""


def _always(target: GateInput) -> str | None:
    return None


def gqa_gate(target: GateInput) -> str | None:
    """GQAFusion's gate; the pipeline also warns when it admits a model that gets no GQA."""
    if target.role != "decoder":
        return f"role {target.role!r} (GQA is for decoders)"
    return missing(target.caps, "GroupQueryAttention", target.dtype)


def _gqa_sinks(target: GateInput) -> str | None:
    """GQASinkFusion's gate: GQA's, and a GQA kernel that takes head_sink."""
    return gqa_gate(target) or missing(target.caps, "GroupQueryAttention.head_sink")


def _gqa_image_blocks(target: GateInput) -> str | None:
    """GQAImageBlockFusion's gate: GQA's, a GQA kernel that takes attention_bias and rotates
    (SeparateRoPE keeps no attention_bias), and no graph capture (og's static attention_mask
    would move the bias's query positions)."""
    caps = target.caps
    reason = (
        gqa_gate(target)
        or missing(caps, "GroupQueryAttention.attention_bias")
        or missing(caps, "GroupQueryAttention.do_rotary")
    )
    if reason is None and caps.enable_graph_capture:
        return "enable_graph_capture=True (a static attention_mask gives no total length)"
    return reason


def _pack_qkv(target: GateInput) -> str | None:
    if target.dtype not in target.caps.qkv_pack_dtypes:
        return f"{target.dtype.name} not in qkv_pack_dtypes"
    return None


def _prune_lm_head(target: GateInput) -> str | None:
    if target.role != "decoder":
        return f"role {target.role!r} (logits are a decoder's)"
    if not target.prune_lm_head:
        return "prune_lm_head=False (every position's logits kept)"
    return None


def _kernel(op_type: str) -> Gate:
    """Runs when the EP has a kernel for the com.microsoft op the rule emits (tier1.py), for
    the model's dtype (the EP's and the op schema's)."""

    def gate(target: GateInput) -> str | None:
        reason = missing(target.caps, op_type, target.dtype)
        if reason is not None:
            return reason
        dtypes = TIER1_OPS[op_type].dtypes
        if dtypes is not None and target.dtype not in dtypes:
            return f"{target.dtype.name} not in {op_type}'s types"
        return None

    return gate


def _vision_kernel(op_type: str) -> Gate:
    """`_kernel`, for a vision tower only (the packed attention of its windows)."""
    kernel = _kernel(op_type)

    def gate(target: GateInput) -> str | None:
        reason = kernel(target)
        if reason is None and target.role != "vision":
            return f"role {target.role!r} ({op_type} is for vision towers)"
        return reason

    return gate


def _without(kernel: str) -> Gate:
    """Runs when the EP's entry says it lacks `kernel` (a lowering)."""
    says = KERNELS[kernel].flag or f"kernels[{kernel!r}]"

    def gate(target: GateInput) -> str | None:
        return f"{says}=True" if target.caps.kernel_dtypes(kernel) else None

    return gate


FUSIONS: tuple[RuleGroup, ...] = (
    RuleGroup("GQASinkFusion", gqa_sinks.rules, _gqa_sinks),
    RuleGroup("GQAFusion", gqa.rules, gqa_gate),
    RuleGroup("GQAImageBlockFusion", gqa_image_blocks.rules, _gqa_image_blocks),
    RuleGroup("PackQKV", pack_qkv.rules, _pack_qkv),
    # After PackQKV: the layers whose q/k/v reach GQA through q/k norms (packed, then split).
    RuleGroup("PackQKVSplit", pack_qkv_split.PackQKVSplitPass, _pack_qkv),
    RuleGroup("SkipNorm", skip_norm.rules, _kernel("SkipSimplifiedLayerNormalization")),
    RuleGroup("SkipLayerNorm", skip_layer_norm.rules, _kernel("SkipLayerNormalization")),
    RuleGroup("GeluFusion", gelu.rules, _always),
    RuleGroup("BiasGelu", bias_gelu.rules, _kernel("BiasGelu")),
    RuleGroup("FusedMatMul", fused_matmul.rules, _kernel("FusedMatMul")),
    RuleGroup("MoE", fused_moe.FusedMoEPass, _kernel(fused_moe.OP_TYPE), fused_moe.OP_TYPE),
    RuleGroup(
        "PackedMHA",
        packed_mha.PackedMHAPass,
        _vision_kernel(packed_mha.OP_TYPE),
        packed_mha.OP_TYPE,
    ),
    # Last: it slices the activations entering the fused, row-wise ops after the last attention.
    RuleGroup("PruneLmHead", prune_lm_head.PruneLmHeadPass, _prune_lm_head),
)

LOWERINGS: tuple[RuleGroup, ...] = (
    RuleGroup("UnpackQKV", unpack_qkv.rules, _without("GroupQueryAttention.do_rotary")),
    RuleGroup("SeparateRoPE", separate_rope.rules, _without("GroupQueryAttention.do_rotary")),
    RuleGroup("SimplifiedNorm", simplified_norm.rules, _without("RMSNormalization")),
    RuleGroup("EliminateShape", eliminate_shape.EliminateShapePass, _without("Shape")),
)
