"""Group-limited routing (DeepSeek-V2/V3's MoE gate), as data.

The experts are split into `groups` equal groups; each token keeps the `top_groups` groups of
highest group score and picks its `top_k` experts among theirs. Scores are the softmax of the
router logits (DeepSeek-V2) or their sigmoid (V3). V3 adds a learned per-expert
`e_score_correction_bias` to the scores it chooses by (the group scores are then the sum of
each group's two best), while the chosen experts are weighted by the uncorrected scores; V2
scores a group by its best expert. The weights are renormalized to sum 1 when the MoE config's
`normalize_top_k` says so, then multiplied by `scaling` (`routed_scaling_factor`).
LFM2-MoE routes the same way with one group: sigmoid scores corrected by its `expert_bias`,
renormalized over the sum plus `epsilon` (1e-6). GLM-4 MoE routes as V3; MiniMax-M2 as V3 in
one group; ERNIE-4.5-MoE chooses by softmax scores plus its correction bias, which it stores
as one [1, experts] row (`correction_bias_row`). Kolibri-1 chooses by its raw router logits
plus the correction bias (`choice_by_logits`) and weights the chosen experts by the sigmoid of
their logits. Laguna (and Mellum's parent row) routes as
MiniMax-M2, its router logits first capped to cap * tanh(logits / cap) (`logit_softcap`,
moe_router_logit_softcapping; 0: none).
"""

from __future__ import annotations

import dataclasses

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError

SCORINGS = ("softmax", "sigmoid")
#: How a group is scored from its experts' scores: its best, or the sum of its best two.
GROUP_SCORES = {"max": 1, "top2_sum": 2}


@dataclasses.dataclass(frozen=True)
class GroupRouting:
    """Group-limited top-k routing (see the module docstring)."""

    scoring: str
    groups: int = 1
    top_groups: int = 1
    group_score: str = "max"
    correction_bias: bool = False
    scaling: float = 1.0
    # added to the sum of the picked weights a renormalization divides by
    epsilon: float = 0.0
    correction_bias_row: bool = False
    # scores computed in float32 from the logits whatever the graph's dtype (MiniMax-M2's
    # sigmoid(router_logits.float())); models/families/float32.py keeps a router's parameters
    float32_scores: bool = False
    # experts chosen by the logits (plus the correction bias), not by the scores (Kolibri-1)
    choice_by_logits: bool = False
    # router logits become cap * tanh(logits / cap) before scoring (0: none)
    logit_softcap: float = 0.0


def validate_routing(routing: GroupRouting, num_experts: int, top_k: int) -> None:
    """Refuse a routing the router cannot compute: unknown kinds, groups that do not split the
    experts evenly, fewer experts in the kept groups than a token picks."""
    if routing.scoring not in SCORINGS or routing.group_score not in GROUP_SCORES:
        raise ConfigError(
            f"config.json: MoE routing scores {routing.scoring!r} by {routing.group_score!r}; "
            f"accepted: scores {list(SCORINGS)}, group scores {list(GROUP_SCORES)}"
        )
    groups, kept = routing.groups, routing.top_groups
    if not (fields.is_int(groups) and fields.is_int(kept) and 0 < kept <= groups):
        raise ConfigError(
            f"config.json: n_group {groups!r} and topk_group {kept!r}; accepted: positive "
            "integers, topk_group at most n_group"
        )
    if num_experts % groups:
        raise ConfigError(
            f"config.json: n_group {groups} does not divide the {num_experts} experts; "
            "accepted: a divisor of n_routed_experts"
        )
    per_group = num_experts // groups
    if per_group < GROUP_SCORES[routing.group_score] or kept * per_group < top_k:
        raise ConfigError(
            f"config.json: topk_group {kept} groups of {per_group} experts cannot hold "
            f"num_experts_per_tok {top_k} picks; accepted: topk_group * experts per group >= "
            "num_experts_per_tok"
        )
    if not fields.is_number(routing.scaling) or routing.scaling <= 0:
        raise ConfigError(
            f"config.json: routed_scaling_factor must be a positive number, found "
            f"{routing.scaling!r}"
        )
    if not fields.is_number(routing.logit_softcap) or routing.logit_softcap < 0:
        raise ConfigError(
            f"config.json: moe_router_logit_softcapping must be a number >= 0 (0: none), found "
            f"{routing.logit_softcap!r}"
        )
    if not fields.is_number(routing.epsilon) or routing.epsilon < 0:
        raise ConfigError(
            f"config.json: the MoE renormalization epsilon must be a number >= 0, found "
            f"{routing.epsilon!r}"
        )
