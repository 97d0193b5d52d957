"""CausalLMModel: embeddings, decoder layers, final norm and LM head."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.alibi import alibi_bias
from mobius_genai.components.altup import StreamCollapse, StreamExpansion
from mobius_genai.components.altup_layer import AltUpDecoderLayer
from mobius_genai.components.decoder import DecoderLayer, float32_residual
from mobius_genai.components.deepstack import split_deepstack
from mobius_genai.components.embedding import Embedding
from mobius_genai.components.image_masks import image_block_bias
from mobius_genai.components.kv_slots import Slots, kv_slots
from mobius_genai.components.linear import Linear, parameter
from mobius_genai.components.masks import attention_bias
from mobius_genai.components.norms import RMSNorm, make_norm
from mobius_genai.components.per_layer_stack import PerLayerDecoderLayer
from mobius_genai.components.positions import make_positions
from mobius_genai.components.rope import MultimodalRotaryEmbedding, RotaryEmbedding, Rotation
from mobius_genai.components.shared_blocks import MambaLayer, shared_block_layers
from mobius_genai.config import ArchitectureConfig, RopeConfig
from mobius_genai.ep.context import get_build_dtype
from mobius_genai.errors import ConfigError


class TextModel(nn.Module):
    """The decoder stack; named `model` so parameter names match llama-style checkpoints.

    Layers that share a rope share one `RotaryEmbedding` (its cos/sin tables): `rotary_emb`
    for the config's rope, `rotary_emb_local` for sliding layers when `rope_local` differs,
    and `rotary_emb_layers` for the other ropes of `layer_rope_thetas`, in layer order.
    With `image_token_id` the tokens of one image attend to each other in both directions
    (components/image_masks.py); with `deepstack_layers` the embeddings carry that many
    DeepStack parts, added after the first layers (components/deepstack.py).
    """

    def __init__(
        self,
        config: ArchitectureConfig,
        context_length: int,
        image_token_id: int | None = None,
        deepstack_layers: int = 0,
    ) -> None:
        super().__init__()
        self.config = config
        self.image_token_id = image_token_id
        self.deepstack_layers = deepstack_layers
        self.embed_tokens = Embedding(
            config.vocab_size, config.embedding_width, config.embedding_multiplier
        )
        self.embed_positions = make_positions(config, context_length)
        _projections(self, config)
        self.embed_norm = None
        if config.embedding_layernorm:
            self.embed_norm = make_norm(config.norm_type, config.hidden_size, config.norm_eps)
        self.layers = nn.ModuleList(
            [DecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        )
        self.norm = None
        if config.embedding_layout.final_norm:
            self.norm = make_norm(config.norm_type, config.hidden_size, config.norm_eps)
        ropes = [config.rope_of_layer(i) for i in range(config.num_hidden_layers)]
        rotary = RotaryEmbedding if config.rope.mrope_section is None else MultimodalRotaryEmbedding
        self.rotary_emb = (
            rotary(config.rope, config.rotary_dim, context_length) if config.rope in ropes else None
        )
        local = config.rope_local
        if local is not None and local != config.rope and local in ropes:
            self.rotary_emb_local = RotaryEmbedding(
                local, config.rotary_dim_of(local), context_length
            )
        else:
            self.rotary_emb_local = None
        self._layer_ropes = [
            rope for rope in dict.fromkeys(ropes) if rope not in (None, config.rope, local)
        ]
        self.rotary_emb_layers = nn.ModuleList(
            [RotaryEmbedding(r, config.rotary_dim_of(r), context_length) for r in self._layer_ropes]
        )
        # a chunk as long as the context holds every position: the layer attends in full
        self.masks = [
            (
                config.window_of_layer(i) or 0,
                _chunk(config.chunk_of_layer(i), context_length),
                self._image_blocks_in(i),
            )
            for i in range(len(self.layers))
        ]

    def _image_blocks_in(self, layer: int) -> bool:
        """Whether the tokens of one image attend to each other both ways in `layer` (Gemma
        3: in every layer, when the stack has an `image_token_id`)."""
        return self.image_token_id is not None

    def shared_copies(self) -> dict[str, str]:
        """Parameters a checkpoint may store again under each layer that shares them, as graph
        names: copy → the one the graph reads (none: every layer owns its own)."""
        return {}

    def forward(self, op, input_ids, attention_mask, position_ids, past_key_values, embeds=None):
        config = self.config
        deepstack: list[ir.Value] = []
        if embeds is None:
            hidden_states = self.embed_tokens(op, input_ids)
        else:
            hidden_states, deepstack = split_deepstack(op, embeds, self.deepstack_layers)
            if config.tie_word_embeddings:
                self.embed_tokens(op)  # the tied head's table, under its checkpoint name
        if self.project_in is not None:
            hidden_states = self.project_in(op, hidden_states)
        if self.embed_positions is not None:
            hidden_states = op.Add(hidden_states, self.embed_positions(op, position_ids))
        if config.embedding_norm:
            hidden_states = self.norm(op, hidden_states)
        if self.embed_norm is not None:
            hidden_states = self.embed_norm(op, hidden_states)
        rotations, slots, biases = self._layer_inputs(op, input_ids, attention_mask, position_ids)
        residual_float32 = float32_residual(config)
        if residual_float32:  # the layers carry the residual stream in float32
            hidden_states = op.Cast(hidden_states, to=ir.DataType.FLOAT)
        presents = []
        for i, layer in enumerate(self.layers):
            hidden_states, present = layer(
                op,
                hidden_states,
                position_ids,
                rotations[i],
                biases[i],
                past_key_values[i],
                attention_mask,
                slots,
            )
            presents.append(present)
            if i < len(deepstack):
                hidden_states = op.Add(hidden_states, deepstack[i])
        if residual_float32:
            hidden_states = op.Cast(hidden_states, to=get_build_dtype())
        if self.norm is not None:
            hidden_states = self.norm(op, hidden_states)
        if self.project_out is not None:
            hidden_states = self.project_out(op, hidden_states)
        return hidden_states, presents

    def _layer_inputs(
        self, op, input_ids, attention_mask, position_ids
    ) -> tuple[list[Rotation | None], Slots | None, list[ir.Value]]:
        """Each layer's rotation and attention bias (computed once per rope and per window and
        chunk), and the slots of the new keys."""
        config = self.config
        rotations = {}
        for i in range(config.num_hidden_layers):
            rope = config.rope_of_layer(i)
            if rope is not None and rope not in rotations:
                rotations[rope] = self._rotary_of(rope)(op, position_ids)
        # where og.Engine's rows put their keys; it runs no multimodal-rope (3-D position) model
        flat = config.rope.mrope_section is None
        slots = kv_slots(op, input_ids, attention_mask, position_ids) if flat else None
        biases = {
            mask: self._bias(op, input_ids, attention_mask, mask, position_ids if flat else None)
            for mask in sorted(set(self.masks))
        }
        layers = range(config.num_hidden_layers)
        return (
            [rotations.get(config.rope_of_layer(i)) for i in layers],
            slots,
            [biases[self.masks[i]] for i in layers],
        )

    def _rotary_of(self, rope: RopeConfig) -> nn.Module:
        """The RotaryEmbedding that holds `rope`'s tables."""
        if rope == self.config.rope:
            return self.rotary_emb
        if rope == self.config.rope_local:
            return self.rotary_emb_local
        return self.rotary_emb_layers[self._layer_ropes.index(rope)]

    def _sharing_layers(
        self, op, state, per_layer, input_ids, attention_mask, position_ids, past
    ) -> tuple[ir.Value, list]:
        """Run the layers of a stack whose layers may share caches (AltUpDecoderLayer,
        PerLayerDecoderLayer) over `state`, each given its slice of `per_layer` (None: no
        per-layer inputs) and, when it shares a cache, its source layer's keys and values; the
        final state and the layers' caches."""
        rotations, slots, biases = self._layer_inputs(op, input_ids, attention_mask, position_ids)
        shared, presents = {}, []
        for i, layer in enumerate(self.layers):
            source = self.config.kv_source_of(i)
            layer_input = None
            if per_layer is not None:
                layer_input = op.Gather(per_layer, op.Constant(value_int=i), axis=2)
            state, present, shared[i] = layer(
                op,
                state,
                layer_input,
                position_ids,
                rotations[i],
                biases[i],
                past[i],
                slots,
                shared.get(source) if source != i else None,
            )
            presents.append(present)
        return state, presents

    def _bias(
        self, op, input_ids, attention_mask, mask: tuple[int, int, bool], position_ids
    ) -> ir.Value:
        window, chunk, image_blocks = mask
        if not image_blocks:
            bias = attention_bias(
                op, input_ids, attention_mask, window or None, position_ids, chunk or None
            )
            config = self.config
            if config.alibi is None:
                return bias
            heads = config.num_attention_heads
            return alibi_bias(
                op, bias, input_ids, attention_mask, config.alibi, heads, config.scale
            )
        if chunk:
            raise ConfigError(
                "chunked attention layers with image tokens are not supported; accepted: a "
                "text decoder, or a context length within attention_chunk_size"
            )
        return image_block_bias(op, input_ids, attention_mask, window or None, self.image_token_id)


def _projections(model: nn.Module, config: ArchitectureConfig) -> None:
    """project_in and project_out between a narrower token table and the stack (OPT-350m's
    word_embed_proj_dim), unbiased; None where the table is as wide as the stack."""
    width, hidden = config.embedding_width, config.hidden_size
    model.project_in = Linear(width, hidden) if width != hidden else None
    model.project_out = Linear(hidden, width) if width != hidden else None


def _chunk(chunk: int | None, context_length: int) -> int:
    """The chunk a layer's mask applies (0: none); a chunk of the whole context is none."""
    return chunk if chunk is not None and chunk < context_length else 0


class AltUpTextModel(TextModel):
    """Gemma 3n's stack (config/altup.py): the token embedding expanded to AltUp's streams,
    a per-layer input for each layer (its slice of a second table plus a projection of the
    embedding), AltUpDecoderLayers that pass each cache source's keys on to the layers sharing
    them, the streams averaged back before the final norm."""

    def __init__(self, config: ArchitectureConfig, *stack_args: int | None) -> None:
        """`stack_args`: TextModel's context length, image token id and DeepStack layers."""
        super().__init__(config, *stack_args)
        section, hidden = config.altup, config.hidden_size
        self.layers = nn.ModuleList(
            [AltUpDecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        )
        _per_layer_tables(self, config, section)
        self.altup_projections = StreamExpansion(hidden, section.streams)
        self.altup_unembed_projections = StreamCollapse(hidden, section.streams)

    def _per_layer_inputs(self, op, input_ids: ir.Value, embeds: ir.Value) -> ir.Value:
        return per_layer_inputs(op, self, self.config.altup, input_ids, embeds)

    def forward(self, op, input_ids, attention_mask, position_ids, past_key_values, embeds=None):
        embeds = self.embed_tokens(op, input_ids)
        per_layer = self._per_layer_inputs(op, input_ids, embeds)
        streams = self.altup_projections(op, embeds)
        streams, presents = self._sharing_layers(
            op, streams, per_layer, input_ids, attention_mask, position_ids, past_key_values
        )
        return self.norm(op, self.altup_unembed_projections(op, streams)), presents


def _per_layer_tables(model: nn.Module, config: ArchitectureConfig, section) -> None:
    """The per-layer input table, the embedding's projection and its norm, on `model` under
    their checkpoint names (`section`: an AltUpConfig or a PerLayerStack)."""
    size, table = section.per_layer_size, section.table_layers * section.per_layer_size
    model.embed_tokens_per_layer = Embedding(section.per_layer_vocab, table, size**0.5)
    model.per_layer_model_projection = Linear(config.hidden_size, table)
    model.per_layer_projection_norm = RMSNorm(size, config.norm_eps)


def per_layer_inputs(op, model: nn.Module, section, input_ids: ir.Value, embeds: ir.Value):
    """(norm(proj(embeds) / √hidden) + table[ids]) / √2, [batch, seq, table_layers, size]
    (Gemma 3n's and Gemma 4's per-layer inputs, `_per_layer_tables`' modules); ids outside
    a table shorter than the vocabulary read row 0."""
    layered = op.Constant(value_ints=[0, 0, section.table_layers, section.per_layer_size])
    ids = input_ids
    if section.per_layer_vocab < model.config.vocab_size:  # Gemma 3n's table is shorter
        zero = op.Constant(value_int=0)
        in_table = op.And(
            op.GreaterOrEqual(input_ids, zero),
            op.Less(input_ids, op.Constant(value_int=section.per_layer_vocab)),
        )
        ids = op.Where(in_table, input_ids, zero)
    # read by the token ids themselves, an int4 bundle's lookup is GatherBlockQuantized
    rows = model.embed_tokens_per_layer(op, ids)
    scale = op.CastLike(op.Constant(value_float=model.config.hidden_size**-0.5), embeds)
    projected = op.Mul(model.per_layer_model_projection(op, embeds), scale)
    projected = model.per_layer_projection_norm(op, op.Reshape(projected, layered))
    half = op.CastLike(op.Constant(value_float=2**-0.5), embeds)
    return op.Mul(op.Add(projected, op.Reshape(rows, layered)), half)


class PerLayerTextModel(TextModel):
    """Gemma 4's stack (config/per_layer_stack.py): PerLayerDecoderLayers, each given its slice
    of the per-layer inputs (when the model has them) and, when it shares a cache, its source
    layer's keys and values."""

    def __init__(self, config: ArchitectureConfig, *stack_args: int | None) -> None:
        """`stack_args`: TextModel's context length, image token id and DeepStack layers."""
        super().__init__(config, *stack_args)
        self.layers = nn.ModuleList(
            [PerLayerDecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        )
        if config.per_layer_stack.per_layer_size:
            _per_layer_tables(self, config, config.per_layer_stack)

    def _image_blocks_in(self, layer: int) -> bool:
        """Gemma 4 gives an image's tokens both ways in its sliding layers only; its full
        layers stay causal (transformers' `create_masks_for_vision_model`)."""
        return self.image_token_id is not None and bool(self.config.window_of_layer(layer))

    def _per_layer_inputs(self, op, input_ids: ir.Value, embeds: ir.Value) -> ir.Value:
        """The per-layer inputs; a multimodal model's soft tokens read the pad token's rows
        and project their features (`embeds`: the embedding graph's)."""
        section = self.config.per_layer_stack
        if section.soft_tokens is not None:
            pad, soft = section.soft_tokens
            ids = op.Constant(value_ints=list(soft))
            is_soft = op.ReduceMax(
                op.Cast(
                    op.Equal(op.Unsqueeze(input_ids, op.Constant(value_ints=[-1])), ids),
                    to=ir.DataType.INT64,
                ),
                op.Constant(value_ints=[-1]),
                keepdims=0,
            )
            input_ids = op.Where(
                op.Cast(is_soft, to=ir.DataType.BOOL), op.Constant(value_int=pad), input_ids
            )
        return per_layer_inputs(op, self, section, input_ids, embeds)

    def forward(self, op, input_ids, attention_mask, position_ids, past_key_values, embeds=None):
        if embeds is None:
            hidden = self.embed_tokens(op, input_ids)
        else:  # a vision-language decoder: the embedding graph's, images in place
            hidden = embeds
            if self.config.tie_word_embeddings:
                self.embed_tokens(op)  # the tied head's table, under its checkpoint name
        per_layer = None
        if self.config.per_layer_stack.per_layer_size:
            per_layer = self._per_layer_inputs(op, input_ids, hidden)
        hidden, presents = self._sharing_layers(
            op, hidden, per_layer, input_ids, attention_mask, position_ids, past_key_values
        )
        return self.norm(op, hidden), presents


class SharedBlockTextModel(TextModel):
    """Zamba2's stack (components/shared_blocks.py): Mamba2 layers and hybrid layers that
    invoke the shared blocks on the hidden state and the token embeddings, then the final
    `norm` (the row names it as the checkpoint's `final_layernorm`)."""

    def __init__(self, config: ArchitectureConfig, *stack_args: int | None) -> None:
        """`stack_args`: TextModel's context length, image token id and DeepStack layers."""
        super().__init__(config, *stack_args)
        self.layers = nn.ModuleList(shared_block_layers(config))

    def shared_copies(self) -> dict[str, str]:
        """Each later invocation's copy of its block (transformers ties them; a checkpoint
        that stores them too must store them equal) → the first invocation's."""
        section, owners, copies = self.config.shared_blocks, {}, {}
        for invocation, layer in enumerate(section.hybrid_layers):
            owner = owners.setdefault(section.block_of(invocation), layer)
            if owner == layer:
                continue
            for name, _ in self.layers[owner].named_parameters():
                if name.startswith("shared_transformer."):
                    copies[f"model.layers.{layer}.{name}"] = f"model.layers.{owner}.{name}"
        return copies

    def forward(self, op, input_ids, attention_mask, position_ids, past_key_values, embeds=None):
        embeds = self.embed_tokens(op, input_ids)
        rotations, slots, biases = self._layer_inputs(op, input_ids, attention_mask, position_ids)
        hidden, presents = embeds, []
        for i, layer in enumerate(self.layers):
            if isinstance(layer, MambaLayer):
                hidden, present = layer(op, hidden, attention_mask, past_key_values[i])
            else:
                invocation = self.config.shared_blocks.invocation_of(i)
                attention = (position_ids, rotations[i], biases[i], slots)
                hidden, present = layer(
                    op, hidden, embeds, invocation, attention, attention_mask, past_key_values[i]
                )
            presents.append(present)
        return self.norm(op, hidden), presents


class TiedLMHead(nn.Module):
    """logits = h @ embed_table.T (+ bias): the LM head that shares the token embedding table.

    A tied head may still own a bias (phi's `lm_head.bias`); only the weight is shared.
    """

    def __init__(self, vocab_size: int, bias: bool) -> None:
        super().__init__()
        self.bias = parameter([vocab_size]) if bias else None

    def forward(self, op, hidden_states: ir.Value, table: ir.Value) -> ir.Value:
        logits = op.MatMul(hidden_states, op.Transpose(table, perm=[1, 0]))
        return logits if self.bias is None else op.Add(logits, self.bias)


def make_lm_head(config: ArchitectureConfig) -> nn.Module:
    """The LM head `config` says: the embedding table (tied) or a Linear of its own."""
    if config.tie_word_embeddings:
        return TiedLMHead(config.vocab_size, config.lm_head_bias)
    return Linear(config.embedding_width, config.vocab_size, config.lm_head_bias)


def head_logits(
    op, config: ArchitectureConfig, lm_head: nn.Module, hidden_states: ir.Value, table: ir.Value
) -> ir.Value:
    """The LM head (`table` is the embedding table a tied head reads) and the transforms
    `config` puts on its logits: divided by `logits_scaling`, capped by
    `final_logit_softcapping` (cap * tanh(logits / cap)). The decoder and the MTP head
    (models/mtp.py) both end here, so a draft's logits are on the main model's scale."""
    if isinstance(lm_head, TiedLMHead):
        logits = lm_head(op, hidden_states, table)
    else:
        logits = lm_head(op, hidden_states)
    if config.logits_scaling != 1.0:
        scaling = op.CastLike(op.Constant(value_float=config.logits_scaling), logits)
        logits = op.Div(logits, scaling)
    if config.final_logit_softcapping:
        cap = op.CastLike(op.Constant(value_float=float(config.final_logit_softcapping)), logits)
        logits = op.Mul(op.Tanh(op.Div(logits, cap)), cap)
    return logits


class CausalLMModel(nn.Module):
    """A decoder-only language model that returns logits and the updated KV cache.

    `context_length` bounds positions (and sizes the rotary tables); it defaults to the
    config's max_position_embeddings. A vision-language decoder is called with `inputs_embeds`
    (the embedding graph's output) and gets the `image_token_id` its mask reads and the
    `deepstack_layers` its embeddings carry. With `hidden_output` it also returns the
    post-final-norm hidden states (what an MTP head reads: models/mtp.py).
    """

    def __init__(
        self,
        config: ArchitectureConfig,
        context_length: int | None = None,
        *,
        image_token_id: int | None = None,
        deepstack_layers: int = 0,
    ) -> None:
        super().__init__()
        self.config = config
        self.context_length = context_length or config.max_position_embeddings
        stack = TextModel
        if config.altup is not None:
            stack = AltUpTextModel
        elif config.per_layer_stack is not None:
            stack = PerLayerTextModel
        elif config.shared_blocks is not None:
            stack = SharedBlockTextModel
        self.model = stack(config, self.context_length, image_token_id, deepstack_layers)
        self.hidden_output = False
        self.lm_head = make_lm_head(config)

    def tied_weights(self) -> dict[str, str]:
        """Checkpoint parameters this model shares, as graph names: copy → the one it reads.

        With tied embeddings the LM head is the embedding table; a checkpoint may still store
        it (equal), like transformers' `_tied_weights_keys`; so may it a shared block's copies
        under each layer that invokes it (the stack's `shared_copies`).
        """
        tied = dict(self.model.shared_copies())
        if isinstance(self.lm_head, TiedLMHead):
            tied["lm_head.weight"] = "model.embed_tokens.weight"
        return tied

    def forward(
        self,
        op,
        input_ids: ir.Value,
        attention_mask: ir.Value,
        position_ids: ir.Value,
        past_key_values: list[tuple[ir.Value, ...]],
        inputs_embeds: ir.Value | None = None,
    ) -> tuple[ir.Value, ...]:
        hidden_states, presents = self.model(
            op, input_ids, attention_mask, position_ids, past_key_values, inputs_embeds
        )
        table = self.model.embed_tokens.weight
        logits = head_logits(op, self.config, self.lm_head, hidden_states, table)
        if self.hidden_output:
            return _logits_for_mtp(op, logits), presents, hidden_states
        return logits, presents


def _logits_for_mtp(op, logits: ir.Value) -> ir.Value:
    """float32 logits as float16 beside an MTP head: onnxruntime-genai 0.18's MtpGenerator casts
    the main model's logits to float32 (MainLogitsRowsCpu) with a Cast that throws when they
    already are ("Cast - input and output types are the same"); a same-type cast should be a
    copy, a fix that belongs in og. float16 and bfloat16 logits are cast as og expects."""
    if get_build_dtype() != ir.DataType.FLOAT:
        return logits
    return op.Cast(logits, to=ir.DataType.FLOAT16)
