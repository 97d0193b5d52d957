"""MtpTask: the graph inputs and outputs onnxruntime-genai 0.18's MtpGenerator expects of an
MTP head (genai_config's `model.mtp` section, og's default names)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx_ir as ir
from onnxscript import GraphBuilder

from mobius_genai._graph_keys import CONTEXT_LENGTH_KEY
from mobius_genai.ep.context import get_build_dtype
from mobius_genai.tasks.causal_lm import (
    BATCH,
    HIDDEN_STATES,
    OPSET,
    PAST,
    SEQ,
    TOTAL,
    finish_model,
    past_names,
    position_shape,
    present_names,
)

if TYPE_CHECKING:
    from mobius_genai.models.mtp import MtpModel

#: The head's own post-norm hidden state, which og feeds back as the next chained draft's
#: `hidden_states` (og's default `model.mtp.outputs.hidden_states`).
HIDDEN_STATES_OUT = "hidden_states_out"


class MtpTask:
    """Builds the head's graph: input_ids, the main model's `hidden_states`, attention_mask,
    position_ids and the head's KV cache in; logits, the cache and `hidden_states_out` out."""

    def build(self, module: MtpModel) -> ir.Model:
        config = module.config
        dtype = get_build_dtype()
        graph = ir.Graph([], [], nodes=[], opset_imports={"": OPSET}, name="mtp_graph")
        builder = GraphBuilder(graph)
        int64 = ir.DataType.INT64
        hidden_shape = [BATCH, SEQ, config.hidden_size]
        input_ids = builder.input("input_ids", int64, [BATCH, SEQ])
        hidden = builder.input(HIDDEN_STATES, dtype, hidden_shape)
        attention_mask = builder.input("attention_mask", int64, [BATCH, TOTAL])
        position_ids = builder.input("position_ids", int64, position_shape(config))
        cache = [BATCH, config.num_key_value_heads, PAST, config.head_dim]
        past = [
            tuple(builder.input(name, dtype, cache) for name in past_names(layer))
            for layer in range(config.num_hidden_layers)
        ]
        logits, presents, head_hidden = module(
            builder.op, input_ids, hidden, attention_mask, position_ids, past
        )
        builder.add_output(logits, "logits")
        logits.shape = ir.Shape([BATCH, SEQ, config.vocab_size])
        logits.dtype = dtype
        for layer, values in enumerate(presents):
            for value, name in zip(values, present_names(layer), strict=True):
                builder.add_output(value, name)
                value.shape = ir.Shape([BATCH, config.num_key_value_heads, TOTAL, config.head_dim])
        builder.add_output(head_hidden, HIDDEN_STATES_OUT)
        head_hidden.shape = ir.Shape(hidden_shape)
        head_hidden.dtype = dtype
        model = finish_model(graph, builder)
        model.metadata_props[CONTEXT_LENGTH_KEY] = str(module.context_length)
        return model
