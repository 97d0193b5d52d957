"""Linear weights a checkpoint stores interleaved by group in one tensor, read back as the
graph's parameters a range of stored rows at a time.

Qwen3-Next packs its gated delta nets' projections per key head: `in_proj_qkvz` is, for each
key head, [q_h | k_h | v_h | z_h] (the value heads that share key head h for v and z), and
`in_proj_ba` [b_h | a_h]. The graph keeps the separate [q | k | v], z, b and a projections the
gated delta net computes with (components/gated_delta_net.py). Each parameter is a
`ConcatTensor` of `CheckpointTensor`s, one per run of consecutive stored rows: saving reads it
run by run, INT4 quantization reads each run's rows as it quantizes them (quantize/streaming.py),
and nothing is copied whole.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping

import numpy as np
import onnx_ir as ir

from mobius_genai.checkpoint.reader import (
    CheckpointName,
    CheckpointReader,
    ModelConfig,
)
from mobius_genai.checkpoint.weights import CheckpointTensor, ConcatTensor
from mobius_genai.errors import WeightsError

# (groups, rows of each segment in all groups together) for a config.
GroupSizes = Callable[[ModelConfig], tuple[int, Mapping[str, int]]]


@dataclasses.dataclass(frozen=True)
class GroupedWeight:
    """Graph parameters whose rows one checkpoint tensor interleaves by group (a row's data).

    The checkpoint tensor is `groups` equal blocks of rows; each block holds the next 1/groups
    of every segment, in the order `segments` lists them. `pattern` matches graph parameter
    names; its group `part` names one of `parts`, which maps each parameter to the segments it
    concatenates. `fused` is the re.sub replacement that gives the fused tensor's name in graph
    terms (then the family's renames apply). `sizes(config)` gives the groups and each
    segment's rows.
    """

    pattern: str
    fused: str
    segments: tuple[str, ...]
    parts: Mapping[str, tuple[str, ...]]
    sizes: GroupSizes

    def rows(self, part: str, config: ModelConfig) -> list[tuple[int, int]]:
        """The stored row ranges [start, stop) whose concatenation is parameter `part`,
        adjacent ranges merged."""
        groups, sizes = self.sizes(config)
        uneven = {s: sizes[s] for s in self.segments if sizes[s] % groups}
        if uneven:
            raise WeightsError(
                f"{self.fused}: segments {uneven} do not split into {groups} groups; accepted: "
                "sizes that are multiples of the group count"
            )
        block = sum(sizes[s] for s in self.segments) // groups
        offsets, at = {}, 0
        for segment in self.segments:
            offsets[segment] = at
            at += sizes[segment] // groups
        ranges: list[tuple[int, int]] = []
        for segment in self.parts[part]:
            for group in range(groups):
                start = group * block + offsets[segment]
                stop = start + sizes[segment] // groups
                if ranges and ranges[-1][1] == start:
                    start = ranges.pop()[0]
                ranges.append((start, stop))
        return ranges


def grouped_tensors(
    parameters: Mapping[str, ir.Value],
    checkpoint: CheckpointReader,
    config: ModelConfig,
    grouped: tuple[GroupedWeight, ...],
    checkpoint_name: CheckpointName,
) -> tuple[dict[str, ConcatTensor], list[str]]:
    """A lazy tensor for each Linear weight of `parameters` that `grouped` describes, and the
    checkpoint tensors they read; missing or misshapen tensors raise a WeightsError naming them
    before anything is read."""
    tensors: dict[str, ConcatTensor] = {}
    read: list[str] = []
    for name, value in parameters.items():
        for weight in grouped:
            match = re.search(weight.pattern, name)
            if match is None or value.const_value is not None:
                continue
            fused = name[: match.start()] + match.expand(weight.fused) + name[match.end() :]
            source = checkpoint_name(fused)
            stored = source if isinstance(source, str) else source.names[0]
            if stored not in checkpoint:
                raise WeightsError(
                    f"{checkpoint.folder}: checkpoint lacks tensor {stored!r}, which holds "
                    f"parameter {name!r}; accepted: a config.json that matches the checkpoint"
                )
            ranges = weight.rows(match.group("part"), config)
            tensors[name] = _gathered(checkpoint, stored, ranges, value, name, config, weight)
            read.append(stored)
    return tensors, sorted(set(read))


def _gathered(
    checkpoint: CheckpointReader,
    stored: str,
    ranges: list[tuple[int, int]],
    value: ir.Value,
    name: str,
    config: ModelConfig,
    weight: GroupedWeight,
) -> ConcatTensor:
    """Parameter `name` ([in, out], a Linear weight) from stored rows `ranges` of `stored`."""
    shape = checkpoint.shape(stored)
    groups, sizes = weight.sizes(config)
    segments = {segment: sizes[segment] for segment in weight.segments}
    needed = [sum(segments.values()), int(value.shape[0])]
    if list(shape) != needed or sum(stop - start for start, stop in ranges) != value.shape[1]:
        raise WeightsError(
            f"{checkpoint.folder}: tensor {stored!r} has shape {list(shape)}, the architecture "
            f"in config.json needs {needed} ({groups} groups of {segments} rows, parameter "
            f"{name!r} {list(value.shape)})"
        )
    parts = [_rows(checkpoint, stored, start, stop, value.dtype, name) for start, stop in ranges]
    return ConcatTensor(parts, 1, value.dtype, name)


def _rows(
    checkpoint: CheckpointReader, stored: str, start: int, stop: int, dtype: ir.DataType, name: str
) -> CheckpointTensor:
    """Stored rows [start, stop) of matrix `stored`, held transposed ([in, rows])."""
    columns = checkpoint.shape(stored)[1]
    index = (slice(start, stop), slice(None))

    def load() -> ir.TensorProtocol:
        values = tensor.stored_rows(0, stop - start, transpose=True)
        return ir.Tensor(np.ascontiguousarray(values), name=name)

    tensor = CheckpointTensor(
        load, checkpoint, stored, index, dtype, (columns, stop - start), name, True
    )
    return tensor
