"""The multi-token-prediction (MTP) head of Qwen3.5 / Qwen3.6 / Qwen3-Next checkpoints (`mtp.*`).

No transformers implementation exists (transformers drops `mtp.*` on load); the math is the
models' reference as vLLM (`qwen3_next_mtp.py`: Qwen3NextMultiTokenPredictor), SGLang and
onnxruntime-genai's builder (`builders/qwen_mtp.py`: Qwen35MtpHead) implement it. From the
main model's post-final-norm hidden state h_i and the token t_{i+1} it just produced:

    x      = fc(concat[pre_fc_norm_embedding(embed(t_{i+1})), pre_fc_norm_hidden(h_i)])
    h'     = norm(decoder_layer(x))           # one full-attention layer with its own KV cache
    logits = lm_head(h')                      # the main model's head: predicts t_{i+2}

The head's logits go through the main model's head transforms too (`head_logits`: a family's
`logits_scaling`, config.json's `final_logit_softcapping`), so og.MtpGenerator's drafts and
verifications are scored on one scale.

The embedding table and LM head are the main model's; the decoder layer is the model's own
kind of full-attention layer (gated attention, q/k norms, partial rotary; MoE blocks when the
model has them). h' is an output too: onnxruntime-genai's MtpGenerator feeds it back as the
next chained draft's hidden state.

`mtp_graph` builds it for a checkpoint whose family row has an MTP head (`FamilyAdapter.mtp`)
and whose config.json declares one, its tensors read by the one read path
(`parameter_tensors`) under the family's names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx_ir as ir
from onnxscript import nn

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.checkpoint.grouped import GroupedWeight
from mobius_genai.checkpoint.parameters import attach_weights, parameter_tensors
from mobius_genai.checkpoint.reader import CheckpointReader, TensorSource
from mobius_genai.components.linear import Linear
from mobius_genai.components.norms import make_norm
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.mtp import head_config, mtp_layers
from mobius_genai.models.causal_lm import TextModel, TiedLMHead, head_logits, make_lm_head
from mobius_genai.models.families import FamilyAdapter
from mobius_genai.tasks.mtp import MtpTask

#: The head's embedding table: the main model's (`mtp_use_dedicated_embeddings` is refused).
_HEAD_TABLE = "mtp.embed_tokens.weight"


class MtpHead(TextModel):
    """The head's block, named `mtp` (checkpoint names `mtp.fc.weight`, `mtp.layers.0.*`,
    `mtp.norm.weight`); `embed_tokens` is the main model's table (`_HeadNaming` reads it
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
        self.lm_head = make_lm_head(config)

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
        logits = head_logits(op, self.config, self.lm_head, normed, self.mtp.embed_tokens.weight)
        return logits, presents, normed


def has_mtp_head(family: FamilyAdapter, raw: Mapping[str, Any]) -> bool:
    """Whether the family's checkpoints may hold a head and config.json declares one."""
    return family.mtp is not None and mtp_layers(family.text_keys(raw), family.mtp) > 0


def mtp_graph(
    config: ArchitectureConfig,
    context_length: int,
    family: FamilyAdapter,
    checkpoint: CheckpointReader | None,
) -> ir.Model:
    """The head's graph for the decoder `config`, its weights read from `checkpoint` (none
    for a graph-only build): every `mtp.*` tensor must be read, with its shape."""
    module = MtpModel(head_config(config), context_length)
    if checkpoint is not None:
        tensors, _ = parameter_tensors(
            dict(module.named_parameters()),
            checkpoint,
            _HeadNaming(family),
            module.config,
            tied=module.tied_weights(),
        )
    model = MtpTask().build(module)
    if checkpoint is not None:
        attach_weights(model, tensors)
    return model


@dataclasses.dataclass(frozen=True)
class _HeadNaming:
    """The family's names for the head's parameters; the checkpoint's tensors outside `mtp.*`
    are the main model's (the shared embedding and LM head are read, the rest left)."""

    family: FamilyAdapter
    unused_weights: tuple[str, ...] = (r"^(?!mtp\.)",)

    @property
    def model_type(self) -> str:
        return self.family.model_type

    @property
    def experts(self) -> ExpertLayout | None:
        return self.family.experts

    @property
    def grouped_weights(self) -> tuple[GroupedWeight, ...]:
        return self.family.grouped_weights

    def checkpoint_name(self, name: str) -> str | TensorSource:
        shared = "model.embed_tokens.weight" if name == _HEAD_TABLE else name
        return self.family.checkpoint_name(shared)

    def preprocess_weight(self, name: str, array: np.ndarray, config: Any) -> np.ndarray:
        return self.family.preprocess_weight(name, array, config)

    def preprocessed(self, name: str) -> bool:
        return self.family.preprocessed(name)
