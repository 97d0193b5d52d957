"""A GGUF file read as a checkpoint: HuggingFace tensor names, float reads, stored blocks.

`GgufCheckpoint` is a `reader.CheckpointReader`, as a safetensors `weights.Checkpoint` is
(names, shapes, float values: other block types are dequantized with the gguf package's own
`quants.dequantize`; a type outside `blocks.ACCEPTED_TYPES` is refused when the file is
opened), and `blocks(name)` gives the stored integers of the block types MatMulNBits holds as
they are (`blocks.NBITS_TYPES`; `stored_integers` by graph parameter). llama.cpp's Q/K row
permutation is undone on both paths: rows of a block-quantized matrix are independent, so
moving them is exact.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import onnx_ir as ir
from gguf import GGUFReader
from gguf.quants import dequantize

from mobius_genai.checkpoint.gguf.blocks import ACCEPTED_TYPES, NBITS_TYPES, BlockType
from mobius_genai.checkpoint.gguf.metadata import ROPE_TENSORS, architecture
from mobius_genai.checkpoint.prequantized.tensor import PrequantizedTensor, StoredBlocks
from mobius_genai.checkpoint.reader import TRANSPOSED_FROM_CHECKPOINT, CheckpointName, TensorSource
from mobius_genai.errors import UnsupportedModelError, WeightsError

__all__ = ["GgufCheckpoint"]

#: llama.cpp tensor names → HuggingFace names (the same for every supported architecture).
_GLOBAL = {
    "token_embd": "model.embed_tokens",
    "output_norm": "model.norm",
    "output": "lm_head",
}
_LAYER = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_NAME = re.compile(r"(?:blk\.(?P<layer>\d+)\.)?(?P<base>\w+?)\.(?P<kind>weight|bias)")


def _hf_name(name: str, where: Path, names: Mapping[str, str]) -> str:
    """The HuggingFace name of llama.cpp tensor `name`; `names`: the architecture's layer
    names that differ from llama's."""
    layer_names = {**_LAYER, **names}
    match = _NAME.fullmatch(name)
    base = match and (layer_names if match["layer"] else _GLOBAL).get(match["base"])
    if not match or base is None:
        raise UnsupportedModelError(
            f"{where}: tensor {name!r} has no HuggingFace counterpart here; accepted: "
            f"{', '.join(_GLOBAL)} and per layer {', '.join(layer_names)}"
        )
    prefix = f"model.layers.{match['layer']}." if match["layer"] else ""
    return f"{prefix}{base}.{match['kind']}"


class GgufCheckpoint:
    """The tensors and metadata of one GGUF file, by HuggingFace tensor name."""

    mxfp4_experts = False  # experts, where a GGUF holds them, are read as float (`read`)

    def __init__(self, path: Path) -> None:
        self.folder = path
        try:
            reader = GGUFReader(path)
        except (ValueError, OSError, IndexError, KeyError) as error:
            raise WeightsError(
                f"{path}: not a readable GGUF file ({error}); accepted: a complete GGUF v2/v3 file"
            ) from None
        self.metadata: dict[str, Any] = {k: f.contents() for k, f in reader.fields.items()}
        self.arch, self._row = architecture(self.metadata, str(path))
        for tensor in reader.tensors:
            if tensor.tensor_type.name not in ACCEPTED_TYPES:
                raise UnsupportedModelError(
                    f"{path}: tensor {tensor.name!r} is stored as {tensor.tensor_type.name}; "
                    f"accepted: {', '.join(sorted(ACCEPTED_TYPES))}"
                )
        weights = [t for t in reader.tensors if t.name not in ROPE_TENSORS]
        self._tensors = {_hf_name(t.name, path, self._row.names): t for t in weights}
        self.kinds = Counter(t.tensor_type.name for t in weights)
        self.rope_tensors: dict[str, tuple[float, ...]] = {
            t.name: tuple(float(f) for f in dequantize(t.data, t.tensor_type).ravel())
            for t in reader.tensors
            if t.name in ROPE_TENSORS
        }
        """The rope's factor tensors by name (metadata.ROPE_TENSORS): not weights."""

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self._tensors)

    def __len__(self) -> int:
        return len(self._tensors)

    def files(self) -> list[Path]:
        return [self.folder]

    def kind(self, name: str) -> str:
        """The GGUF type of tensor `name` ("Q4_K", "F32", ...)."""
        return self._tensors[name].tensor_type.name

    def shape(self, name: str) -> tuple[int, ...]:
        """HuggingFace order ([out, in] for a matrix; GGUF lists the innermost dimension first)."""
        return tuple(int(d) for d in reversed(self._tensors[name].shape))

    def dtype(self, name: str) -> str:
        return "F32"  # every read is float32 (dequantized when stored in blocks)

    def read(self, name: str, index: tuple[slice, ...] | None = None) -> np.ndarray:
        """Tensor `name` as float32 in HuggingFace order, dequantized and un-permuted."""
        if name not in self._tensors:
            raise WeightsError(f"{self.folder}: tensor {name!r} not found in the GGUF file")
        tensor = self._tensors[name]
        data, shape = np.asarray(tensor.data), self.shape(name)
        if index is not None and len(shape) == 2 and self._permuted_heads(name) is None:
            # rows (output features) are independent blocks: dequantize only those asked for
            data, index = data[index[0]], (slice(None), *index[1:])
            shape = (data.shape[0], shape[1])
        array = dequantize(data, tensor.tensor_type).astype(np.float32).reshape(shape)
        array = self._unpermute(name, array)
        if self._row.norm_offset and name.endswith("norm.weight"):
            array = array - np.float32(self._row.norm_offset)
        return array if index is None else np.ascontiguousarray(array[index])

    def blocks(self, name: str) -> StoredBlocks:
        """The stored integers of a matrix of one of `blocks.NBITS_TYPES`, rows un-permuted."""
        tensor = self._tensors[name]
        n, k = self.shape(name)
        stored = NBITS_TYPES[self.kind(name)].read(np.asarray(tensor.data).reshape(n, -1), n, k)
        return StoredBlocks(
            *(self._unpermute(name, part) for part in (stored.values, stored.scales, stored.zeros))
        )

    def block_type(self, name: str) -> BlockType | None:
        """The MatMulNBits form of this tensor's blocks, None when it must be dequantized."""
        entry = NBITS_TYPES.get(self.kind(name))
        if entry is None or len(self.shape(name)) != 2 or self.shape(name)[1] % entry.block_size:
            return None
        return entry

    def stored_integers(
        self, parameters: Mapping[str, ir.Value], checkpoint_name: CheckpointName
    ) -> tuple[dict[str, PrequantizedTensor], list[str]]:
        """The matrices stored in a MatMulNBits block type, as their stored integers."""
        return gguf_tensors(parameters, self, checkpoint_name)

    def stored_bits(self) -> frozenset[int]:
        """The bit widths of the matrices whose integers MatMulNBits holds as they are."""
        return frozenset(entry.bits for entry in map(self.block_type, self) if entry is not None)

    def _unpermute(self, name: str, rows: np.ndarray) -> np.ndarray:
        """Undo llama.cpp's permute() of the Q and K rows (llama architecture only)."""
        heads = self._permuted_heads(name)
        if heads is None:
            return rows
        n = rows.shape[0]
        order = np.arange(n).reshape(heads, 2, n // heads // 2).swapaxes(1, 2).reshape(n)
        out = np.empty_like(rows)
        out[order] = rows
        return out

    def _permuted_heads(self, name: str) -> int | None:
        if not self._row.permuted_qk or not name.endswith(".weight"):
            return None
        if ".q_proj." in name:
            return int(self.metadata[f"{self.arch}.attention.head_count"])
        if ".k_proj." in name:
            meta = self.metadata
            return int(
                meta.get(f"{self.arch}.attention.head_count_kv")
                or meta[f"{self.arch}.attention.head_count"]
            )
        return None

    def describe(self) -> str:
        """The source's quantization in words: GGUF and its tensor types."""
        kinds = ", ".join(f"{kind} ×{count}" for kind, count in self.kinds.most_common())
        return f"GGUF ({kinds})"


def gguf_tensors(
    parameters: Mapping[str, ir.Value],
    checkpoint: GgufCheckpoint,
    checkpoint_name: CheckpointName,
) -> tuple[dict[str, PrequantizedTensor], list[str]]:
    """A `PrequantizedTensor` for each matrix stored in a MatMulNBits block type (Linear
    weights, rows of a fused one such as phi3's attn_qkv, and embedding tables as `table`s),
    by parameter name, and the GGUF tensors they read (the others are left for
    `parameters.parameter_tensors`, which dequantizes them)."""
    tensors: dict[str, PrequantizedTensor] = {}
    for name, value in parameters.items():
        if value.const_value is not None:
            continue
        source, rows = _rows(checkpoint_name(name), parameters, name)
        if source is None or source not in checkpoint:
            continue
        block_type = checkpoint.block_type(source)
        if block_type is None:
            continue
        n, k = checkpoint.shape(source)
        table = not value.meta.get(TRANSPOSED_FROM_CHECKPOINT)
        needed = [int(d) for d in value.shape or ()]
        if rows is not None and rows.stop <= n:
            n = rows.stop - rows.start
        if [n, k] != (needed if table else needed[::-1]):
            raise WeightsError(
                f"{checkpoint.folder}: tensor {source!r} has shape [{n}, {k}], the architecture "
                f"in the GGUF metadata needs {needed if table else needed[::-1]}"
            )
        tensors[name] = PrequantizedTensor(
            _reader(checkpoint, source, rows),
            k=k,
            n=n,
            bits=block_type.bits,
            block_size=block_type.block_size,
            zero_form=block_type.zero_form,
            scheme=checkpoint.kind(source),
            dtype=value.dtype,
            name=name,
            sources=(source,),
            table=table,
        )
    return tensors, sorted({source for tensor in tensors.values() for source in tensor.sources})


def _rows(
    source: str | TensorSource, parameters: Mapping[str, ir.Value], name: str
) -> tuple[str | None, slice | None]:
    """The GGUF tensor parameter `name` reads and, for a part of a tensor fused along its
    rows (phi3's [q; k; v]), that part's rows; (None, None) for other reads."""
    if isinstance(source, str):
        return source, None
    if len(source.names) != 1 or not source.parts or source.axis != 0 or source.in_out:
        return None, None
    sizes = [int((parameters[part].shape or (0, 0))[-1]) for part in source.parts]
    start = sum(sizes[: source.parts.index(name)])
    return source.names[0], slice(start, start + sizes[source.parts.index(name)])


def _reader(checkpoint: GgufCheckpoint, name: str, rows: slice | None) -> Callable[[], Any]:
    def read() -> Any:
        blocks = checkpoint.blocks(name)
        if rows is None:
            return blocks
        return StoredBlocks(blocks.values[rows], blocks.scales[rows], blocks.zeros[rows])

    return read
