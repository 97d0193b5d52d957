"""The encoder and decoder graphs onnxruntime-genai 0.18 runs for its `whisper` model type.

    encoder  audio_features [batch, num_mel_bins, mel_frames] (the model dtype)
             → hidden_states [batch, positions, d_model],
               present_key_cross_{i} / present_value_cross_{i} [batch, heads, positions, head_dim]
    decoder  input_ids int32 [batch, seq],
             past_key_self_{i} / past_value_self_{i} [batch, heads, past, head_dim],
             past_key_cross_{i} / past_value_cross_{i} [batch, heads, positions, head_dim]
             → logits [batch, seq, vocab],
               present_key_self_{i} / present_value_self_{i} [batch, heads, past + seq, head_dim]

og runs the encoder once, hands its cross outputs to the decoder's cross inputs unchanged for
every step, and threads the self caches; there is no attention_mask or position_ids (the
decoder's positions start at the self cache's length). Names as og 0.18's builder writes them;
docs/whisper.md has the contract.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import onnx_ir as ir
from onnxscript import GraphBuilder

from mobius_genai._graph_keys import CONTEXT_LENGTH_KEY
from mobius_genai.config.whisper import WhisperConfig
from mobius_genai.ep.context import get_build_dtype
from mobius_genai.tasks.causal_lm import BATCH, OPSET, PAST, SEQ, TOTAL, finish_model

if TYPE_CHECKING:
    from onnxscript import nn

AUDIO_FEATURES = "audio_features"
HIDDEN_STATES = "hidden_states"
INPUT_IDS = "input_ids"
LOGITS = "logits"
#: genai_config's name patterns (%d: the decoder layer).
PAST_KEY_SELF, PAST_VALUE_SELF = "past_key_self_%d", "past_value_self_%d"
PRESENT_KEY_SELF, PRESENT_VALUE_SELF = "present_key_self_%d", "present_value_self_%d"
PAST_KEY_CROSS, PAST_VALUE_CROSS = "past_key_cross_%d", "past_value_cross_%d"
PRESENT_KEY_CROSS, PRESENT_VALUE_CROSS = "present_key_cross_%d", "present_value_cross_%d"


def _graph() -> tuple[ir.Graph, GraphBuilder]:
    graph = ir.Graph([], [], nodes=[], opset_imports={"": OPSET}, name="main_graph")
    return graph, GraphBuilder(graph)


def _cache_shape(config: WhisperConfig, length: int | str) -> list[int | str]:
    return [BATCH, config.decoder_attention_heads, length, config.decoder_head_dim]


def _add_outputs(builder: GraphBuilder, values, names, shape: list[int | str]) -> None:
    for value, name in zip(values, names, strict=True):
        builder.add_output(value, name)
        value.shape = ir.Shape(shape)
        value.dtype = get_build_dtype()


class WhisperEncoderTask:
    """The encoder graph of ``module(op, audio_features) → (hidden_states, [(key, value)])``."""

    def build(self, module: nn.Module, config: WhisperConfig) -> ir.Model:
        graph, builder = _graph()
        mel = builder.input(
            AUDIO_FEATURES, get_build_dtype(), [BATCH, config.num_mel_bins, config.mel_frames]
        )
        hidden, cross = module(builder.op, mel)
        positions = config.max_source_positions
        _add_outputs(builder, [hidden], [HIDDEN_STATES], [BATCH, positions, config.d_model])
        for i, pair in enumerate(cross):
            names = (PRESENT_KEY_CROSS % i, PRESENT_VALUE_CROSS % i)
            _add_outputs(builder, pair, names, _cache_shape(config, positions))
        return finish_model(graph, builder)


class WhisperDecoderTask:
    """The decoder graph of ``module(op, input_ids, past, cross) → (logits, presents)``."""

    def build(self, module: nn.Module, config: WhisperConfig) -> ir.Model:
        graph, builder = _graph()
        dtype = get_build_dtype()
        input_ids = builder.input(INPUT_IDS, ir.DataType.INT32, [BATCH, SEQ])
        layers = range(config.decoder_layers)
        past = [
            tuple(
                builder.input(pattern % i, dtype, _cache_shape(config, PAST))
                for pattern in (PAST_KEY_SELF, PAST_VALUE_SELF)
            )
            for i in layers
        ]
        cross_shape = _cache_shape(config, config.max_source_positions)
        cross = [
            tuple(
                builder.input(pattern % i, dtype, cross_shape)
                for pattern in (PAST_KEY_CROSS, PAST_VALUE_CROSS)
            )
            for i in layers
        ]
        logits, presents = module(builder.op, input_ids, past, cross)
        _add_outputs(builder, [logits], [LOGITS], [BATCH, SEQ, config.vocab_size])
        for i, pair in enumerate(presents):
            names = (PRESENT_KEY_SELF % i, PRESENT_VALUE_SELF % i)
            _add_outputs(builder, pair, names, _cache_shape(config, TOTAL))
        model = finish_model(graph, builder)
        model.metadata_props[CONTEXT_LENGTH_KEY] = str(config.max_target_positions)
        return model
