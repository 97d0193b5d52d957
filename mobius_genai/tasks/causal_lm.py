"""CausalLMTask: the graph inputs and outputs onnxruntime-genai expects of a decoder."""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx_ir as ir
from onnxscript import GraphBuilder

from mobius_genai._graph_keys import BUILT_FOR_KEY, CONTEXT_LENGTH_KEY
from mobius_genai.config import ArchitectureConfig
from mobius_genai.ep.context import ep_capabilities, get_build_dtype

if TYPE_CHECKING:
    from onnxscript import nn

OPSET = 24
BATCH, SEQ, TOTAL, PAST = (
    "batch_size",
    "sequence_length",
    "total_sequence_length",
    "past_sequence_length",
)
#: The decoder input a vision-language package's embedding graph feeds.
INPUTS_EMBEDS = "inputs_embeds"
#: The decoder output an MTP head reads (onnxruntime-genai's default name).
HIDDEN_STATES = "hidden_states"


def past_names(layer: int) -> tuple[str, str]:
    return f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"


def present_names(layer: int) -> tuple[str, str]:
    return f"present.{layer}.key", f"present.{layer}.value"


def _cache(
    config: ArchitectureConfig, layer: int, past: bool, dtype: ir.DataType
) -> list[tuple[str, list, ir.DataType]]:
    """(name, shape, dtype) of each cache tensor of `layer`: key and value for attention, then
    the states its recurrent block declares (config/recurrent.py); none for an MLP alone."""
    cache = []
    if config.has_kv_cache(layer):
        length = PAST if past else TOTAL
        shape = [BATCH, config.kv_heads_of(layer), length, config.head_dim_of(layer)]
        names = (past_names if past else present_names)(layer)
        cache += [(name, shape, dtype) for name in names]
    block = config.recurrent_block(layer)
    if block is not None:
        cache += [
            (
                block.naming.names(state.suffix)[0 if past else 1] % layer,
                state.shape(config, BATCH),
                ir.DataType.FLOAT if state.float32 else dtype,
            )
            for state in block.states
        ]
    return cache


class CausalLMTask:
    """Builds the decoder graph: input_ids, attention_mask, position_ids and the caches in
    (KV for attention layers, a state for recurrent ones); logits and the updated caches out
    (names and layouts as in onnxruntime-genai). The model's metadata names the build
    context's EP and the positions the graph covers, so a bundle's graph says what it is for.

    With `inputs_embeds` the decoder of a vision-language package: it also takes the embedding
    graph's `inputs_embeds` [batch, seq, hidden] (input_ids stay for masks that read them),
    `embeds_width` wide when they carry more than the hidden size (DeepStack). A module that
    returns a third value (`CausalLMModel.hidden_output`) gives the graph the output
    `hidden_states` [batch, seq, hidden] (an MTP head's input)."""

    def __init__(self, inputs_embeds: bool = False, embeds_width: int | None = None) -> None:
        self.inputs_embeds = inputs_embeds
        self.embeds_width = embeds_width

    def build(self, module: nn.Module, config: ArchitectureConfig) -> ir.Model:
        """The graph of `module`, called as ``module(op, input_ids, attention_mask, position_ids,
        past[, inputs_embeds])`` and returning ``(logits, presents)`` like CausalLMModel."""
        dtype = get_build_dtype()
        graph = ir.Graph([], [], nodes=[], opset_imports={"": OPSET}, name="main_graph")
        builder = GraphBuilder(graph)
        int64 = ir.DataType.INT64
        embeds = (
            builder.input(
                INPUTS_EMBEDS, dtype, [BATCH, SEQ, self.embeds_width or config.hidden_size]
            )
            if self.inputs_embeds
            else None
        )
        input_ids = builder.input("input_ids", int64, [BATCH, SEQ])
        attention_mask = builder.input("attention_mask", int64, [BATCH, TOTAL])
        position_ids = builder.input("position_ids", int64, position_shape(config))
        past = [
            tuple(
                builder.input(name, kind, shape)
                for name, shape, kind in _cache(config, i, True, dtype)
            )
            for i in range(config.num_hidden_layers)
        ]
        extra = () if embeds is None else (embeds,)
        logits, presents, *hidden = module(
            builder.op, input_ids, attention_mask, position_ids, past, *extra
        )
        builder.add_output(logits, "logits")
        logits.shape = ir.Shape([BATCH, SEQ, config.vocab_size])
        for value in hidden:
            builder.add_output(value, HIDDEN_STATES)
            value.shape = ir.Shape([BATCH, SEQ, config.hidden_size])
            value.dtype = dtype
        for i, values in enumerate(presents):
            cache = _cache(config, i, False, dtype)
            for value, (name, shape, kind) in zip(values, cache, strict=True):
                builder.add_output(value, name)
                value.shape = ir.Shape(shape)
                value.dtype = kind
        model = finish_model(graph, builder)
        context = getattr(module, "context_length", config.max_position_embeddings)
        model.metadata_props[CONTEXT_LENGTH_KEY] = str(context)
        return model


def position_shape(config: ArchitectureConfig) -> list[int | str]:
    """[batch, seq], or [3, batch, seq] for multimodal rope: a temporal, a height and a width
    position per token, which onnxruntime-genai computes for Qwen2.5-VL."""
    return [BATCH, SEQ] if config.rope.mrope_section is None else [3, BATCH, SEQ]


def finish_model(graph: ir.Graph, builder: GraphBuilder) -> ir.Model:
    """The model of a built graph, its functions attached and the build context's EP recorded."""
    model = ir.Model(graph, ir_version=10, producer_name="mobius-genai")
    model.metadata_props[BUILT_FOR_KEY] = ep_capabilities().name
    for function in builder.functions.values():  # Tier-1 ops the components emit
        model.functions[function.identifier()] = function
        graph.opset_imports.setdefault(function.domain, 1)
    return model
