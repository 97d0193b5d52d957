"""A lazy tensor for each parameter of a model, from any checkpoint: the one read path of every
model kind (a text decoder's graph, a vision-language model's three).

Each reader takes the parameters stored its way: integers MatMulNBits holds (GPTQ/AWQ, GGUF
blocks: `CheckpointReader.stored_integers`), stacked MoE experts (`experts.py`), projections
interleaved by group (`grouped.py`); the rest are read as float (`weights.lazy_tensor`). Then
every checkpoint tensor must have been read by one of them, or be a buffer, a tied copy or a
tensor of a layer the build leaves out (`checks.require_all_used`).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np
import onnx_ir as ir

from mobius_genai.checkpoint.checks import few, require_all_used
from mobius_genai.checkpoint.experts import ExpertLayout, expert_tensors
from mobius_genai.checkpoint.grouped import GroupedWeight, grouped_tensors
from mobius_genai.checkpoint.reader import (
    CheckpointName,
    CheckpointReader,
    ModelConfig,
    TensorSource,
)
from mobius_genai.checkpoint.weights import lazy_tensor, no_preprocess
from mobius_genai.errors import UnsupportedModelError, WeightsError


class WeightNaming(Protocol):
    """How a model's parameters are found in its checkpoint (a family row provides it)."""

    model_type: str
    unused_weights: Sequence[str]
    """Regexes over checkpoint tensors no parameter reads (buffers, an unused head)."""

    @property
    def experts(self) -> ExpertLayout | None:
        """Where MoE experts lie, None without a MoE block."""
        ...

    @property
    def grouped_weights(self) -> tuple[GroupedWeight, ...]:
        """Projections the checkpoint interleaves by group."""
        ...

    def checkpoint_name(self, name: str) -> str | TensorSource: ...

    def preprocess_weight(self, name: str, array: np.ndarray, config: ModelConfig) -> np.ndarray:
        """The value change a parameter needs as it is read (for those `preprocessed` takes)."""
        ...

    def preprocessed(self, name: str) -> bool: ...


@dataclasses.dataclass(frozen=True)
class NameMap:
    """The `WeightNaming` of a model kind whose checkpoint needs a name map alone: no value
    changes, experts or grouped projections (Whisper)."""

    model_type: str
    names: CheckpointName
    unused_weights: tuple[str, ...] = ()
    experts: ExpertLayout | None = None
    grouped_weights: tuple[GroupedWeight, ...] = ()

    def checkpoint_name(self, name: str) -> str | TensorSource:
        return self.names(name)

    def preprocess_weight(self, name: str, array: np.ndarray, config: ModelConfig) -> np.ndarray:
        return array

    def preprocessed(self, name: str) -> bool:
        return False


def parameter_tensors(
    parameters: Mapping[str, ir.Value],
    checkpoint: CheckpointReader,
    naming: WeightNaming,
    config: ModelConfig,
    *,
    tied: Mapping[str, str] | None = None,
    dropped: Collection[str] = (),
) -> tuple[dict[str, ir.TensorProtocol], dict[str, int]]:
    """A lazy tensor for each parameter without a value, and the stored kinds of the
    checkpoint tensors read as float (kind → count, for the manifest of a pre-quantized
    source).

    `naming` says where each parameter lies (a family row); `config` is handed to its
    callbacks. `tied` maps graph parameters that must equal another ("lm_head.weight" →
    "model.embed_tokens.weight"); `dropped` names the checkpoint tensors of layers the build
    leaves out (a first-layers twin: `layers_from`), which none reads.
    """
    if checkpoint.mxfp4_experts and naming.experts is None:
        raise UnsupportedModelError(
            f"config.json: quantization_config.quant_method is 'mxfp4' for model_type "
            f"{naming.model_type!r}; MXFP4 is read for the experts of MoE families only"
        )
    quantized, read = checkpoint.stored_integers(parameters, naming.checkpoint_name)
    experts, expert_read = (
        ({}, [])
        if naming.experts is None
        else expert_tensors(
            parameters,
            checkpoint,
            naming.experts,
            naming.checkpoint_name,
            checkpoint.mxfp4_experts,
        )
    )
    grouped, grouped_read = grouped_tensors(
        {name: value for name, value in parameters.items() if name not in quantized},
        checkpoint,
        config,
        naming.grouped_weights,
        naming.checkpoint_name,
    )
    special = {**quantized, **experts, **grouped}
    elsewhere = {*read, *expert_read, *grouped_read, *dropped}
    tensors = _float_tensors(
        {name: value for name, value in parameters.items() if name not in special},
        checkpoint,
        naming,
        config,
        tied or {},
        elsewhere,
    )
    float_kinds = Counter(checkpoint.kind(name) for name in checkpoint if name not in elsewhere)
    return {**tensors, **special}, dict(sorted(float_kinds.items()))


def layers_from(names: Iterable[str], first: int | None) -> list[str]:
    """Of the checkpoint tensor `names`, those of layers `first` and later (a name's first
    number is its layer); none when `first` is None."""
    if first is None:
        return []
    numbered = ((name, re.search(r"\.(\d+)\.", name)) for name in names)
    return [name for name, match in numbered if match and int(match.group(1)) >= first]


def attach_weights(model: ir.Model, tensors: Mapping[str, ir.TensorProtocol]) -> None:
    """Give the graph parameters named in `tensors` (from `parameter_tensors`) their values."""
    for name, tensor in tensors.items():
        model.graph.initializers[name].const_value = tensor


def _float_tensors(
    parameters: Mapping[str, ir.Value],
    checkpoint: CheckpointReader,
    naming: WeightNaming,
    config: ModelConfig,
    tied: Mapping[str, str],
    read_elsewhere: Collection[str],
) -> dict[str, ir.TensorProtocol]:
    """A lazy tensor read from `checkpoint` for each parameter of `parameters` without a value.

    The family's preprocess changes values as they are read, for the parameters its
    `preprocessed` accepts; the others are taken as stored, matrices as `CheckpointTensor`s.
    Everything is checked here, from the headers, before a value is read or a graph is built,
    with errors naming the parameter and the checkpoint tensor: missing tensors, shape
    mismatches, and checkpoint tensors that no parameter reads. Those may only be buffers
    (`IGNORED_TENSORS` and the family's `unused_weights`), the tied copies `tied` maps to the
    parameter they must equal, or `read_elsewhere` (another reader took them: GPTQ's qweight).
    """
    tensors: dict[str, ir.TensorProtocol] = {}
    missing = []
    read_from: dict[str, str] = {}  # graph parameter → checkpoint tensor
    for name, value in parameters.items():
        if value.const_value is not None:
            continue
        source = naming.checkpoint_name(name)
        if isinstance(source, str):
            source = TensorSource((source,))
        found = _first_held(checkpoint, source)
        if found is None:
            missing.append(source.names[0])
            continue
        read_from[name] = found
        changes = naming.preprocess_weight if naming.preprocessed(name) else no_preprocess
        tensors[name] = lazy_tensor(checkpoint, config, parameters, name, source, found, changes)
    if missing:
        raise WeightsError(
            f"{checkpoint.folder}: checkpoint lacks tensors {few(missing)} that the architecture "
            "in config.json reads; accepted: a config.json that matches the checkpoint (check "
            "num_hidden_layers and model_type)"
        )
    ties = {}
    for copy, original in tied.items():
        stored = _first_held(checkpoint, naming.checkpoint_name(copy))
        if stored is not None and original in read_from:
            ties[stored] = read_from[original]
    used = {*read_from.values(), *read_elsewhere}
    require_all_used(checkpoint, used, naming.unused_weights, ties)
    return tensors


def _first_held(checkpoint: CheckpointReader, source: str | TensorSource) -> str | None:
    """The first name of `source` the checkpoint holds, or None."""
    names = (source,) if isinstance(source, str) else source.names
    return next((name for name in names if name in checkpoint), None)
