"""The multi-token-prediction (MTP) head of Qwen3.5 / Qwen3.6 / Qwen3-Next checkpoints (`mtp.*`).

No transformers implementation exists (transformers drops `mtp.*` on load); the math is the
models' reference as vLLM (`qwen3_next_mtp.py`: Qwen3NextMultiTokenPredictor), SGLang and
onnxruntime-genai's builder (`builders/qwen_mtp.py`: Qwen35MtpHead) implement it. From the
main model's post-final-norm hidden state h_i and the token t_{i+1} it just produced:

    x      = fc(concat[pre_fc_norm_embedding(embed(t_{i+1})), pre_fc_norm_hidden(h_i)])
    h'     = norm(decoder_layer(x))           # one full-attention layer with its own KV cache
    logits = lm_head(h')                      # the main model's head: predicts t_{i+2}

The embedding table and LM head are the main model's; the decoder layer is the model's own
kind of full-attention layer (gated attention, q/k norms, partial rotary; MoE blocks when the
model has them). h' is an output too: onnxruntime-genai's MtpGenerator feeds it back as the
next chained draft's hidden state.
"""

from __future__ import annotations

import onnx_ir as ir
from onnxscript import nn

from mobius_genai.components.linear import Linear
from mobius_genai.components.norms import make_norm
from mobius_genai.config import ArchitectureConfig
from mobius_genai.models.causal_lm import TextModel, TiedLMHead


class MtpHead(TextModel):
    """The head's block, named `mtp` (checkpoint names `mtp.fc.weight`, `mtp.layers.0.*`,
    `mtp.norm.weight`); `embed_tokens` is the main model's table (models/mtp.py reads it
    under the main model's name)."""

    def __init__(self, config: ArchitectureConfig, context_length: int) -> None:
        super().__init__(config, context_length)
        size = config.hidden_size
        self.fc = Linear(2 * size, size)
        self.pre_fc_norm_embedding = make_norm(config.norm_type, size, config.norm_eps)
        self.pre_fc_norm_hidden = make_norm(config.norm_type, size, config.norm_eps)

    def forward(self, op, input_ids, hidden_states, attention_mask, position_ids, past):
        embedded = self.pre_fc_norm_embedding(op, self.embed_tokens(op, input_ids))
        hidden = self.pre_fc_norm_hidden(op, hidden_states)
        joined = self.fc(op, op.Concat(embedded, hidden, axis=-1))
        return super().forward(op, input_ids, attention_mask, position_ids, past, embeds=joined)


class MtpModel(nn.Module):
    """The MTP head as a graph: (input_ids, hidden_states, mask, positions, its KV cache) →
    (logits, its KV cache, its post-norm hidden state)."""

    def __init__(self, config: ArchitectureConfig, context_length: int) -> None:
        super().__init__()
        self.config = config
        self.context_length = context_length
        self.mtp = MtpHead(config, context_length)
        if config.tie_word_embeddings:
            self.lm_head = TiedLMHead(config.vocab_size, config.lm_head_bias)
        else:
            self.lm_head = Linear(config.hidden_size, config.vocab_size, config.lm_head_bias)

    def tied_weights(self) -> dict[str, str]:
        """The LM head that is the embedding table (tied embeddings), as graph names."""
        if isinstance(self.lm_head, TiedLMHead):
            return {"lm_head.weight": "mtp.embed_tokens.weight"}
        return {}

    def forward(
        self,
        op,
        input_ids: ir.Value,
        hidden_states: ir.Value,
        attention_mask: ir.Value,
        position_ids: ir.Value,
        past_key_values: list[tuple[ir.Value, ...]],
    ) -> tuple[ir.Value, list[tuple[ir.Value, ...]], ir.Value]:
        normed, presents = self.mtp(
            op, input_ids, hidden_states, attention_mask, position_ids, past_key_values
        )
        if isinstance(self.lm_head, TiedLMHead):
            logits = self.lm_head(op, normed, self.mtp.embed_tokens.weight)
        else:
            logits = self.lm_head(op, normed)
        return logits, presents, normed
