"""Mamba2 layers ("mamba2": Granite-4.0-H): the sizes of their heads, groups, state and conv.

A layer projects h to [gate (intermediate) | x, B, C (conv_dim) | dt (heads)], convolves
[x | B | C] causally with a `conv_kernel_size`-tap depthwise kernel (a bias when `conv_bias`)
and SiLU, then runs the selective scan: `heads` heads of `head_dim` channels, each reading the
B and C of its group (`groups` groups of `state_size`, the heads repeat-interleaved onto them).
Its states: the conv's last `conv_kernel_size - 1` columns [batch, conv_dim,
conv_kernel_size - 1] and the scan's [batch, heads, state_size, head_dim] in float32.
Families name the keys differently (`Mamba2Keys`: a row's data).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Mamba2Config:
    """Head, group, state and conv sizes of the Mamba2 layers (see the module docstring)."""

    heads: int
    head_dim: int
    state_size: int
    groups: int
    conv_kernel_size: int
    conv_bias: bool = True
    proj_bias: bool = False

    @property
    def intermediate(self) -> int:
        """Channels of x, of the gate and of the scan's output."""
        return self.heads * self.head_dim

    @property
    def conv_dim(self) -> int:
        """Channels of the convolved [x | B | C]."""
        return self.intermediate + 2 * self.groups * self.state_size


@dataclasses.dataclass(frozen=True)
class Mamba2Keys:
    """The config.json names a family gives the Mamba2 sizes and the conv's activation (and
    transformers' defaults); `head_dim` may be "auto" there: the intermediate size over the
    heads."""

    heads: tuple[str, int]
    head_dim: tuple[str, int | str]
    state_size: tuple[str, int]
    groups: tuple[str, int]
    conv_kernel_size: tuple[str, int]
    expand: tuple[str, int]
    conv_bias: tuple[str, bool]
    proj_bias: tuple[str, bool]
    activation: tuple[str, str] = ("hidden_act", "silu")


#: GraniteMoeHybridConfig's keys and defaults.
GRANITE_KEYS = Mamba2Keys(
    heads=("mamba_n_heads", 128),
    head_dim=("mamba_d_head", "auto"),
    state_size=("mamba_d_state", 256),
    groups=("mamba_n_groups", 1),
    conv_kernel_size=("mamba_d_conv", 4),
    expand=("mamba_expand", 2),
    conv_bias=("mamba_conv_bias", True),
    proj_bias=("mamba_proj_bias", False),
)


def mamba2_reader(keys: Mamba2Keys) -> Callable[[Mapping[str, Any]], Mamba2Config]:
    """A config override (FamilyAdapter.config_overrides["mamba2"]) that reads `keys`."""
    return lambda raw: read_mamba2(raw, keys)


def _bound(value: Any) -> Any:
    """A float as config.json holds it: a number, or transformers 5's {"__float__": "Infinity"}
    for one JSON cannot spell."""
    if isinstance(value, Mapping) and isinstance(value.get("__float__"), str):
        try:
            return float(value["__float__"])
        except ValueError:
            return value
    return value


def _time_step_limit(raw: Mapping[str, Any]) -> None:
    """transformers clamps dt to `time_step_limit` in its prefill but not in its decode
    steps; only the default (0, inf), where softplus already lies, computes one thing."""
    limit = raw.get("time_step_limit")
    if limit is None:
        return
    bounds = [_bound(value) for value in limit] if isinstance(limit, list | tuple) else []
    if not (
        len(bounds) == 2
        and fields.is_number(bounds[0])
        and bounds[0] <= 0
        and bounds[1] == math.inf
    ):
        raise ConfigError(
            f"config.json: time_step_limit is {limit!r}; accepted: [0.0, Infinity] (transformers "
            "clamps dt only in its prefill)"
        )


def read_mamba2(raw: Mapping[str, Any], keys: Mamba2Keys) -> Mamba2Config:
    """The Mamba2Config of config.json `raw`, read through `keys`; errors name the field."""
    hidden = fields.require(raw, "hidden_size")
    heads = fields.integer(raw.get(keys.heads[0]), *keys.heads)
    expand = fields.integer(raw.get(keys.expand[0]), *keys.expand)
    head_key, head_default = keys.head_dim
    head_dim = raw.get(head_key, head_default)
    if head_dim in (None, "auto"):
        head_dim = expand * hidden // heads
    head_dim = fields.integer(head_dim, head_key)
    if heads * head_dim != expand * hidden:
        raise ConfigError(
            f"config.json: {keys.heads[0]} {heads} x {head_key} {head_dim} is not "
            f"{keys.expand[0]} {expand} x hidden_size {hidden}; accepted: heads that split the "
            "Mamba2 intermediate size"
        )
    config = Mamba2Config(
        heads=heads,
        head_dim=head_dim,
        state_size=fields.integer(raw.get(keys.state_size[0]), *keys.state_size),
        groups=fields.integer(raw.get(keys.groups[0]), *keys.groups),
        conv_kernel_size=fields.integer(raw.get(keys.conv_kernel_size[0]), *keys.conv_kernel_size),
        conv_bias=fields.flag(raw.get(keys.conv_bias[0]), *keys.conv_bias),
        proj_bias=fields.flag(raw.get(keys.proj_bias[0]), *keys.proj_bias),
    )
    if config.heads % config.groups:
        raise ConfigError(
            f"config.json: {keys.heads[0]} {config.heads} is not a multiple of {keys.groups[0]} "
            f"{config.groups}; accepted: groups that share the heads evenly"
        )
    if config.conv_kernel_size < 2:
        raise ConfigError(
            f"config.json: {keys.conv_kernel_size[0]} is {config.conv_kernel_size}; accepted: 2 "
            "or more"
        )
    activation = raw.get(keys.activation[0]) or keys.activation[1]
    if activation != "silu":
        raise ConfigError(
            f"config.json: {keys.activation[0]} is {activation!r}; accepted for Mamba2 layers: "
            "'silu' (their conv's activation)"
        )
    _time_step_limit(raw)
    return config
