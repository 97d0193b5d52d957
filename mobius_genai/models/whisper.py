"""The two graphs of a Whisper package, with the checkpoint's weights attached.

A graph parameter is named like its checkpoint tensor less the `model.` prefix (the MLP's
`mlp.` is the one difference); the output projection `proj_out.weight` is the decoder's token
table (transformers ties them), so a checkpoint that stores it must store the same values.
"""

from __future__ import annotations

import re
from collections.abc import Collection

import onnx_ir as ir

from mobius_genai.checkpoint.parameters import NameMap, attach_weights, parameter_tensors
from mobius_genai.checkpoint.reader import CheckpointReader
from mobius_genai.components.whisper import WhisperDecoderModel, WhisperEncoderModel
from mobius_genai.config.whisper import WhisperConfig
from mobius_genai.tasks.whisper import WhisperDecoderTask, WhisperEncoderTask

#: Graph key → the role optimize_model gates this graph's fusions by.
WHISPER_ROLES = {"encoder": "encoder", "decoder": "cross_decoder"}
_TIED = {"proj_out.weight": "decoder.embed_tokens.weight"}
_MLP = re.compile(r"\.mlp\.")


def checkpoint_name(parameter: str) -> str:
    """The checkpoint tensor a graph parameter reads."""
    if parameter in _TIED:
        return parameter
    return "model." + _MLP.sub(".", parameter)


_NAMES = NameMap("whisper", checkpoint_name)


def whisper_graphs(
    config: WhisperConfig, checkpoint: CheckpointReader | None, dropped: Collection[str] = ()
) -> dict[str, ir.Model]:
    """{"encoder", "decoder"} graphs; call inside the build context. Every checkpoint tensor is
    checked (present, shaped, used) before any is read, except those `dropped` (the decoder
    layers a first-layers build leaves out)."""
    models = {
        "encoder": WhisperEncoderTask().build(WhisperEncoderModel(config), config),
        "decoder": WhisperDecoderTask().build(WhisperDecoderModel(config), config),
    }
    if checkpoint is not None:  # one check over both graphs: every tensor read once
        parameters = {
            name: value
            for model in models.values()
            for name, value in model.graph.initializers.items()
        }
        tensors, _ = parameter_tensors(
            parameters, checkpoint, _NAMES, config, tied=_TIED, dropped=dropped
        )
        for model in models.values():
            initializers = model.graph.initializers
            attach_weights(model, {k: v for k, v in tensors.items() if k in initializers})
    return models
