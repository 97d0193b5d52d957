"""Mutant rows and components for the parity tests: a family row with some config overrides
replaced (`with_overrides`), its MoE settings changed (`with_moe`) or its group routing changed
(`with_routing`), and a group router that ignores its correction bias."""

from __future__ import annotations

import dataclasses

from mobius_genai.components.group_router import GroupRouter
from mobius_genai.models import FAMILIES
from mobius_genai.models.families.adapter import FamilyAdapter


def with_overrides(family: str, **overrides) -> FamilyAdapter:
    """`family`'s row with `overrides` replacing or joining its config overrides."""
    row = FAMILIES[family]
    return dataclasses.replace(row, config_overrides={**row.config_overrides, **overrides})


def with_moe(row: FamilyAdapter, **changes) -> FamilyAdapter:
    """`row` with `changes` made to the MoeConfig its "moe" override reads."""
    read = row.config_overrides["moe"]
    overrides = {
        **row.config_overrides,
        "moe": lambda raw: dataclasses.replace(read(raw), **changes),
    }
    return dataclasses.replace(row, config_overrides=overrides)


def with_routing(family: str, **changes) -> FamilyAdapter:
    """`family`'s row with `changes` made to its MoE's group routing."""
    read = FAMILIES[family].config_overrides["moe"]

    def moe(raw):
        config = read(raw)
        routing = dataclasses.replace(config.group_routing, **changes)
        return dataclasses.replace(config, group_routing=routing)

    return with_overrides(family, moe=moe)


class CorrectionBiasIgnored(GroupRouter):
    """Reads e_score_correction_bias and chooses by the uncorrected scores."""

    def _choice(self, op, scores):
        return scores
