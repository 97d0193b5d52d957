"""What checkpoint/ offers and asks: the `CheckpointReader` interface every stored format
implements, and the words the layers above use to say where their parameters lie.

checkpoint/ is the bottom of the data flow: it imports nothing from config/, models/,
components/ or later rooms. What it needs of them is passed in as the types below: a model
names its parameters' tensors (`TensorSource`; `parameters.WeightNaming`), marks the matrices it holds
transposed (`TRANSPOSED_FROM_CHECKPOINT`) and hands its configuration through unread
(`ModelConfig`: the family's own callbacks read it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np
import onnx_ir as ir

if TYPE_CHECKING:
    from mobius_genai.checkpoint.prequantized.tensor import PrequantizedTensor

#: Value metadata key of a graph parameter holding the transpose of the checkpoint's matrix
#: (a Linear weight: [in, out] in the graph, [out, in] as stored).
TRANSPOSED_FROM_CHECKPOINT = "mobius.transposed"
#: Marks (in `ir.Value.meta`) a parameter its family keeps in float32, which int4 leaves
#: float (models/families/float32.py).
KEPT_FLOAT32 = "mobius.kept_float32"

#: A model's configuration as checkpoint/ sees it: passed through to the callbacks that read it
#: (a family's preprocess, a grouped weight's sizes), never read here.
ModelConfig = Any


@dataclasses.dataclass(frozen=True)
class TensorSource:
    """Where one graph parameter's value lies in the checkpoint.

    `names`: candidate tensor names, the first one the checkpoint holds is read (checkpoints
    saved from the base model drop the task prefix, e.g. gpt2's "transformer.").
    `in_out`: the checkpoint stores this matrix [in, out] (GPT-2's Conv1D) where the graph
    expects the usual [out, in] of a Linear layer, so it is read without transposing.
    `parts`: when non-empty, the tensor concatenates these graph parameters (this one among
    them) along checkpoint axis `axis`, in this order (phi3's qkv_proj, gpt2's c_attn); each
    part's extent is the size of that parameter, so the split needs no sizes from the config.
    """

    names: tuple[str, ...]
    in_out: bool = False
    parts: tuple[str, ...] = ()
    axis: int = 0


#: Graph parameter name → its checkpoint tensor name, or a TensorSource.
CheckpointName = Callable[[str], "str | TensorSource"]


@runtime_checkable
class CheckpointReader(Protocol):
    """The tensors of one checkpoint by HuggingFace name, whatever stores them (safetensors
    files: `weights.Checkpoint`; a GGUF file: `gguf.GgufCheckpoint`).

    Reads are float or as stored (`dtype`); `kind` is the stored kind for reports. A format
    that keeps quantized integers says so (`describe`, `stored_bits`) and hands them over as
    they are (`stored_integers`), so a bundle keeps them without a second rounding.
    """

    folder: Path
    """What errors name: the checkpoint folder, or the file of a one-file format."""
    mxfp4_experts: bool
    """The MoE experts are stored as MXFP4 blocks (dequantized as they stream)."""

    def __contains__(self, name: object) -> bool: ...

    def __iter__(self) -> Iterator[str]: ...

    def __len__(self) -> int: ...

    def files(self) -> list[Path]:
        """The files the tensors are read from."""
        ...

    def read(self, name: str, index: tuple[slice, ...] | None = None) -> np.ndarray:
        """Tensor `name` (or the part `index` of it) as a new numpy array."""
        ...

    def dtype(self, name: str) -> str:
        """The dtype a read gives, as safetensors names it ("BF16", "F32", ...)."""
        ...

    def kind(self, name: str) -> str:
        """The stored kind of tensor `name` for reports (a safetensors dtype, a GGUF type)."""
        ...

    def shape(self, name: str) -> tuple[int, ...]: ...

    def describe(self) -> str | None:
        """How the source stores quantized weights, in words; None for float weights."""
        ...

    def stored_bits(self) -> frozenset[int]:
        """The bit widths of the integers a bundle can keep as stored; empty for floats."""
        ...

    def stored_integers(
        self, parameters: Mapping[str, ir.Value], checkpoint_name: CheckpointName
    ) -> tuple[dict[str, PrequantizedTensor], list[str]]:
        """A `PrequantizedTensor` for each parameter stored as integers MatMulNBits holds,
        and the checkpoint tensors they read."""
        ...
