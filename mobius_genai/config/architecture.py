"""ArchitectureConfig: one normalized, validated description of a decoder architecture.

config.json comes in two layouts: the one hub checkpoints carry (`rope_theta`, `rope_scaling`,
`torch_dtype`) and the one transformers 5 writes (`rope_parameters`, `dtype`). Both parse to the
same ArchitectureConfig, so nothing downstream depends on transformers or on its release.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mobius_genai.checkpoint.source import read_config_json
from mobius_genai.config import fields
from mobius_genai.config.alibi import Alibi
from mobius_genai.config.altup import AltUpConfig
from mobius_genai.config.attention_experts import AttentionExperts
from mobius_genai.config.attention_gate import AttentionGate
from mobius_genai.config.bitlinear import BitLinearConfig
from mobius_genai.config.checks import HIDDEN_ACTS, validate
from mobius_genai.config.differential import DifferentialAttention
from mobius_genai.config.dynamic_mask import DynamicMask
from mobius_genai.config.embedding_layout import EmbeddingLayout
from mobius_genai.config.head_layout import HeadLayout
from mobius_genai.config.latent_attention import LatentAttentionConfig
from mobius_genai.config.layers import (
    ATTENTION_LAYER_TYPES,
    check_layer_count,
    first_of_every_kind,
    parse_layer_types,
)
from mobius_genai.config.lightning_attention import LightningAttentionConfig
from mobius_genai.config.linear_attention import LinearAttentionConfig
from mobius_genai.config.local_global import CHUNKED, LocalGlobalAttention
from mobius_genai.config.mamba1 import Mamba1Config
from mobius_genai.config.mamba2 import Mamba2Config
from mobius_genai.config.moe import MoeConfig
from mobius_genai.config.per_layer_stack import FULL, PerLayerStack
from mobius_genai.config.recurrent import RECURRENT_BLOCKS, RecurrentBlock
from mobius_genai.config.residual_factors import ResidualFactors
from mobius_genai.config.rglru import RgLruConfig
from mobius_genai.config.rope import RopeConfig, parse_rope, rotated_channels
from mobius_genai.config.shared_blocks import SharedBlocks
from mobius_genai.config.short_conv import ShortConvConfig
from mobius_genai.config.weight_scales import WeightScale
from mobius_genai.errors import ConfigError

_NORM_EPS_KEYS = (
    "rms_norm_eps",
    "layer_norm_eps",
    "layer_norm_epsilon",
    "norm_epsilon",
    "norm_eps",
)


def activation(value: Any, key: str) -> str:
    """`value` of field `key` as one of HIDDEN_ACTS, the activations a tower or MLP builds."""
    if value not in HIDDEN_ACTS:
        raise ConfigError(
            f"config.json: field {key!r} is {value!r}; accepted: {sorted(HIDDEN_ACTS)}"
        )
    return value


@dataclasses.dataclass(frozen=True)
class ArchitectureConfig:
    """What the graph builder needs to know about a decoder-only LM, and nothing else.

    Beyond sizes, a few generic switches describe how families differ (each defaults to the
    llama-style decoder):

    - `norm_type`: "rms" (RMSNormalization), "layer" (LayerNormalization with bias),
      "layer_no_bias" (LayerNormalization with a weight and no bias: cohere) or
      "layer_no_affine" (LayerNormalization without learnable weight or bias: olmo) or
      "rms_no_affine" (RMSNormalization without a weight: nanochat).
    - `norm_placement`: where a layer normalizes. "pre": norm → block → add (llama);
      "sandwich": norm → block → norm → add (gemma2/3); "post": block → norm → add (olmo2);
      "post_residual": block → add → norm (opt-350m's do_layer_norm_before false).
    - `recurrent_norm_placement`: the placement of the layers with a recurrent block and no
      attention where it differs from `norm_placement` (OLMo hybrid: post-norm attention
      layers, pre-norm gated delta nets); None: the same.
    - `parallel_residual`: attention and MLP read the same normed input and both outputs are
      added to the residual at once, x + attn(ln(x)) + mlp(ln(x)) (phi); needs placement "pre".
    - `parallel_mlp_norm`: with `parallel_residual`, the MLP normalizes the layer input with a
      norm of its own, x + attn(ln1(x)) + mlp(ln2(x)) (gpt_neox), instead of reading the
      attention's normed input.
    - `residual_after_norm`: with placement "pre", each block's residual is its normed input,
      h = ln1(x) + attn(ln1(x)) (bloom's apply_residual_connection_post_layernorm).
    - `gated_mlp`: down(act(gate(x)) * up(x)) when True, fc2(act(fc1(x))) when False.
    - `embedding_norm`: the token embeddings pass through the final norm before the first
      layer as well (nanochat).
    - `embedding_multiplier`: token embeddings are multiplied by it (gemma: sqrt(hidden_size),
      granite: `embedding_multiplier`).
    - `residual_multiplier`: each block's output is multiplied by it before the residual add
      (granite).
    - `residual_in_float32`: the residual stream between the layers is float32 in a float16 or
      bfloat16 build, each block reading it in the model dtype and its output added in float32
      (transformers' `residual_in_fp32`: Mamba, FalconMamba); a float32 build is unchanged.
    - `logits_scaling`: logits are divided by it (granite).
    - `attn_logit_softcapping`, `final_logit_softcapping`: attention scores and logits become
      cap * tanh(x / cap) (gemma2). These, the multipliers and `attention_scale` are family
      facts: only the rows whose transformers class reads the config.json key set them
      (models/families/scales.py), so a key a family ignores changes nothing.
    - `position_embedding`: "rope", or "learned" absolute positions added to the token
      embeddings (gpt2), or "sinusoidal" ones computed from the positions (xglm), or "alibi"
      linear biases on the attention scores (bloom, mpt, falcon: `alibi`, config/alibi.py);
      each of these means no rotary in any layer.
    - `embedding_layout`: the absolute positions' table offset, a token table narrower than
      the stack, no final norm (config/embedding_layout.py: OPT, XGLM).
    - `embedding_layernorm`: the token embeddings pass through a norm of their own before the
      first layer (bloom's word_embeddings_layernorm).
    - `no_rope_layers`: indices of layers that apply no rotary embedding (smollm3's NoPE layers).
    - `rope_local`: the rope of sliding-window layers when it differs from `rope` (gemma3's
      `rope_local_base_freq`); None means every layer uses `rope`.
    - `layer_rope_thetas`: each layer's rope base, replacing the theta of the rope the layer
      would use (granite_swa's `layer_rope_theta`); 0 means the layer applies none. Layers
      with one theta share one cos/sin table. Empty: each rope keeps its own theta.
    - `qk_norm_per_head`: with `qk_norm`, normalize each head's q/k (qwen3, gemma3) when True,
      the whole q/k projection at once (olmo2) when False.
    - `qk_norm_head_weights`: with per-head `qk_norm`, every head has its own norm weight and
      the q/k norms no bias (stablelm's per-head LayerNorms); one weight shared by all heads
      when False.
    - `qk_norm_stacked_weights`: with `qk_norm_head_weights`, the per-head weights are one
      [num_heads, head_dim] tensor `q_norm.weight` (cohere) instead of one tensor per head.
    - `qk_norm_after_rope`: with `qk_norm`, q and k are normalized after the rotary embedding
      (hunyuan_v1_dense) instead of before it.
    - `rope_interleaved`: every rope of the config rotates adjacent channel pairs
      (x0, x1), (x2, x3), ... (gptj, cohere, glm) instead of the two halves of the rotated
      channels (llama's rotate_half).
    - `packed_qkv`: q, k and v come from one projection `qkv_proj` whose output is
      [q | k | v], split in the graph (gpt_neox's query_key_value, whose per-head rows the
      adapter regroups into these blocks as it reads them).
    - `clip_qkv`: q, k and v projections are clipped to [-clip_qkv, clip_qkv] right after
      the projection (olmo); None means no clipping.
    - `lm_head_bias`: the LM head adds a bias (phi).
    - `attention_scale`: softmax scale when not 1/sqrt(head_dim) (gemma2/3's
      query_pre_attn_scalar**-0.5, granite's attention_multiplier).
    - `attention_sinks`: every attention layer has a learned logit per head that joins its
      softmax and is dropped after it (gpt_oss's `sinks`, components/sinks.py).
    - `moe`: the mixture-of-experts routing and sizes (config/moe.py); None for a dense decoder.
    - `short_conv`: taps and bias of the depthwise causal convolution of "conv" layers
      (config/short_conv.py: LFM2's `conv_L_cache`, `conv_bias`); None when the family reads none.
    - `linear_attention`: head and conv sizes of gated-delta-rule "linear_attention" layers
      (config/linear_attention.py); None when the model has none. Each recurrent layer kind
      names its section in config/recurrent.py, which declares its states.
    - `latent_attention`: attention layers are DeepSeek's multi-head latent attention
      (config/latent_attention.py); `head_dim` is then the cached head size and the rotary
      embedding turns its `qk_rope_head_dim` channels.
    - `differential_attention`: every attention layer is DiffLlama's differential attention
      (config/differential.py: the lambda_init of each depth, the head norm); None otherwise.
    - `attention_experts`: every attention layer is JetMoE's mixture of attention heads
      (config/attention_experts.py: experts with their own query and output projections
      around a shared key/value projection); None otherwise.
    - `dynamic_mask`: every attention layer is Doge's dynamic mask attention
      (config/dynamic_mask.py: a bias per key from its value states, the keys kept past a
      window); None otherwise.
    - `residual_scales`: each layer multiplies its two residuals by learned vectors before
      adding the block outputs (Doge's `input_residual`, `post_attention_residual`).
    - `block_norm_eps`: the epsilon of the decoder layers' norms where it differs from the
      final norm's `norm_eps` (JetMoE's layers keep RMSNorm's default 1e-6); None: the same.
    - `mamba2`: head, group, state and conv sizes of Mamba2 "mamba2" layers (config/mamba2.py);
      None when the model has none.
    - `mamba1`: scan, conv and dt sizes of Mamba1 "mamba" layers (config/mamba1.py); None when
      the model has none.
    - `rglru`: width, gate heads and conv taps of RecurrentGemma's RG-LRU "rglru" layers
      (config/rglru.py); None when the model has none.
    - `lightning_attention`: heads and per-layer decays of MiniMax's "lightning_attention"
      layers (config/lightning_attention.py); None when the model has none.
    - `residual_factors`: alpha * residual + beta * block at each residual add, per layer kind
      and for the MLP (config/residual_factors.py: MiniMax's); None for plain adds.
    - `one_block_layers`: each layer is one pre-norm block and its residual: its token mixer
      (attention or a recurrent block) without an MLP, or in "mlp" layers an MLP alone
      (Nemotron-H).
    - `parallel_recurrent`: a recurrent layer kind (config/recurrent.py) that every attention
      layer runs beside its attention on the same normed input, the two outputs added; its
      states join the layer's KV cache (Falcon-H1: "mamba2").
    - `weight_scales`: constant multipliers folded into weights as they are read
      (config/weight_scales.py: Falcon-H1's µP multipliers); a family's rows apply them with
      the `scaled_weights` preprocessor.
    - `local_global`: Llama 4's chunked local layers (layer type "chunked_attention"), the
      L2 q/k norm of rotating layers and the temperature tuning of NoPE layers, or Ministral
      3's query scale in every layer (config/local_global.py); None when the model has none.
    - `altup`: Gemma 3n's streams, per-layer inputs, Laurel, sparse MLPs and shared caches
      (config/altup.py); None for every other decoder.
    - `per_layer_stack`: Gemma 4's full-layer head geometry, per-layer inputs, shared caches and
      MoE block beside the MLP (config/per_layer_stack.py); None for every other decoder.
    - `bitlinear`: BitNet's projections, sub-norms before o_proj and down_proj and int8
      activations (config/bitlinear.py); None for every other decoder.
    - `shared_blocks`: Zamba2's shared transformer blocks, invoked before the Mamba2 mixer of
      its "hybrid" layers (config/shared_blocks.py); None for every other decoder.
    - `attention_output_gate`: q_proj also yields a per-head gate, [q_h | gate_h] for each head
      h, and the attention output is multiplied by sigmoid(gate) before o_proj (Qwen3.5).
    - `head_layout`: layers whose values are narrower than their keys and whose key/value heads
      are fewer than the cache's, widened in the graph, and the layer types with sinks
      (config/head_layout.py: MiMo-V2-Flash); None when every layer has the cache's layout.
    - `attention_gate`: the attention output is multiplied by act(x @ g_proj), a projection of
      its own, per head or per channel (config/attention_gate.py: Laguna's softplus gate,
      AFMoE's sigmoid one); None otherwise.
    """

    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    hidden_act: str = "silu"
    norm_eps: float = 1e-6
    rope: RopeConfig = dataclasses.field(default_factory=RopeConfig)
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False
    qk_norm_per_head: bool = True
    qk_norm_head_weights: bool = False
    qk_norm_stacked_weights: bool = False
    qk_norm_after_rope: bool = False
    packed_qkv: bool = False
    clip_qkv: float | None = None
    lm_head_bias: bool = False
    tie_word_embeddings: bool = False
    norm_type: str = "rms"
    norm_placement: str = "pre"
    recurrent_norm_placement: str | None = None
    parallel_residual: bool = False
    parallel_mlp_norm: bool = False
    residual_after_norm: bool = False
    gated_mlp: bool = True
    embedding_multiplier: float = 1.0
    embedding_norm: bool = False
    embedding_layernorm: bool = False
    residual_multiplier: float = 1.0
    residual_in_float32: bool = False
    logits_scaling: float = 1.0
    position_embedding: str = "rope"
    embedding_layout: EmbeddingLayout = dataclasses.field(default_factory=EmbeddingLayout)
    no_rope_layers: tuple[int, ...] = ()
    rope_local: RopeConfig | None = None
    layer_rope_thetas: tuple[float, ...] = ()
    rope_interleaved: bool = False
    sliding_window: int | None = None
    layer_types: tuple[str, ...] = ()
    short_conv: ShortConvConfig | None = None
    linear_attention: LinearAttentionConfig | None = None
    mamba2: Mamba2Config | None = None
    mamba1: Mamba1Config | None = None
    rglru: RgLruConfig | None = None
    lightning_attention: LightningAttentionConfig | None = None
    residual_factors: ResidualFactors | None = None
    one_block_layers: bool = False
    parallel_recurrent: str | None = None
    weight_scales: tuple[WeightScale, ...] = ()
    attention_output_gate: bool = False
    attention_gate: AttentionGate | None = None
    head_layout: HeadLayout | None = None
    attention_scale: float | None = None
    attention_sinks: bool = False
    attn_logit_softcapping: float | None = None
    final_logit_softcapping: float | None = None
    bos_token_id: int | None = None
    eos_token_id: tuple[int, ...] = ()
    pad_token_id: int | None = None
    torch_dtype: str | None = None
    moe: MoeConfig | None = None
    latent_attention: LatentAttentionConfig | None = None
    differential_attention: DifferentialAttention | None = None
    attention_experts: AttentionExperts | None = None
    dynamic_mask: DynamicMask | None = None
    residual_scales: bool = False
    block_norm_eps: float | None = None
    local_global: LocalGlobalAttention | None = None
    altup: AltUpConfig | None = None
    per_layer_stack: PerLayerStack | None = None
    bitlinear: BitLinearConfig | None = None
    alibi: Alibi | None = None
    shared_blocks: SharedBlocks | None = None

    def __post_init__(self) -> None:
        if not self.layer_types:
            object.__setattr__(self, "layer_types", ("full_attention",) * self.num_hidden_layers)
        if self.rope_interleaved:
            for name in ("rope", "rope_local"):
                rope = getattr(self, name)
                if rope is not None and not rope.interleaved:
                    object.__setattr__(self, name, dataclasses.replace(rope, interleaved=True))
        validate(self)

    @property
    def rotary_dim(self) -> int:
        """Number of channels of each head that rotary embedding rotates (even)."""
        return self.rotary_dim_of(self.rope)

    def rotary_dim_of(self, rope: RopeConfig) -> int:
        """Number of channels of each head that `rope` rotates (even)."""
        if self.latent_attention is not None:
            return self.latent_attention.qk_rope_head_dim
        heads = {
            self.head_dim_of(i)
            for i in range(self.num_hidden_layers)
            if self.rope_of_layer(i) == rope
        }
        head_dim = heads.pop() if len(heads) == 1 else self.head_dim
        if rope.type == "proportional":  # the whole head turns (components/rope.py)
            return head_dim
        dim = rotated_channels(head_dim, rope.partial_rotary_factor)
        return dim - dim % 2

    @property
    def embedding_width(self) -> int:
        """Width of the token table (and of a tied head): hidden_size unless projected."""
        return self.embedding_layout.width or self.hidden_size

    @property
    def scale(self) -> float:
        """Softmax scale of attention scores."""
        if self.attention_scale is not None:
            return self.attention_scale
        return 1.0 / math.sqrt(self.head_dim)

    def rope_of_layer(self, index: int) -> RopeConfig | None:
        """The rope of layer `index`, or None when the layer applies no rotary embedding."""
        if self.position_embedding != "rope" or index in self.no_rope_layers:
            return None
        rope = self.rope
        if self.rope_local is not None and self.layer_types[index] == "sliding_attention":
            rope = self.rope_local
        if not self.layer_rope_thetas:
            return rope
        theta = self.layer_rope_thetas[index]
        return dataclasses.replace(rope, theta=theta) if theta else None

    def head_dim_of(self, index: int) -> int:
        """The head size of layer `index` (Gemma 4's full layers have their own)."""
        stack = self.per_layer_stack
        if stack is not None and self.layer_types[index] == FULL:
            return stack.full_head_dim
        return self.head_dim

    def kv_heads_of(self, index: int) -> int:
        """The key/value head count of layer `index` (Gemma 4's full layers have their own)."""
        stack = self.per_layer_stack
        if stack is not None and self.layer_types[index] == FULL:
            return stack.full_kv_heads
        return self.num_key_value_heads

    def kv_source_of(self, index: int) -> int:
        """The layer whose keys and values layer `index` attends over (itself unless it
        shares an earlier layer's cache: Gemma 3n, Gemma 4)."""
        section = self.altup or self.per_layer_stack
        return index if section is None else section.kv_sources[index]

    def has_kv_cache(self, index: int) -> bool:
        """Whether layer `index` attends (KV cache) rather than carrying a recurrent state."""
        return self.layer_types[index] in ATTENTION_LAYER_TYPES

    def norm_placement_of(self, index: int) -> str:
        """Where layer `index` normalizes: `recurrent_norm_placement` in a layer whose only
        token mixer is a recurrent block, else `norm_placement`."""
        recurrent = not self.has_kv_cache(index) and self.recurrent_block(index) is not None
        if recurrent and self.recurrent_norm_placement is not None:
            return self.recurrent_norm_placement
        return self.norm_placement

    def recurrent_block(self, index: int) -> RecurrentBlock | None:
        """The recurrent block layer `index` runs: its kind's, or beside its attention the
        `parallel_recurrent` one; None for a layer without one."""
        kind = self.layer_types[index]
        if kind in ATTENTION_LAYER_TYPES and self.parallel_recurrent is not None:
            kind = self.parallel_recurrent
        return RECURRENT_BLOCKS.get(kind)

    def has_sinks(self, index: int) -> bool:
        """Whether layer `index`'s attention has sinks (MiMo-V2-Flash's sliding layers alone)."""
        layout = self.head_layout
        if not self.attention_sinks or layout is None or not layout.sink_layer_types:
            return self.attention_sinks
        return self.layer_types[index] in layout.sink_layer_types

    def window_of_layer(self, index: int) -> int | None:
        """Sliding-window size of layer `index`, or None for full attention."""
        if self.layer_types[index] == "sliding_attention":
            return self.sliding_window
        return None

    def chunk_of_layer(self, index: int) -> int | None:
        """Chunk size of layer `index`'s local attention, or None when it is not chunked."""
        if self.layer_types[index] == CHUNKED and self.local_global is not None:
            return self.local_global.chunk_size
        return None

    def layer_kind(self, index: int) -> tuple[str, RopeConfig | None]:
        """What makes layer `index` differ from others: its attention type and the rope it
        applies (None: none), each rope's table built once."""
        return self.layer_types[index], self.rope_of_layer(index)

    def layers_of_every_kind(self) -> int:
        """The fewest first layers that hold every kind of layer the model has (`layer_kind`)."""
        return first_of_every_kind([self.layer_kind(i) for i in range(self.num_hidden_layers)])

    def first_layers(self, count: int) -> ArchitectureConfig:
        """The same architecture with only its first `count` layers (the smoke test's twin)."""
        check_layer_count(count, self.num_hidden_layers)
        return dataclasses.replace(
            self,
            num_hidden_layers=count,
            layer_types=self.layer_types[:count],
            no_rope_layers=tuple(index for index in self.no_rope_layers if index < count),
            layer_rope_thetas=self.layer_rope_thetas[:count],
            altup=None if self.altup is None else self.altup.first_layers(count),
            head_layout=(
                None if self.head_layout is None else self.head_layout.first_layers(count)
            ),
            per_layer_stack=(
                None if self.per_layer_stack is None else self.per_layer_stack.first_layers(count)
            ),
            shared_blocks=(
                None if self.shared_blocks is None else self.shared_blocks.first_layers(count)
            ),
        )

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any], **overrides: Any) -> ArchitectureConfig:
        """Parse a config.json dict (hub or transformers-5 layout).

        `overrides` are applied after parsing; family adapters use them for facts the family
        fixes that config.json does not spell out (e.g. qwen2 always has q/k/v biases).
        """
        parsed = _parse(raw)
        parsed.update(overrides)
        try:
            return cls(**parsed)
        except TypeError as error:
            raise ConfigError(f"config.json: {error}") from error

    @classmethod
    def from_file(cls, path: str | Path, **overrides: Any) -> ArchitectureConfig:
        """Read and parse a config.json file."""
        return cls.from_dict(read_config_json(path), **overrides)


def _parse(raw: Mapping[str, Any]) -> dict[str, Any]:
    model_type = fields.model_type(raw.get("model_type"))
    hidden = fields.require(raw, "hidden_size")
    heads = fields.require(raw, "num_attention_heads")
    num_layers = fields.require(raw, "num_hidden_layers")
    max_positions = fields.require(raw, "max_position_embeddings")
    kv_heads = fields.integer(raw.get("num_key_value_heads"), "num_key_value_heads", heads)
    head_dim = fields.integer(raw.get("head_dim"), "head_dim")
    if head_dim is None:
        if hidden % heads:
            raise ConfigError(
                f"config.json: hidden_size {hidden} is not divisible by num_attention_heads "
                f"{heads}; accepted: a divisor of hidden_size, or an explicit head_dim"
            )
        head_dim = hidden // heads
    layer_types = parse_layer_types(raw, num_layers)
    has_sliding = "sliding_attention" in layer_types
    rope, rope_local = parse_rope(raw)
    eps_key = next((key for key in _NORM_EPS_KEYS if raw.get(key) is not None), _NORM_EPS_KEYS[0])
    return {
        "model_type": model_type,
        "vocab_size": fields.require(raw, "vocab_size"),
        "hidden_size": hidden,
        "intermediate_size": _intermediate_size(raw),
        "num_hidden_layers": num_layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "max_position_embeddings": max_positions,
        "hidden_act": raw.get("hidden_act", raw.get("hidden_activation", "silu")),
        "norm_eps": fields.number(raw.get(eps_key), eps_key, 1e-6, positive=True),
        "rope": rope,
        "rope_local": rope_local,
        "qkv_bias": fields.flag(raw.get("attention_bias"), "attention_bias", False),
        "o_bias": fields.flag(raw.get("attention_bias"), "attention_bias", False),
        "mlp_bias": fields.flag(raw.get("mlp_bias"), "mlp_bias", False),
        "tie_word_embeddings": fields.flag(
            raw.get("tie_word_embeddings"), "tie_word_embeddings", False
        ),
        "sliding_window": raw.get("sliding_window") if has_sliding else None,
        "layer_types": layer_types,
        "bos_token_id": raw.get("bos_token_id"),
        "eos_token_id": fields.int_tuple(raw.get("eos_token_id"), "eos_token_id"),
        "pad_token_id": raw.get("pad_token_id"),
        "torch_dtype": raw.get("torch_dtype", raw.get("dtype")),
    }


def _intermediate_size(raw: Mapping[str, Any]) -> int:
    """intermediate_size; a list of one size per layer (Gemma 3n) gives its largest, and the
    family's section (config/altup.py) keeps each layer's."""
    value = raw.get("intermediate_size")
    if isinstance(value, list) and value:
        sizes = [fields.integer(size, "intermediate_size") for size in value]
        return max(sizes)
    return fields.require(raw, "intermediate_size")
