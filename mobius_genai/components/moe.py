"""The mixture-of-experts block: a router, one com.microsoft::MoE node over the experts, and an
optional shared expert.

The MoE node is a Tier-1 op (components/tier1.py, whose body the pipeline registers as it
starts): onnxruntime runs its fused kernel, other runtimes expand the standard-ONNX body, and
EPs whose capabilities lack `supports_fused_moe` get the body inlined at build time. The expert weights are stacked in the
op's layout: `experts.gate_up_proj` [experts, 2 * intermediate, hidden] with gate and up rows
interleaved (gate of row j at 2j, up at 2j + 1), `experts.down_proj` [experts, hidden,
intermediate] (expert_weights.py reads them from the checkpoint), with biases
`experts.gate_up_proj_bias` [experts, 2 * intermediate] (interleaved alike) and
`experts.down_proj_bias` [experts, hidden] when the family has them (gpt_oss). Non-gated
experts (config/moe.py's EXPERT_FORMS: Nemotron-H's relu2) keep the layout, both rows of a pair
holding the up projection's row, and run as the node's SwiGLU with the form's alpha; their
shared expert is a plain MLP (`up_proj`, `down_proj` as FCMLP's fc1, fc2). A MoE config's
`latent_size` puts the routed experts between `fc1_latent_proj` and `fc2_latent_proj`
(hidden → latent → hidden); the router and the shared expert still read the hidden state.
"""

from __future__ import annotations

import math

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components import scaled_input, sparsemixer
from mobius_genai.components.group_router import GroupRouter
from mobius_genai.components.linear import Linear, parameter
from mobius_genai.components.mlp import FCMLP, GatedMLP
from mobius_genai.components.norms import make_norm
from mobius_genai.components.pnorm_routing import pnorm_factor
from mobius_genai.components.tier1 import MS_DOMAIN
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.moe import EXPERT_FORMS, MoeConfig


class Experts(nn.Module):
    """The stacked expert weights; calling it gives them to the MoE node (fc1, fc2)."""

    def __init__(self, moe: MoeConfig, hidden: int) -> None:
        super().__init__()
        inter = moe.intermediate_size
        self.gate_up_proj = parameter([moe.num_experts, 2 * inter, hidden])
        self.down_proj = parameter([moe.num_experts, hidden, inter])
        biased = moe.expert_bias
        self.gate_up_proj_bias = parameter([moe.num_experts, 2 * inter]) if biased else None
        self.down_proj_bias = parameter([moe.num_experts, hidden]) if biased else None

    def forward(self, op) -> tuple[ir.Value, ...]:
        """The MoE node's fc1 weights, fc1 bias, fc2 weights and fc2 bias (biases may be None)."""
        return self.gate_up_proj, self.gate_up_proj_bias, self.down_proj, self.down_proj_bias


class MoEBlock(nn.Module):
    """out = MoE(x, router(x)) [+ sigmoid(x @ shared_gate) * shared_mlp(x)] (the sum times
    `combined_scale`: Cohere2-MoE's average); with a latent (Nemotron-3 Super), fc2_latent(MoE(fc1_latent(x), router(x))) + shared_mlp(x); with a
    sparsemixer, MoE(x, first pick) + MoE(x, second pick); with DBRX's p-norm, MoE(x, router(x))
    times sum(w) / ||w||_p (components/pnorm_routing.py); with group-limited routing,
    MoE(x, picks) times the router's factor (components/group_router.py); with Llama 4's
    scaled input, one MoE node per pick over the token times its score
    (components/scaled_input.py); with an output bias (JetMoE), MoE(x, router(x)) + bias.
    With `output_norm` (A.X-K1) the sum passes through `post_mlp_layernorm`."""

    def __init__(self, config: ArchitectureConfig) -> None:
        super().__init__()
        moe = config.moe
        if moe is None:
            raise ValueError("MoEBlock needs a config with moe set")
        self.moe = moe
        if moe.group_routing is None:
            self.gate = Linear(config.hidden_size, moe.num_experts, moe.router_bias)
        else:
            self.gate = GroupRouter(moe, config.hidden_size)
        self.experts = Experts(moe, moe.latent_size or config.hidden_size)
        latent, bias = moe.latent_size, config.mlp_bias
        self.fc1_latent_proj = Linear(config.hidden_size, latent, bias) if latent else None
        self.fc2_latent_proj = Linear(latent, config.hidden_size, bias) if latent else None
        self.shared_expert = _shared_expert(moe, config) if moe.shared_expert_size else None
        self.shared_expert_gate = Linear(config.hidden_size, 1) if moe.shared_expert_gate else None
        self.bias = parameter([config.hidden_size]) if moe.output_bias else None
        self.post_mlp_layernorm = (
            make_norm(config.norm_type, config.hidden_size, config.norm_eps)
            if moe.output_norm
            else None
        )

    def forward(self, op, x: ir.Value) -> ir.Value:
        moe = self.moe
        tokens = x if self.fc1_latent_proj is None else self.fc1_latent_proj(op, x)
        if moe.group_routing is not None:
            router, factor = self.gate(op, x)
            out = self._experts(op, tokens, router, moe.top_k, True)
            out = out if factor is None else op.Mul(out, factor)
        else:
            out = self._routed(op, x, tokens)
        if self.fc2_latent_proj is not None:
            out = self.fc2_latent_proj(op, out)
        if self.bias is not None:
            out = op.Add(out, self.bias)
        out = self._with_shared_expert(op, x, out)
        return out if self.post_mlp_layernorm is None else self.post_mlp_layernorm(op, out)

    def _routed(self, op, x: ir.Value, tokens: ir.Value) -> ir.Value:
        """The experts over `tokens` (`x`, or its latent) as routed by the router of `x`."""
        moe = self.moe
        logits = op.Reshape(self.gate(op, x), op.Constant(value_ints=[-1, moe.num_experts]))
        if moe.scaled_input:
            nodes = [
                self._experts(op, op.Mul(tokens, scale), router, 1, True)
                for scale, router in scaled_input.picks(op, x, logits, moe.top_k)
            ]
            out = nodes[0]
            for node in nodes[1:]:
                out = op.Add(out, node)
            return out
        if moe.sparse_mixer is None:
            out = self._experts(op, tokens, logits, moe.top_k, moe.normalize_top_k)
            if not moe.normalize_top_k or moe.norm_p == 1:
                return out
            return op.Mul(out, pnorm_factor(op, x, logits, moe.top_k, moe.norm_p))
        # two k=1 nodes, each weighting its pick by its band's softmax (sparsemixer.py)
        first = sparsemixer.first_pick(op, logits, moe.sparse_mixer)
        second = sparsemixer.second_pick(op, logits, moe.sparse_mixer)
        return op.Add(
            self._experts(op, tokens, first, 1, False), self._experts(op, tokens, second, 1, False)
        )

    def _with_shared_expert(self, op, x: ir.Value, out: ir.Value) -> ir.Value:
        if self.shared_expert is None:
            return out
        shared = self.shared_expert(op, x)
        if self.shared_expert_gate is not None:
            shared = op.Mul(op.Sigmoid(self.shared_expert_gate(op, x)), shared)
        out = op.Add(out, shared)
        if self.moe.combined_scale == 1:
            return out
        scale = ir.tensor(np.array(self.moe.combined_scale, dtype=np.float32))
        return op.Mul(out, op.CastLike(op.Constant(value=scale), out))

    def _experts(self, op, x: ir.Value, router: ir.Value, k: int, normalize: bool) -> ir.Value:
        """One MoE node: the `k` experts of the softmax of `router`, weighted by it, with the
        family's expert biases and SwiGLU (alpha, beta, limit)."""
        fc1, fc1_bias, fc2, fc2_bias = self.experts(op)
        inputs = [x, router, fc1, fc1_bias, fc2] + ([fc2_bias] if fc2_bias is not None else [])
        swiglu = self.moe.node_activation
        # onnxruntime's defaults (alpha 1, beta 0, no limit) are left unsaid
        changed = {
            name: float(value)
            for name, value, default in (
                ("activation_alpha", swiglu.alpha, 1.0),
                ("activation_beta", swiglu.beta, 0.0),
                ("swiglu_limit", swiglu.limit, math.inf),
            )
            if value != default
        }
        out = op.MoE(
            *inputs,
            k=k,
            activation_type="swiglu",
            swiglu_fusion=1,
            normalize_routing_weights=int(normalize),
            **changed,
            _domain=MS_DOMAIN,
        )
        if fc2_bias is not None:
            out.producer().overload = "bias"  # the Tier-1 body with the expert biases
        out.type, out.shape = x.type, x.shape  # what onnxruntime's schema infers
        return out


def _shared_expert(moe: MoeConfig, config: ArchitectureConfig) -> GatedMLP | FCMLP:
    """The always-on expert in the routed experts' form (gated, or a plain MLP)."""
    if EXPERT_FORMS[moe.experts].gated:
        return GatedMLP(config.hidden_size, moe.shared_expert_size, moe.experts)
    return FCMLP(config.hidden_size, moe.shared_expert_size, moe.experts, config.mlp_bias)
