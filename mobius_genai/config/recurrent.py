"""Recurrent blocks: the layer kinds that carry fixed-size states instead of a KV cache.

Each block's row declares its states once (name suffix, sizes from the config, dtype) and how
onnxruntime-genai 0.18 names them and learns which layers have them (`Naming`). The decoder task
makes its graph inputs and outputs from the rows, genai_config writes what og reads of them,
bundle validation checks a graph against them, graph reading knows their names, and the decoder
layer builds the row's component. A block (Mamba2's: a conv state and a scan state per layer)
is one row here, its config section (an ArchitectureConfig field its family rows read) and its
component; nothing else branches on a block.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mobius_genai.config.architecture import ArchitectureConfig

#: The states og 0.18's RecurrentState derives names for from the KV patterns, in the order it
#: reads them; it takes every graph input named as the first as a recurrent layer.
DERIVED_SUFFIXES = ("conv_state", "recurrent_state")


@dataclasses.dataclass(frozen=True)
class Naming:
    """How onnxruntime-genai 0.18 names a block's states and finds the layers that have them.

    `declared`: genai_config names each state's patterns (`inputs.past_<suffix>_names`,
    `outputs.present_<suffix>_names`), lists `layer_types` and gives each state's sizes under
    its axis names (LFM2's `conv_cache_size`). Otherwise og derives the names from the KV
    patterns (their part after the last '.' replaced by the suffix), finds the layers by the
    first of DERIVED_SUFFIXES and allocates one shape per state for all of them, only the batch
    dim dynamic; genai_config names nothing.
    """

    past: str
    present: str
    declared: bool

    def names(self, suffix: str) -> tuple[str, str]:
        """The past input and present output patterns ("%d": the layer) of state `suffix`."""
        return self.past.format(suffix), self.present.format(suffix)


#: og's lfm2 type: the patterns and sizes are read from genai_config.
IN_GENAI_CONFIG = Naming("past.%d.{}", "present.%d.{}", declared=True)
#: og's RecurrentState (qwen3_5_text, and its generic decoder): the KV names, another last part.
FROM_KV_NAMES = Naming("past_key_values.%d.{}", "present.%d.{}", declared=False)


@dataclasses.dataclass(frozen=True)
class State:
    """One state of a recurrent layer: [batch, *dims(config)], one size per name in `axes`
    (with IN_GENAI_CONFIG naming, the decoder keys og sizes the state by); `float32`: kept in
    float32 whatever the model dtype, else in the model dtype."""

    suffix: str
    axes: tuple[str, ...]
    dims: Callable[[ArchitectureConfig], tuple[int, ...]]
    float32: bool = False

    def shape(self, config: ArchitectureConfig, batch: str) -> list[int | str]:
        return [batch, *self.dims(config)]


@dataclasses.dataclass(frozen=True)
class RecurrentBlock:
    """A recurrent layer kind: `layer_type` as config.json names it, `section` the
    ArchitectureConfig field with its settings, `module` its name in checkpoints
    (model.layers.N.<module>.*), `component` the onnxscript.nn block ("package.module:Class",
    or a function of the config that returns the block, imported when a decoder is built), its
    states and how og names them; `per_layer`: the component is built with the layer's index
    too (settings that differ by depth)."""

    layer_type: str
    section: str
    module: str
    component: str
    states: tuple[State, ...]
    naming: Naming
    per_layer: bool = False

    def __post_init__(self) -> None:
        suffixes = tuple(state.suffix for state in self.states)
        if not self.naming.declared and suffixes != DERIVED_SUFFIXES:
            raise ValueError(
                f"recurrent block {self.layer_type!r}: states {list(suffixes)} named from the KV "
                f"patterns; accepted: {list(DERIVED_SUFFIXES)}, the ones og 0.18 derives"
            )

    def block_class(self) -> Callable[..., Any]:
        """The component class, imported here so that reading configs needs no graph stack."""
        module, _, name = self.component.partition(":")
        return getattr(importlib.import_module(module), name)

    def build(self, config: ArchitectureConfig, layer_index: int) -> Any:
        """The component of layer `layer_index`."""
        block = self.block_class()
        return block(config, layer_index) if self.per_layer else block(config)


def _short_conv_dims(config: ArchitectureConfig) -> tuple[int, ...]:
    return config.hidden_size, config.short_conv.cache_size


def _delta_conv_dims(config: ArchitectureConfig) -> tuple[int, ...]:
    sizes = config.linear_attention
    return sizes.conv_dim, sizes.conv_kernel_size - 1


def _delta_recurrent_dims(config: ArchitectureConfig) -> tuple[int, ...]:
    sizes = config.linear_attention
    return sizes.value_heads, sizes.key_head_dim, sizes.value_head_dim


def _mamba2_conv_dims(config: ArchitectureConfig) -> tuple[int, ...]:
    sizes = config.mamba2
    return sizes.conv_dim, sizes.conv_kernel_size - 1


def _mamba2_ssm_dims(config: ArchitectureConfig) -> tuple[int, ...]:
    sizes = config.mamba2
    return sizes.heads, sizes.state_size, sizes.head_dim


def _mamba1_conv_dims(config: ArchitectureConfig) -> tuple[int, ...]:
    sizes = config.mamba1
    return sizes.intermediate, sizes.conv_kernel_size - 1


def _mamba1_ssm_dims(config: ArchitectureConfig) -> tuple[int, ...]:
    sizes = config.mamba1
    return sizes.intermediate, sizes.state_size, 1


def _rglru_conv_dims(config: ArchitectureConfig) -> tuple[int, ...]:
    sizes = config.rglru
    return sizes.width, sizes.conv_kernel_size - 1


def _rglru_dims(config: ArchitectureConfig) -> tuple[int, ...]:
    return config.rglru.width, 1, 1


def _unused_conv_dims(config: ArchitectureConfig) -> tuple[int, ...]:
    return 1, 1


def _lightning_dims(config: ArchitectureConfig) -> tuple[int, ...]:
    sizes = config.lightning_attention
    return sizes.heads, sizes.head_dim, sizes.head_dim


#: Layer kind → its block. LFM2's short conv (config/short_conv.py): the conv's last columns.
#: Qwen3.5's gated delta net or Kimi's delta attention (config/linear_attention.py's `rule`):
#: its conv's last columns and the delta rule's state, in float32. Mamba2 (config/mamba2.py):
#: its conv's last columns and the selective scan's state, in float32, named as the gated delta
#: net's. Mamba1 (config/mamba1.py): the same two states, its scan's a state entry per channel
#: and state size, named alike. RecurrentGemma's RG-LRU (config/rglru.py): its conv's last
#: columns and the recurrence's one entry per channel, in float32, named alike; its checkpoint
#: module is the layer's `temporal_block` (attention layers' too: the family row renames
#: theirs). MiniMax's lightning attention (config/lightning_attention.py): its [heads, d, d]
#: state in float32, named alike, and a [1, 1] conv state carried unchanged, which og needs to
#: find the layer; its slopes differ by layer (`per_layer`); checkpoints name it `self_attn`
#: (the family row renames it).
RECURRENT_BLOCKS: dict[str, RecurrentBlock] = {
    block.layer_type: block
    for block in (
        RecurrentBlock(
            layer_type="conv",
            section="short_conv",
            module="conv",
            component="mobius_genai.components.short_conv:ShortConv",
            states=(State("conv", ("hidden_size", "conv_cache_size"), _short_conv_dims),),
            naming=IN_GENAI_CONFIG,
        ),
        RecurrentBlock(
            layer_type="linear_attention",
            section="linear_attention",
            module="linear_attn",
            component="mobius_genai.components.delta_rule_blocks:delta_rule_block",
            states=(
                State("conv_state", ("conv_dim", "conv_cache_size"), _delta_conv_dims),
                State(
                    "recurrent_state",
                    ("value_heads", "key_head_dim", "value_head_dim"),
                    _delta_recurrent_dims,
                    float32=True,
                ),
            ),
            naming=FROM_KV_NAMES,
        ),
        RecurrentBlock(
            layer_type="mamba2",
            section="mamba2",
            module="mamba",
            component="mobius_genai.components.mamba2:Mamba2Mixer",
            states=(
                State("conv_state", ("conv_dim", "conv_cache_size"), _mamba2_conv_dims),
                State(
                    "recurrent_state",
                    ("mamba_heads", "state_size", "mamba_head_dim"),
                    _mamba2_ssm_dims,
                    float32=True,
                ),
            ),
            naming=FROM_KV_NAMES,
        ),
        RecurrentBlock(
            layer_type="mamba",
            section="mamba1",
            module="mamba",
            component="mobius_genai.components.mamba1:Mamba1Mixer",
            states=(
                State("conv_state", ("mamba_channels", "conv_cache_size"), _mamba1_conv_dims),
                State(
                    "recurrent_state",
                    ("mamba_channels", "state_size", "mamba_value_dim"),
                    _mamba1_ssm_dims,
                    float32=True,
                ),
            ),
            naming=FROM_KV_NAMES,
        ),
        RecurrentBlock(
            layer_type="rglru",
            section="rglru",
            module="temporal_block",
            component="mobius_genai.components.rglru:RgLruBlock",
            states=(
                State("conv_state", ("lru_width", "conv_cache_size"), _rglru_conv_dims),
                State(
                    "recurrent_state",
                    ("lru_width", "lru_key_dim", "lru_value_dim"),
                    _rglru_dims,
                    float32=True,
                ),
            ),
            naming=FROM_KV_NAMES,
        ),
        RecurrentBlock(
            layer_type="lightning_attention",
            section="lightning_attention",
            module="lightning_attn",
            component="mobius_genai.components.lightning_attention:LightningAttention",
            states=(
                State("conv_state", ("unused_conv", "unused_conv"), _unused_conv_dims),
                State(
                    "recurrent_state",
                    ("lightning_heads", "lightning_head_dim", "lightning_head_dim"),
                    _lightning_dims,
                    float32=True,
                ),
            ),
            naming=FROM_KV_NAMES,
            per_layer=True,
        ),
    )
}


def state_suffixes() -> tuple[str, ...]:
    """The last name part of every declared state (graph reading's cache roles)."""
    return tuple(dict.fromkeys(s.suffix for b in RECURRENT_BLOCKS.values() for s in b.states))


def derived_ranks() -> dict[str, int]:
    """Each state og derives from the KV names → its rank, as the blocks so named declare."""
    return {
        state.suffix: 1 + len(state.axes)
        for block in RECURRENT_BLOCKS.values()
        if not block.naming.declared
        for state in block.states
    }


def declared_blocks() -> tuple[RecurrentBlock, ...]:
    """The blocks whose states genai_config names (IN_GENAI_CONFIG)."""
    return tuple(block for block in RECURRENT_BLOCKS.values() if block.naming.declared)


def layers_of(layer_types: Sequence[Any], kind: str) -> tuple[int, ...]:
    """The indices of the layers of kind `kind`."""
    return tuple(i for i, layer in enumerate(layer_types) if layer == kind)
