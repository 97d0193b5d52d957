"""Checks that a checkpoint's values and names make a correct model, not only a runnable one.

A NaN or Inf weight, or a checkpoint tensor that the architecture in config.json never reads
(a layer past num_hidden_layers, the q/k/v biases a wrong model_type drops), gives a bundle
that validates, runs and generates garbage. These checks refuse them with errors that name the
checkpoint tensor. Values are checked as they stream through the save (weights.py calls
`require_finite` on each block it converts), names before anything is read or built.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator, Mapping, Sequence

import ml_dtypes
import numpy as np

from mobius_genai.checkpoint.reader import CheckpointReader
from mobius_genai.errors import WeightsError

#: Elements checked (and, for an error, counted or compared) at a time.
BLOCK_ELEMENTS = 1 << 24
#: Checkpoint tensors of any family that are buffers, never weights: rotary inverse
#: frequencies, which older checkpoints store per layer (transformers ignores them the same way).
IGNORED_TENSORS = (r"(^|\.)inv_freq$",)
#: Exponent bits of the 16-bit floats: a value is NaN or Inf when all of them are set.
_EXPONENT_BITS = {np.dtype(np.float16): 0x7C00, np.dtype(ml_dtypes.bfloat16): 0x7F80}
_FLOAT_DTYPES = frozenset({*_EXPONENT_BITS, np.dtype(np.float32), np.dtype(np.float64)})


def few(names: Sequence[str]) -> str:
    """The first five of `names`, quoted, and how many more there are."""
    shown = ", ".join(repr(n) for n in names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def sliced_shape(shape: tuple[int, ...], index: tuple[slice, ...] | None) -> tuple[int, ...]:
    """The shape of `index` (slices, one per axis) of a tensor of `shape`."""
    if index is None:
        return shape
    return tuple(len(range(*s.indices(n))) for s, n in zip(index, shape, strict=True))


def require_all_used(
    checkpoint: CheckpointReader, used: set[str], unused: Sequence[str], tied: Mapping[str, str]
) -> None:
    """Refuse checkpoint tensors outside `used`: a config.json with fewer layers than the
    checkpoint, or a model_type without the q/k/v biases it holds, would silently drop them.

    Buffers matching IGNORED_TENSORS or the regexes `unused` are accepted, and so is a tied
    copy stored beside the tensor it must equal (`tied`: copy → original, checkpoint names).
    """
    ignored = re.compile("|".join(f"(?:{pattern})" for pattern in (*IGNORED_TENSORS, *unused)))
    left = {name for name in checkpoint if name not in used and not ignored.search(name)}
    for copy, original in tied.items():
        if copy in left:
            _require_equal(checkpoint, copy, original)
            left.discard(copy)
    if left:
        raise WeightsError(
            f"{checkpoint.folder}: the architecture in config.json reads no tensor "
            f"{few(sorted(left))} of the checkpoint, which would be dropped; accepted: a "
            "config.json that uses every weight (check num_hidden_layers and model_type)"
        )


def _require_equal(checkpoint: CheckpointReader, copy: str, original: str) -> None:
    """Refuse a tied copy that differs from the tensor it stands for (compared block by block,
    bit for bit, without holding either tensor)."""
    same = (
        checkpoint.shape(copy) == checkpoint.shape(original)
        and checkpoint.dtype(copy) == checkpoint.dtype(original)
        and all(
            np.array_equal(a.view(np.uint8), b.view(np.uint8))
            for a, b in zip(
                _stored_blocks(checkpoint, copy, None),
                _stored_blocks(checkpoint, original, None),
                strict=True,
            )
        )
    )
    if not same:
        raise WeightsError(
            f"{checkpoint.folder}: tensor {copy!r} differs from {original!r}, but config.json "
            "ties them (tie_word_embeddings is true: the LM head is the embedding table); "
            "accepted: tie_word_embeddings false for a separate LM head, or equal tensors"
        )


def _all_finite(values: np.ndarray) -> bool:
    """No NaN or Inf among `values` (a contiguous array), checked a chunk at a time.

    16-bit floats are tested on their bits, several times faster than np.isfinite on them.
    """
    if values.dtype not in _FLOAT_DTYPES:
        return True
    flat = values.reshape(-1)
    exponent = _EXPONENT_BITS.get(values.dtype)
    for start in range(0, flat.size, BLOCK_ELEMENTS):
        chunk = flat[start : start + BLOCK_ELEMENTS]
        if exponent is None:
            finite = bool(np.isfinite(chunk).all())
        else:
            finite = int(np.bitwise_and(chunk.view(np.uint16), 0x7FFF).max()) < exponent
        if not finite:
            return False
    return True


def require_finite(
    values: np.ndarray,
    checkpoint: CheckpointReader,
    source: str,
    index: tuple[slice, ...] | None,
    name: str,
) -> None:
    """Refuse NaN or Inf in `values`, converted from (part `index` of) checkpoint tensor
    `source` for graph parameter `name`: such a weight turns the model's outputs into NaN."""
    if not _all_finite(values):
        raise _non_finite_error(checkpoint, source, index, name, values.dtype)


def _non_finite_error(
    checkpoint: CheckpointReader,
    source: str,
    index: tuple[slice, ...] | None,
    name: str,
    dtype: np.dtype,
) -> WeightsError:
    """The error for a tensor with NaN or Inf values: counts them in the stored tensor, or
    counts the finite values beyond the range of `dtype` when the conversion made them."""
    nan = inf = beyond = 0
    for block in _stored_blocks(checkpoint, source, index):
        nan += int(np.isnan(block).sum())
        inf += int(np.isinf(block).sum())
        with np.errstate(over="ignore"):
            beyond += int((np.isfinite(block) & ~np.isfinite(block.astype(dtype))).sum())
    where = f"{checkpoint.folder}: tensor {source!r}"
    if index is not None:
        where += f" (part {index})"
    if name != source:
        where += f" (graph parameter {name!r})"
    if nan or inf:
        return WeightsError(
            f"{where} holds {nan} NaN and {inf} Inf values; accepted: finite weights (a NaN or "
            "Inf weight makes the model's outputs NaN): re-download or re-save the checkpoint"
        )
    largest = ml_dtypes.finfo(dtype).max
    return WeightsError(
        f"{where} holds {beyond} values beyond the range of {dtype.name} (largest {largest:g}), "
        f"which become Inf in it; accepted: values within the build dtype's range: build with "
        "a wider dtype (f32 or bf16)"
    )


def _stored_blocks(
    checkpoint: CheckpointReader, source: str, index: tuple[slice, ...] | None
) -> Iterator[np.ndarray]:
    """(Part `index` of) checkpoint tensor `source`, a block of rows at a time."""
    shape = checkpoint.shape(source)
    if not shape:
        yield checkpoint.read(source)
        return
    index = index or tuple(slice(None) for _ in shape)
    first, last, _ = index[0].indices(shape[0])
    row = math.prod(sliced_shape(shape[1:], index[1:]))
    step = max(1, BLOCK_ELEMENTS // max(1, row))
    for start in range(first, last, step):
        yield checkpoint.read(source, (slice(start, min(last, start + step)), *index[1:]))
