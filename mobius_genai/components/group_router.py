"""Group-limited routing (config/moe_routing.py) as the router input of one MoE node.

com.microsoft::MoE weights its top-k experts by the softmax of its router input. The router
here picks each token's experts in standard ops (scores, corrected choice scores, kept groups,
top-k; the router logits capped first where the routing says) and hands the node log(weight) at the picked experts and -inf elsewhere: the node's
softmax then gives weight / sum(weights) at exactly the picked experts. The MoE output times
`scaling` (renormalized routing; times sum / (sum + epsilon) with an epsilon) or
`scaling * sum(weights)` (raw weights) is the routed sum.
"""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import in_float32, parameter
from mobius_genai.config.moe import MoeConfig
from mobius_genai.config.moe_routing import GROUP_SCORES
from mobius_genai.ep.context import get_build_dtype


def _constant(op, value: float, like: ir.Value) -> ir.Value:
    return op.CastLike(op.Constant(value=ir.tensor(np.array(value, dtype=np.float32))), like)


def _sigmoid(op, logits: ir.Value) -> ir.Value:
    """1 / (1 + exp(-x)): onnxruntime's CPU Sigmoid is off by 1e-3 of the value at -11 and
    17% at -15, which the weights of experts with small scores (divided by their sum) keep."""
    return op.Reciprocal(op.Add(_constant(op, 1.0, logits), op.Exp(op.Neg(logits))))


class GroupRouter(nn.Module):
    """DeepSeek's MoE gate: `weight` [experts, hidden] and, for V3 (GLM-4 MoE, MiniMax-M2,
    ERNIE-4.5-MoE), `e_score_correction_bias`. Where the family keeps them in float32 in a
    float16 or bfloat16 graph (models/families/float32.py), the router computes in float32
    from the hidden state cast in, as transformers' DeepseekV3TopkRouter does; routing with
    `float32_scores` (MiniMax-M2) computes from the logits on in float32; a float32 bias on
    float16 scores (LFM2-MoE's) corrects them in float32. Outputs return to the graph's dtype."""

    def __init__(self, moe: MoeConfig, hidden: int) -> None:
        super().__init__()
        routing = moe.group_routing
        if routing is None:
            raise ValueError("GroupRouter needs a MoE config with group_routing set")
        self.routing = routing
        self.num_experts, self.top_k, self.normalize = (
            moe.num_experts,
            moe.top_k,
            moe.normalize_top_k,
        )
        self.weight = parameter([hidden, moe.num_experts], transposed=True)
        shape = [1, moe.num_experts] if routing.correction_bias_row else [moe.num_experts]
        self.e_score_correction_bias = parameter(shape) if routing.correction_bias else None

    def forward(self, op, x: ir.Value) -> tuple[ir.Value, ir.Value | None]:
        """(router input [tokens, experts] for a renormalizing MoE node, the factor its output
        is multiplied by: [batch, seq, 1] like `x`, a scalar, or None when it is 1)."""
        routing = self.routing
        graph_dtype = get_build_dtype()
        hidden = x if self.weight.dtype == graph_dtype else op.Cast(x, to=self.weight.dtype)
        logits = op.Reshape(
            op.MatMul(hidden, self.weight), op.Constant(value_ints=[-1, self.num_experts])
        )
        logits = in_float32(op, logits, self.weight.dtype) if routing.float32_scores else logits
        if routing.logit_softcap:
            cap = _constant(op, routing.logit_softcap, logits)
            logits = op.Mul(op.Tanh(op.Div(logits, cap)), cap)
        scores = (
            _sigmoid(op, logits) if routing.scoring == "sigmoid" else op.Softmax(logits, axis=-1)
        )
        choice = self._choice(op, logits if routing.choice_by_logits else scores)
        if routing.top_groups < routing.groups:
            choice = self._kept_groups(op, choice)
        top_k = op.Constant(value_ints=[self.top_k])
        _, picked = op.TopK(choice, top_k, axis=-1, _outputs=2)
        weights = op.GatherElements(scores, picked, axis=-1)
        none = op.Expand(_constant(op, -np.inf, scores), op.Shape(scores))
        router = op.ScatterElements(none, picked, op.Log(weights), axis=-1)
        factor = None
        if not self.normalize or routing.epsilon:
            total = op.ReduceSum(weights, op.Constant(value_ints=[-1]), keepdims=1)
            if self.normalize:  # weight / (sum + epsilon): the node's weight / sum, rescaled
                total = op.Div(total, op.Add(total, _constant(op, routing.epsilon, total)))
            rows = op.Concat(op.Shape(x, end=-1), op.Constant(value_ints=[1]), axis=0)
            factor = op.Reshape(total, rows)
        if routing.scaling != 1.0:
            scaling = _constant(op, routing.scaling, scores)
            factor = scaling if factor is None else op.Mul(factor, scaling)
        if self._scores_dtype() != graph_dtype:  # the MoE node's input, the factor: as `x`
            router = op.Cast(router, to=graph_dtype)
            factor = None if factor is None else op.Cast(factor, to=graph_dtype)
        return router, factor

    def _scores_dtype(self) -> ir.DataType:
        """The scores' dtype: the weight's (float32 where the family keeps it so), or float32
        where the routing computes them so."""
        return ir.DataType.FLOAT if self.routing.float32_scores else self.weight.dtype

    def _choice(self, op, scores: ir.Value) -> ir.Value:
        """The scores (Kolibri-1: the logits) experts are chosen by: corrected by
        e_score_correction_bias (V3). A
        float32 bias and float16 scores (or the reverse) add in float32, as torch promotes."""
        bias = self.e_score_correction_bias
        if bias is None:
            return scores
        if bias.dtype == self._scores_dtype():
            return op.Add(scores, bias)
        return op.Add(
            in_float32(op, scores, self._scores_dtype()), in_float32(op, bias, bias.dtype)
        )

    def _kept_groups(self, op, choice: ir.Value) -> ir.Value:
        """`choice` with -inf outside each token's `top_groups` best groups."""
        routing = self.routing
        per_group = self.num_experts // routing.groups
        grouped = op.Reshape(choice, op.Constant(value_ints=[-1, routing.groups, per_group]))
        best = GROUP_SCORES[routing.group_score]
        if best == 1:
            group_scores = op.ReduceMax(grouped, op.Constant(value_ints=[-1]), keepdims=0)
        else:
            tops, _ = op.TopK(grouped, op.Constant(value_ints=[best]), axis=-1, _outputs=2)
            group_scores = op.ReduceSum(tops, op.Constant(value_ints=[-1]), keepdims=0)
        _, kept = op.TopK(
            group_scores, op.Constant(value_ints=[routing.top_groups]), axis=-1, _outputs=2
        )
        zeros = op.Expand(_constant(op, 0.0, choice), op.Shape(group_scores))
        ones = op.Expand(_constant(op, 1.0, choice), op.Shape(kept))
        mask = op.ScatterElements(zeros, kept, ones, axis=-1)  # [tokens, groups]
        mask = op.Expand(
            op.Unsqueeze(mask, op.Constant(value_ints=[-1])),
            op.Constant(value_ints=[1, 1, per_group]),
        )
        mask = op.Reshape(mask, op.Constant(value_ints=[-1, self.num_experts]))
        return op.Where(
            op.Greater(mask, _constant(op, 0.5, choice)), choice, _constant(op, -np.inf, choice)
        )
