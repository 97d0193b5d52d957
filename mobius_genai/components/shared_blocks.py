"""Zamba2's layers (config/shared_blocks.py): Mamba2 layers, and "hybrid" layers that first
invoke one of the shared transformer blocks.

    mamba layer   out = h + mamba(norm(h))
    hybrid layer  t = linear(block(h, e, j));  out = h + mamba(norm(h + t))
    block         n = norm(concat(h, e));  a = attn(n);  out = mlp(norm(a))   (no residuals)

`e` is the token embedding (the stack's input), so the block's attention reads 2 x hidden
channels and heads of 2 x hidden / heads; o_proj brings them back to hidden. Invocation j of
the block adds its own adapter to gate_up_proj (and with `attention_adapters` to q, k and v):
x @ A_j @ B_j. A block's weights belong to the first layer that invokes it (the checkpoint's
names) and are stored once in the graph: the later invocations call the same module, whose
parameters are graph initializers already. Each invocation has its layer's KV cache.
"""

from __future__ import annotations

import dataclasses

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.attention import Attention
from mobius_genai.components.linear import Linear, parameter
from mobius_genai.components.mamba2 import Mamba2Mixer
from mobius_genai.components.mlp import activation
from mobius_genai.components.norms import RMSNorm
from mobius_genai.config import ArchitectureConfig

#: Zamba2RMSNormGated's epsilon inside the Mamba2 mixer, whatever rms_norm_eps says.
_MIXER_NORM_EPS = 1e-5


class _Factor(nn.Module):
    """x @ weight, unbiased; with None, nothing (its weight realized by the call)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.weight = parameter([in_features, out_features], transposed=True)

    def forward(self, op, x: ir.Value | None) -> ir.Value | None:
        return None if x is None else op.MatMul(x, self.weight)


class _Adapter(nn.Module):
    """x @ A @ B, as the checkpoint's nn.Sequential of two unbiased Linears (`0`, `1`).
    Called with None it computes nothing: its weights are then graph initializers under the
    caller's names (`_claim`)."""

    def __init__(self, in_features: int, rank: int, out_features: int) -> None:
        super().__init__()
        setattr(self, "0", _Factor(in_features, rank))
        setattr(self, "1", _Factor(rank, out_features))

    def forward(self, op, x: ir.Value | None) -> ir.Value | None:
        return getattr(self, "1")(op, getattr(self, "0")(op, x))


def _claim(op, *adapter_lists: nn.ModuleList) -> None:
    """Make every invocation's adapter weights graph initializers now, named under the module
    being called: the block's first invocation, whose layer the checkpoint names them by
    (a later invocation would otherwise name its adapter after its own layer)."""
    for adapters in adapter_lists:
        for adapter in adapters:
            if isinstance(adapter, _Adapter):
                adapter(op, None)


def _adapter_list(
    config: ArchitectureConfig, block: int, in_features: int, out_features: int
) -> nn.ModuleList:
    """One entry per invocation: an adapter for the invocations of `block`, empty for the
    others (the checkpoint's nn.Identity)."""
    section = config.shared_blocks
    return nn.ModuleList(
        [
            _Adapter(in_features, section.adapter_rank, out_features)
            if section.block_of(j) == block
            else nn.ModuleList([])
            for j in range(section.invocations)
        ]
    )


class AdaptedAttention(Attention):
    """The block's attention: 2 x hidden channels in, hidden out, and with
    `attention_adapters` the invocation's adapter added to each of q, k and v (`invocation`:
    set by SharedTransformer before each call, as Attention's forward takes no such argument)."""

    def __init__(self, config: ArchitectureConfig, layer_index: int, block: int) -> None:
        hidden = config.hidden_size
        wide = dataclasses.replace(config, hidden_size=2 * hidden)
        super().__init__(wide, layer_index)
        self.o_proj = Linear(self.num_heads * self.head_dim, hidden)
        self.invocation = 0
        self.adapted = config.shared_blocks.attention_adapters
        if self.adapted:
            q_size, kv_size = self.sizes[0], self.sizes[1]
            self.linear_q_adapter_list = _adapter_list(config, block, 2 * hidden, q_size)
            self.linear_k_adapter_list = _adapter_list(config, block, 2 * hidden, kv_size)
            self.linear_v_adapter_list = _adapter_list(config, block, 2 * hidden, kv_size)

    def _project(self, op, x: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value]:
        """q, k and v (three projections: Zamba2 packs none), each plus the invocation's
        adapter when the block has them."""
        projections = (self.q_proj, self.k_proj, self.v_proj)
        if not self.adapted:
            return tuple(projection(op, x) for projection in projections)
        j = self.invocation
        lists = (self.linear_q_adapter_list, self.linear_k_adapter_list, self.linear_v_adapter_list)
        _claim(op, *lists)
        return tuple(
            op.Add(projection(op, x), adapters[j](op, x))
            for projection, adapters in zip(projections, lists, strict=True)
        )


class AdaptedMLP(nn.Module):
    """down(act(gate) * up), [gate | up] = gate_up_proj(x) + the invocation's adapter."""

    def __init__(self, config: ArchitectureConfig, block: int) -> None:
        super().__init__()
        hidden, inner = config.hidden_size, config.intermediate_size
        self.act = config.hidden_act
        self.gate_up_proj = Linear(hidden, 2 * inner, config.mlp_bias)
        self.down_proj = Linear(inner, hidden, config.mlp_bias)
        self.gate_up_proj_adapter_list = _adapter_list(config, block, hidden, 2 * inner)

    def forward(self, op, x: ir.Value, invocation: int) -> ir.Value:
        _claim(op, self.gate_up_proj_adapter_list)
        both = op.Add(self.gate_up_proj(op, x), self.gate_up_proj_adapter_list[invocation](op, x))
        gate, up = op.Split(both, num_outputs=2, axis=-1, _outputs=2)
        return self.down_proj(op, op.Mul(activation(op, gate, self.act), up))


def block_input(op, hidden_states: ir.Value, embeddings: ir.Value) -> ir.Value:
    """What a block reads: the hidden state and the token embeddings side by side."""
    return op.Concat(hidden_states, embeddings, axis=-1)


class SharedTransformer(nn.Module):
    """One shared block: norm(concat(h, e)) → attention → norm → MLP, with no residual."""

    def __init__(self, config: ArchitectureConfig, layer_index: int, block: int) -> None:
        super().__init__()
        hidden, eps = config.hidden_size, config.norm_eps
        self.input_layernorm = RMSNorm(2 * hidden, eps)
        self.self_attn = AdaptedAttention(config, layer_index, block)
        self.pre_ff_layernorm = RMSNorm(hidden, eps)
        self.feed_forward = AdaptedMLP(config, block)

    def forward(
        self,
        op,
        hidden_states: ir.Value,
        embeddings: ir.Value,
        invocation: int,
        attention: tuple,
    ) -> tuple[ir.Value, ir.Value, ir.Value]:
        """The block's output and invocation `invocation`'s present key and value;
        `attention`: (position_ids, rotary, bias, past key, past value, slots)."""
        normed = self.input_layernorm(op, block_input(op, hidden_states, embeddings))
        self.self_attn.invocation = invocation
        out, key, value = self.self_attn(op, normed, *attention)
        out = self.feed_forward(op, self.pre_ff_layernorm(op, out), invocation)
        return out, key, value


class MambaLayer(nn.Module):
    """h + mamba(norm(h + added)): a Mamba2 layer, or a hybrid layer's `mamba_decoder`
    (`added`: the shared block's projected output)."""

    def __init__(self, config: ArchitectureConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.norm_eps)
        self.mamba = Mamba2Mixer(dataclasses.replace(config, norm_eps=_MIXER_NORM_EPS))

    def forward(
        self,
        op,
        hidden_states: ir.Value,
        attention_mask: ir.Value,
        states: tuple[ir.Value, ...],
        added: ir.Value | None = None,
    ) -> tuple[ir.Value, tuple[ir.Value, ...]]:
        mixed = hidden_states if added is None else op.Add(hidden_states, added)
        out, conv, ssm = self.mamba(op, self.input_layernorm(op, mixed), attention_mask, *states)
        return op.Add(hidden_states, out), (conv, ssm)


class HybridLayer(nn.Module):
    """A shared block's invocation, projected by `linear`, then the layer's Mamba2 layer
    (`mamba_decoder`). `block`: the shared module; registered here when this layer is its
    first invocation (its weights' names), else only called."""

    def __init__(self, config: ArchitectureConfig, block: SharedTransformer, owner: bool) -> None:
        super().__init__()
        if owner:
            self.shared_transformer = block
        object.__setattr__(self, "_block", block)
        self.linear = Linear(config.hidden_size, config.hidden_size)
        self.mamba_decoder = MambaLayer(config)

    def forward(
        self,
        op,
        hidden_states: ir.Value,
        embeddings: ir.Value,
        invocation: int,
        attention: tuple,
        attention_mask: ir.Value,
        past: tuple[ir.Value, ...],
    ) -> tuple[ir.Value, tuple[ir.Value, ...]]:
        """The layer's output and cache (key, value, conv state, scan state); `attention`:
        (position_ids, rotary, bias, slots)."""
        position_ids, rotary, bias, slots = attention
        out, key, value = self._block(
            op,
            hidden_states,
            embeddings,
            invocation,
            (position_ids, rotary, bias, past[0], past[1], slots),
        )
        hidden_states, states = self.mamba_decoder(
            op, hidden_states, attention_mask, past[2:], self.linear(op, out)
        )
        return hidden_states, (key, value, *states)


def shared_block_layers(config: ArchitectureConfig) -> list[nn.Module]:
    """The layers of a Zamba2 stack: each hybrid layer with its invocation's block (made by
    its first invocation), a MambaLayer elsewhere."""
    section = config.shared_blocks
    blocks: dict[int, SharedTransformer] = {}
    layers: list[nn.Module] = []
    for i in range(config.num_hidden_layers):
        invocation = section.invocation_of(i)
        if invocation is None:
            layers.append(MambaLayer(config))
            continue
        block = section.block_of(invocation)
        owner = block not in blocks
        if owner:
            blocks[block] = SharedTransformer(config, i, block)
        layers.append(HybridLayer(config, blocks[block], owner))
    return layers
