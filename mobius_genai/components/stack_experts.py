"""Gemma 4's MoE block beside the MLP (config/per_layer_stack.py's `experts`).

    logits = proj(rmsnorm(h) * scale / √hidden)          (router: its norm has no weight)
    w = top-k of softmax(logits), renormalized, each times per_expert_scale[e]
    out = Σ w_e · down_e(Gelu_tanh(gate_e(x)) * up_e(x))   over x = the normed residual

One com.microsoft::MoE node with GeGLU experts (its "geglu" overload, components/tier1.py):
the per-expert scale is folded into each expert's down projection (a constant per expert
factors out of its output), so the node's own softmax, top-k and renormalization route exactly.
No onnxruntime 1.32 CPU kernel takes GeGLU, so the pipeline expands the body (ep/kernels.py's
"MoE.geglu"); with int4 it leaves the node to quantize/qmoe.py, which stores the experts in 4
bits (the per-expert scale folded into fc2's block scales) in a QMoE body that it expands.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import Linear, parameter
from mobius_genai.components.moe import Experts
from mobius_genai.components.norms import RMSNorm
from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.config.moe import MoeConfig


class StackRouter(nn.Module):
    """The router's logits [tokens, experts] (module names as transformers')."""

    def __init__(self, hidden: int, experts: int, eps: float) -> None:
        super().__init__()
        self.hidden = hidden
        self.experts = experts
        self.norm = RMSNorm(hidden, eps, affine=False)
        self.scale = parameter([hidden])
        self.proj = Linear(hidden, experts)
        self.per_expert_scale = parameter([experts])

    def forward(self, op, x: ir.Value) -> ir.Value:
        root = op.CastLike(op.Constant(value_float=self.hidden**-0.5), x)
        scaled = op.Mul(op.Mul(self.norm(op, x), self.scale), root)
        return op.Reshape(self.proj(op, scaled), op.Constant(value_ints=[-1, self.experts]))

    def expert_scale(self, op) -> ir.Value:
        """per_expert_scale as [experts, 1, 1], a factor of each expert's down projection."""
        return op.Reshape(self.per_expert_scale, op.Constant(value_ints=[-1, 1, 1]))


def geglu_experts(
    op, x: ir.Value, router: StackRouter, experts: Experts, moe: MoeConfig, residual: ir.Value
) -> ir.Value:
    """The experts' weighted sum for `x`, routed by the router of `residual` (see above)."""
    fc1, _, fc2, _ = experts(op)
    out = op.MoE(
        x,
        router(op, residual),
        fc1,
        None,
        op.Mul(fc2, router.expert_scale(op)),
        k=moe.top_k,
        activation_type="geglu",
        swiglu_fusion=1,
        normalize_routing_weights=1,
        _domain=MS_DOMAIN,
    )
    out.producer().overload = "geglu"
    out.type, out.shape = x.type, x.shape  # what onnxruntime's schema infers
    return out
