"""Mamba2 layers ("mamba2": Granite-4.0-H, Nemotron-H, Falcon-H1, Codestral Mamba): the sizes of
their heads, groups, state and conv, and where their gated norm normalizes.

A layer projects h to [gate (intermediate) | x, B, C (conv_dim) | dt (heads)], convolves
[x | B | C] causally with a `conv_kernel_size`-tap depthwise kernel (a bias when `conv_bias`)
and SiLU, then runs the selective scan: `heads` heads of `head_dim` channels, each reading the
B and C of its group (`groups` groups of `state_size`, the heads repeat-interleaved onto them).
Its states: the conv's last `conv_kernel_size - 1` columns [batch, conv_dim,
conv_kernel_size - 1] and the scan's [batch, heads, state_size, head_dim] in float32.
The scan's output y is gated by silu(gate) and normalized over each group of channels
(`norm`): "gate_then_norm" normalizes y * silu(gate) (Granite, Nemotron-H; transformers'
norm_before_gate=False), "norm_then_gate" multiplies the normalized y by silu(gate), and
"gate" only gates, with no norm (Falcon-H1 without `mamba_rms_norm`). Families name the keys
differently (`Mamba2Keys`: a row's data).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from mobius_genai.config import fields
from mobius_genai.errors import ConfigError

#: The gated norm's placements (see the module docstring).
MAMBA2_NORMS = ("gate_then_norm", "norm_then_gate", "gate")


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
    out_bias: bool = False
    norm: str = "gate_then_norm"

    def __post_init__(self) -> None:
        if self.norm not in MAMBA2_NORMS:
            raise ValueError(f"Mamba2 norm {self.norm!r}; accepted: {list(MAMBA2_NORMS)}")

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
    heads. The intermediate size is `intermediate` where the config has it, else `expand` x
    hidden_size; with neither key it is heads x head_dim, unchecked (Nemotron-H).
    `out_proj_bias`: out_proj's bias switch where it differs from in_proj's (`proj_bias`)."""

    heads: tuple[str, int]
    head_dim: tuple[str, int | str]
    state_size: tuple[str, int]
    groups: tuple[str, int]
    conv_kernel_size: tuple[str, int]
    expand: tuple[str, int] | None
    conv_bias: tuple[str, bool]
    proj_bias: tuple[str, bool]
    activation: tuple[str, str] = ("hidden_act", "silu")
    intermediate: str | None = None
    out_proj_bias: tuple[str, bool] | None = None


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

#: NemotronHConfig's keys and defaults (no expand check: Nemotron-Nano-9B-v2's heads x head_dim
#: is not twice its hidden size; transformers builds heads x head_dim).
NEMOTRON_H_KEYS = Mamba2Keys(
    heads=("mamba_num_heads", 128),
    head_dim=("mamba_head_dim", 64),
    state_size=("ssm_state_size", 128),
    groups=("n_groups", 8),
    conv_kernel_size=("conv_kernel", 4),
    expand=None,
    conv_bias=("use_conv_bias", True),
    proj_bias=("use_bias", False),
    activation=("mamba_hidden_act", "silu"),
)

#: FalconH1Config's keys and defaults: `mamba_d_ssm` the intermediate size when set, out_proj's
#: bias `projectors_bias`.
FALCON_H1_KEYS = dataclasses.replace(
    GRANITE_KEYS,
    heads=("mamba_n_heads", 128),
    state_size=("mamba_d_state", 256),
    groups=("mamba_n_groups", 1),
    intermediate="mamba_d_ssm",
    out_proj_bias=("projectors_bias", False),
)


#: Mamba2Config's keys and defaults (Codestral Mamba, state-spaces/mamba2-*): heads x head_dim
#: must be expand x hidden_size, as Mamba2Config validates.
MAMBA2_KEYS = Mamba2Keys(
    heads=("num_heads", 128),
    head_dim=("head_dim", 64),
    state_size=("state_size", 128),
    groups=("n_groups", 8),
    conv_kernel_size=("conv_kernel", 4),
    expand=("expand", 2),
    conv_bias=("use_conv_bias", True),
    proj_bias=("use_bias", False),
)


def check_scan_conv(
    raw: Mapping[str, Any],
    kernel: tuple[str, int],
    activation: tuple[str, str],
    layers: str,
) -> None:
    """The conv before a selective scan (Mamba1's and Mamba2's): `kernel` (its key, the size
    read) at least 2 taps, the activation config.json names (key, default) SiLU, the only one
    the components build."""
    if kernel[1] < 2:
        raise ConfigError(f"config.json: {kernel[0]} is {kernel[1]}; accepted: 2 or more")
    found = raw.get(activation[0]) or activation[1]
    if found != "silu":
        raise ConfigError(
            f"config.json: {activation[0]} is {found!r}; accepted for {layers} layers: 'silu' "
            "(their conv's activation)"
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


def _intermediate(raw: Mapping[str, Any], keys: Mamba2Keys) -> tuple[str, int] | None:
    """(how config.json gives it, the Mamba2 intermediate size), or None where it does not."""
    if keys.intermediate is not None and raw.get(keys.intermediate) is not None:
        return keys.intermediate, fields.integer(raw[keys.intermediate], keys.intermediate)
    if keys.expand is None:
        return None
    expand = fields.integer(raw.get(keys.expand[0]), *keys.expand)
    hidden = fields.require(raw, "hidden_size")
    return f"{keys.expand[0]} {expand} x hidden_size {hidden}", expand * hidden


def _head_dim(raw: Mapping[str, Any], keys: Mamba2Keys, heads: int) -> int:
    """The heads' size; "auto" (or absent with that default): the intermediate size over the
    heads, which must then split it."""
    intermediate = _intermediate(raw, keys)
    head_key, head_default = keys.head_dim
    head_dim = raw.get(head_key, head_default)
    if head_dim in (None, "auto") and intermediate is not None:
        head_dim = intermediate[1] // heads
    head_dim = fields.integer(head_dim, head_key)
    if intermediate is not None and heads * head_dim != intermediate[1]:
        raise ConfigError(
            f"config.json: {keys.heads[0]} {heads} x {head_key} {head_dim} is not "
            f"{intermediate[0]}; accepted: heads that split the Mamba2 intermediate size"
        )
    return head_dim


def read_mamba2(raw: Mapping[str, Any], keys: Mamba2Keys) -> Mamba2Config:
    """The Mamba2Config of config.json `raw`, read through `keys`; errors name the field."""
    heads = fields.integer(raw.get(keys.heads[0]), *keys.heads)
    proj_bias = fields.flag(raw.get(keys.proj_bias[0]), *keys.proj_bias)
    out_key = keys.out_proj_bias
    config = Mamba2Config(
        heads=heads,
        head_dim=_head_dim(raw, keys, heads),
        state_size=fields.integer(raw.get(keys.state_size[0]), *keys.state_size),
        groups=fields.integer(raw.get(keys.groups[0]), *keys.groups),
        conv_kernel_size=fields.integer(raw.get(keys.conv_kernel_size[0]), *keys.conv_kernel_size),
        conv_bias=fields.flag(raw.get(keys.conv_bias[0]), *keys.conv_bias),
        proj_bias=proj_bias,
        out_bias=proj_bias if out_key is None else fields.flag(raw.get(out_key[0]), *out_key),
    )
    if config.heads % config.groups:
        raise ConfigError(
            f"config.json: {keys.heads[0]} {config.heads} is not a multiple of {keys.groups[0]} "
            f"{config.groups}; accepted: groups that share the heads evenly"
        )
    kernel = (keys.conv_kernel_size[0], config.conv_kernel_size)
    check_scan_conv(raw, kernel, keys.activation, "Mamba2")
    _time_step_limit(raw)
    return config
