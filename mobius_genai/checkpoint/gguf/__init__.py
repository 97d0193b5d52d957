"""GGUF files (llama.cpp) as a source: config, tokenizer and weights from the file itself.

`open_gguf` reads the metadata with the gguf package (llama.cpp's own reader) and writes the
config.json, tokenizer.json, tokenizer_config.json and generation_config.json a HuggingFace
checkpoint would have into a private folder (removed at exit); the weights stay in the GGUF:
block types MatMulNBits holds keep their integers (`gguf_tensors`), others are
dequantized as they are read.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import onnx_ir as ir

from mobius_genai._json import write_json
from mobius_genai.checkpoint.gguf.checkpoint import GgufCheckpoint
from mobius_genai.checkpoint.gguf.metadata import config_json, generation_config
from mobius_genai.checkpoint.gguf.tokenizer import tokenizer_config, tokenizer_json
from mobius_genai.checkpoint.prequantized.tensor import PrequantizedTensor, StoredBlocks
from mobius_genai.checkpoint.source import Source, checkpoint_file
from mobius_genai.checkpoint.weights import TensorSource
from mobius_genai.components.linear import TRANSPOSED_FROM_CHECKPOINT
from mobius_genai.errors import ConfigError, WeightsError

__all__ = ["GgufCheckpoint", "find_gguf", "gguf_tensors", "open_gguf"]


def find_gguf(model: str | Path) -> Path | None:
    """The GGUF file `model` names: a .gguf file, or a folder holding one and no config.json;
    a ConfigError when it is a link leading out of its folder (`source.checkpoint_file`)."""
    path = Path(model).expanduser()
    if path.is_file() and path.suffix.lower() == ".gguf":
        return checkpoint_file(path, path.parent)
    if not path.is_dir() or (path / "config.json").is_file():
        return None
    found = sorted(path.glob("*.gguf"))
    if len(found) > 1:
        raise ConfigError(
            f"model {str(model)!r}: holds several GGUF files ({', '.join(p.name for p in found)});"
            " accepted: the path of one of them"
        )
    return checkpoint_file(found[0], path) if found else None


def open_gguf(path: Path) -> tuple[Source, dict[str, Any], GgufCheckpoint]:
    """The Source (a folder of HuggingFace metadata files), config.json and checkpoint of a GGUF."""
    checkpoint = GgufCheckpoint(path)
    meta = checkpoint.metadata
    where = str(path)
    vocab = len(meta.get("tokenizer.ggml.tokens") or []) or int(
        meta.get(f"{checkpoint.arch}.vocab_size", 0)
    )
    tied = "lm_head.weight" not in checkpoint
    config = config_json(meta, tied, vocab, where, checkpoint.rope_tensors)
    folder = Path(tempfile.mkdtemp(prefix="mobius-gguf-"))
    atexit.register(shutil.rmtree, folder, True)
    write_json(folder / "config.json", config)
    write_json(folder / "generation_config.json", generation_config(meta))
    write_json(folder / "tokenizer.json", tokenizer_json(meta, where))
    write_json(
        folder / "tokenizer_config.json",
        tokenizer_config(meta, config.get("max_position_embeddings")),
    )
    return Source(path=folder, model_id=path.name, weights=path), config, checkpoint


def gguf_tensors(
    parameters: Mapping[str, ir.Value],
    checkpoint: GgufCheckpoint,
    checkpoint_name: Callable[[str], str | TensorSource],
) -> tuple[dict[str, PrequantizedTensor], list[str]]:
    """A `PrequantizedTensor` for each matrix stored in a MatMulNBits block type (Linear
    weights, rows of a fused one such as phi3's attn_qkv, and embedding tables as `table`s),
    by parameter name, and the GGUF tensors they read (the others are left for
    `weights.checkpoint_tensors`, which dequantizes them)."""
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
