"""Block-wise INT4 layouts of a [K, N] weight (K = in features, N = out features).

Two layouts, both computed by onnxruntime's own quantization kernels (`quantize_matmul_4bits` /
`quantize_qdq_matmul_4bits` of its extension module `onnxruntime.capi.onnxruntime_pybind11_state`,
the ones `onnxruntime.quantization.matmul_nbits_quantizer` uses), so the bytes are exactly what
the runtime kernels read:

- **MatMulNBits** (`com.microsoft`): one row per output feature. `packed` [N, K/bs, bs/2] uint8
  (two 4-bit values per byte, the first in the low nibble), `scales` [N, K/bs] in the weight's
  float dtype, `zero_points` [N, ceil((K/bs)/2)] uint8 packed the same way (asymmetric only;
  symmetric uses the implicit zero point 8). Row n of `packed` reshaped to [K/2] is also the
  `com.microsoft::GatherBlockQuantized` layout (uint8 data, bits=4, quantize_axis=1) of an
  embedding table [N, K], so one copy serves both ops.
- **DequantizeLinear** (ONNX opset 21+, blocked along axis 0): `data` [K, N] int4 (symmetric)
  or uint4 (asymmetric) packed row-major two per byte, `scales` [K/bs, N], `zero_points`
  [K/bs, N] uint4 packed (asymmetric only).

Dequantization: w = (q - zero_point) * scale per block of `block_size` consecutive k.

The kernels run on slices of the weight (along N for MatMulNBits, along K for
DequantizeLinear), so the temporary float32 copies stay small whatever the weight's size;
results are identical to one call on the whole weight because blocks never cross the slices.
The `dequantize_*` functions are plain numpy, written from the operator specs: tests use them to
check the kernels' layout and to build reference graphs.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterator

import numpy as np

from mobius_genai.checkpoint.file_rows import NotFinite
from mobius_genai.quantize.rounding import SEARCH_ELEMENTS, search_columns
from mobius_genai.quantize.search_pool import PARALLEL_ELEMENTS, Lookahead, map_chunks

__all__ = [
    "KERNEL_DTYPES",
    "BlockedInt4",
    "ColumnReader",
    "ColumnRequest",
    "NBitsWeight",
    "dequantize_blocked_int4",
    "dequantize_matmul_nbits",
    "plan_search",
    "quantize_blocked_int4",
    "quantize_matmul_nbits",
    "quantize_matmul_nbits_columns",
]

#: Elements of the float weight converted per kernel call (bounds the temporary copies: 4
#: MiB of float32).
DEFAULT_CHUNK_ELEMENTS = 1 << 20

#: The dtypes onnxruntime's quantization kernels take.
KERNEL_DTYPES = (np.dtype(np.float32), np.dtype(np.float16))

#: MatMulNBits `bits` values written here, and onnxruntime's round-to-nearest kernel for each.
_NEAREST_KERNELS = {4: "quantize_matmul_4bits", 8: "quantize_matmul_8bits"}


def _ort_kernel(name: str) -> Callable[..., None]:
    """One of onnxruntime's quantization kernels, imported when first used: the search's
    worker processes import this module without onnxruntime."""
    from onnxruntime.capi import onnxruntime_pybind11_state as kernels

    return getattr(kernels, name)


@dataclasses.dataclass(frozen=True)
class NBitsWeight:
    """The com.microsoft::MatMulNBits inputs B, scales and zero_points of one weight."""

    packed: np.ndarray
    """[N, K/block_size, block_size*bits/8] uint8."""
    scales: np.ndarray
    """[N, K/block_size], the weight's float dtype."""
    zero_points: np.ndarray | None
    """[N, ceil(K/block_size*bits/8)] uint8, or None (symmetric: implicit zero point
    2**(bits-1))."""
    bits: int = 4


@dataclasses.dataclass(frozen=True)
class BlockedInt4:
    """The ONNX DequantizeLinear inputs (blocked along axis 0) of one weight, packed."""

    data: np.ndarray
    """ceil(K*N/2) uint8: the [K, N] int4 (symmetric) or uint4 values, two per byte."""
    scales: np.ndarray
    """[K/block_size, N], the weight's float dtype."""
    zero_points: np.ndarray | None
    """ceil(K/block_size*N/2) uint8: the [K/block_size, N] uint4 zero points, or None."""


def _kernel_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype onnxruntime's kernels compute in for a weight of `dtype` (f32 or f16)."""
    return dtype if dtype in KERNEL_DTYPES else np.dtype(np.float32)


def _check(weight: np.ndarray, block_size: int) -> tuple[int, int]:
    if weight.ndim != 2:
        raise ValueError(f"expected a 2-D [K, N] weight, got shape {weight.shape}")
    k, n = weight.shape
    if k % block_size:
        raise ValueError(f"K={k} is not a multiple of block_size={block_size}")
    return k, n


ColumnReader = Callable[[int, int, np.dtype], np.ndarray]
"""read(start, stop, dtype): columns [start, stop) of a [K, N] weight, contiguous [K, stop-start]."""

ColumnRequest = Callable[[int, int, np.dtype], Callable[[], np.ndarray]]
"""request(start, stop, dtype): a picklable function that reads those columns where it is
called, in a search worker (`StoredRows`: from the checkpoint file itself)."""


def quantize_matmul_nbits(
    weight: np.ndarray,
    block_size: int,
    symmetric: bool,
    *,
    bits: int = 4,
    search: bool = False,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    importance: np.ndarray | None = None,
) -> NBitsWeight:
    """Quantize a [K, N] weight to the MatMulNBits layout (`bits` 4 or 8).

    `weight` may be a non-contiguous view (e.g. the transpose of an [N, K] embedding table);
    only `chunk_elements` of it are copied at a time. float32 and float16 weights are quantized
    in their own dtype; others (bfloat16) in float32 with the scales cast back, as onnxruntime's
    quantizer does. `search` rounds each block with `rounding.search_blocks` instead of
    onnxruntime's round-to-nearest kernel, weighting each k's error by `importance` ([K]) if
    given (`search_blocks`).
    """
    k, n = _check(weight, block_size)

    def read(start: int, stop: int, dtype: np.dtype) -> np.ndarray:
        return np.ascontiguousarray(weight[:, start:stop], dtype=dtype)

    return quantize_matmul_nbits_columns(
        read,
        k,
        n,
        weight.dtype,
        block_size,
        symmetric,
        bits=bits,
        search=search,
        chunk_elements=chunk_elements,
        importance=importance,
    )


def quantize_matmul_nbits_columns(
    read: ColumnReader,
    k: int,
    n: int,
    dtype: np.dtype,
    block_size: int,
    symmetric: bool,
    *,
    bits: int = 4,
    search: bool = False,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    importance: np.ndarray | None = None,
    request: ColumnRequest | None = None,
    ahead: tuple[Lookahead, object] | None = None,
) -> NBitsWeight:
    """`quantize_matmul_nbits` of a [K, N] weight of `dtype` given by its columns.

    The weight is never whole in memory: `read` is asked for about `chunk_elements` values at
    a time, in the dtype the kernel computes in. The search of a weight of PARALLEL_ELEMENTS
    or more runs in `search_pool`'s worker processes (the same results); with `request`, each
    worker reads and converts its columns itself, and this process sends only where they lie
    (a chunk a worker could not read is read here, whose error names the tensor). With
    `ahead` (a Lookahead and this weight's key in it, planned by `plan_search`), the workers
    go on to the weights planned after this one. Each chunk done moves the bar of the running
    counted phase (`progress.item_part`).
    """
    from mobius_genai.progress import item_part  # not in the search's worker processes

    if k % block_size:
        raise ValueError(f"K={k} is not a multiple of block_size={block_size}")
    if bits not in _NEAREST_KERNELS:
        raise ValueError(f"bits={bits} is not supported; accepted: 4, 8")
    if importance is not None and (not search or np.shape(importance) != (k,)):
        raise ValueError(f"importance needs search=True and shape ({k},)")
    blocks = k // block_size
    compute = _kernel_dtype(np.dtype(dtype))
    packed = np.zeros((n, blocks, block_size * bits // 8), np.uint8)
    scales = np.zeros((n, blocks), compute)
    zero_points = np.zeros((n, (blocks * bits + 7) // 8), np.uint8)
    ranges = _column_ranges(k, n, chunk_elements)
    if search:
        searched = _chunk_search(k, block_size, symmetric, bits, importance)
        parallel = k * n >= PARALLEL_ELEMENTS
        if parallel and request is not None and ahead is not None:
            lookahead, key = ahead
            results = lookahead.results(key, searched, _requests(request, ranges, compute))
        else:
            fetch = request if parallel and request is not None else read
            chunks = (fetch(start, stop, compute) for start, stop in ranges)
            results = map_chunks(searched, chunks, parallel=parallel)
        done = 0
        try:
            for (start, stop), outputs in zip(ranges, results, strict=True):
                packed[start:stop], scales[start:stop], zero_points[start:stop] = outputs
                done += 1
                item_part(done, len(ranges))
        except (NotFinite, OSError):
            read(*ranges[done], compute)  # raises this process's error, naming the tensor
            raise
        finally:
            results.close()  # stopped early (Ctrl-C): the pool ends now, not when collected
    else:
        kernel = _ort_kernel(_NEAREST_KERNELS[bits])
        for done, (start, stop) in enumerate(ranges, 1):
            rows = slice(start, stop)
            chunk = read(start, stop, compute)
            outputs = (packed[rows], chunk, scales[rows], zero_points[rows])
            kernel(*outputs, block_size, stop - start, k, symmetric)
            del chunk, outputs
            item_part(done, len(ranges))
    return NBitsWeight(
        packed=packed,
        scales=scales.astype(dtype, copy=False),
        zero_points=None if symmetric else zero_points,
        bits=bits,
    )


def plan_search(
    ahead: tuple[Lookahead, object],
    request: ColumnRequest,
    shape: tuple[int, int],
    dtype: np.dtype,
    block_size: int,
    symmetric: bool,
    *,
    bits: int = 4,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    importance: np.ndarray | None = None,
) -> None:
    """Plan in `ahead`'s Lookahead the search that `quantize_matmul_nbits_columns` of a [K, N]
    `shape` weight with these arguments (and `search=True`) will run in the workers; nothing
    for a weight searched here."""
    k, n = shape
    if k * n < PARALLEL_ELEMENTS:
        return
    lookahead, key = ahead
    searched = _chunk_search(k, block_size, symmetric, bits, importance)
    ranges = _column_ranges(k, n, chunk_elements)
    lookahead.plan(key, searched, _requests(request, ranges, _kernel_dtype(np.dtype(dtype))))


def _chunk_search(
    k: int, block_size: int, symmetric: bool, bits: int, importance: np.ndarray | None
) -> Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """The search of a chunk of a [K, N] weight's columns (`_searched_chunk`), picklable for
    search_pool's workers."""
    return functools.partial(
        _searched_chunk,
        bits=bits,
        symmetric=symmetric,
        blocks=k // block_size,
        importance=importance,
    )


def _column_ranges(k: int, n: int, chunk_elements: int) -> list[tuple[int, int]]:
    """The column ranges [start, stop) of about `chunk_elements` values each."""
    step = max(1, chunk_elements // k)
    return [(start, min(n, start + step)) for start in range(0, n, step)]


def _requests(
    request: ColumnRequest, ranges: list[tuple[int, int]], dtype: np.dtype
) -> Callable[[], Iterator[Callable[[], np.ndarray]]]:
    """The requests of `ranges`' columns, made when the first is sent."""
    return lambda: (request(start, stop, dtype) for start, stop in ranges)


def _searched_chunk(
    chunk: np.ndarray | Callable[[], np.ndarray],
    *,
    bits: int,
    symmetric: bool,
    blocks: int,
    importance: np.ndarray | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The MatMulNBits rows (packed, scales, zero points) of the columns `chunk` [K, rows]
    (or read by calling it: a `ColumnRequest`'s), searched (in a worker process of
    `search_pool`, or here)."""
    if callable(chunk):
        chunk = chunk()
    k, rows = chunk.shape
    packed = np.zeros((rows, blocks, k // blocks * bits // 8), np.uint8)
    scales = np.zeros((rows, blocks), chunk.dtype)
    zero_points = np.zeros((rows, (blocks * bits + 7) // 8), np.uint8)
    _searched_rows(chunk, bits, symmetric, packed, scales, zero_points, importance)
    return packed, scales, zero_points


def _searched_rows(
    chunk: np.ndarray,
    bits: int,
    symmetric: bool,
    packed: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray,
    importance: np.ndarray | None,
) -> None:
    """Fill rows of the MatMulNBits outputs from `search_columns` on columns `chunk` [K, rows]
    (`importance` [K]: the same for every column).

    A few rows at a time, so the copies stay small: their blocks go to the search as the
    columns of one [block_size, blocks * count] copy, ordered by block along K, then by row."""
    rows, blocks, _ = packed.shape
    size = chunk.shape[0] // blocks
    per_block = None
    if importance is not None:
        per_block = np.asarray(importance, np.float32).reshape(blocks, size).T
    step = max(1, SEARCH_ELEMENTS // chunk.shape[0])
    for start in range(0, rows, step):
        part = slice(start, min(rows, start + step))
        count = part.stop - start
        columns = chunk[:, part].reshape(blocks, size, count).transpose(1, 0, 2)
        weight = None if per_block is None else np.repeat(per_block, count, axis=1)
        rounded = search_columns(columns.reshape(size, -1), bits, symmetric, weight)
        scales[part] = rounded.scales.reshape(blocks, count).T
        q = rounded.q.reshape(size, blocks, count).transpose(2, 1, 0)
        packed[part] = _pack_nibbles(q) if bits == 4 else q
        if not symmetric:
            zero = rounded.zero.reshape(blocks, count).T
            zero_points[part] = _pack_nibbles(zero, pad=True) if bits == 4 else zero


def _searched_blocked(
    data: np.ndarray,
    chunk: np.ndarray,
    scales: np.ndarray,
    zero_points: np.ndarray,
    block_size: int,
    symmetric: bool,
    importance: np.ndarray | None,
) -> None:
    """Fill a slice of the DequantizeLinear outputs from `search_columns` on rows `chunk`
    (`importance`: those rows' entries, the same for every column)."""
    rows, n = chunk.shape
    blocks = rows // block_size
    columns = chunk.reshape(blocks, block_size, n).transpose(1, 0, 2).reshape(block_size, -1)
    weight = None
    if importance is not None:
        per_block = np.asarray(importance, np.float32).reshape(blocks, block_size).T
        weight = np.repeat(per_block, n, axis=1)
    rounded = search_columns(columns, 4, symmetric, weight)
    scales[...] = rounded.scales.reshape(blocks, n)
    q = rounded.q.reshape(block_size, blocks, n).transpose(1, 0, 2).reshape(-1)
    if symmetric:  # signed int4 two's complement: q - 8 in a nibble
        q = (q - 8) & 0x0F
    data[...] = _pack_nibbles(q, pad=True)
    if not symmetric:
        zero_points[...] = _pack_nibbles(rounded.zero, pad=True)


def _pack_nibbles(values: np.ndarray, *, pad: bool = False) -> np.ndarray:
    """Pairs along the last axis packed into bytes, the first in the low nibble."""
    if pad and values.shape[-1] % 2:
        values = np.concatenate([values, np.zeros_like(values[..., :1])], axis=-1)
    return (values[..., 0::2] | (values[..., 1::2] << 4)).astype(np.uint8)


def quantize_blocked_int4(
    weight: np.ndarray,
    block_size: int,
    symmetric: bool,
    *,
    search: bool = False,
    chunk_elements: int = DEFAULT_CHUNK_ELEMENTS,
    importance: np.ndarray | None = None,
) -> BlockedInt4:
    """Quantize a [K, N] weight to the blocked DequantizeLinear layout (axis 0).

    Symmetric gives signed int4 values without zero points; asymmetric gives uint4 values and
    uint4 zero points. Slices along K hold an even number of blocks so every slice starts on a
    byte of the packed outputs. `search` rounds with `rounding.search_blocks`, weighting each
    k's error by `importance` ([K]) if given. Each slice done moves the bar of the running
    counted phase (`progress.item_part`).
    """
    from mobius_genai.progress import item_part

    k, n = _check(weight, block_size)
    if importance is not None and (not search or np.shape(importance) != (k,)):
        raise ValueError(f"importance needs search=True and shape ({k},)")
    blocks = k // block_size
    compute = _kernel_dtype(weight.dtype)
    data = np.zeros((k * n + 1) // 2, np.uint8)
    scales = np.zeros((blocks, n), compute)
    zero_points = np.zeros((blocks * n + 1) // 2, np.uint8)
    pair = 2 * block_size
    if search:  # the search transposes its slice and keeps several copies of it
        chunk_elements = min(chunk_elements, SEARCH_ELEMENTS)
    rows = max(pair, (chunk_elements // max(n, 1)) // pair * pair)
    starts = range(0, k, rows)
    for done, start in enumerate(starts, 1):
        stop = min(k, start + rows)
        block0, block1 = start // block_size, stop // block_size
        chunk = np.ascontiguousarray(weight[start:stop], dtype=compute)
        outputs = (
            data[start * n // 2 : (stop * n + 1) // 2],
            chunk,
            scales[block0:block1],
            zero_points[block0 * n // 2 : (block1 * n + 1) // 2],
        )
        if search:
            part = None if importance is None else importance[start:stop]
            _searched_blocked(*outputs, block_size, symmetric, part)
        else:
            _ort_kernel("quantize_qdq_matmul_4bits")(
                *outputs, block_size, n, stop - start, symmetric
            )
        del chunk
        item_part(done, len(starts))
    return BlockedInt4(
        data=data,
        scales=scales.astype(weight.dtype, copy=False),
        zero_points=None if symmetric else zero_points,
    )


def _unpack_nibbles(packed: np.ndarray, count: int) -> np.ndarray:
    """The first `count` 4-bit values of a flat uint8 array, low nibble first, as int16."""
    flat = np.asarray(packed, np.uint8).reshape(-1)
    values = np.stack([flat & 0x0F, flat >> 4], axis=-1).reshape(-1)
    return values[:count].astype(np.int16)


def dequantize_matmul_nbits(weight: NBitsWeight, k: int) -> np.ndarray:
    """The [K, N] float32 weight that MatMulNBits computes with (numpy reference)."""
    n, blocks, blob = weight.packed.shape
    block_size = blob * 8 // weight.bits
    if weight.bits == 8:
        q = weight.packed.astype(np.int16)
    else:
        q = _unpack_nibbles(weight.packed, n * blocks * block_size).reshape(n, blocks, block_size)
    if weight.zero_points is None:
        zero = np.full((n, blocks, 1), 2 ** (weight.bits - 1), np.int16)
    elif weight.bits == 8:
        zero = weight.zero_points.astype(np.int16)[:, :, None]
    else:
        per_row = weight.zero_points.shape[1] * 2
        zero = _unpack_nibbles(weight.zero_points, n * per_row).reshape(n, per_row)
        zero = zero[:, :blocks, None]
    scales = np.asarray(weight.scales).astype(np.float32)[:, :, None]
    rows = (q - zero).astype(np.float32) * scales
    return np.ascontiguousarray(rows.reshape(n, blocks * block_size)[:, :k].T)


def dequantize_blocked_int4(weight: BlockedInt4, k: int, n: int) -> np.ndarray:
    """The [K, N] float32 weight that DequantizeLinear(axis=0, block_size) produces."""
    blocks = weight.scales.shape[0]
    block_size = k // blocks
    q = _unpack_nibbles(weight.data, k * n).reshape(k, n)
    if weight.zero_points is None:
        q = np.where(q >= 8, q - 16, q)  # signed int4
    else:
        zero = _unpack_nibbles(weight.zero_points, blocks * n).reshape(blocks, n)
        q = q - np.repeat(zero, block_size, axis=0)
    scales = np.repeat(np.asarray(weight.scales).astype(np.float32), block_size, axis=0)
    return q.astype(np.float32) * scales
