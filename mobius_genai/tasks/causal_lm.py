"""CausalLMTask: the graph inputs and outputs onnxruntime-genai expects of a decoder."""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx_ir as ir
from onnxscript import GraphBuilder

from mobius_genai.config import ArchitectureConfig
from mobius_genai.ep.context import ep_capabilities, get_build_dtype

if TYPE_CHECKING:
    from onnxscript import nn

OPSET = 24
#: Model metadata key naming the EP the graph was built for (read by `validate`).
BUILT_FOR_KEY = "mobius_genai.execution_provider"
BATCH, SEQ, TOTAL, PAST = (
    "batch_size",
    "sequence_length",
    "total_sequence_length",
    "past_sequence_length",
)
#: The decoder input a vision-language package's embedding graph feeds.
INPUTS_EMBEDS = "inputs_embeds"


def past_names(layer: int) -> tuple[str, str]:
    return f"past_key_values.{layer}.key", f"past_key_values.{layer}.value"


def present_names(layer: int) -> tuple[str, str]:
    return f"present.{layer}.key", f"present.{layer}.value"


class CausalLMTask:
    """Builds the decoder graph: input_ids, attention_mask, position_ids and the KV cache in;
    logits and the updated KV cache out (names and layouts as in onnxruntime-genai). The
    model's metadata names the build context's EP, so a bundle's graph says what it is for.

    With `inputs_embeds` the decoder of a vision-language package: it also takes the embedding
    graph's `inputs_embeds` [batch, seq, hidden] (input_ids stay for masks that read them)."""

    def __init__(self, inputs_embeds: bool = False) -> None:
        self.inputs_embeds = inputs_embeds

    def build(self, module: nn.Module, config: ArchitectureConfig) -> ir.Model:
        """The graph of `module`, called as ``module(op, input_ids, attention_mask, position_ids,
        past[, inputs_embeds])`` and returning ``(logits, presents)`` like CausalLMModel."""
        dtype = get_build_dtype()
        graph = ir.Graph([], [], nodes=[], opset_imports={"": OPSET}, name="main_graph")
        builder = GraphBuilder(graph)
        int64 = ir.DataType.INT64
        embeds = (
            builder.input(INPUTS_EMBEDS, dtype, [BATCH, SEQ, config.hidden_size])
            if self.inputs_embeds
            else None
        )
        input_ids = builder.input("input_ids", int64, [BATCH, SEQ])
        attention_mask = builder.input("attention_mask", int64, [BATCH, TOTAL])
        position_ids = builder.input("position_ids", int64, [BATCH, SEQ])
        cache_shape = [BATCH, config.num_key_value_heads, PAST, config.head_dim]
        past = [
            tuple(builder.input(name, dtype, cache_shape) for name in past_names(i))
            for i in range(config.num_hidden_layers)
        ]
        extra = () if embeds is None else (embeds,)
        logits, presents = module(builder.op, input_ids, attention_mask, position_ids, past, *extra)
        builder.add_output(logits, "logits")
        logits.shape = ir.Shape([BATCH, SEQ, config.vocab_size])
        present_shape = ir.Shape([BATCH, config.num_key_value_heads, TOTAL, config.head_dim])
        for i, values in enumerate(presents):
            for value, name in zip(values, present_names(i), strict=True):
                builder.add_output(value, name)
                value.shape = present_shape
                value.dtype = dtype
        return finish_model(graph, builder)


def finish_model(graph: ir.Graph, builder: GraphBuilder) -> ir.Model:
    """The model of a built graph, its functions attached and the build context's EP recorded."""
    model = ir.Model(graph, ir_version=10, producer_name="mobius-genai")
    model.metadata_props[BUILT_FOR_KEY] = ep_capabilities().name
    for function in builder.functions.values():
        model.functions[function.identifier()] = function
    return model
