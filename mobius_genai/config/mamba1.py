"""Mamba1 layers ("mamba": Mamba, FalconMamba, Jamba's mixers): the sizes of their selective
scan and conv, and the norms some families put on dt, B and C.

A layer projects h to [x | z] (`intermediate` channels each), convolves x causally with a
`conv_kernel_size`-tap depthwise kernel (a bias when `conv_bias`) and SiLU, projects it to
[dt (`dt_rank`) | B | C (`state_size` each)], widens dt back to `intermediate` channels, then
scans: one state of `state_size` per channel, A [intermediate, state_size] its own decay per
state entry. Its states: the conv's last `conv_kernel_size - 1` columns [batch, intermediate,
conv_kernel_size - 1] and the scan's [batch, intermediate, state_size, 1] in float32 (the
LinearAttention op's [batch, heads, key dim, value dim] with a head per channel).
`bc_norm`: none (Mamba), an RMSNorm without weights on dt, B and C (FalconMamba's
`mixer_rms_eps`) or one with weights (Jamba's dt_layernorm, b_layernorm, c_layernorm).
Families name the keys differently (`Mamba1Keys`: a row's data).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.config.mamba2 import check_scan_conv

#: The norms on dt, B and C (see the module docstring).
MAMBA1_NORMS = ("none", "weightless", "weighted")


@dataclasses.dataclass(frozen=True)
class Mamba1Config:
    """Scan, conv and projection sizes of the Mamba1 layers (see the module docstring)."""

    intermediate: int
    state_size: int
    conv_kernel_size: int
    dt_rank: int
    conv_bias: bool = True
    proj_bias: bool = False
    bc_norm: str = "none"
    bc_norm_eps: float = 1e-6

    def __post_init__(self) -> None:
        if self.bc_norm not in MAMBA1_NORMS:
            raise ValueError(f"Mamba1 norm {self.bc_norm!r}; accepted: {list(MAMBA1_NORMS)}")


@dataclasses.dataclass(frozen=True)
class Mamba1Keys:
    """The config.json names a family gives the Mamba1 sizes (and transformers' defaults).
    The intermediate size is `expand` x hidden_size (transformers computes it so whatever
    config.json's intermediate_size says); `dt_rank` "auto" is ceil(hidden_size / 16).
    `bc_norm_eps`: the key of the dt/B/C norms' epsilon and its default, None without them."""

    state_size: tuple[str, int]
    conv_kernel_size: tuple[str, int]
    expand: tuple[str, int]
    dt_rank: tuple[str, int | str]
    conv_bias: tuple[str, bool]
    proj_bias: tuple[str, bool]
    bc_norm: str = "none"
    bc_norm_eps: tuple[str, float] | None = None


#: MambaConfig's keys and defaults.
MAMBA_KEYS = Mamba1Keys(
    state_size=("state_size", 16),
    conv_kernel_size=("conv_kernel", 4),
    expand=("expand", 2),
    dt_rank=("time_step_rank", "auto"),
    conv_bias=("use_conv_bias", True),
    proj_bias=("use_bias", False),
)

#: FalconMambaConfig's: Mamba's, dt, B and C normalized without weights (`mixer_rms_eps`).
FALCON_MAMBA_KEYS = dataclasses.replace(
    MAMBA_KEYS, bc_norm="weightless", bc_norm_eps=("mixer_rms_eps", 1e-6)
)

#: JambaConfig's keys and defaults: dt, B and C normalized with weights (`rms_norm_eps`).
JAMBA_KEYS = Mamba1Keys(
    state_size=("mamba_d_state", 16),
    conv_kernel_size=("mamba_d_conv", 4),
    expand=("mamba_expand", 2),
    dt_rank=("mamba_dt_rank", "auto"),
    conv_bias=("mamba_conv_bias", True),
    proj_bias=("mamba_proj_bias", False),
    bc_norm="weighted",
    bc_norm_eps=("rms_norm_eps", 1e-6),
)


def mamba1_reader(keys: Mamba1Keys) -> Callable[[Mapping[str, Any]], Mamba1Config]:
    """A config override (FamilyAdapter.config_overrides["mamba1"]) that reads `keys`."""
    return lambda raw: read_mamba1(raw, keys)


def _dt_rank(raw: Mapping[str, Any], keys: Mamba1Keys, hidden: int) -> int:
    key, default = keys.dt_rank
    value = raw.get(key, default)
    if value in (None, "auto"):
        return math.ceil(hidden / 16)
    return fields.integer(value, key)


def read_mamba1(raw: Mapping[str, Any], keys: Mamba1Keys) -> Mamba1Config:
    """The Mamba1Config of config.json `raw`, read through `keys`; errors name the field."""
    hidden = fields.require(raw, "hidden_size")
    eps_key = keys.bc_norm_eps
    config = Mamba1Config(
        intermediate=fields.integer(raw.get(keys.expand[0]), *keys.expand) * hidden,
        state_size=fields.integer(raw.get(keys.state_size[0]), *keys.state_size),
        conv_kernel_size=fields.integer(raw.get(keys.conv_kernel_size[0]), *keys.conv_kernel_size),
        dt_rank=_dt_rank(raw, keys, hidden),
        conv_bias=fields.flag(raw.get(keys.conv_bias[0]), *keys.conv_bias),
        proj_bias=fields.flag(raw.get(keys.proj_bias[0]), *keys.proj_bias),
        bc_norm=keys.bc_norm,
        bc_norm_eps=1e-6
        if eps_key is None
        else fields.number(raw.get(eps_key[0]), *eps_key, positive=True),
    )
    kernel = (keys.conv_kernel_size[0], config.conv_kernel_size)
    check_scan_conv(raw, kernel, ("hidden_act", "silu"), "Mamba1")
    return config
