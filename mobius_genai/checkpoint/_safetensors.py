"""safetensors files: each header parsed and checked once, tensors read from their offsets.

safetensors' own `safe_open` parses a file's whole header each time the file is opened, and a
checkpoint read one tensor at a time through fresh opens (see `read_tensor`) would parse it
once per tensor: a 90 MB header of metadata took minutes. Here `read_header` parses it once
and checks it as safetensors does (known dtypes, sizes that match shapes, tensor data tiling
the rest of the file exactly), so that every fault in a checkpoint someone else wrote is one
line naming the file and the fault; `read_tensor` then needs only the offsets.
"""

from __future__ import annotations

import dataclasses
import json
import reprlib
from pathlib import Path

import ml_dtypes
import numpy as np

from mobius_genai.errors import WeightsError

__all__ = ["TensorEntry", "read_header", "read_tensor", "shown"]

#: safetensors refuses larger headers (its MAX_HEADER_SIZE).
MAX_HEADER_BYTES = 100_000_000
#: Offsets and dimensions are 64-bit unsigned integers in safetensors.
_LIMIT = 1 << 64

#: Bits per element of every dtype safetensors knows.
_BITS = {
    "BOOL": 8,
    "F4": 4,
    "F6_E2M3": 6,
    "F6_E3M2": 6,
    "U8": 8,
    "I8": 8,
    "F8_E5M2": 8,
    "F8_E4M3": 8,
    "F8_E8M0": 8,
    "I16": 16,
    "U16": 16,
    "F16": 16,
    "BF16": 16,
    "I32": 32,
    "U32": 32,
    "F32": 32,
    "C64": 64,
    "F64": 64,
    "I64": 64,
    "U64": 64,
}

#: The numpy dtype each readable dtype is read as (safetensors stores little-endian).
_NUMPY = {
    "BOOL": np.dtype(np.bool_),
    "U8": np.dtype("u1"),
    "I8": np.dtype("i1"),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E8M0": np.dtype(ml_dtypes.float8_e8m0fnu),
    "I16": np.dtype("<i2"),
    "U16": np.dtype("<u2"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "I32": np.dtype("<i4"),
    "U32": np.dtype("<u4"),
    "F32": np.dtype("<f4"),
    "C64": np.dtype("<c8"),
    "F64": np.dtype("<f8"),
    "I64": np.dtype("<i8"),
    "U64": np.dtype("<u8"),
}


_SHOWN = reprlib.Repr()
_SHOWN.maxstring, _SHOWN.maxlong, _SHOWN.maxother, _SHOWN.maxlist = 160, 40, 80, 8


def itemsize(dtype: str) -> int:
    """Bytes per element of safetensors dtype `dtype` ("BF16": 2); 8 for a name not known."""
    known = _NUMPY.get(dtype)
    return 8 if known is None else known.itemsize


def shown(value: object) -> str:
    """repr(value) cut to a readable length: values from a file may be megabytes long."""
    return _SHOWN.repr(value)


@dataclasses.dataclass(frozen=True, slots=True)
class TensorEntry:
    """One tensor of a safetensors file: dtype as safetensors names it ("BF16"), shape, and
    where its bytes lie in the file."""

    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


def _fault(file: Path, what: str) -> WeightsError:
    return WeightsError(f"{file}: not a valid safetensors file: {what}")


def read_header(file: Path) -> dict[str, TensorEntry]:
    """The tensors of safetensors `file`, from its header, parsed and checked once."""
    try:
        size = file.stat().st_size
        with open(file, "rb") as stream:
            prefix = stream.read(8)
            if len(prefix) < 8:
                raise _fault(file, f"{size} bytes, shorter than the 8 bytes of the header size")
            length = int.from_bytes(prefix, "little")
            if length > MAX_HEADER_BYTES:
                raise _fault(
                    file, f"header of {length} bytes; safetensors reads at most {MAX_HEADER_BYTES}"
                )
            if length < 2:
                raise _fault(file, f"header of {length} bytes, too short for a JSON object")
            if 8 + length > size:
                raise _fault(
                    file, f"header of {length} bytes runs past the end of the file ({size} bytes)"
                )
            raw = stream.read(length)
    except OSError as error:
        raise WeightsError(f"{file}: cannot be read ({error})") from error
    try:
        header = json.loads(raw.decode("utf-8"))
    except RecursionError as error:
        raise _fault(file, "header nested too deeply") from error
    except ValueError as error:  # also UnicodeDecodeError, and integers of over 4,300 digits
        raise _fault(file, f"header is not valid JSON ({error})") from error
    del raw
    if not isinstance(header, dict):
        raise _fault(file, f"header is not a JSON object but {shown(header)}")
    metadata = header.pop("__metadata__", None)
    if metadata is not None and not (
        isinstance(metadata, dict) and all(isinstance(v, str) for v in metadata.values())
    ):
        raise _fault(file, "__metadata__ is not an object of strings")
    del metadata
    start = 8 + length
    entries = {name: _entry(file, name, value, start) for name, value in header.items()}
    _check_tiling(file, entries, start, size)
    return entries


def _is_count(value: object) -> bool:
    return type(value) is int and 0 <= value < _LIMIT


def _entry(file: Path, name: str, value: object, start: int) -> TensorEntry:
    """The entry of tensor `name`, checked: known dtype, shape and offsets that agree."""
    tensor = f"tensor {shown(name)}"
    if not isinstance(value, dict):
        raise _fault(file, f"{tensor}: its entry is not an object")
    dtype, shape, offsets = (value.get(key) for key in ("dtype", "shape", "data_offsets"))
    if not isinstance(dtype, str) or dtype not in _BITS:
        raise _fault(file, f"{tensor}: dtype {shown(dtype)}; accepted: {', '.join(sorted(_BITS))}")
    if not isinstance(shape, list) or not all(_is_count(d) for d in shape):
        raise _fault(
            file, f"{tensor}: shape {shown(shape)}; accepted: a list of sizes (integers ≥ 0)"
        )
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(_is_count(o) for o in offsets)
        or offsets[0] > offsets[1]
    ):
        raise _fault(
            file,
            f"{tensor}: data_offsets {shown(offsets)}; accepted: [begin, end], integers "
            "with 0 ≤ begin ≤ end",
        )
    elements = 1
    for size in shape:
        elements *= size
        if elements >= _LIMIT:
            raise _fault(file, f"{tensor}: shape {shown(shape)} has too many elements")
    bits = elements * _BITS[dtype]
    nbytes = offsets[1] - offsets[0]
    if bits % 8 or bits // 8 != nbytes:
        raise _fault(
            file,
            f"{tensor}: holds {nbytes} bytes, but {dtype} {shown(shape)} needs {bits / 8:g}",
        )
    return TensorEntry(dtype, tuple(shape), start + offsets[0], nbytes)


def _check_tiling(file: Path, entries: dict[str, TensorEntry], start: int, size: int) -> None:
    """The tensors' bytes (from file offset `start`) follow each other without gaps or
    overlaps, and end where the file of `size` bytes ends."""
    end = 0
    for name, entry in sorted(entries.items(), key=lambda item: (item[1].offset, item[1].nbytes)):
        begin = entry.offset - start
        if begin != end:
            raise _fault(
                file,
                f"tensor {shown(name)}: its data starts at byte {begin} of the data, "
                f"where the previous tensor's ends at byte {end}; accepted: tensors stored one "
                "after the other, without gaps or overlaps",
            )
        end = begin + entry.nbytes
    if start + end > size:
        raise WeightsError(
            f"{file}: truncated: its header describes {start + end} bytes but the file has "
            f"{size}; re-download or re-save the checkpoint"
        )
    if start + end < size:
        raise _fault(file, f"{size - start - end} bytes after the last tensor's data")


def read_tensor(
    file: Path, entry: TensorEntry, index: tuple[slice, ...] | None = None
) -> np.ndarray:
    """The tensor `entry` of `file` as a new numpy array; with `index`, only that slice.

    Read through a memory map of its own, closed after the read: pages read through a
    long-lived map stay in the process's RSS, so reading a 15 GB checkpoint through maps kept
    open would end the build with 15 GB of RSS.
    """
    dtype = _NUMPY.get(entry.dtype)
    if dtype is None:
        raise WeightsError(
            f"{file}: tensors stored as {entry.dtype} cannot be read; accepted: "
            f"{', '.join(sorted(_NUMPY))}"
        )
    if entry.nbytes == 0:
        empty = np.zeros(entry.shape, dtype)
        return empty if index is None else np.array(empty[index])
    try:
        mapped = np.memmap(file, dtype, "r", offset=entry.offset, shape=entry.shape)
    except (OSError, ValueError) as error:  # the file changed since its header was read
        raise WeightsError(f"{file}: cannot be read ({error})") from error
    return np.array(mapped if index is None else mapped[index])
