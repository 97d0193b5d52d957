"""The interface every model kind implements, and what `build()` hands one.

parse → graphs: `ModelKind.build` turns config.json and the opened checkpoint into
`KindGraphs` (`{key: (role, model)}` and what the bundle needs of them); bundle:
`genai_config` (the whole document: a decoder's, a decoder's with the sections beside it, or
another layout such as Whisper's encoder and decoder) and `bundle_files` (processor configs);
smoke test: `twin_layers` (how a small twin cuts the graphs beside the decoder) and
the og type's row (`og_types`: the prompt's image placeholder). `build()`, the packager and
validate call these and nothing else of a kind.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import onnx_ir as ir

from mobius_genai.bundle.graph import GraphInfo
from mobius_genai.checkpoint.reader import CheckpointReader
from mobius_genai.checkpoint.source import Source
from mobius_genai.config import ArchitectureConfig
from mobius_genai.models.causal_lm import CausalLMModel
from mobius_genai.models.families import FamilyAdapter
from mobius_genai.target import Target

if TYPE_CHECKING:
    from mobius_genai.build import ModelPackage


@dataclasses.dataclass(frozen=True)
class DecoderWeights:
    """A decoder module's lazy tensors as the checkpoint stores them (`KindInput.read_decoder`)."""

    tensors: dict[str, ir.TensorProtocol]
    float_kinds: dict[str, int]
    prequantized: str | None


@dataclasses.dataclass(frozen=True)
class KindInput:
    """The checkpoint as `build()` opened it, and the target it builds for."""

    raw: Mapping[str, Any]  # config.json (a GGUF's, derived from its metadata)
    source: Source
    checkpoint: CheckpointReader | None  # None: a graph-only build
    target: Target
    num_layers: int | None  # the first layers only (the smoke test's twin)
    # A decoder module's tensors through every reader of stored formats (GGUF, GPTQ/AWQ,
    # MXFP4 experts, grouped projections), checked against the checkpoint.
    read_decoder: Callable[[CausalLMModel, FamilyAdapter], DecoderWeights]
    # PEFT target module names whose projections take LoRA inputs (components/lora.py)
    lora_targets: tuple[str, ...] = ()
    # the decoder's logits for the last position only (`build(prune_lm_head=True)`)
    prune_lm_head: bool = False


@dataclasses.dataclass
class KindGraphs:
    """What a kind built: its graphs by package key with their roles (`optimize.gates.ROLES`),
    the text decoder's config and what the bundle records of the source."""

    graphs: dict[str, tuple[str, ir.Model]]
    config: ArchitectureConfig
    context_length: int
    family: Any
    kind_config: Any = None  # the kind's config of the whole checkpoint (e.g. vision + text)
    prequantized: str | None = None
    float_kinds: dict[str, int] = dataclasses.field(default_factory=dict)
    not_built: str | None = None


@dataclasses.dataclass(frozen=True)
class WrittenGraphs:
    """The bundle folder as the packager saved the graphs into it, and what else of the
    checkpoint genai_config takes."""

    folder: Path
    decoder: GraphInfo  # the decoder graph's inputs, outputs and ops, read back
    generation: Mapping[str, Any]  # generation_config.json ({} without one)


class ModelKind(Protocol):
    """One kind of model: a text decoder, a vision-language model, ..."""

    name: str

    def claims(self, model_type: str) -> bool:
        """Whether config.json's `model_type` is this kind's (a row of its table)."""
        ...

    def build(self, given: KindInput) -> KindGraphs:
        """Parse config.json and build the graphs; call inside the target's build context."""
        ...

    def genai_config(self, package: ModelPackage, written: WrittenGraphs) -> dict[str, Any]:
        """genai_config.json of the bundle whose graphs are `written`; its model.type is the
        kind's row's og type (`og_types` holds what og does with it)."""
        ...

    def bundle_files(self, checkpoint: Path, package: ModelPackage) -> dict[str, Any]:
        """The JSON files besides the decoder's (a processor config): file name → document."""
        ...

    def twin_layers(self, package: ModelPackage) -> tuple[int, int] | None:
        """The layers of the graphs beside the decoder a smoke-test twin keeps (twin's,
        whole's), None when the decoder's layers are all it cuts."""
        ...
