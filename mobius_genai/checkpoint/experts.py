"""MoE expert weights: per-expert (or fused 3-D) checkpoint tensors, stacked lazily into the
layout of com.microsoft::MoE.

The graph holds one [experts, 2 * inter, hidden] tensor with each expert's gate and up rows
interleaved and one [experts, hidden, inter] tensor (components/moe.py). Checkpoints store them
per expert (`experts.{e}.gate_proj.weight`, ... as transformers' save_pretrained writes
mixtral, qwen*_moe, olmoe) or fused (granitemoe's `input_linear` [E, 2I, H] = [gate | up],
gpt_oss's `gate_up_proj` [E, H, 2I] interleaved) or as 2-D tensors of every expert's rows in
turn (DBRX's `w1`, `v1`, `w2` [E * I, H]). An `ExpertsTensor` reads one expert at a time:
saving it writes expert by expert, so a layer's experts are never all in memory at once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import BinaryIO

import numpy as np
import onnx_ir as ir

from mobius_genai.checkpoint.checks import require_finite
from mobius_genai.checkpoint.prequantized import mxfp4
from mobius_genai.checkpoint.reader import CheckpointName, CheckpointReader, TensorSource
from mobius_genai.errors import WeightsError

GATE_UP = "gate_up_proj"
DOWN = "down_proj"
_FLOAT_STORED = frozenset({"F16", "BF16", "F32", "F64"})


@dataclasses.dataclass(frozen=True)
class ExpertLayout:
    """Where a family's checkpoint keeps the experts of a MoE layer (a family row's data).

    Names are relative to the experts module's checkpoint path (the graph path through the
    family's renames). With "{e}" in `gate`, each expert has its own tensors: `gate`, `up` and
    `down` [out, in] matrices. Without it, `gate` names one fused [E, 2I, H] tensor ([gate | up]
    rows, or interleaved rows with `interleaved`; `up` is None) and `down` one [E, H, I] tensor;
    `in_out` says both fused tensors are stored transposed ([E, H, 2I] and [E, I, H]);
    `either_way` that a checkpoint may hold them either way (the hub's Qwen3-VL-MoE in_out,
    transformers 5's save_pretrained not), which the stored shapes tell layer by layer.
    `up` equal to `gate`: non-gated experts (Nemotron-H), one matrix read once into both rows
    of each pair. `flat`: `gate`, `up` and `down` each name one [E * I, H] tensor whose rows
    are expert 0's I rows, then expert 1's, ... (DBRX); a down block is stored [in, out].
    """

    gate: str = "{e}.gate_proj.weight"
    up: str | None = "{e}.up_proj.weight"
    down: str = "{e}.down_proj.weight"
    interleaved: bool = False
    in_out: bool = False
    either_way: bool = False
    flat: bool = False

    @property
    def per_expert(self) -> bool:
        return "{e}" in self.gate


class ExpertsTensor(ir.LazyTensor):
    """A stacked [experts, rows, columns] parameter read one expert at a time (`expert(e)`)."""

    def __init__(
        self,
        read: Callable[[int], np.ndarray],
        dtype: ir.DataType,
        shape: tuple[int, ...],
        name: str,
    ) -> None:
        super().__init__(self._load, dtype=dtype, shape=ir.Shape(shape), name=name)
        self._read = read

    def expert(self, index: int) -> np.ndarray:
        """Expert `index`'s [rows, columns] matrix in the graph's dtype, contiguous."""
        return np.ascontiguousarray(self._read(index).astype(self.dtype.numpy(), copy=False))

    def experts(self) -> Iterator[np.ndarray]:
        for index in range(int(self.shape[0])):
            yield self.expert(index)

    def _load(self) -> ir.TensorProtocol:
        return ir.Tensor(np.stack(list(self.experts())), dtype=self.dtype, name=self.name)

    def chunks(self) -> Iterator[np.ndarray]:
        """The tensor's bytes an expert at a time (what savers that stream read)."""
        return self.experts()

    def tofile(self, file: BinaryIO) -> None:
        """Write the tensor's bytes to `file` an expert at a time."""
        for matrix in self.chunks():
            file.write(matrix.tobytes())


def _interleave(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    fused = np.empty((2 * gate.shape[0], *gate.shape[1:]), gate.dtype)
    fused[0::2], fused[1::2] = gate, up
    return fused


class _Reader:
    """Checks and reads the experts of one layer whose checkpoint path is `base`."""

    def __init__(
        self,
        checkpoint: CheckpointReader,
        layout: ExpertLayout,
        base: str,
        graph: str,
        mxfp4: bool,
        gate_up: tuple[int, int],
    ):
        self.checkpoint, self.layout, self.base, self.graph = checkpoint, layout, base, graph
        self.mxfp4 = mxfp4
        self.inter = gate_up[0] // 2  # the rows of an expert's block in a flat layout
        self.in_out = self._stored_in_out(gate_up)

    def _stored_in_out(self, gate_up: tuple[int, int]) -> bool:
        """Whether the layer's fused tensors are stored [in, out]: the layout's say or, with
        `either_way`, what the stored shape of gate_up (of down where gate_up is square) shows.
        `gate_up` is the graph's [2I, H]."""
        layout = self.layout
        if not layout.either_way:
            return layout.in_out
        rows, columns = gate_up
        for template, shape in (
            (layout.gate, (rows, columns)),
            (layout.down, (columns, rows // 2)),
        ):
            name = self.name(template)
            if shape[0] != shape[1] and name in self.checkpoint:
                return tuple(self.checkpoint.shape(name)[1:]) == shape[::-1]
        return layout.in_out

    def name(self, template: str, expert: int = 0) -> str:
        return f"{self.base}.{template.format(e=expert)}"

    def check(self, template: str, expected: tuple[int, ...], experts: int) -> list[str]:
        """The checkpoint tensors `template` names, each checked for its shape and dtype."""
        names = [self.name(template, e) for e in range(experts if "{e}" in template else 1)]
        for name in names:
            if name not in self.checkpoint:
                raise WeightsError(
                    f"{self.checkpoint.folder}: checkpoint lacks tensor {name!r} (experts of "
                    f"graph parameter {self.graph!r})"
                )
            stored = self.checkpoint.shape(name)
            if stored != expected:
                raise WeightsError(
                    f"{self.checkpoint.folder}: tensor {name!r} has shape {list(stored)}, the "
                    f"MoE sizes in config.json need {list(expected)}"
                )
            if self.checkpoint.dtype(name) not in _FLOAT_STORED:
                raise WeightsError(
                    f"{self.checkpoint.folder}: tensor {name!r} is stored as "
                    f"{self.checkpoint.dtype(name)}; accepted: {', '.join(sorted(_FLOAT_STORED))}"
                )
        return names

    def _in_mxfp4(self, name: str) -> bool:
        return self.mxfp4 and mxfp4.stored_as_mxfp4(self.checkpoint, name)

    def check_fused(self, template: str, graph_shape: tuple[int, int, int]) -> list[str]:
        """The fused tensor `template` (graph shape [E, rows, columns]) as `check` does, or
        its MXFP4 blocks and scales, which are stored in the graph's orientation."""
        name = self.name(template)
        if self._in_mxfp4(name):
            return mxfp4.check_stored(self.checkpoint, name, graph_shape)
        experts, rows, columns = graph_shape
        stored = (experts, columns, rows) if self.in_out else graph_shape
        return self.check(template, stored, experts)

    def read(self, template: str, expert: int) -> np.ndarray:
        """Expert `expert`'s matrix of `template`, refused if it holds NaN or Inf."""
        if "{e}" in template:
            source, index = self.name(template, expert), None
            matrix = self.checkpoint.read(source)
        elif self.layout.flat:  # expert `expert`'s block of rows, read alone
            rows = self.inter
            source, index = self.name(template), (slice(expert * rows, (expert + 1) * rows),)
            matrix = self.checkpoint.read(source, index)
        elif self._in_mxfp4(self.name(template)):
            return mxfp4.read_expert(self.checkpoint, self.name(template), expert)
        else:
            source, index = self.name(template), (slice(expert, expert + 1),)
            matrix = self.checkpoint.read(source, index)[0]
            matrix = matrix.T if self.in_out else matrix
        require_finite(matrix, self.checkpoint, source, index, self.graph)
        return matrix

    def gate_up(self, expert: int) -> np.ndarray:
        layout = self.layout
        if layout.per_expert:
            gate = self.read(layout.gate, expert)
            up = gate if layout.up == layout.gate else self.read(layout.up or "", expert)
            return _interleave(gate, up)
        if layout.flat:
            return _interleave(self.read(layout.gate, expert), self.read(layout.up or "", expert))
        fused = self.read(layout.gate, expert)
        if layout.interleaved:
            return fused
        half = fused.shape[0] // 2
        return _interleave(fused[:half], fused[half:])

    def down(self, expert: int) -> np.ndarray:
        matrix = self.read(self.layout.down, expert)
        return matrix.T if self.layout.flat else matrix


def expert_tensors(
    parameters: Mapping[str, ir.Value],
    checkpoint: CheckpointReader,
    layout: ExpertLayout,
    checkpoint_name: CheckpointName,
    mxfp4_stored: bool = False,
) -> tuple[dict[str, ExpertsTensor], list[str]]:
    """An ExpertsTensor read from `checkpoint` for every stacked expert parameter.

    With `mxfp4_stored` (config.json's quant_method is mxfp4), a fused tensor the checkpoint
    holds as MXFP4 blocks and scales is dequantized one expert at a time (prequantized/mxfp4.py).

    `checkpoint_name` is the family's graph → checkpoint name map, applied to the experts
    module's path. Missing or misshapen tensors raise a WeightsError naming them, before
    anything is built. Returns the tensors by parameter name and the checkpoint tensors read.
    """
    tensors: dict[str, ExpertsTensor] = {}
    read: list[str] = []
    for name, value in parameters.items():
        base, _, leaf = name.rpartition(".")
        if leaf not in (GATE_UP, DOWN) or not base.endswith(".experts"):
            continue
        source = checkpoint_name(base)
        experts, rows, columns = (int(d) for d in value.shape)
        reader = _Reader(
            checkpoint,
            layout,
            _stored_base(source, checkpoint),
            name,
            mxfp4_stored,
            (rows, columns) if leaf == GATE_UP else (2 * columns, rows),
        )
        if leaf == GATE_UP:
            if layout.per_expert:
                for template in (layout.gate, layout.up or ""):
                    read += reader.check(template, (rows // 2, columns), experts)
            elif layout.flat:
                for template in (layout.gate, layout.up or ""):
                    read += reader.check(template, (experts * rows // 2, columns), 1)
            else:
                read += reader.check_fused(layout.gate, (experts, rows, columns))
            load = reader.gate_up
        else:
            if layout.per_expert:
                read += reader.check(layout.down, (rows, columns), experts)
            elif layout.flat:
                read += reader.check(layout.down, (experts * columns, rows), 1)
            else:
                read += reader.check_fused(layout.down, (experts, rows, columns))
            load = reader.down
        tensors[name] = ExpertsTensor(load, value.dtype, (experts, rows, columns), name)
    return tensors, read


def _stored_base(source: str | TensorSource, checkpoint: CheckpointReader) -> str:
    """The experts module's name in `checkpoint`: of a TensorSource's names (prefixes tried in
    order, a vision-language row's), the first some checkpoint tensor starts with."""
    if isinstance(source, str):
        return source
    return next(
        (base for base in source.names if any(name.startswith(f"{base}.") for name in checkpoint)),
        source.names[0],
    )
