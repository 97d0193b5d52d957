"""One decoder layer: attention and MLP blocks with residuals, norms where the config places them.

    pre       h = x + attn(norm(x));               out = h + mlp(norm(h))          (llama)
              with residual_after_norm: h = n + attn(n), n = norm(x); alike for the MLP
                                                                                (bloom)
    sandwich  h = x + norm(attn(norm(x)));         out = h + norm(mlp(norm(h)))    (gemma2/3)
    post      h = x + norm(attn(x));               out = h + norm(mlp(h))          (olmo2)
    post_residual  h = norm(x + attn(x));          out = norm(h + mlp(h))          (opt-350m)
    parallel  n = norm(x);  out = (attn(n) + mlp(n)) + x                           (phi)
              with parallel_mlp_norm: out = (attn(norm1(x)) + mlp(norm2(x))) + x    (gpt_neox)

Each block output is multiplied by `residual_multiplier` before its add when that is not 1
(granite); with `residual_factors` each add is alpha * residual + beta * block (MiniMax). With
`residual_in_float32` in a float16 or bfloat16 build the layers pass the residual stream on in
float32: a block reads it cast to the model dtype and its output is cast to float32 before the
add, where transformers' Mamba blocks cast (`residual_in_fp32`). A layer whose only mixer is a
recurrent block may have a placement of its own (`recurrent_norm_placement`: OLMo hybrid's
pre-norm delta nets between post-norm attention layers). Norm modules carry the names
transformers gives them for each placement, so checkpoints need no renames. A recurrent layer
has the component its kind's row names in place of attention (config/recurrent.py: "conv" →
LFM2's ShortConv, "linear_attention" → Qwen3.5's GatedDeltaNet or Kimi's delta attention,
"mamba2" → Granite-4.0-H's Mamba2Mixer, "rglru" → RecurrentGemma's RgLruBlock,
"lightning_attention" → MiniMax's LightningAttention); its cache is the block's tuple of states
instead of (key, value). A config with `latent_attention` attends with DeepSeek's multi-head
latent attention, one with `differential_attention` DiffLlama's, one with `attention_experts`
JetMoE's mixture of attention heads, one with `dynamic_mask` Doge's dynamic mask attention. With
`residual_scales` (Doge) a pre-norm layer multiplies each residual by a learned vector before
the add: h = x * input_residual + attn(norm(x)), out = h * post_attention_residual +
mlp(norm(h)). A layer may run a recurrent block beside its attention (Falcon-H1:
`parallel_recurrent`, both reading the normed input, their outputs added; its cache is (key,
value, *states)), and with `one_block_layers` a layer is one block (Nemotron-H): its mixer
alone, h = x + mixer(norm(x)), or in an "mlp" layer its MLP alone, h = x + mlp(norm(x)).
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.attention import Attention
from mobius_genai.components.attention_experts import MixtureOfHeadsAttention
from mobius_genai.components.bitlinear import add_bitlinear_inputs
from mobius_genai.components.differential_attention import DifferentialAttention
from mobius_genai.components.dynamic_mask import DynamicMaskAttention
from mobius_genai.components.kv_slots import Slots
from mobius_genai.components.latent_attention import LatentAttention
from mobius_genai.components.linear import parameter
from mobius_genai.components.mlp import make_mlp
from mobius_genai.components.moe import MoEBlock
from mobius_genai.components.norms import make_norm
from mobius_genai.components.rope import Rotation
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.residual_factors import ResidualFactors
from mobius_genai.ep.context import get_build_dtype

# placement → module names of the norms (attention input, attention output, MLP input,
# MLP output); None where that placement has no norm.
NORM_SLOTS: dict[str, tuple[str | None, str | None, str | None, str | None]] = {
    "pre": ("input_layernorm", None, "post_attention_layernorm", None),
    "sandwich": (
        "input_layernorm",
        "post_attention_layernorm",
        "pre_feedforward_layernorm",
        "post_feedforward_layernorm",
    ),
    "post": (None, "post_attention_layernorm", None, "post_feedforward_layernorm"),
    "post_residual": (None, None, None, None),
}
# placement → module names of the norms of the residual sums (after attention, after the MLP),
# for the placements that normalize the sum itself.
SUM_NORMS: dict[str, tuple[str, str]] = {
    "post_residual": ("input_layernorm", "post_attention_layernorm"),
}


def _attention_class(config: ArchitectureConfig) -> type[nn.Module]:
    """The attention component of the config's section: DeepSeek's latent attention,
    DiffLlama's differential attention, JetMoE's mixture of attention heads, Doge's dynamic
    mask attention, else the standard one."""
    if config.latent_attention is not None:
        return LatentAttention
    if config.attention_experts is not None:
        return MixtureOfHeadsAttention
    if config.dynamic_mask is not None:
        return DynamicMaskAttention
    if config.differential_attention is not None:
        return DifferentialAttention
    return Attention


def float32_residual(config: ArchitectureConfig) -> bool:
    """Whether this build carries `config`'s residual stream in float32 (its
    `residual_in_float32` in a float16 or bfloat16 build)."""
    return config.residual_in_float32 and get_build_dtype() != ir.DataType.FLOAT


class DecoderLayer(nn.Module):
    """Residual attention + MLP blocks; module names follow the llama checkpoint layout."""

    def __init__(self, config: ArchitectureConfig, layer_index: int) -> None:
        super().__init__()
        placement = config.norm_placement_of(layer_index)
        slots = NORM_SLOTS[placement]
        if config.parallel_residual:
            # the MLP reads the attention's normed input, or the input through a norm of its own
            slots = (slots[0], None, slots[2] if config.parallel_mlp_norm else None, None)
        if config.one_block_layers:  # one norm before the one block
            slots = (slots[0], None, None, None)
        self.slots = slots
        self.sum_norms = SUM_NORMS.get(placement, (None, None))
        self.parallel = config.parallel_residual
        self.residual_after_norm = config.residual_after_norm
        self.residual_multiplier = config.residual_multiplier
        factors = config.residual_factors or ResidualFactors(())
        self.mixer_factors = factors.mixer(config.layer_types[layer_index])
        self.mlp_factors = factors.mlp
        self.config = config
        eps = config.norm_eps if config.block_norm_eps is None else config.block_norm_eps
        for name in (*slots, *self.sum_norms):
            if name is not None:
                setattr(self, name, make_norm(config.norm_type, config.hidden_size, eps))
        self.self_attn = self.recurrent = None
        if config.has_kv_cache(layer_index):
            self.self_attn = _attention_class(config)(config, layer_index)
        block = config.recurrent_block(layer_index)
        if block is not None:
            self.recurrent = block.module
            setattr(self, block.module, block.build(config, layer_index))
        mixes = self.self_attn is not None or self.recurrent is not None
        sparse = config.moe is not None and config.moe.is_sparse(layer_index)
        self.mlp = None
        if not (mixes and config.one_block_layers):
            self.mlp = MoEBlock(config) if sparse else make_mlp(config)
        add_bitlinear_inputs(self, config)  # BitNet's sub-norms and int8 inputs, if any
        scaled = config.residual_scales
        self.input_residual = parameter([config.hidden_size]) if scaled else None
        self.post_attention_residual = parameter([config.hidden_size]) if scaled else None

    def _norm(self, op, slot: int, x: ir.Value) -> ir.Value:
        name = self.slots[slot]
        return x if name is None else getattr(self, name)(op, x)

    def _sum_norm(self, op, slot: int, x: ir.Value) -> ir.Value:
        name = self.sum_norms[slot]
        return x if name is None else getattr(self, name)(op, x)

    def _scaled(self, op, x: ir.Value) -> ir.Value:
        """A block's output as the residual stream adds it: scaled, in float32 where the
        stream is."""
        if self.residual_multiplier != 1.0:
            multiplier = op.CastLike(op.Constant(value_float=self.residual_multiplier), x)
            x = op.Mul(x, multiplier)
        return op.Cast(x, to=ir.DataType.FLOAT) if float32_residual(self.config) else x

    def _added(self, op, residual: ir.Value, block: ir.Value, factors: tuple) -> ir.Value:
        """alpha * residual + beta * block (residual_factors; a plain add for (1, 1))."""
        alpha, beta = factors
        if alpha != 1.0:
            residual = op.Mul(residual, op.CastLike(op.Constant(value_float=alpha), residual))
        if beta != 1.0:
            block = op.Mul(block, op.CastLike(op.Constant(value_float=beta), block))
        return op.Add(residual, block)

    def _model_dtype(self, op, x: ir.Value) -> ir.Value:
        """The residual stream as a block reads it: in the model dtype."""
        return op.Cast(x, to=get_build_dtype()) if float32_residual(self.config) else x

    def forward(
        self,
        op,
        hidden_states: ir.Value,
        position_ids: ir.Value,
        rotary: Rotation | None,
        attention_bias: ir.Value,
        past: tuple[ir.Value, ...],
        attention_mask: ir.Value,
        slots: Slots | None = None,
    ) -> tuple[ir.Value, tuple[ir.Value, ...]]:
        """The layer output and its new cache: (key, value), or a recurrent block's states
        (`slots`: where new keys and values land, components/kv_slots.py)."""
        residual = hidden_states
        hidden_states = self._model_dtype(op, hidden_states)
        normed = self._norm(op, 0, hidden_states)
        if self.residual_after_norm:
            residual = normed
        mixed, presents = self._mix(
            op, normed, position_ids, rotary, attention_bias, past, attention_mask, slots
        )
        if mixed is None:  # an MLP alone
            return op.Add(residual, self._scaled(op, self.mlp(op, normed))), presents
        attn_out = self._scaled(op, self._norm(op, 1, mixed))
        if self.mlp is None:  # a mixer alone
            return op.Add(residual, attn_out), presents
        if self.parallel:
            mlp_in = normed if self.slots[2] is None else self._norm(op, 2, hidden_states)
            mlp_out = self._scaled(op, self.mlp(op, mlp_in))
            return op.Add(op.Add(attn_out, mlp_out), residual), presents
        if self.input_residual is not None:
            residual = op.Mul(residual, self.input_residual)
        hidden_states = self._sum_norm(
            op, 0, self._added(op, residual, attn_out, self.mixer_factors)
        )
        mlp_in = self._norm(op, 2, self._model_dtype(op, hidden_states))
        mlp_out = self._scaled(op, self._norm(op, 3, self.mlp(op, mlp_in)))
        if self.residual_after_norm:
            hidden_states = mlp_in
        if self.post_attention_residual is not None:
            hidden_states = op.Mul(hidden_states, self.post_attention_residual)
        added = self._added(op, hidden_states, mlp_out, self.mlp_factors)
        return self._sum_norm(op, 1, added), presents

    def _mix(
        self,
        op,
        normed: ir.Value,
        position_ids: ir.Value,
        rotary: Rotation | None,
        attention_bias: ir.Value,
        past: tuple[ir.Value, ...],
        attention_mask: ir.Value,
        slots: Slots | None,
    ) -> tuple[ir.Value | None, tuple[ir.Value, ...]]:
        """The token mixers' summed output (None without one) and their caches, in the order
        of `past`: the attention's key and value, then the recurrent block's states."""
        outputs, presents = [], ()
        if self.self_attn is not None:
            out, key, value = self.self_attn(
                op, normed, position_ids, rotary, attention_bias, *past[:2], slots
            )
            outputs, presents = [out], (key, value)
        if self.recurrent is not None:
            block = getattr(self, self.recurrent)
            out, *states = block(op, normed, attention_mask, *past[len(presents) :])
            outputs, presents = [out, *outputs], (*presents, *states)
        if not outputs:
            return None, presents
        return (outputs[0] if len(outputs) == 1 else op.Add(*outputs)), presents
