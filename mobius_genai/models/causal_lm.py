"""CausalLMModel: embedding, decoder layers, final norm and LM head."""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.decoder import DecoderLayer
from mobius_genai.components.embedding import Embedding
from mobius_genai.components.linear import Linear
from mobius_genai.components.masks import attention_bias
from mobius_genai.components.norms import RMSNorm
from mobius_genai.components.rope import RotaryEmbedding
from mobius_genai.config import ArchitectureConfig


class TextModel(nn.Module):
    """The decoder stack; named `model` so parameter names match llama-style checkpoints."""

    def __init__(self, config: ArchitectureConfig, context_length: int) -> None:
        super().__init__()
        self.embed_tokens = Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(
            [DecoderLayer(config, i) for i in range(config.num_hidden_layers)]
        )
        self.norm = RMSNorm(config.hidden_size, config.norm_eps)
        self.rotary_emb = RotaryEmbedding(config.rope, config.rotary_dim, context_length)
        self.windows = sorted({config.window_of_layer(i) or 0 for i in range(len(self.layers))})
        self.config = config

    def forward(self, op, input_ids, attention_mask, position_ids, past_key_values):
        hidden_states = self.embed_tokens(op, input_ids)
        biases = {
            window: attention_bias(op, input_ids, attention_mask, window or None)
            for window in self.windows
        }
        presents = []
        for i, layer in enumerate(self.layers):
            past_key, past_value = past_key_values[i]
            bias = biases[self.config.window_of_layer(i) or 0]
            hidden_states, present_key, present_value = layer(
                op, hidden_states, position_ids, self.rotary_emb, bias, past_key, past_value
            )
            presents.append((present_key, present_value))
        return self.norm(op, hidden_states), presents


class CausalLMModel(nn.Module):
    """A decoder-only language model that returns logits and the updated KV cache.

    `context_length` bounds positions (and sizes the rotary tables); it defaults to the
    config's max_position_embeddings.
    """

    def __init__(self, config: ArchitectureConfig, context_length: int | None = None) -> None:
        super().__init__()
        self.config = config
        self.context_length = context_length or config.max_position_embeddings
        self.model = TextModel(config, self.context_length)
        if config.tie_word_embeddings:
            self.lm_head = None
        else:
            self.lm_head = Linear(config.hidden_size, config.vocab_size)

    def forward(
        self,
        op,
        input_ids: ir.Value,
        attention_mask: ir.Value,
        position_ids: ir.Value,
        past_key_values: list[tuple[ir.Value, ir.Value]],
    ) -> tuple[ir.Value, list[tuple[ir.Value, ir.Value]]]:
        hidden_states, presents = self.model(
            op, input_ids, attention_mask, position_ids, past_key_values
        )
        if self.lm_head is None:
            table = self.model.embed_tokens.weight
            logits = op.MatMul(hidden_states, op.Transpose(table, perm=[1, 0]))
        else:
            logits = self.lm_head(op, hidden_states)
        if self.config.final_logit_softcapping:
            cap = op.Constant(value_float=float(self.config.final_logit_softcapping))
            cap = op.CastLike(cap, logits)
            logits = op.Mul(op.Tanh(op.Div(logits, cap)), cap)
        return logits, presents
