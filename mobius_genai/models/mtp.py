"""The MTP head's graph of a checkpoint whose family row has an MTP head (`FamilyAdapter.mtp`)
and whose config.json declares one: components/mtp.py's module, its tensors read by the one
read path (`parameter_tensors`) under the family's names."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np
import onnx_ir as ir

from mobius_genai.checkpoint.experts import ExpertLayout
from mobius_genai.checkpoint.grouped import GroupedWeight
from mobius_genai.checkpoint.parameters import attach_weights, parameter_tensors
from mobius_genai.checkpoint.reader import CheckpointReader, TensorSource
from mobius_genai.components.mtp import MtpModel
from mobius_genai.config import ArchitectureConfig
from mobius_genai.config.mtp import head_config, mtp_layers
from mobius_genai.models.families import FamilyAdapter
from mobius_genai.tasks.mtp import MtpTask

#: The head's embedding table: the main model's (`mtp_use_dedicated_embeddings` is refused).
_HEAD_TABLE = "mtp.embed_tokens.weight"


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
