"""Mixture-of-experts switches: the routing and expert sizes of a MoE decoder, as data.

A MoE layer replaces the MLP with a router (a [hidden, experts] projection), the top-k experts
of each token (gated SiLU MLPs of `intermediate_size`) and their weighted sum. The families
read here route the same way (transformers' SparseMoeBlock / TopKRouter): a softmax over every
expert's logit, the `top_k` largest probabilities, renormalized to sum 1 when `normalize_top_k`
(mixtral, qwen3_moe; what granitemoe computes as a softmax over the top-k logits). Layers not in
`sparse_layers` keep a dense MLP (qwen*_moe's `mlp_only_layers` / `decoder_sparse_step`); a
`shared_expert_size` adds an always-on gated MLP, scaled by sigmoid(x @ gate) when
`shared_expert_gate` (qwen2_moe). PhiMoE routes with its `SparseMixer` instead of the softmax;
DeepSeek-V2/V3 with group-limited routing (config/moe_routing.py). Llama 4 routes by
`scaled_input`: each token's `top_k` largest router logits pick its experts, and each picked
expert takes the token times sigmoid(its logit), the outputs summed unweighted.
gpt_oss adds a bias to the router and to both expert
projections (`router_bias`, `expert_bias`) and clamps its SwiGLU (`activation`). Nemotron-H's
experts and shared expert are not gated: down(relu(up(x))**2) (`experts`, "relu2"); Nemotron-3
Super's routed experts work in a latent of `latent_size` between two projections (the router
and the shared expert read the hidden state itself). DBRX renormalizes the top-k probabilities
by their p-norm (`norm_p`, its moe_normalize_expert_weights) instead of their sum.
Cohere2-MoE averages the routed experts with its shared expert (`combined_scale` 0.5).
A.X-K1 normalizes the MoE block's output (routed plus shared experts) with an RMSNorm of its
own in the sparse layers (`output_norm`, its `post_mlp_layernorm`).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.moe_routing import GroupRouting, validate_routing
from mobius_genai.errors import ConfigError

#: The expert MLP activation the MoE op and its body compute (SwiGLU with alpha 1: silu(gate) * up).
MOE_ACTIVATION = "silu"
#: onnxruntime's MoE has no squared-ReLU expert. Its SwiGLU with both rows of a pair the up
#: projection's row h and alpha this large is h * sigmoid(alpha * h) * h = relu(h) * h =
#: relu(h)**2, but for |h| < 18 / alpha (below 3e-4), where it is off by at most h**2 < 1e-7;
#: the largest float16 value, so no dtype the graph takes turns it into inf (inf * 0 is NaN).
RELU2_ALPHA = 65504.0
_SPARSE_MIXER_PICKS = 2


@dataclasses.dataclass(frozen=True)
class SparseMixer:
    """PhiMoE's sparsemixer routing (transformers' `sparsemixer`, eval mode): always two picks.

    The first is the largest router logit, weighted by the softmax over the experts whose logit
    lies within a relative `2 * eps` of it (`(max - s) / max(|s|, max) <= 2 * eps`); the second
    is the largest logit once the first is masked out, weighted the same way among the others
    (the band measured from the second maximum). `eps` is config.json's `router_jitter_noise`.
    """

    eps: float


@dataclasses.dataclass(frozen=True)
class ExpertActivation:
    """The experts' SwiGLU as onnxruntime's MoE op computes it (its activation_alpha,
    activation_beta and swiglu_limit): G * sigmoid(alpha * G) * (L + beta), with the gate
    G = min(gate, limit) and L = clip(up, -limit, limit). The defaults are silu(gate) * up."""

    alpha: float = 1.0
    beta: float = 0.0
    limit: float = math.inf


@dataclasses.dataclass(frozen=True)
class MoeConfig:
    """Routing and expert sizes of a MoE decoder (see the module docstring)."""

    num_experts: int
    top_k: int
    intermediate_size: int
    normalize_top_k: bool
    sparse_layers: tuple[int, ...]
    shared_expert_size: int = 0
    shared_expert_gate: bool = False
    sparse_mixer: SparseMixer | None = None
    router_bias: bool = False
    expert_bias: bool = False
    activation: ExpertActivation = ExpertActivation()
    group_routing: GroupRouting | None = None
    scaled_input: bool = False
    experts: str = MOE_ACTIVATION
    latent_size: int = 0  # 0: the experts read and write the hidden state itself
    # with normalize_top_k, the top-k probabilities are divided by their p-norm (1: their sum)
    norm_p: float = 1.0
    # the routed experts' output plus the shared expert's, times this (Cohere2-MoE's "average")
    combined_scale: float = 1.0
    # a [hidden] bias added to the routed experts' weighted sum (JetMoE's `bias`)
    output_bias: bool = False
    # the block's output through an RMSNorm of its own, `post_mlp_layernorm` (A.X-K1)
    output_norm: bool = False

    def is_sparse(self, layer: int) -> bool:
        """Whether layer `layer` runs the experts (else its dense MLP)."""
        return layer in self.sparse_layers

    @property
    def node_activation(self) -> ExpertActivation:
        """The SwiGLU settings of the MoE node (relu2 experts: gate rows = up rows, RELU2_ALPHA)."""
        return EXPERT_FORMS[self.experts].node_activation or self.activation


@dataclasses.dataclass(frozen=True)
class ExpertForm:
    """How the MoE node runs one kind of expert MLP, and the shared expert's form beside it."""

    gated: bool
    node_activation: ExpertActivation | None  # None: the config's `activation`


#: The expert MLPs by activation: gated SwiGLU (silu(gate) * up); or Nemotron-H's non-gated
#: squared ReLU, whose checkpoint up rows the family's ExpertLayout reads into both rows of
#: each pair.
EXPERT_FORMS = {
    MOE_ACTIVATION: ExpertForm(gated=True, node_activation=None),
    "relu2": ExpertForm(gated=False, node_activation=ExpertActivation(alpha=RELU2_ALPHA)),
}


@dataclasses.dataclass(frozen=True)
class MoeKeys:
    """The config.json names a family gives the MoE fields (a row's data).

    `normalize` is the key of the renormalization switch, or a bool the family fixes.
    `intermediate` falls back to `intermediate_size` when absent. `sparse_step` / `dense_layers`
    name qwen's `decoder_sparse_step` / `mlp_only_layers` (None: every layer is sparse).
    `shared_expert` names the shared expert's size (None: no shared expert).
    `sparse_mixer` names the sparsemixer's eps (None: softmax routing).
    """

    num_experts: str
    intermediate: str = "intermediate_size"
    normalize: str | bool = "norm_topk_prob"
    normalize_default: bool = False
    sparse_step: str | None = None
    dense_layers: str | None = None
    shared_expert: str | None = None
    shared_expert_gate: bool = False
    top_k: str = "num_experts_per_tok"
    sparse_mixer: str | None = None


def moe_reader(keys: MoeKeys) -> Callable[[Mapping[str, Any]], MoeConfig]:
    """A config override (FamilyAdapter.config_overrides["moe"]) that reads `keys`."""
    return lambda raw: read_moe(raw, keys)


def read_moe(raw: Mapping[str, Any], keys: MoeKeys) -> MoeConfig:
    """The MoeConfig of config.json `raw`, read through `keys`; errors name the field."""
    num_layers = fields.require(raw, "num_hidden_layers")
    num_experts = fields.require(raw, keys.num_experts)
    top_k = fields.require(raw, keys.top_k)
    if top_k > num_experts:
        raise ConfigError(
            f"config.json: field {keys.top_k!r} is {top_k}, more than the {num_experts} experts "
            f"({keys.num_experts}); accepted: 1..{num_experts}"
        )
    intermediate = raw.get(keys.intermediate)
    key = keys.intermediate if intermediate is not None else "intermediate_size"
    normalize = keys.normalize
    if isinstance(normalize, str):
        normalize = fields.flag(raw.get(normalize), normalize, keys.normalize_default)
    shared = 0
    if keys.shared_expert is not None:
        shared = fields.integer(raw.get(keys.shared_expert), keys.shared_expert, 0, positive=False)
    return MoeConfig(
        num_experts=num_experts,
        top_k=top_k,
        intermediate_size=fields.require(raw, key),
        normalize_top_k=normalize,
        sparse_layers=_sparse_layers(raw, keys, num_layers),
        shared_expert_size=shared,
        shared_expert_gate=keys.shared_expert_gate and shared > 0,
        sparse_mixer=_sparse_mixer(raw, keys, top_k),
    )


def _sparse_mixer(raw: Mapping[str, Any], keys: MoeKeys, top_k: int) -> SparseMixer | None:
    """The sparsemixer named by `keys` (its eps, default 0.01 as PhimoeConfig), or None."""
    if keys.sparse_mixer is None:
        return None
    if top_k != _SPARSE_MIXER_PICKS:
        raise ConfigError(
            f"config.json: field {keys.top_k!r} is {top_k}; accepted: {_SPARSE_MIXER_PICKS} "
            "(the sparsemixer routes each token to two experts)"
        )
    eps = fields.number(raw.get(keys.sparse_mixer), keys.sparse_mixer, 0.01)
    if eps < 0:
        raise ConfigError(
            f"config.json: field {keys.sparse_mixer!r} is {eps}; accepted: a number >= 0"
        )
    return SparseMixer(eps=eps)


def _sparse_layers(raw: Mapping[str, Any], keys: MoeKeys, num_layers: int) -> tuple[int, ...]:
    """Layers that run the experts: qwen's rule, (i + 1) % step == 0 and i not MLP-only."""
    step = 1
    if keys.sparse_step is not None:
        step = fields.integer(raw.get(keys.sparse_step), keys.sparse_step, 1)
    dense: tuple[int, ...] = ()
    if keys.dense_layers is not None:
        dense = fields.int_tuple(raw.get(keys.dense_layers), keys.dense_layers)
        outside = [i for i in dense if not 0 <= i < num_layers]
        if outside:
            raise ConfigError(
                f"config.json: field {keys.dense_layers!r} holds {outside}; accepted: layer "
                f"indices 0..{num_layers - 1}"
            )
    return tuple(i for i in range(num_layers) if (i + 1) % step == 0 and i not in dense)


def validate_moe(moe: MoeConfig | None, hidden_act: str) -> None:
    """Refuse what the MoE block cannot compute exactly."""
    if moe is None:
        return
    if not isinstance(moe, MoeConfig):
        raise ConfigError(f"config.json: moe must be a MoeConfig or None, found {moe!r}")
    for name in ("num_experts", "top_k", "intermediate_size"):
        value = getattr(moe, name)
        if not fields.is_int(value) or value <= 0:
            raise ConfigError(
                f"config.json: MoE {name} must be a positive integer, found {value!r}"
            )
    if moe.top_k > moe.num_experts:
        raise ConfigError(
            f"config.json: num_experts_per_tok {moe.top_k} exceeds the {moe.num_experts} experts; "
            f"accepted: 1..{moe.num_experts}"
        )
    if moe.sparse_mixer is not None and moe.top_k != _SPARSE_MIXER_PICKS:
        raise ConfigError(
            f"config.json: the sparsemixer routes to {_SPARSE_MIXER_PICKS} experts, found "
            f"num_experts_per_tok {moe.top_k}; accepted: {_SPARSE_MIXER_PICKS}"
        )
    if not (fields.is_number(moe.norm_p) and moe.norm_p > 0):
        raise ConfigError(
            f"config.json: MoE renormalization p-norm must be a positive number, found "
            f"{moe.norm_p!r}"
        )
    if not (fields.is_number(moe.combined_scale) and moe.combined_scale > 0):
        raise ConfigError(
            f"config.json: MoE shared expert combination scale must be a positive number, "
            f"found {moe.combined_scale!r}"
        )
    if moe.group_routing is not None:
        validate_routing(moe.group_routing, moe.num_experts, moe.top_k)
    swiglu = moe.activation
    if not isinstance(swiglu, ExpertActivation) or not (
        fields.is_number(swiglu.alpha) and fields.is_number(swiglu.beta)
    ):
        raise ConfigError(f"config.json: MoE activation {swiglu!r} needs numbers alpha and beta")
    if swiglu.limit != math.inf and not (fields.is_number(swiglu.limit) and swiglu.limit > 0):
        raise ConfigError(
            f"config.json: MoE swiglu limit must be a positive number, found {swiglu.limit!r}"
        )
    # gated experts run the config's hidden_act; others name their own (Nemotron-H's relu2)
    act = hidden_act if moe.experts == MOE_ACTIVATION else moe.experts
    if act not in EXPERT_FORMS or EXPERT_FORMS[act].gated != (moe.experts == MOE_ACTIVATION):
        raise ConfigError(
            f"config.json: hidden_act {act!r} is not supported in MoE experts; accepted: "
            f"{MOE_ACTIVATION!r} (gated), 'relu2' (nemotron_h's non-gated experts)"
        )
